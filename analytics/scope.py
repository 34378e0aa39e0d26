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

from typing import TYPE_CHECKING, Any

from mqttbed.analytics.figures import PERCENTILES, _distribution, _number, _per_level
from mqttbed.core.events import ClockSource, EventKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

LevelKey = tuple[str, str]


def split_by_clock(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(software rows, scope rows)."""
    from pyspark.sql import functions as F

    is_scope = F.col("clock_source") == ClockSource.SCOPE.value
    return events.where(~is_scope), events.where(is_scope)


def scope_figures(scope: DataFrame, levels: DataFrame) -> dict[LevelKey, dict[str, Any]]:
    """Per level: {"latency_us": {...}, "sync_spread_us": {...}, "acquisitions": n}."""
    from pyspark.sql import functions as F

    delays = scope.where(F.col("kind") == EventKind.DELIVERY.value).select(
        "run_id", "seq", "receiver", ((F.col("t_recv_ns") - F.col("t_pub_ns")) / 1000.0)
        .alias("value"))
    spreads = (delays.groupBy("run_id", "seq")
               .agg((F.max("value") - F.min("value")).alias("value"),
                    F.count("*").alias("caught"))
               .where(F.col("caught") >= 2).select("run_id", "seq", "value"))
    rows = (_per_level(delays.withColumn("figure", F.lit("latency_us"))
                       .unionByName(spreads.withColumn("receiver", F.lit(None).cast("string"))
                                    .withColumn("figure", F.lit("sync_spread_us"))), levels)
            .groupBy("level", "key", "figure")
            .agg(F.count("value").alias("count"), F.avg("value").alias("mean"),
                 F.stddev_samp("value").alias("std"),
                 F.percentile("value", list(PERCENTILES.values())).alias("percentiles"),
                 F.max("value").alias("max"),
                 F.countDistinct("run_id", "seq").alias("acquisitions"))
            .collect())
    result: dict[LevelKey, dict[str, Any]] = {}
    for row in rows:
        entry = result.setdefault((row["level"], row["key"]), {})
        entry[row["figure"]] = _distribution(row)
        if row["figure"] == "latency_us":
            entry["acquisitions"] = int(row["acquisitions"])
    return result


def clock_uncertainty_us(software: DataFrame) -> dict[str, float]:
    """Per run, the largest clock-offset uncertainty of its events, in microseconds."""
    from pyspark.sql import functions as F

    rows = (software.groupBy("run_id")
            .agg(F.max("clock_offset_uncertainty_ns").alias("u")).collect())
    return {row["run_id"]: value for row in rows
            if row["u"] is not None and (value := _number(row["u"] / 1000.0)) is not None}


def agent_clocks(software: DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """Per run and agent: the largest offset uncertainty of its events, how far its
    offset estimates moved during the run (drift), and how many estimates it used."""
    from pyspark.sql import functions as F

    rows = (software.groupBy("run_id", "agent_id")
            .agg(F.max("clock_offset_uncertainty_ns").alias("u"),
                 F.min("clock_offset_ns").alias("lo"), F.max("clock_offset_ns").alias("hi"),
                 F.countDistinct("clock_offset_ns", "clock_offset_uncertainty_ns")
                 .alias("estimates")).collect())
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row["u"] is None:
            continue
        result.setdefault(row["run_id"], {})[row["agent_id"]] = {
            "offset_uncertainty_us_max": _number(row["u"] / 1000.0),
            "offset_drift_us": _number((row["hi"] - row["lo"]) / 1000.0),
            "estimates": int(row["estimates"])}
    return result


def time_sync_errors(software: DataFrame, levels: DataFrame) -> dict[LevelKey, dict[str, Any]]:
    """Per level: each subscriber's clock error after adopting the time server's timestamp."""
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
    rows = (_per_level(errors, levels).groupBy("level", "key", "receiver")
            .agg(F.avg("e").alias("mean"), F.stddev_samp("e").alias("std"),
                 F.max(F.abs("e")).alias("max_abs"), F.count("*").alias("n"))
            .collect())
    result: dict[LevelKey, dict[str, Any]] = {}
    for row in rows:
        entry = result.setdefault((row["level"], row["key"]), {"per_subscriber": {}})
        entry["per_subscriber"][row["receiver"]] = {
            "mean_error_us": _number(row["mean"]), "std_us": _number(row["std"]),
            "max_abs_error_us": _number(row["max_abs"]), "samples": int(row["n"])}
    for entry in result.values():
        subscribers = entry["per_subscriber"].values()
        entry["worst_max_abs_error_us"] = max(
            (s["max_abs_error_us"] for s in subscribers if s["max_abs_error_us"] is not None),
            default=None)
    return result
