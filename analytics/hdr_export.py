"""Each sweep point's latency and sync spread as HdrHistogram logs (for the dataset export).

The values are the ones the results pool (:func:`mqttbed.analytics.figures.
distribution_value_rows` over the events as :func:`mqttbed.analytics.stats.
software_events` gives them): ``latency_us`` per unique delivery, ``sync_spread_us`` per
message received by two receivers or more, of the point's done runs, warm-up excluded.

Choices, and why:

- **Unit: integer nanoseconds.** HdrHistogram records integers; the figures are
  differences of nanosecond timestamps, so nanoseconds keep every value exact (the
  results' microseconds are those divided by 1000). ``Interval_Max`` is in milliseconds,
  as Java's ``HistogramLogProcessor`` assumes by default (``-outputValueUnitRatio 1e6``).
- **Significant digits: 3.** Each value is kept to 0.1 % of its size (HdrHistogram's
  stated precision); the range adapts to the largest value of the log.
- **One log per point and figure, one interval per run.** A tool that sums a log's
  intervals (``HistogramLogProcessor``'s accumulated distribution, the Python reader's
  ``add_next_interval_histogram``) gets the point's pooled distribution, the one whose
  percentiles ``stats.json`` reports; each interval is one repetition, at the run's
  wall-clock start and of its wall-clock length, so that a drift between repetitions stays
  visible. Intervals are untagged (the Java processor reads only untagged intervals unless
  asked for a tag); a comment line before each names its run.
- **Negative values** (a latency whose clock offsets were estimated across machines can
  come out below zero) cannot be recorded: they are left out and counted, in the log's
  head and in the export's manifest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mqttbed.analytics.hdr_log import HistogramLayout, HistogramLog, Interval

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from mqttbed.analytics.stats import RunInfo

SIGNIFICANT_DIGITS = 3
VALUE_UNIT = "ns"
NS_PER_US = 1000
# Interval_Max: nanoseconds shown as milliseconds, the Java tools' default ratio.
MAX_VALUE_UNIT_RATIO = 1e6
# The figures exported, and the name each has in a log's file name.
HDR_FIGURES = {"latency_us": "latency", "sync_spread_us": "sync_spread"}
_WHAT = {
    "latency_us": "latency, t_recv - t_pub per unique delivery (offset-corrected)",
    "sync_spread_us": "sync spread, max - min arrival over the receivers of each message "
                      "received by two or more (offset-corrected)",
}


@dataclass(frozen=True)
class RunWindow:
    """A done run as a log shows it: its point, repetition and wall-clock span."""

    run_id: str
    point_index: int
    repetition: int
    params: dict[str, Any]
    start_s: float    # seconds since the epoch
    length_s: float


@dataclass(frozen=True)
class PointLog:
    """One point's HdrHistogram log of one figure, and what it holds."""

    point_index: int
    figure: str
    file_name: str
    text: str
    run_ids: tuple[str, ...]
    count: int
    values_below_zero: int

    def facts(self) -> dict[str, Any]:
        """What an export's manifest says of this log."""
        return {"file": self.file_name, "point_index": self.point_index,
                "figure": self.figure, "unit": VALUE_UNIT,
                "significant_digits": SIGNIFICANT_DIGITS, "intervals": "one per run",
                "run_ids": list(self.run_ids), "count": self.count,
                "values_below_zero": self.values_below_zero}


def run_values(spark: SparkSession, events_path: Path, campaign_id: str,
               runs: Sequence[RunInfo]) -> dict[tuple[str, str], np.ndarray]:
    """(run_id, figure) -> the run's values of each of HDR_FIGURES, in integer ns.

    Reads only ``runs`` (pass the done ones: the points pool only those); one Spark job.
    """
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    from mqttbed.analytics.datasets import EVENTS_DDL, read_runs_held
    from mqttbed.analytics.figures import (
        delivery_rows,
        distribution_value_rows,
        subscription_rows,
    )
    from mqttbed.analytics.passes import analysis_conf
    from mqttbed.analytics.stats import software_events

    if not runs:
        return {}
    # held as the analysis holds them: two actions read the events
    stored = read_runs_held(spark, events_path, campaign_id, [run.run_id for run in runs],
                            EVENTS_DDL)
    try:
        with analysis_conf(spark):
            events = software_events(stored, runs)
            subscriptions = [row.asDict() for row in subscription_rows(events).collect()]
            deliveries = delivery_rows(events, subscriptions)
            values = (
                distribution_value_rows(events, deliveries, subscriptions)
                .where(F.col("figure").isin(list(HDR_FIGURES)) & F.col("value").isNotNull())
                # us back to the integer ns they were computed from (exact below 2**53/1000)
                .select("run_id", "figure",
                        F.round(F.col("value") * NS_PER_US).cast("long").alias("value_ns"))
                .toArrow())
    finally:
        stored.unpersist()
    found: dict[tuple[str, str], np.ndarray] = {}
    for run in runs:
        for figure in HDR_FIGURES:
            chosen = (pc.field("run_id") == run.run_id) & (pc.field("figure") == figure)
            found[(run.run_id, figure)] = (values.filter(chosen)["value_ns"]
                                           .to_numpy().astype(np.int64))
    return found


def point_logs(values: dict[tuple[str, str], np.ndarray], windows: Sequence[RunWindow],
               heading: Sequence[str] = ()) -> list[PointLog]:
    """The logs of every point and figure of the done runs ``windows``; a point whose
    runs have no value of a figure (one receiver: no spread) has no log of it.

    ``values`` are :func:`run_values`; ``heading`` comment lines open every log.
    """
    by_point: dict[int, list[RunWindow]] = {}
    for window in sorted(windows, key=lambda w: (w.start_s, w.run_id)):
        by_point.setdefault(window.point_index, []).append(window)
    logs = []
    for point_index, point_runs in sorted(by_point.items()):
        for figure, name in HDR_FIGURES.items():
            log = _point_log(point_index, figure, f"point-{point_index:03d}-{name}.hlog",
                             point_runs, values, heading)
            if log is not None:
                logs.append(log)
    return logs


def _point_log(point_index: int, figure: str, file_name: str, runs: list[RunWindow],
               values: dict[tuple[str, str], np.ndarray], heading: Sequence[str]
               ) -> PointLog | None:
    per_run = {run.run_id: values.get((run.run_id, figure), np.zeros(0, np.int64))
               for run in runs}
    below_zero = sum(int((v < 0).sum()) for v in per_run.values())
    kept = {run_id: v[v >= 0] for run_id, v in per_run.items()}
    count = sum(v.size for v in kept.values())
    if count == 0:
        return None
    highest = max(2, max(int(v.max()) for v in kept.values() if v.size))
    intervals = [Interval(start_s=run.start_s, length_s=run.length_s, values=kept[run.run_id],
                          comments=(f"run {run.run_id}, repetition {run.repetition}: "
                                    f"{kept[run.run_id].size} values",))
                 for run in runs]
    comments = (*heading,
                f"sweep point {point_index}: {_params(runs[0].params)}",
                f"figure {figure}: {_WHAT[figure]}",
                f"values in nanoseconds ({VALUE_UNIT}); Interval_Max in milliseconds; "
                f"{SIGNIFICANT_DIGITS} significant digits (0.1 %)",
                f"one interval per done run of the point ({len(runs)}), at its wall-clock "
                f"start and of its length; their sum is the point's pooled distribution",
                f"values below zero, left out: {below_zero}")
    text = HistogramLog(intervals, HistogramLayout(SIGNIFICANT_DIGITS, 1, highest),
                        comments=comments, max_value_unit_ratio=MAX_VALUE_UNIT_RATIO).text()
    return PointLog(point_index=point_index, figure=figure, file_name=file_name, text=text,
                    run_ids=tuple(per_run), count=count, values_below_zero=below_zero)


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(params.items())) or "(none)"
