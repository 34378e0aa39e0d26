"""P4, clients held on this machine: 1,000 publishers + 1,000 subscribers in one run.

One campaign through an embedded controller: Mosquitto, two agent processes (the
controller assigns the clients round-robin), per-publisher topics (publisher i ->
subscriber i, so 2,000 clients without 1,000,000 deliveries per message), open loop.
Checks and prints: every message delivered (agent-side counts and stored events), the
generators kept their rate, every process the run started is gone afterwards; and where
the time went (connect + subscribe barrier, the window, upload and teardown).

    .venv/bin/python bench/scale.py [--clients 1000] [--rate-hz 10] [--messages 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

from mqttbed.brokers.mosquitto.backend import MosquittoDeployment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, load_average, run_campaign  # noqa: E402


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000, help="publishers = subscribers")
    parser.add_argument("--rate-hz", type=float, default=10.0)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--qos", type=int, default=0)
    args = parser.parse_args()
    before = children()
    load = load_average()
    table, record, wall = run_campaign({
        "name": "scale",
        "workload": {"publishers": args.clients, "subscribers": args.clients,
                     "topics": "per-publisher", "topic": "scale/t", "rate_hz": args.rate_hz,
                     "messages": args.messages, "warmup_messages": 0, "qos": args.qos},
        "agents": {"count": 2},
        "timing": {"setup_timeout_s": 300, "drain_s": 2.0}})
    time.sleep(0.5)
    left = sorted(children() - before)
    expected = args.clients * args.messages
    counts = record.delivery_counts
    published = sum(c.published for c in counts.values())
    received = sum(c.received for c in counts.values())
    generators = record.generators.values()
    window_s = args.messages / args.rate_hz
    figures = {
        "clients": 2 * args.clients, "agents": len(counts), "expected_deliveries": expected,
        "published": published, "received_agent_side": received,
        "stored_deliveries": table.num_rows, "lost": expected - received,
        "rate_kept": all(g.rate_kept for g in generators),
        "send_lag_max_ms": max((g.send_lag_max_ns for g in generators), default=0) / 1e6,
        "kernel_stamped": sum(g.kernel_deliveries for g in generators),
        "nofile_agents": sorted({g.nofile_limit for g in generators
                                 if g.nofile_limit is not None}),
        "broker_limits": None if record.broker is None
        else record.broker.as_type(MosquittoDeployment).limits.model_dump(),
        "subscribe_barrier_s": None if record.subscribe_s is None
        else round(record.subscribe_s, 2),
        "window_s": window_s, "campaign_wall_s": round(wall, 1),
        "processes_left": left, "load_average_before": load,
    }
    ok = received == expected == published and not left
    print(f"{2 * args.clients} clients ({args.clients} publishers -> {args.clients} "
          f"subscribers, per-publisher topics) on 2 agent processes; "
          f"{'OK' if ok else 'NOT MET'}")
    for key, value in figures.items():
        print(f"  {key:22} {value}")
    emit("P4 clients held", None, {}, {**figures, "target_met": ok})
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
