"""P1, latency floor: mqttbed's measurement path against plain paho clients, same broker.

1 publisher -> 10 subscribers through Mosquitto on loopback, at 100 Hz and at 1 kHz.
Prints p50/p99 latency and per-message arrival spread (max - min over subscribers) for
  - paho + TCP_NODELAY (the baseline): one process, one paho network thread per client,
  - mqttbed, lean client: the real campaign path (agent processes, selector loop, the
    lean TCP client, kernel receive stamps, chunked upload),
  - mqttbed, paho client (``workload.client: paho``): the same path on paho,
each as a ratio to the baseline measured in this one script. Targets: lean p50 <= 0.5x,
p99 <= 0.7x.

    .venv/bin/python bench/latency_floor.py [--messages-100 500] [--messages-1k 2000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, load_average, paho_fanout, pct, ratio, run_campaign, spreads  # noqa: E402

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options  # noqa: E402
from mqttbed.core.host import LocalHost  # noqa: E402

SUBSCRIBERS = 10
WARMUP = 20


def us(values: np.ndarray, q: float) -> float | None:
    value = pct(values, q)
    return None if value is None else value / 1e3


def summarize(latency_ns: np.ndarray, spread_ns: np.ndarray) -> dict[str, float | None]:
    return {"lat_p50": us(latency_ns, 50), "lat_p99": us(latency_ns, 99),
            "spread_p50": us(spread_ns, 50), "spread_p99": us(spread_ns, 99),
            "n": float(len(latency_ns))}


def measure_mqttbed(messages: int, rate_hz: float, client: str,
                    subscribers: int = SUBSCRIBERS) -> dict[str, dict[str, float | None]]:
    """One campaign; its figures from the recorded receive time (kernel stamps where the
    client took them) and from the user-space receive time of the same deliveries."""
    table, _, _ = run_campaign({
        "name": "latency-floor",
        "workload": {"publishers": 1, "subscribers": subscribers, "rate_hz": rate_hz,
                     "messages": messages, "warmup_messages": WARMUP, "client": client}})
    t_pub, seq = table["t_pub_ns"].to_numpy(), table["seq"].to_numpy()
    figures = {}
    for clock, column in (("kernel", "t_recv_ns"), ("user", "t_recv_user_ns")):
        t_recv = table[column].to_numpy(zero_copy_only=False)
        figures[clock] = summarize(t_recv - t_pub, spreads(seq, t_recv, subscribers))
    return figures


def measure_paho(messages: int, rate_hz: float, subscribers: int = SUBSCRIBERS
                 ) -> dict[str, float | None]:
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(), LocalHost())
    try:
        latency, spread = paho_fanout(endpoint, subscribers, messages, rate_hz, WARMUP)
    finally:
        backend.teardown()
    return summarize(latency, spread)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages-100", type=int, default=500)
    parser.add_argument("--messages-1k", type=int, default=2000)
    args = parser.parse_args()
    figures, ratios = {}, {}
    print(f"1 publisher -> {SUBSCRIBERS} subscribers, Mosquitto on loopback; µs; "
          f"load average {load_average()} before")
    print(f"{'rate':>6} {'client':34} {'lat p50':>9} {'lat p99':>9} {'spread p50':>10} "
          f"{'n':>6}  ratios (p50, p99) to paho + TCP_NODELAY")
    for label, rate, messages in (("100hz", 100.0, args.messages_100),
                                  ("1khz", 1000.0, args.messages_1k)):
        lean = measure_mqttbed(messages, rate, "lean")
        results = {
            "paho + TCP_NODELAY (baseline)": measure_paho(messages, rate),
            "mqttbed, lean client (kernel)": lean["kernel"],
            "mqttbed, lean client (user)": lean["user"],   # the same run's deliveries
            "mqttbed, paho client": measure_mqttbed(messages, rate, "paho")["user"],
        }
        base = results["paho + TCP_NODELAY (baseline)"]
        for name, r in results.items():
            p50, p99 = ratio(r["lat_p50"], base["lat_p50"]), ratio(r["lat_p99"], base["lat_p99"])
            print(f"{label:>6} {name:34} {r['lat_p50'] or 0:9.1f} {r['lat_p99'] or 0:9.1f} "
                  f"{r['spread_p50'] or 0:10.1f} {int(r['n'] or 0):6d}  "
                  f"x{p50 or 0:.2f}, x{p99 or 0:.2f}")
        best = results["mqttbed, lean client (kernel)"]
        ratios[f"lat_p50_{label}"] = ratio(best["lat_p50"], base["lat_p50"])
        ratios[f"lat_p99_{label}"] = ratio(best["lat_p99"], base["lat_p99"])
        figures[label] = {name: {k: None if v is None else round(v, 1) for k, v in r.items()}
                          for name, r in results.items()}
        figures[f"load_average_{label}"] = load_average()
    emit("P1 latency floor", "paho + TCP_NODELAY, one process", ratios,
         {**figures, "targets": {"lat_p50": 0.5, "lat_p99": 0.7}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
