"""Series for report plots: latency CDFs per sweep point, latency over time per run.

These are drawn, not tabulated: a CDF as 101 quantiles (0 %, 1 %, ... 100 %) of the
latency of every unique, non-warm-up delivery of a point's done runs (read from the
sketch of the point's ``latency_us`` figure of :mod:`mqttbed.analytics.figures`), and a
run's latency over time as the median, p99 and count per time bin of the send time,
counted from the run's first measured publish.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mqttbed.analytics.figures import CDF_FIGURE, POINT_LEVEL, RUN_LEVEL
from mqttbed.analytics.passes import (
    SKETCH_LEVELS,
    Aggregate,
    GroupKey,
    figure_rows,
    literal_map,
    lookup,
)
from mqttbed.core.events import EventKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CDF_LEVELS = [i / 100 for i in range(101)]
# The CDF is every CDF_STEP-th quantile of the sketch (the same doubles: i/100 == 10i/1000).
CDF_STEP = (len(SKETCH_LEVELS) - 1) // (len(CDF_LEVELS) - 1)
TIMELINE_BIN_S = 0.1


def start_rows(events: DataFrame) -> DataFrame:
    """Per run, ``t0_ns``: when its timeline starts. The send time of its first measured
    publish (offset-corrected, as a delivery's departure), or in a run without publish
    records the earliest payload timestamp of its deliveries (their departure then).
    Small; collected before the figure pass."""
    from pyspark.sql import functions as F

    kind, measured = F.col("kind"), events.where(~F.col("warmup"))
    return (measured.groupBy("run_id")
            .agg(F.min(F.when(kind == EventKind.PUBLISH.value,
                              F.col("t_pub_ns") - F.col("clock_offset_ns"))).alias("sent"),
                 F.min(F.when(kind == EventKind.DELIVERY.value, F.col("t_pub_ns")))
                 .alias("payload"))
            .select("run_id", F.coalesce("sent", "payload").alias("t0_ns")))


def series_rows(deliveries: DataFrame, starts: Sequence[dict[str, Any]],
                run_ids: Sequence[str] | None = None) -> list[DataFrame]:
    """The figure rows of the series that are not figures already: each run's latencies
    by time bin of the send time (from the run's ``t0_ns``, the collected
    :func:`start_rows`), for the timeline; of ``run_ids`` only, if given (the others'
    come from their partials, :mod:`mqttbed.analytics.partials`).

    ``deliveries`` are the :func:`~mqttbed.analytics.figures.delivery_rows`. A point's
    CDF (whole, and per stream of a message mix) is the sketch of its ``latency_us``
    distribution (:data:`~mqttbed.analytics.figures.CDF_FIGURE`): the same
    deliveries and values as the point's latency figures, by construction.
    """
    from pyspark.sql import functions as F

    # (a run with no publish and no delivery has no start, and nothing to bin)
    t0 = lookup(literal_map({r["run_id"]: r["t0_ns"] for r in starts
                             if r["t0_ns"] is not None}), F.col("run_id"),
                "bigint")
    received = deliveries.where("received")
    if run_ids is not None:
        received = received.where(F.col("run_id").isin(list(run_ids)))
    bins = (received
            .withColumn("bin", F.floor((F.col("departure_ns") - t0)
                                       / (TIMELINE_BIN_S * 1e9)).cast("int")))
    return [figure_rows(bins, "timeline", level=F.lit(RUN_LEVEL), key="run_id", sub="bin",
                        figure=F.lit("latency_us"), value="latency_us")]


def read_series(groups: dict[GroupKey, Aggregate]) -> dict[str, Any]:
    """``{"latency_cdf_us": {point: [101 quantiles]}, "stream_latency_cdf_us": {point:
    {stream: [...]}}, "latency_timeline": {run: ...}}`` from the aggregated
    :func:`series_rows`."""
    cdfs: dict[str, list[float]] = {}
    by_stream: dict[str, dict[str, list[float]]] = {}
    bins: dict[str, list[tuple[int, Aggregate]]] = {}
    for (family, level, key, sub, figure), found in groups.items():
        if (family == "distribution" and level == POINT_LEVEL and figure == CDF_FIGURE
                and found.quantiles is not None):
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
