"""Series for report plots: latency CDFs per sweep point, latency over time per run.

These are drawn, not tabulated, so they are kept apart from the figures of
:mod:`mqttbed.analytics.figures`: a CDF as 101 quantiles (0 %, 1 %, ... 100 %) of the
latency of every unique, non-warm-up delivery of a point's done runs, and a run's
latency over time as the median, p99 and count per time bin of the send time, counted
from the run's first measured publish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mqttbed.core.events import EventKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CDF_LEVELS = [i / 100 for i in range(101)]
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


def compute_series(events: DataFrame, point_of_done_run: dict[str, int],
                   streams: DataFrame | None = None) -> dict[str, Any]:
    """Return ``{"latency_cdf_us": {point: [101 quantiles]}, "latency_timeline": {run: ...}}``,
    and with ``streams`` (run_id, publisher, stream of a message mix) each point's CDF per
    stream under ``stream_latency_cdf_us``.

    ``point_of_done_run`` maps each done run to its point index; the CDF pools those.
    """
    from pyspark.sql import functions as F

    latencies = _unique_latencies(events).cache()
    try:
        points = events.sparkSession.createDataFrame(
            list(point_of_done_run.items()) or [("", -1)], "run_id string, point int")
        pooled = latencies.join(F.broadcast(points), "run_id")
        cdf_rows = (pooled.groupBy("point")
                    .agg(F.percentile("latency_us", CDF_LEVELS).alias("q")).collect())
        stream_rows = [] if streams is None else (
            pooled.join(F.broadcast(streams), ["run_id", "publisher"])
            .groupBy("point", "stream")
            .agg(F.percentile("latency_us", CDF_LEVELS).alias("q")).collect())
        start = latencies.groupBy("run_id").agg(F.min("t_send_ns").alias("t0"))
        bins = (latencies.join(start, "run_id")
                .withColumn("bin", F.floor((F.col("t_send_ns") - F.col("t0"))
                                           / (TIMELINE_BIN_S * 1e9)).cast("int"))
                .groupBy("run_id", "bin")
                .agg(F.percentile("latency_us", [0.5, 0.99]).alias("q"),
                     F.count("*").alias("n"))
                .orderBy("run_id", "bin").collect())
    finally:
        latencies.unpersist()
    timeline: dict[str, dict[str, list[float]]] = {}
    for row in bins:
        series = timeline.setdefault(row["run_id"], {"t_s": [], "p50_us": [], "p99_us": [],
                                                     "deliveries": []})
        series["t_s"].append(round(row["bin"] * TIMELINE_BIN_S, 6))
        series["p50_us"].append(float(row["q"][0]))
        series["p99_us"].append(float(row["q"][1]))
        series["deliveries"].append(int(row["n"]))
    by_stream: dict[str, dict[str, list[float]]] = {}
    for row in sorted(stream_rows, key=lambda r: (r["point"], r["stream"])):
        by_stream.setdefault(str(row["point"]), {})[row["stream"]] = [float(v) for v in row["q"]]
    return {"latency_cdf_us": {str(r["point"]): [float(v) for v in r["q"]] for r in cdf_rows},
            "stream_latency_cdf_us": by_stream, "latency_timeline": timeline}
