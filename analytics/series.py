"""Series for report plots: latency CDFs per sweep point, latency over time per run.

These are drawn, not tabulated, so they are kept apart from the figures of
:mod:`mqttbed.analytics.figures`: a CDF as 101 quantiles (0 %, 1 %, ... 100 %) of the
latency of every unique, non-warm-up delivery of a point's done runs, and a run's
latency over time as the median, p99 and count per time bin of the send time, counted
from the run's first measured publish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mqttbed.analytics.figures import (
    POINT_LEVEL,
    RUN_LEVEL,
    Levels,
    PublisherStreams,
    _per_level,
    stream_of,
)
from mqttbed.analytics.passes import SKETCH_LEVELS, Aggregate, GroupKey, figure_rows
from mqttbed.core.events import EventKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CDF_LEVELS = [i / 100 for i in range(101)]
# The CDF is every CDF_STEP-th quantile of the sketch (the same doubles: i/100 == 10i/1000).
CDF_STEP = (len(SKETCH_LEVELS) - 1) // (len(CDF_LEVELS) - 1)
TIMELINE_BIN_S = 0.1
_KEY = ("run_id", "publisher", "seq", "receiver")


def _unique_latencies(events: DataFrame) -> DataFrame:
    """run_id, publisher, t_send_ns (offset-corrected), latency_us of each first arrival."""
    from pyspark.sql import functions as F

    kind = F.col("kind")
    measured = events.where(~F.col("warmup"))
    sent = (measured.where(kind == EventKind.PUBLISH.value)
            .groupBy("run_id", "publisher", "seq")
            .agg(F.min(F.col("t_pub_ns") - F.col("clock_offset_ns")).alias("t_send_ns")))
    first = (measured.where(kind == EventKind.DELIVERY.value)
             .groupBy(*_KEY)
             .agg(F.min(F.struct(F.col("t_recv_ns") - F.col("clock_offset_ns"),
                                 F.col("t_pub_ns"))).alias("d"))
             .select(*_KEY, F.col("d.col1").alias("arrival_ns"),
                     F.col("d.t_pub_ns").alias("payload_t_pub_ns")))
    joined = first.join(sent, ["run_id", "publisher", "seq"], "left")
    t_send = F.coalesce(F.col("t_send_ns"), F.col("payload_t_pub_ns"))
    return joined.select("run_id", "publisher", t_send.alias("t_send_ns"),
                         ((F.col("arrival_ns") - t_send) / 1000.0).alias("latency_us"))


def series_rows(events: DataFrame, levels: Levels,
                streams: PublisherStreams | None = None) -> list[DataFrame]:
    """The figure rows of the series: each point's latencies of its done runs (whole, and
    per stream of a message mix with ``streams``) for the CDFs, and each run's latencies
    by time bin of the send time for the timeline.

    ``levels`` are the stats' levels: a point's rows are those of its done runs.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    latencies = _unique_latencies(events)
    pooled = latencies.withColumn("stream", F.lit(None).cast("string"))
    if streams:
        pooled = pooled.unionByName(latencies.withColumn("stream", stream_of(streams))
                                    .where(F.col("stream").isNotNull()))
    t0 = F.min("t_send_ns").over(Window.partitionBy("run_id"))
    bins = latencies.withColumn("bin", F.floor((F.col("t_send_ns") - t0)
                                               / (TIMELINE_BIN_S * 1e9)).cast("int"))
    return [figure_rows(_per_level(pooled, levels, only=POINT_LEVEL), "cdf", sub="stream",
                        figure=F.lit("latency_us"), value="latency_us", full=True),
            figure_rows(bins, "timeline", level=F.lit(RUN_LEVEL), key="run_id", sub="bin",
                        figure=F.lit("latency_us"), value="latency_us")]


def read_series(groups: dict[GroupKey, Aggregate]) -> dict[str, Any]:
    """``{"latency_cdf_us": {point: [101 quantiles]}, "stream_latency_cdf_us": {point:
    {stream: [...]}}, "latency_timeline": {run: ...}}`` from the aggregated
    :func:`series_rows`."""
    cdfs: dict[str, list[float]] = {}
    by_stream: dict[str, dict[str, list[float]]] = {}
    bins: dict[str, list[tuple[int, Aggregate]]] = {}
    for (family, _, key, sub, _), found in groups.items():
        if family == "cdf" and found.quantiles is not None:
            cdf = found.quantiles[::CDF_STEP]
            if sub is None:
                cdfs[key] = cdf
            else:
                by_stream.setdefault(key, {})[sub] = cdf
        elif family == "timeline":
            assert sub is not None  # a timeline row's sub is its time bin
            bins.setdefault(key, []).append((int(sub), found))
    timeline: dict[str, dict[str, list[float | None]]] = {}
    for run_id in sorted(bins):
        series = timeline.setdefault(run_id, {"t_s": [], "p50_us": [], "p99_us": [],
                                              "deliveries": []})
        for number, found in sorted(bins[run_id], key=lambda b: b[0]):
            series["t_s"].append(round(number * TIMELINE_BIN_S, 6))
            series["p50_us"].append(found.percentiles["p50"])
            series["p99_us"].append(found.percentiles["p99"])
            series["deliveries"].append(found.rows)
    return {"latency_cdf_us": cdfs,
            "stream_latency_cdf_us": {point: dict(sorted(streams.items()))
                                      for point, streams in sorted(by_stream.items())},
            "latency_timeline": timeline}
