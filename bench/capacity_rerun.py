"""Issue 25's by-hand check: a capacity search, then its found rate and 1.2x it re-run.

One controller in this process (fresh data dir): a capacity search on amqtt (one Python
process, no CPU budget: it saturates on its own core while the native agents keep the
rate), 1 -> 10 subscribers, QoS 0, SLO ``latency_us.p50 <= 20000`` and ``lost == 0``,
probes of 15,000 messages, two confirmations, resolution 0.15; then a second, plain
campaign (no search) over the found rate and 1.2x it, ``--repeat`` runs each,
interleaved, each run judged by the search's own ``judge`` on its ``stats.json`` figures.

The interval holds by hand when every run at the found rate is accepted and every run at
1.2x is rejected. Near capacity that is a matter of chance on a shared 2-core machine:
the found rate is the edge by construction (amqtt at ~95 % of a core), and the agents'
own CPU moves that edge from run to run (clean-clone CI, 2026-11-27: one search rejected
3,084 Hz once and found 2,828 Hz, and 1.2x that, 3,393.6 Hz, passed with p50 11.8 ms,
where earlier searches had found 3,084 Hz and 3,700 Hz failed 4 of 4). So this is a bench
(measured, printed) and not a test (asserted); the search's own contract is tested in
tests/test_search_campaign.py.

    .venv/bin/python bench/capacity_rerun.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, load_average  # noqa: E402

SLO = ["latency_us.p50 <= 20000", "lost == 0"]
BOUND_US = 20000.0
SPEC: dict[str, object] = {
    "name": "capacity-amqtt", "broker": {"backend": "amqtt"},
    "workload": {"publishers": 1, "subscribers": 10, "payload_bytes": 64,
                 "warmup_messages": 50, "messages": 15_000},
    "agents": {"count": 2}, "timing": {"drain_s": 1}}
SEARCH = {"parameter": "workload.rate_hz", "low": 2000, "high": 20_000, "slo": SLO,
          "resolution": 0.15, "confirmations": 2, "max_probes": 14}


def main() -> int:
    from mqttbed.analytics.results import figure_at
    from mqttbed.campaigns.search import Verdict, judge, parse_slo_term
    from mqttbed.campaigns.spec import parse_spec
    from mqttbed.controller.analysis import load_results
    from mqttbed.controller.controller import create_controller
    from mqttbed.core.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs at each re-run rate")
    args = parser.parse_args()
    terms = [parse_slo_term(text) for text in SLO]
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="mqttbed-bench-capacity-") as tmp, \
            create_controller(Settings(data_dir=Path(tmp) / "data")) as controller:
        searched = controller.engine.create_campaign(parse_spec({**SPEC, "search": SEARCH}))
        status = controller.run_campaign(searched)
        found = load_results(controller.layout, searched)
        if status != "done" or found is None or found.search is None \
                or found.search.capacity is None:
            print(f"search ended {status}: no capacity to re-run")
            return 1
        search = found.search
        capacity = search.capacity
        assert capacity is not None
        higher = round(capacity * 1.2, 1)
        print(f"search: {search.conclusion}")
        print(f"  probes: {[(p.value, p.verdict) for p in search.probes]}")
        again = controller.engine.create_campaign(parse_spec(
            {**SPEC, "name": "capacity-amqtt-by-hand", "repetitions": args.repeat,
             "sweep": {"workload.rate_hz": [capacity, higher]}}))
        controller.run_campaign(again)
        rerun = load_results(controller.layout, again)
    assert rerun is not None
    by_rate: dict[float, list[tuple[str, float | None]]] = {capacity: [], higher: []}
    for run in sorted(rerun.runs, key=lambda r: (r.repetition, r.point_index)):
        figures = {t.figure: figure_at(run, t.figure) for t in terms}
        kept = run.generator.rate_kept if run.generator is not None else None
        verdict, _ = judge(terms, figures, kept)
        by_rate[run.params["workload.rate_hz"]].append((verdict.value, run.latency_us.p50))
    for rate, outcomes in by_rate.items():
        print(f"  by hand at {rate:8.1f} Hz: "
              + ", ".join(f"{v} (p50 {p:,.0f} us)" if p is not None else v
                          for v, p in outcomes))
    held = (all(v == Verdict.ACCEPTED.value for v, _ in by_rate[capacity])
            and all(v == Verdict.REJECTED.value for v, _ in by_rate[higher]))
    print(f"the interval {search.interval} {'holds' if held else 'does not hold'} by hand")

    found_p50 = [p for _, p in by_rate[capacity] if p is not None]
    higher_p50 = [p for _, p in by_rate[higher] if p is not None]
    emit("issue 25: capacity search re-run by hand (amqtt)", "the SLO bound, p50 <= 20 ms",
         {"found_rate_p50_max_vs_bound": max(found_p50) / BOUND_US if found_p50 else None,
          "rate_1_2x_p50_min_vs_bound": min(higher_p50) / BOUND_US if higher_p50 else None},
         {"capacity_hz": capacity, "interval": list(search.interval),
          "probes": len(search.probes), "by_hand": {str(k): v for k, v in by_rate.items()},
          "interval_holds": held, "load_average_before": load})
    return 0


if __name__ == "__main__":
    sys.exit(main())
