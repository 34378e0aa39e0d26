"""What the HdrHistogram export costs, and that it agrees with the results at scale.

One sweep point generated as ``bench/analysis.py`` generates it (offset clocks, losses,
late duplicates, lognormal latencies around 150 us), analysed with
``compute_campaign_stats``, then exported as HdrHistogram logs
(:mod:`mqttbed.analytics.hdr_export`): the Spark pass over the values and the encoding are
timed apart, and the logs are read back with the ``hdrhistogram`` package and held to the
results: count equal; p50, p99 and max within 0.1 % (HdrHistogram's precision at 3
digits; with this many values the ranks around a percentile are closer than that).
Exits 1 on a disagreement.

    .venv/bin/python bench/hdr_export.py [--messages 20000] [--subscribers 50] [--runs 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import emit, ratio  # noqa: E402
from analysis import CAMPAIGN_ID, Workload, generate  # noqa: E402
from hdrh.histogram import HdrHistogram  # noqa: E402

from mqttbed.analytics.hdr_export import RunWindow, point_logs, run_values  # noqa: E402
from mqttbed.analytics.spark import get_spark, stop_spark  # noqa: E402
from mqttbed.analytics.stats import compute_campaign_stats  # noqa: E402
from mqttbed.controller.storage import DataLayout  # noqa: E402

REL_TOL = 1e-3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--subscribers", type=int, default=50)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    workload = Workload(args.messages, args.subscribers, args.runs)
    failures = []
    with tempfile.TemporaryDirectory(prefix="mqttbed-hdr-bench-") as root:
        layout = DataLayout(Path(root))
        runs = generate(layout, workload)
        spark = get_spark()
        try:
            started = time.perf_counter()
            stats = compute_campaign_stats(
                spark, events_path=layout.events, samples_path=layout.broker_samples,
                campaign={"id": CAMPAIGN_ID}, runs=runs)
            analysis_s = time.perf_counter() - started
            started = time.perf_counter()
            values = run_values(spark, layout.events, CAMPAIGN_ID, runs)
            values_s = time.perf_counter() - started
        finally:
            stop_spark()
        started = time.perf_counter()
        windows = [RunWindow(run.run_id, run.point_index, run.repetition, run.params,
                             1.8e9 + 100 * i, 60.0) for i, run in enumerate(runs)]
        logs = point_logs(values, windows)
        encode_s = time.perf_counter() - started
    point = stats.points[0]
    print(f"{sum(v.size for v in values.values()):,} values of {len(runs)} runs; analysis "
          f"{analysis_s:.1f} s; export: Spark pass {values_s:.1f} s, encoding "
          f"{encode_s:.2f} s, {sum(len(log.text) for log in logs):,} bytes of logs")
    for log in logs:
        pooled = HdrHistogram(1, 10**13, 3)
        for line in log.text.splitlines():
            if not line.startswith(("#", '"')):
                pooled.decode_and_add(line.split(",")[3])
        figure = point.latency_us if log.figure == "latency_us" else point.sync_spread_us
        expected = {"count": figure.count, "p50": figure.p50, "p99": figure.p99,
                    "max": figure.max}
        found = {"count": pooled.get_total_count(),
                 "p50": pooled.get_value_at_percentile(50) / 1000,
                 "p99": pooled.get_value_at_percentile(99) / 1000,
                 "max": pooled.get_max_value() / 1000}
        print(f"  {log.figure}: stats.json {expected}\n  {' ' * len(log.figure)}  hdr log    "
              f"{ {k: round(v, 3) for k, v in found.items()} }")
        if found["count"] != expected["count"]:
            failures.append(f"{log.figure} count {found['count']} != {expected['count']}")
        for name in ("p50", "p99", "max"):
            want = expected[name]
            if want is None or abs(found[name] - want) > REL_TOL * want:
                failures.append(f"{log.figure} {name} {found[name]} vs {want}")
    for failure in failures:
        print("DISAGREES:", failure)
    emit("HdrHistogram export (issue 25)", "the campaign's analysis (compute_campaign_stats)",
         {"export_s": ratio(values_s + encode_s, analysis_s)},
         {"values": sum(v.size for v in values.values()), "runs": len(runs),
          "analysis_s": round(analysis_s, 2), "spark_pass_s": round(values_s, 2),
          "encoding_s": round(encode_s, 3), "log_bytes": sum(len(log.text) for log in logs),
          "disagreements": failures})
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
