"""Retained state (``workload.retained``): what late subscribers held, and how soon.

The publishers of such a run set retained values (PUBLISH with the RETAIN flag, the
events' ``retain`` column) on ``topics`` topics; the subscribers subscribe afterwards and
the broker sends each the state it keeps. Their deliveries carry the send timestamp of a
value set long before, so a latency means nothing here: the generic figures leave every
retained row out (:func:`mqttbed.analytics.figures` drops ``retain`` rows with the
warm-up), and this block accounts for them instead, per subscriber:

- the time from its SUBSCRIBE written (the subscribe row's ``t_pub_ns``) and from its
  SUBACK until it held every topic's latest value (the arrival of the last of them);
- per topic, exact counts: the latest value delivered (once), a stale one (an older value
  of the run, or one the run never set: left from before), missing (no latest value),
  duplicated (a topic delivered more than once), and deliveries without the RETAIN flag
  (a broker that sends the state as if it were live); values set after the subscriber's
  SUBSCRIBE was written (publishers behind schedule) are counted apart, as ``live``;
- the broker's memory for the state: its RSS in the last sample before the first value
  was set and in the last sample before the first SUBSCRIBE (the broker resource samples,
  ~0.2 s apart, on the controller's clock as the offset-corrected events are).

Spark reduces the run's events to one row per (run, subscriber) in pass 1 of the analysis
(:func:`retained_rows`, collected with the subscriptions); the block is then built here in
plain Python, pooled over a point's done runs (distributions over subscribers, exact
percentiles as :mod:`mqttbed.analytics.connections` takes them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.analytics.connections import phase_distribution
from mqttbed.core.events import EventKind
from mqttbed.core.sections import Distribution

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RETAINED_SHAPE = "retained"


class RetainedFigures(BaseModel):
    """What late subscribers received of the retained state (of a run, or pooled over a
    point's done runs): exact counts per subscriber and topic, and how soon each held it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    topics: int = Field(0, description="topics the publishers set retained values on "
                                       "(counted from the publishes; per run, summed)")
    values_set: int = Field(0, description="retained values published (topics x updates)")
    subscribers: int = Field(0, description="subscribers that subscribed once the values "
                                            "were set")
    subscribers_holding_all: int = Field(
        0, description="subscribers that received every topic's latest value")
    expected: int = Field(0, description="latest values due: topics x subscribers")
    delivered_latest: int = Field(0, description="(subscriber, topic) pairs that received "
                                                 "the topic's latest value")
    missing: int = Field(0, description="(subscriber, topic) pairs without the latest value")
    stale: int = Field(0, description="deliveries of an older value of the run, or of one "
                                      "the run never set (left from before)")
    duplicates: int = Field(0, description="deliveries beyond one per (subscriber, topic)")
    without_retain_flag: int = Field(
        0, description="deliveries of a value set before the subscription that lacked the "
                       "RETAIN flag (MQTT 3.1.1 section 3.3.1.3 asks for it)")
    live: int = Field(0, description="deliveries of values set after the subscriber's "
                                     "SUBSCRIBE was written: live, not state (publishers "
                                     "behind their schedule); none in a run that kept it")
    hold_from_subscribe_us: Distribution = Field(
        default_factory=Distribution,
        description="per subscriber: SUBSCRIBE written to the last latest value received "
                    "(subscribers that held all only)")
    hold_from_suback_us: Distribution = Field(
        default_factory=Distribution,
        description="per subscriber: SUBACK read to the last latest value received (negative "
                    "when the broker sent the state before its SUBACK)")
    subscribe_after_set_us: Distribution = Field(
        default_factory=Distribution,
        description="per subscriber: the last value set (publish written) to its SUBSCRIBE "
                    "written: the wait the run asked for (subscribe_after_s), and any lag")
    rss_before_bytes: int | None = Field(
        None, description="the broker's RSS before the first value was set (the last sample "
                          "before it; the first run's of a point)")
    rss_with_state_bytes: int | None = Field(
        None, description="the broker's RSS with the state set, before the subscribes (the "
                          "last sample between the last value set and the first SUBSCRIBE)")
    rss_per_topic_bytes: float | None = Field(
        None, description="(RSS with the state - RSS before) / topics, mean over runs with "
                          "both samples")
    clock: str = Field("offset-corrected agent CLOCK_MONOTONIC (events), the controller's "
                       "for the broker samples", description="what the times are on")


@dataclass(frozen=True)
class RetainedFacts:
    """Pass 1's retained rows: per run, its subscribers' rows and its broker's samples."""

    subscribers: Mapping[str, tuple[dict[str, Any], ...]]
    samples: Mapping[str, tuple[tuple[int, int], ...]]   # run -> (t_ns, rss_bytes), sorted


def retained_rows(events: DataFrame, run_ids: Sequence[str]) -> DataFrame:
    """One row per (run, subscriber) of the retained runs ``run_ids``: the run's topics,
    values set, first and last set time; the subscriber's SUBSCRIBE written and SUBACK
    times; its deliveries, topics held with their latest value, stale, duplicated and
    unflagged deliveries, and the arrival of its last latest value (null unless it held
    every topic). Times offset-corrected (the controller's clock)."""
    from pyspark.sql import functions as F

    of_runs = events.where(F.col("run_id").isin(list(run_ids)))
    kind, retain = F.col("kind"), F.coalesce(F.col("retain"), F.lit(False))
    corrected = F.col("t_pub_ns") - F.col("clock_offset_ns")
    sets = of_runs.where((kind == EventKind.PUBLISH.value) & retain)
    # each topic's latest value: its last set, by send time (one publisher per topic)
    latest = (sets.groupBy("run_id", "topic")
              .agg(F.max(F.struct(corrected.alias("t"), F.col("seq"), F.col("publisher"),
                                  F.col("t_pub_ns"))).alias("v"))
              .select("run_id", "topic", F.col("v.publisher").alias("latest_publisher"),
                      F.col("v.seq").alias("latest_seq"),
                      F.col("v.t_pub_ns").alias("latest_t_pub_ns")))
    run_sets = sets.groupBy("run_id").agg(
        F.countDistinct("topic").alias("topics"), F.count("*").alias("values_set"),
        F.min(corrected).alias("first_set_ns"), F.max(corrected).alias("last_set_ns"))
    subscribes = (of_runs.where((kind == EventKind.SUBSCRIBE.value)
                                & F.col("t_pub_ns").isNotNull())
                  .groupBy("run_id", "receiver")
                  .agg(F.min(corrected).alias("subscribe_ns"),
                       F.min(F.col("t_recv_ns") - F.col("clock_offset_ns")).alias("suback_ns")))
    arrival = F.col("t_recv_ns") - F.col("clock_offset_ns")
    set_at = sets.groupBy("run_id", "publisher", "seq").agg(F.min(corrected).alias("set_ns"))
    # a value set after the subscriber's SUBSCRIBE was written reaches it live, not as state
    deliveries = (of_runs.where(kind == EventKind.DELIVERY.value)
                  .select("run_id", "receiver", "topic", "publisher", "seq", "t_pub_ns",
                          retain.alias("flagged"), arrival.alias("arrival_ns"))
                  .join(set_at, ["run_id", "publisher", "seq"], "left")
                  .join(subscribes.select("run_id", "receiver", "subscribe_ns"),
                        ["run_id", "receiver"], "left")
                  .withColumn("live", F.coalesce(F.col("set_ns") > F.col("subscribe_ns"),
                                                 F.lit(False))))
    # a value delivered is the latest if it is the very PUBLISH that set it last (the send
    # timestamp too: an equal (publisher, seq) left by an earlier run is stale)
    is_latest = ((F.col("publisher") == F.col("latest_publisher"))
                 & (F.col("seq") == F.col("latest_seq"))
                 & (F.col("t_pub_ns") == F.col("latest_t_pub_ns")))
    per_topic = (deliveries.join(latest, ["run_id", "topic"], "left")
                 .withColumn("latest", F.coalesce(is_latest, F.lit(False)))
                 .groupBy("run_id", "receiver", "topic")
                 .agg(F.count("*").alias("copies"),
                      F.count(F.when(~F.col("latest") & ~F.col("live"), 1)).alias("stale"),
                      F.count(F.when(~F.col("flagged") & ~F.col("live"), 1))
                      .alias("unflagged"),
                      F.count(F.when(F.col("live"), 1)).alias("live"),
                      F.min(F.when(F.col("latest"), F.col("arrival_ns"))).alias("held_ns")))
    per_receiver = (per_topic.groupBy("run_id", "receiver")
                    .agg(F.sum("copies").alias("deliveries"),
                         F.count("held_ns").alias("topics_held"),
                         F.sum("stale").alias("stale"),
                         (F.sum("copies") - F.count("*")).alias("duplicates"),
                         F.sum("unflagged").alias("unflagged"),
                         F.sum("live").alias("live"),
                         F.max("held_ns").alias("last_held_ns")))
    return (subscribes.join(per_receiver, ["run_id", "receiver"], "left")
            .join(run_sets, "run_id", "left"))


def retained_sample_rows(samples: DataFrame, run_ids: Sequence[str]) -> DataFrame:
    """The broker samples (t_ns, rss_bytes) of the retained runs ``run_ids``."""
    from pyspark.sql import functions as F

    return (samples.where(F.col("run_id").isin(list(run_ids)) & F.col("rss_bytes").isNotNull())
            .select("run_id", "t_ns", "rss_bytes"))


def retained_facts(subscriber_rows: Sequence[dict[str, Any]],
                   sample_rows: Sequence[dict[str, Any]]) -> RetainedFacts:
    """The collected rows of :func:`retained_rows` and :func:`retained_sample_rows`, by run."""
    subscribers: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(subscriber_rows, key=lambda r: (r["run_id"], r["receiver"])):
        subscribers.setdefault(row["run_id"], []).append(row)
    samples: dict[str, list[tuple[int, int]]] = {}
    for row in sample_rows:
        samples.setdefault(row["run_id"], []).append((row["t_ns"], row["rss_bytes"]))
    return RetainedFacts({run: tuple(rows) for run, rows in subscribers.items()},
                         {run: tuple(sorted(s)) for run, s in samples.items()})


def _rss_before(samples: Sequence[tuple[int, int]], t_ns: int | None,
                after_ns: int | None = None) -> int | None:
    """The RSS of the last sample before ``t_ns`` (and after ``after_ns``), or None."""
    if t_ns is None:
        return None
    before = [rss for t, rss in samples if t < t_ns and (after_ns is None or t > after_ns)]
    return before[-1] if before else None


def retained_figures(facts: RetainedFacts, run_ids: Sequence[str]) -> RetainedFigures | None:
    """The retained block of a level (a run, or a point's done runs pooled); None when
    none of its runs set retained state."""
    runs = [run_id for run_id in run_ids if run_id in facts.subscribers]
    if not runs:
        return None
    rows = [row for run_id in runs for row in facts.subscribers[run_id]]
    holding = [row for row in rows if row.get("last_held_ns") is not None
               and (row.get("topics_held") or 0) == (row.get("topics") or 0)]
    topics = sum(facts.subscribers[run_id][0].get("topics") or 0 for run_id in runs)
    expected = sum((row.get("topics") or 0) for row in rows)
    held = sum((row.get("topics_held") or 0) for row in rows)
    memory = [_memory(facts, run_id) for run_id in runs]
    grown = [(after - before) / n for before, after, n in memory
             if before is not None and after is not None and n]
    return RetainedFigures(
        topics=topics,
        values_set=sum(facts.subscribers[run_id][0].get("values_set") or 0 for run_id in runs),
        subscribers=len(rows), subscribers_holding_all=len(holding),
        expected=expected, delivered_latest=held, missing=expected - held,
        stale=sum(row.get("stale") or 0 for row in rows),
        duplicates=sum(row.get("duplicates") or 0 for row in rows),
        without_retain_flag=sum(row.get("unflagged") or 0 for row in rows),
        live=sum(row.get("live") or 0 for row in rows),
        hold_from_subscribe_us=phase_distribution(
            [row["last_held_ns"] - row["subscribe_ns"] for row in holding]),
        hold_from_suback_us=phase_distribution(
            [row["last_held_ns"] - row["suback_ns"] for row in holding
             if row.get("suback_ns") is not None]),
        subscribe_after_set_us=phase_distribution(
            [row["subscribe_ns"] - row["last_set_ns"] for row in rows
             if row.get("last_set_ns") is not None]),
        rss_before_bytes=memory[0][0], rss_with_state_bytes=memory[0][1],
        rss_per_topic_bytes=sum(grown) / len(grown) if grown else None)


def _memory(facts: RetainedFacts, run_id: str) -> tuple[int | None, int | None, int]:
    """(RSS before the first value set, RSS before the first SUBSCRIBE, topics) of a run."""
    rows = facts.subscribers[run_id]
    samples = facts.samples.get(run_id, ())
    first_subscribe = min((row["subscribe_ns"] for row in rows), default=None)
    return (_rss_before(samples, rows[0].get("first_set_ns")),
            _rss_before(samples, first_subscribe, rows[0].get("last_set_ns")),
            rows[0].get("topics") or 0)
