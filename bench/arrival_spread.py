"""P2, arrival spread at 100 subscribers: mqttbed against paho in one process.

1 publisher -> 100 subscribers at 100 Hz through Mosquitto on loopback. The spread of a
message is max - min of its arrival over the subscribers; p50 over the messages. The
baseline is 100 paho clients in one process (a network thread each). mqttbed runs the
campaign path (agent processes, one selector loop each, lean client, kernel receive
stamps; the user-space figure beside it). Target: spread p50 <= 0.25x.

    .venv/bin/python bench/arrival_spread.py [--messages 300]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, load_average, ratio  # noqa: E402
from latency_floor import measure_mqttbed, measure_paho  # noqa: E402

SUBSCRIBERS = 100
RATE_HZ = 100.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300)
    args = parser.parse_args()
    print(f"1 publisher -> {SUBSCRIBERS} subscribers, {RATE_HZ:g} Hz, Mosquitto on loopback; "
          f"µs; load average {load_average()} before")
    lean = measure_mqttbed(args.messages, RATE_HZ, "lean", SUBSCRIBERS)
    results = {
        "paho, one process (baseline)": measure_paho(args.messages, RATE_HZ, SUBSCRIBERS),
        "mqttbed, lean (kernel stamps)": lean["kernel"],
        "mqttbed, lean (user stamps)": lean["user"],   # the same run's deliveries
    }
    base = results["paho, one process (baseline)"]
    print(f"{'client':32} {'spread p50':>10} {'spread p99':>10} {'lat p50':>9} {'n':>7}  ratio")
    for name, r in results.items():
        print(f"{name:32} {r['spread_p50'] or 0:10.1f} {r['spread_p99'] or 0:10.1f} "
              f"{r['lat_p50'] or 0:9.1f} {int(r['n'] or 0):7d}  "
              f"x{ratio(r['spread_p50'], base['spread_p50']) or 0:.2f}")
    emit("P2 arrival spread", "paho, one process",
         {"spread_p50": ratio(results["mqttbed, lean (kernel stamps)"]["spread_p50"],
                              base["spread_p50"]),
          "spread_p50_user": ratio(results["mqttbed, lean (user stamps)"]["spread_p50"],
                                   base["spread_p50"])},
         {name: {k: None if v is None else round(v, 1) for k, v in r.items()}
          for name, r in results.items()} | {"target": 0.25})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
