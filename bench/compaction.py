"""Run compaction: what it costs per run, and what Spark gains reading its result.

The events of one sweep point are generated as ``bench/analysis.py`` generates them (its
``generate``: mqttbed's own chunk writer, chunks of ``Assignment.chunk_events`` events,
one publisher agent and one agent per 25 subscribers), then:

- Spark over the chunk files (the baseline): a bare scan of the event columns the stats
  read, and one pass grouped by message identity (run, publisher, seq: deliveries per
  message, as the delivery and spread figures group), each the median of ``--repeat``
  warm calls after one warm-up call;
- each run compacted by ``controller.compaction.compact_run`` (time per run: read,
  checksum, sort, write, fsync, read back and verify, swap, remove the chunks);
- the same Spark passes over the compacted files.

One session for both, so JVM start-up is not in either figure; the OS page cache is warm
for both (each read once before timing).

    .venv/bin/python bench/compaction.py [--messages 20000] [--subscribers 100] [--runs 5]
                                         [--repeat 3]
    .venv/bin/python bench/compaction.py --messages 2000 --subscribers 10   # smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402
from analysis import CAMPAIGN_ID, Workload, generate  # noqa: E402

from mqttbed.analytics.datasets import EVENTS_DDL, read_runs  # noqa: E402
from mqttbed.analytics.spark import get_spark  # noqa: E402
from mqttbed.controller.compaction import compact_run, data_files  # noqa: E402
from mqttbed.controller.storage import DataLayout  # noqa: E402


def _timed(action: Callable[[], Any]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def _median_warm(action: Callable[[], Any], repeat: int) -> float:
    action()   # warm-up: page cache, Spark's file listing cache, JIT
    return statistics.median(_timed(action) for _ in range(repeat))


def spark_passes(spark: Any, layout: DataLayout, run_ids: list[str], repeat: int
                 ) -> dict[str, float]:
    """Median warm seconds of a bare scan and of a pass grouped by message identity."""
    from pyspark.sql import functions as F

    def events() -> Any:
        return read_runs(spark, layout.events, CAMPAIGN_ID, run_ids, EVENTS_DDL)

    def scan() -> None:
        events().agg(F.count("*"), F.max("kind"), F.max("publisher"), F.max("receiver"),
                     F.max("seq"), F.max("t_pub_ns"), F.max("t_recv_ns")).collect()

    def per_message() -> None:
        deliveries = events().where(F.col("kind") == "delivery")
        (deliveries.groupBy("run_id", "publisher", "seq")
         .agg(F.count("*").alias("n"), (F.max("t_recv_ns") - F.min("t_recv_ns")).alias("spread"))
         .agg(F.sum("n"), F.max("spread")).collect())

    return {"scan_s": _median_warm(scan, repeat), "per_message_s": _median_warm(per_message,
                                                                               repeat),
            "read_partitions": events().rdd.getNumPartitions()}


def _stored(layout: DataLayout, run_ids: list[str]) -> tuple[int, int]:
    files = [f for run_id in run_ids
             for f in data_files(layout.run_events(CAMPAIGN_ID, run_id))]
    return len(files), sum(f.stat().st_size for f in files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000,
                        help="messages of the point, split evenly over its runs")
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="warm calls per Spark pass")
    args = parser.parse_args()
    workload = Workload(args.messages, args.subscribers, args.runs)
    if workload.messages_per_run < 2 or args.subscribers < 2 or args.repeat < 1:
        parser.error("need at least 2 messages per run, 2 subscribers and --repeat 1")
    with tempfile.TemporaryDirectory(prefix="mqttbed-bench-compaction-") as scratch:
        layout = DataLayout(Path(scratch).resolve())
        runs = generate(layout, workload)
        run_ids = [run.run_id for run in runs]
        spark = get_spark()
        chunk_files, chunk_bytes = _stored(layout, run_ids)
        chunked = spark_passes(spark, layout, run_ids, args.repeat)
        compactions = [compact_run(layout, CAMPAIGN_ID, run_id) for run_id in run_ids]
        compact_files, compact_bytes = _stored(layout, run_ids)
        compacted = spark_passes(spark, layout, run_ids, args.repeat)
    per_run = [sum(c.seconds for c in done) for done in compactions]
    rows = [sum(c.rows for c in done if c.dataset == "events") for done in compactions]
    print(f"{len(runs)} runs, {sum(rows):,} event rows: {chunk_files} chunk files "
          f"({chunk_bytes / 1e6:.1f} MB) -> {compact_files} files ({compact_bytes / 1e6:.1f} MB)")
    print(f"compaction per run: median {statistics.median(per_run):.2f} s, "
          f"max {max(per_run):.2f} s ({sum(rows) / sum(per_run):,.0f} rows/s)")
    for name in ("scan_s", "per_message_s"):
        print(f"Spark {name[:-2]:12} chunks {chunked[name]:7.2f} s   compacted "
              f"{compacted[name]:7.2f} s   ({compacted[name] / chunked[name]:.2f}x)")
    print(f"Spark read partitions: chunks {chunked['read_partitions']}, compacted "
          f"{compacted['read_partitions']}")
    median_run_s = statistics.median(per_run)
    emit("compaction, Spark over compacted runs", "Spark over the chunk files, same session",
         {"scan": compacted["scan_s"] / chunked["scan_s"],
          "per_message": compacted["per_message_s"] / chunked["per_message_s"],
          # what one run's compaction costs against what it saves on every later pass
          "compaction_per_run_vs_scan_per_run": median_run_s / (chunked["scan_s"] / len(runs))},
         {"runs": len(runs), "event_rows": sum(rows), "chunk_files": chunk_files,
          "compacted_files": compact_files, "chunk_mb": round(chunk_bytes / 1e6, 2),
          "compacted_mb": round(compact_bytes / 1e6, 2),
          "compaction_s_median": round(median_run_s, 3),
          "compaction_s_max": round(max(per_run), 3),
          "spark_chunks": {k: round(v, 3) for k, v in chunked.items()},
          "spark_compacted": {k: round(v, 3) for k, v in compacted.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
