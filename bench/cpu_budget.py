"""A broker saturating under a CPU budget: Mosquitto at shrinking ``broker.cpu_limit``.

    .venv/bin/python bench/cpu_budget.py [--budgets 0.1 0.05 0.02] [--rate-hz 500]

One publisher -> 10 subscribers at QoS 1, open loop, through one Mosquitto whose process
is under a cgroup CPU quota (``broker.cpu_limit``), against the same run without one
(the baseline, run first in this script). Per budget: deliveries per second over the
window, latency p50/p99 (from the intended send time, so a broker that falls behind shows
its backlog), and the share of quota periods in which the broker used up its budget and
waited (the cgroup's own count). Ratios: each budget's figure over the baseline's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, load_average, pct, ratio, run_campaign  # noqa: E402

SUBSCRIBERS = 10


def one_run(cpu_limit: float | None, rate_hz: float, messages: int) -> dict[str, Any]:
    """Run the campaign once; return its figures."""
    broker: dict[str, Any] = {"backend": "mosquitto"}
    if cpu_limit is not None:
        broker["cpu_limit"] = cpu_limit
    table, metadata, wall = run_campaign({
        "name": f"cpu-budget-{cpu_limit}", "broker": broker, "agents": {"count": 2},
        "workload": {"publishers": 1, "subscribers": SUBSCRIBERS, "qos": 1,
                     "rate_hz": rate_hz, "messages": messages, "warmup_messages": 50},
        "timing": {"drain_s": 10, "drain_idle_s": 2, "setup_timeout_s": 60}})
    t_recv = table["t_recv_ns"].to_numpy()
    # from the open-loop schedule: a broker that falls behind shows its backlog
    latency_ms = (t_recv - table["t_intended_ns"].to_numpy()) / 1e6
    window_s = (t_recv.max() - t_recv.min()) / 1e9 if len(t_recv) > 1 else None
    figures: dict[str, Any] = {
        "deliveries": int(len(t_recv)),
        "expected": (messages - 50) * SUBSCRIBERS,
        "delivered_per_s": None if not window_s else float(len(t_recv) / window_s),
        "latency_p50_ms": pct(latency_ms, 50), "latency_p99_ms": pct(latency_ms, 99),
        "wall_s": round(wall, 1), "load_average": load_average()}
    if (budget := metadata.get("cpu_budget")) is not None:
        (held,) = budget["brokers"].values()
        figures.update(mechanism=budget["mechanism"], periods=held["periods"],
                       throttled_periods=held["throttled_periods"],
                       throttled_share=(held["throttled_periods"] / held["periods"]
                                        if held["periods"] else None),
                       throttled_s=held["throttled_s"])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.05, 0.02])
    parser.add_argument("--rate-hz", type=float, default=500.0)
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args()

    baseline = one_run(None, args.rate_hz, args.messages)
    print(f"no budget: {baseline}", flush=True)
    ratios: dict[str, float | None] = {}
    figures: dict[str, Any] = {"no_budget": baseline}
    for cores in args.budgets:
        measured = one_run(cores, args.rate_hz, args.messages)
        print(f"{cores} cores: {measured}", flush=True)
        figures[f"cores_{cores}"] = measured
        for key in ("delivered_per_s", "latency_p50_ms", "latency_p99_ms"):
            ratios[f"{key}_at_{cores}"] = ratio(measured[key], baseline[key])
    figures["offered_per_s"] = args.rate_hz * SUBSCRIBERS
    emit("cpu_budget", "the same Mosquitto run without broker.cpu_limit", ratios, figures)


if __name__ == "__main__":
    main()
