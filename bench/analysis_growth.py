"""Analysis growth: the same stats job on ten times the rows (issue 24: 10 M -> 100 M rows,
time grows <= 12x, driver memory <= 2 GB).

Two datasets generated and compacted as ``bench/analysis.py`` does (one sweep point, 5
runs, 100 subscribers, 1 kHz): ``--messages`` (default 100,000 messages: 10 M delivery
rows) and ten times that (100 M rows). One Spark session with mqttbed's settings
(``MQTTBED_SPARK_*``; local mode, so the driver's JVM runs every task):

1. a first call on the small set (JIT warm-up; timed, not the baseline);
2. a warm call on the small set: the baseline;
3. one call on the large set, with the JVM as warm as in 2.

Each call is ``compute_campaign_stats`` over every run, timed with its breakdown (the
actions, jobs, stages, tasks) as in ``bench/analysis.py``. Memory of call 3: the Spark
JVM's peak resident set (``VmHWM`` of the java process, reset before the call through
``/proc/PID/clear_refs``; heap, off-heap and the JVM's own), its heap limit
(``spark.driver.memory``, which the JVM cannot exceed without failing the job), and the
Python driver's peak resident set over the same call (reset the same way: the data's
generation, in this process, peaks higher). Both sets' counts are checked for what must
hold whatever the engine: every measured message counted as sent and expected at every
subscriber (the figure-by-figure check against DuckDB is ``bench/analysis.py``'s).

    .venv/bin/python bench/analysis_growth.py [--messages 100000] [--factor 10]

At the default size it takes about an hour of both cores and ~15 GB of scratch disk
(events, the held per-delivery rows, shuffle spills): run it alone on the machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import analysis as base
from _common import emit

from mqttbed.analytics.spark import get_spark
from mqttbed.controller.compaction import compact_run
from mqttbed.controller.storage import DataLayout
from mqttbed.core.settings import Settings

GOAL_GROWTH = 12.0           # time on 10x the rows over time on 1x (issue 24)


def prepare(root: Path, workload: base.Workload) -> tuple[DataLayout, list[base.RunInfo], float]:
    """Generate and compact ``workload`` under ``root``; return its layout, runs and seconds."""
    layout = DataLayout(root.resolve())
    start = time.perf_counter()
    runs = base.generate(layout, workload)
    for run in runs:
        compact_run(layout, base.CAMPAIGN_ID, run.run_id)
    return layout, runs, time.perf_counter() - start


def spark_jvm_pid() -> int:
    """The Spark JVM this process started (the one java child of this process)."""
    found = subprocess.run(["pgrep", "-P", str(os.getpid()), "java"], capture_output=True,
                           text=True, check=False).stdout.split()
    if len(found) != 1:
        raise SystemExit(f"expected one java child of pid {os.getpid()}, found {found}")
    return int(found[0])


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"/proc/{pid}/status has no VmHWM")


def reset_peak_rss(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def count_errors(name: str, document: dict[str, Any], workload: base.Workload
                 ) -> list[str]:
    """What the point's counts must be whatever the engine: every measured message sent
    (each run's messages but its warm-up) and expected at every subscriber."""
    point = base.spark_document(document)["points"]["0"]
    sent = workload.runs * (workload.messages_per_run - workload.warmup)
    wanted = {"messages_sent": sent, "deliveries_expected": sent * workload.subscribers}
    return [f"{name} set: {figure} {point.get(figure)!r}, not {value:,}"
            for figure, value in wanted.items() if point.get(figure) != value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000,
                        help="messages of the small set's point, split over its runs")
    parser.add_argument("--factor", type=int, default=10, help="the large set's multiple")
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    small = base.Workload(args.messages, args.subscribers, args.runs)
    large = base.Workload(args.messages * args.factor, args.subscribers, args.runs)
    if small.messages_per_run < 2 or args.subscribers < 2 or args.factor < 2:
        parser.error("need at least 2 messages per run, 2 subscribers and --factor 2")
    with tempfile.TemporaryDirectory(prefix="mqttbed-growth-") as scratch:
        small_layout, small_runs, small_gen_s = prepare(Path(scratch) / "small", small)
        large_layout, large_runs, large_gen_s = prepare(Path(scratch) / "large", large)
        print(f"small: {base.describe_data(small_layout)}; generated in {small_gen_s:.1f} s")
        print(f"large: {base.describe_data(large_layout)}; generated in {large_gen_s:.1f} s",
              flush=True)
        spark = get_spark()
        jvm = spark_jvm_pid()
        first, _ = base.spark_call(spark, small_layout, small_runs, "growth-first")
        print(f"small set, first call (JIT warm-up): {first.seconds:.2f} s", flush=True)
        warm, small_doc = base.spark_call(spark, small_layout, small_runs, "growth-small")
        print(f"small set, warm call: {warm.seconds:.2f} s", flush=True)
        small_jvm_peak = peak_rss_bytes(jvm)
        reset_peak_rss(jvm)
        reset_peak_rss(os.getpid())   # the numpy generation's peak is not the analysis's
        big, large_doc = base.spark_call(spark, large_layout, large_runs, "growth-large")
        large_jvm_peak, python_peak = peak_rss_bytes(jvm), peak_rss_bytes(os.getpid())
        print(f"large set, warm JVM: {big.seconds:.2f} s", flush=True)
    settings = Settings.load()
    growth = big.seconds / warm.seconds
    wrong = (count_errors("small", small_doc, small)
             + count_errors("large", large_doc, large))
    print(f"\nSpark {settings.spark_master}, driver memory {settings.spark_driver_memory}, "
          f"{os.cpu_count()} cores")
    for title, call in (("small set, warm", warm), (f"large set ({args.factor}x)", big)):
        base.print_breakdown(title, [call])
    print(f"\ntime: {warm.seconds:.1f} s -> {big.seconds:.1f} s, {growth:.2f}x for "
          f"{args.factor}x the rows (goal <= {GOAL_GROWTH:g}x: "
          f"{'met' if growth <= GOAL_GROWTH else 'not met'})")
    print(f"Spark JVM peak resident set: small set {small_jvm_peak / 2**30:.2f} GiB, large "
          f"set {large_jvm_peak / 2**30:.2f} GiB (heap limit {settings.spark_driver_memory});"
          f" Python driver peak during the large call {python_peak / 2**30:.2f} GiB")
    print(f"counts (messages sent, deliveries expected): {wrong or 'as generated'}")
    emit("analysis growth, 10x rows", "the same job on 1x rows, warm, same session",
         {"time": growth},
         {"small_warm_s": round(warm.seconds, 2), "large_s": round(big.seconds, 2),
          "small_first_s": round(first.seconds, 2),
          "jvm_peak_rss_large_bytes": large_jvm_peak, "python_peak_rss_bytes": python_peak,
          "driver_memory": settings.spark_driver_memory,
          "large_jobs_stages_tasks": [big.jobs, big.stages, big.tasks],
          "count_mismatches": len(wrong)})
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
