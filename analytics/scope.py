"""Figures from the oscilloscope's rows, and how far the clocks can be trusted.

Scope rows (clock source ``scope``) hold one delay per (acquisition, watched subscriber):
``t_recv_ns`` is the delay from the publisher's GPIO edge to the subscriber's, ``seq`` the
acquisition. Per level they give the latency distribution of the delays, the spread per
acquisition (max - min over the watched subscribers, when two or more were caught) and the
number of acquisitions. They never enter the software figures.

Clock trust: per run, the largest offset uncertainty any software event carries.

Time sync (MQTT-TS, seed 000 section 4.2): a subscriber that sets its clock to the time
server's timestamp on receipt is off by ``announced - true`` = ``t_pub - t_recv`` on the
reference clock, i.e. minus the delivery latency; the figures are per subscriber.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mqttbed.analytics.figures import Levels, _per_level
from mqttbed.analytics.passes import Aggregate, GroupKey, figure_rows, number
from mqttbed.core.events import ClockSource, EventKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

LevelKey = tuple[str, str]


def split_by_clock(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(software rows, scope rows)."""
    from pyspark.sql import functions as F

    is_scope = F.col("clock_source") == ClockSource.SCOPE.value
    return events.where(~is_scope), events.where(is_scope)


def scope_rows(scope: DataFrame, levels: Levels) -> DataFrame:
    """The figure rows of the scope's figures per level: its delays (``latency_us``),
    the spread of each acquisition that caught two subscribers or more
    (``sync_spread_us``), and a counted row per acquisition (``acquisitions``)."""
    from pyspark.sql import functions as F

    delays = scope.where(F.col("kind") == EventKind.DELIVERY.value).select(
        "run_id", "seq", ((F.col("t_recv_ns") - F.col("t_pub_ns")) / 1000.0).alias("value"))
    per_acquisition = (delays.groupBy("run_id", "seq")
                       .agg((F.max("value") - F.min("value")).alias("value"),
                            F.count("*").alias("caught")))
    spreads = per_acquisition.where(F.col("caught") >= 2).select(
        "run_id", "value", F.lit("sync_spread_us").alias("figure"))
    counted = per_acquisition.select("run_id", F.lit(None).cast("double").alias("value"),
                                     F.lit("acquisitions").alias("figure"))
    delays = delays.select("run_id", "value", F.lit("latency_us").alias("figure"))
    return figure_rows(_per_level(delays.unionByName(spreads).unionByName(counted), levels),
                       "scope")


def read_scope_figures(groups: dict[GroupKey, Aggregate]) -> dict[LevelKey, dict[str, Any]]:
    """Per level: {"latency_us": {...}, "sync_spread_us": {...}, "acquisitions": n}."""
    result: dict[LevelKey, dict[str, Any]] = {}
    for (family, level, key, _, figure), found in groups.items():
        if family != "scope":
            continue
        entry = result.setdefault((level, key), {})
        if figure == "acquisitions":
            entry["acquisitions"] = found.rows
        else:
            entry[figure] = found.distribution()
    return result


def clock_rows(software: DataFrame) -> DataFrame:
    """Per run and agent: the largest offset uncertainty of its events (``u``), its
    offset's range (``lo``, ``hi``) and how many (offset, uncertainty) estimates it used.
    Small; collected before the figure pass."""
    from pyspark.sql import functions as F

    return (software.groupBy("run_id", "agent_id")
            .agg(F.max("clock_offset_uncertainty_ns").alias("u"),
                 F.min("clock_offset_ns").alias("lo"), F.max("clock_offset_ns").alias("hi"),
                 F.countDistinct("clock_offset_ns", "clock_offset_uncertainty_ns")
                 .alias("estimates")))


def clock_uncertainty_us(clocks: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per run, the largest clock-offset uncertainty of its events, in microseconds, from
    the collected :func:`clock_rows`."""
    largest: dict[str, int] = {}
    for row in clocks:
        if row.get("u") is not None:
            largest[row["run_id"]] = max(row["u"], largest.get(row["run_id"], row["u"]))
    return {run_id: value for run_id, u in largest.items()
            if (value := number(u / 1000.0)) is not None}


def agent_clocks(clocks: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per run and agent: the largest offset uncertainty of its events, how far its
    offset estimates moved during the run (drift), and how many estimates it used; from
    the collected :func:`clock_rows`."""
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for row in clocks:
        if row.get("u") is None:
            continue
        result.setdefault(row["run_id"], {})[row["agent_id"]] = {
            "offset_uncertainty_us_max": number(row["u"] / 1000.0),
            "offset_drift_us": number((row["hi"] - row["lo"]) / 1000.0),
            "estimates": int(row["estimates"])}
    return result


def time_sync_rows(software: DataFrame, levels: Levels) -> DataFrame:
    """The figure rows of each subscriber's clock error after adopting the time server's
    timestamp, per level (``sub``: the receiver)."""
    from pyspark.sql import functions as F

    error = ((F.col("t_pub_ns") - F.col("pub_offset_ns"))
             - (F.col("t_recv_ns") - F.col("clock_offset_ns"))) / 1000.0
    sent = (software.where((F.col("kind") == EventKind.PUBLISH.value) & ~F.col("warmup"))
            .groupBy("run_id", "publisher", "seq")
            .agg(F.min("clock_offset_ns").alias("pub_offset_ns")))
    first = (software.where((F.col("kind") == EventKind.DELIVERY.value) & ~F.col("warmup"))
             .groupBy("run_id", "publisher", "seq", "receiver")
             .agg(F.min(F.struct("t_recv_ns", "t_pub_ns", "clock_offset_ns")).alias("d"))
             .select("run_id", "publisher", "seq", "receiver", "d.*"))
    errors = (first.join(sent, ["run_id", "publisher", "seq"], "left")
              .fillna({"pub_offset_ns": 0}).select("run_id", "receiver", error.alias("e")))
    return figure_rows(_per_level(errors, levels), "time_sync", sub="receiver",
                       figure=F.lit("error"), value="e")


def read_time_sync_errors(groups: dict[GroupKey, Aggregate]
                          ) -> dict[LevelKey, dict[str, Any]]:
    """Per level: each subscriber's clock error after adopting the time server's timestamp."""
    result: dict[LevelKey, dict[str, Any]] = {}
    for (family, level, key, receiver, _), found in groups.items():
        if family != "time_sync":
            continue
        entry = result.setdefault((level, key), {"per_subscriber": {}})
        entry["per_subscriber"][receiver] = {
            "mean_error_us": found.mean, "std_us": found.std,
            "max_abs_error_us": found.max_abs, "samples": found.rows}
    for entry in result.values():
        subscribers = entry["per_subscriber"].values()
        entry["worst_max_abs_error_us"] = max(
            (s["max_abs_error_us"] for s in subscribers if s["max_abs_error_us"] is not None),
            default=None)
    return result
