"""The Spark side of the campaign stats: every figure, per run and per sweep point.

A *level* is a (level, key) pair: ("run", run_id) or ("point", point_index). Each run's
rows are joined to the levels it belongs to (its own run, and its point if the run is
done), so one aggregation yields the run figures and the pooled point figures together:
a point's percentiles are taken over all deliveries of its runs, never averaged from
per-run percentiles. Figures come out in three long-format families:

- counts: one row per counted thing, named by ``figure``; summed per level.
- distributions: one value per delivery or message (latency, spreads, in microseconds);
  mean, sample std, exact linearly interpolated percentiles and max per level.
- items: one value per run or per run's sub-group (a receiver's jitter, a stream's RFC
  3550 jitter, a run's throughput or broker figure); mean, sample std, max and sum.

A run of a message mix (``workload.streams``) also has its figures per stream: the
counts and distributions of its rows whose publisher belongs to the stream (``streams``:
run_id, publisher, stream). Those rows are tagged with their stream and aggregated in the
same pass as the level's own rows (tagged with a null stream), grouped by level, key and
stream; items stay per level. (A *stream* here is a stream of the mix; the per-publisher
sequences that reordering and RFC 3550 jitter follow are each receiver's stream from one
publisher.)

Only Spark SQL functions are used (no Python UDFs). Warm-up rows are dropped up front,
except subscribe rows: a subscription is not a message, and it must still count when
an agent marks everything before the measured window as warm-up.

Times compared across receivers (sync spread, first/last, the throughput window, the
subscription order) are offset-corrected (``t - clock_offset_ns``): raw monotonic clocks
of two machines share no origin. RFC 3550 jitter uses the raw payload and receive
timestamps of one stream, whose offsets cancel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mqttbed.analytics.passes import (
    PERCENTILES,
    SKETCH_LEVELS,
    Aggregate,
    GroupKey,
    Struct,
    figure_rows,
    literal_map,
    lookup,
    union_all,
)
from mqttbed.analytics.shared_subscriptions import (
    group_of_receiver,
    grouped_subscriptions,
    shared_deliveries,
    shared_rows,
)
from mqttbed.analytics.topic_tree import filters_of, tree_rows
from mqttbed.analytics.topics import is_wildcard, topic_filter_regex
from mqttbed.core.events import EventKind

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

LevelKey = tuple[str, str]
# run_id -> the levels its rows count in (its run; its point if done)
Levels = dict[str, list[LevelKey]]
# run_id -> publisher -> the stream of a message mix the publisher belongs to
PublisherStreams = dict[str, dict[str, str]]
FigureKey = tuple[str, str, str]
StreamKey = tuple[str, str, str]              # (level, key, stream)
StreamFigureKey = tuple[str, str, str, str]   # (level, key, stream, figure)

RUN_LEVEL = "run"
POINT_LEVEL = "point"
BYTES_PER_KB = 1000  # kB, as instruments.resources.summarize
NS_PER_US = 1000.0
# RFC 3550 section 6.4.1: J += (|D| - J) / 16.
RFC3550_GAIN = 16

# Distributions a stream of a message mix has of its own (counts: all but the fault's).
STREAM_DISTRIBUTIONS = ("latency_us", "latency_from_intended_us", "send_lag_us",
                        "sync_spread_us")
COUNT_FIGURES = ("messages_sent", "deliveries_expected", "delivery_rows", "unique_deliveries",
                 "deliveries_received", "reordered", "receivers_not_resumed")
_MESSAGE_KEY = ("run_id", "publisher", "seq")
_DELIVERY_KEY = ("run_id", "publisher", "seq", "receiver")


# Figures whose point percentiles get a bootstrap interval across runs; each run's values
# are summarised by their quantiles at SKETCH_LEVELS (0, 0.1 %, ... 100 %).
SKETCHED_FIGURES = ("latency_us", "sync_spread_us")
# A point's latency CDF (and its streams') is its latency distribution's sketch
CDF_FIGURE = "latency_us"
__all__ = ["PERCENTILES", "SKETCH_LEVELS"]  # re-exported: where callers have found them


@dataclass(frozen=True)
class QuantileSketch:
    """One run's values of one figure: how many, and their quantiles at SKETCH_LEVELS."""

    count: int
    quantiles: list[float]


@dataclass(frozen=True)
class LevelFigures:
    """The collected figures of every level, as plain Python numbers (None when empty)."""

    counts: dict[LevelKey, dict[str, int]]
    distributions: dict[FigureKey, dict[str, float | None]]
    items: dict[FigureKey, dict[str, float | None]]
    # (run_id, figure) -> the run's sketch, for SKETCHED_FIGURES
    sketches: dict[tuple[str, str], QuantileSketch]
    # the same per stream of a message mix (empty without one)
    stream_counts: dict[StreamKey, dict[str, int]] = field(default_factory=dict)
    stream_distributions: dict[StreamFigureKey, dict[str, float | None]] = field(
        default_factory=dict)
    stream_sketches: dict[tuple[str, str, str], QuantileSketch] = field(default_factory=dict)


def subscription_rows(events: DataFrame) -> DataFrame:
    """(run_id, receiver, topic_filter, suback_ns): each receiver's subscriptions.

    A receiver subscribed twice to one filter is one subscription, from its first SUBACK;
    SUBACK times are offset-corrected so receivers on different machines compare. Small
    (a row per receiver and filter): collected before the figure pass, whose topic
    matching needs the wildcard filters on the driver.
    """
    from pyspark.sql import functions as F

    measured = _measured(events)
    return (measured.where(F.col("kind") == EventKind.SUBSCRIBE.value)
            .groupBy("run_id", "receiver", F.col("topic").alias("topic_filter"))
            .agg(F.min(F.col("t_recv_ns") - F.col("clock_offset_ns")).alias("suback_ns")))


def delivery_rows(events: DataFrame, subscriptions: Sequence[dict[str, Any]]) -> DataFrame:
    """One row per (run, publisher, seq, receiver) that was expected or received, with
    every per-delivery figure: the row every count, distribution and item starts from.

    ``subscriptions`` are the collected :func:`subscription_rows`. Columns: the delivery
    key; of its first
    arrival t_pub_ns (payload), t_recv_ns, arrival_ns and departure_ns (offset
    corrected), latency_us and intended_latency_us (from the open-loop intended send
    time), all null if it never arrived; ``received``; ``expected`` (a subscription of
    the receiver matches); ``copies`` (rows received, duplicates included) and
    ``reordered_copies`` (of those, rows that came after a higher seq of the same
    publisher at that receiver); ``member``: the client whose copy arrived first.

    The receiver of a shared subscription (``$share/G/F``) is its group ``$share/G``
    (:mod:`mqttbed.analytics.shared_subscriptions`): a message is due once per group, and
    a copy at a second member is a duplicate; ``member`` says which member took it.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    publishes, deliveries = _split_events(events)
    group = group_of_receiver(subscriptions)
    pairs = (_expected_pairs(publishes, grouped_subscriptions(subscriptions)).distinct()
             .withColumn("expected", F.lit(True)))
    # A row is reordered if an earlier arrival on its stream carried a higher seq.
    stream = (Window.partitionBy("run_id", "receiver", "publisher").orderBy("t_recv_ns", "seq")
              .rowsBetween(Window.unboundedPreceding, -1))
    reordered = F.coalesce(F.col("seq") < F.max("seq").over(stream), F.lit(False))
    # a member's own stream is what reorders; its group is what receives
    deliveries = deliveries.withColumn("reordered", reordered).withColumn(
        "member", F.col("receiver"))
    if group is not None:
        deliveries = deliveries.withColumn("receiver", F.coalesce(group, F.col("receiver")))
    first = (deliveries
             .groupBy(*_DELIVERY_KEY)
             .agg(F.min(F.struct("t_recv_ns", "recv_offset_ns", "t_pub_ns",
                                 "t_intended_ns", "member")).alias("d"),
                  F.count("*").alias("copies"),
                  F.count(F.when(F.col("reordered"), 1)).alias("reordered_copies"))
             .select(*_DELIVERY_KEY, "d.*", "copies", "reordered_copies"))
    sent = (publishes.groupBy(*_MESSAGE_KEY)
            .agg(F.min(F.struct("t_pub_ns", "pub_offset_ns", "t_intended_ns")).alias("p"))
            .select(*_MESSAGE_KEY, F.col("p.t_pub_ns").alias("sent_ns"),
                    F.col("p.pub_offset_ns"), F.col("p.t_intended_ns").alias("intended_ns")))
    arrival = F.col("t_recv_ns") - F.col("recv_offset_ns")
    # The publisher's own record is the better send time; without one, use the payload's
    # timestamp on an unknown clock (offset 0).
    pub_offset = F.coalesce(F.col("pub_offset_ns"), F.lit(0))
    departure = F.coalesce(F.col("sent_ns"), F.col("t_pub_ns")) - pub_offset
    intended = F.coalesce(F.col("intended_ns"), F.col("t_intended_ns")) - pub_offset
    return (first.join(pairs, list(_DELIVERY_KEY), "full")
            .join(sent, list(_MESSAGE_KEY), "left")
            .select(*_DELIVERY_KEY, "t_pub_ns", "t_recv_ns", arrival.alias("arrival_ns"),
                    departure.alias("departure_ns"),
                    ((arrival - departure).cast("double") / NS_PER_US).alias("latency_us"),
                    ((arrival - intended).cast("double") / NS_PER_US)
                    .alias("intended_latency_us"),
                    F.col("t_recv_ns").isNotNull().alias("received"),
                    F.coalesce(F.col("expected"), F.lit(False)).alias("expected"),
                    F.coalesce(F.col("copies"), F.lit(0)).alias("copies"),
                    F.coalesce(F.col("reordered_copies"), F.lit(0)).alias("reordered_copies"),
                    "member"))


def level_figure_rows(events: DataFrame, deliveries: DataFrame, samples: DataFrame,
                      levels: Levels, subscriptions: Sequence[dict[str, Any]],
                      faults: dict[str, int] | None = None,
                      streams: PublisherStreams | None = None,
                      tree_runs: Sequence[str] = ()) -> list[DataFrame]:
    """The figure rows (:mod:`mqttbed.analytics.passes`) of every count, distribution
    and item of every level, for :func:`read_level_figures` once aggregated.

    ``deliveries`` are the :func:`delivery_rows` of ``events`` (best materialised: every
    family reads them). ``levels`` are the levels each run belongs to.
    ``subscriptions`` are the collected :func:`subscription_rows`. ``faults`` (run_id ->
    fault_ns, on the controller's clock) are the runs in which a backend caused a fault
    on purpose, for the recovery figures (:func:`_fault_rows`). ``streams`` name the
    stream of a message mix each publisher of a run belongs to; their figures come out
    per stream too. ``tree_runs`` are the runs of a topic tree, whose figures come out
    per filter too (:mod:`mqttbed.analytics.topic_tree`); the groups of shared
    subscriptions have theirs in any run (:mod:`mqttbed.analytics.shared_subscriptions`).
    """
    from pyspark.sql import functions as F

    publishes, _ = _split_events(events)
    unique = deliveries.where("received")
    values = distribution_value_rows(events, deliveries, subscriptions)
    counted = _count_rows(publishes, deliveries)
    if faults:
        recovery = _fault_rows(unique, faults)
        values = values.unionByName(recovery.where(F.col("figure") != "receivers_not_resumed"))
        # one row per receiver that got nothing sent after the fault
        counted = counted.unionByName(recovery.where(
            F.col("figure") == "receivers_not_resumed").select(
                "run_id", "publisher", "figure", F.lit(1.0).alias("value")))
    values = _by_stream(values, streams, F.col("figure").isin(list(STREAM_DISTRIBUTIONS)))
    # A count is a sum: summed per (run, publisher) here, a few rows per publisher go on
    # to the levels and streams (both decided by run and publisher) instead of one or more
    # per message. The sums are of whole numbers, exact in any order.
    counted = counted.groupBy("run_id", "publisher", "figure").agg(F.sum("value").alias("value"))
    counted = _by_stream(counted, streams, F.col("figure") != "receivers_not_resumed")
    level, figure = F.col("level"), F.col("figure")
    sketched = (((level == RUN_LEVEL) & figure.isin(list(SKETCHED_FIGURES)))
                | ((level == POINT_LEVEL) & (figure == CDF_FIGURE)))
    tree = tree_rows(deliveries, publishes, filters_of(subscriptions, tree_runs),
                     lambda frame: _per_level(frame, levels))
    return [
        figure_rows(_per_level(counted, levels), "count", sub="stream"),
        figure_rows(_per_level(values, levels), "distribution", sub="stream", full=sketched),
        figure_rows(_per_level(_item_rows(unique, samples, publishes), levels), "item"),
        shared_rows(_per_level(shared_deliveries(deliveries), levels)),
        *([] if tree is None else [tree]),
    ]


def distribution_value_rows(events: DataFrame, deliveries: DataFrame,
                            subscriptions: Sequence[dict[str, Any]]) -> DataFrame:
    """(run_id, publisher, figure, value): every value of every per-delivery, per-message
    and per-publish distribution (latencies, spreads and send lag, in us), one row each.

    What the distributions of :func:`level_figure_rows` are aggregated from, and what an
    export of the raw values (HdrHistogram logs) reads, so that both count the same
    values. ``deliveries`` are the :func:`delivery_rows` of ``events``; ``subscriptions``
    the collected :func:`subscription_rows`.
    """
    publishes, _ = _split_events(events)
    return _distribution_rows(deliveries.where("received"),
                              subscription_ends(grouped_subscriptions(subscriptions)), publishes)


def read_level_figures(groups: dict[GroupKey, Aggregate]) -> LevelFigures:
    """The LevelFigures of the aggregated :func:`level_figure_rows`."""
    counts: dict[tuple[str, str, str | None], dict[str, int]] = {}
    distributions: dict[tuple[str, str, str | None, str], dict[str, float | None]] = {}
    sketches: dict[tuple[str, str | None, str], QuantileSketch] = {}
    items: dict[FigureKey, dict[str, float | None]] = {}
    for (family, level, key, sub, figure), found in groups.items():
        if family == "count":
            counts.setdefault((level, key, sub), dict.fromkeys(COUNT_FIGURES, 0))[figure] = (
                int(found.sum or 0))
        elif family == "distribution":
            distributions[(level, key, sub, figure)] = found.distribution()
            if level == RUN_LEVEL and found.quantiles is not None and found.count:
                sketches[(key, sub, figure)] = QuantileSketch(found.count, found.quantiles)
        elif family == "item":
            items[(level, key, figure)] = {"mean": found.mean, "std": found.std,
                                           "max": found.max, "sum": found.sum}
    return LevelFigures(
        counts={(level, key): c for (level, key, sub), c in counts.items() if sub is None},
        distributions={(level, key, figure): d for (level, key, sub, figure), d
                       in distributions.items() if sub is None},
        items=items,
        sketches={(run_id, figure): s for (run_id, sub, figure), s in sketches.items()
                  if sub is None},
        stream_counts={(level, key, sub): c for (level, key, sub), c in counts.items()
                       if sub is not None},
        stream_distributions={(level, key, sub, figure): d for (level, key, sub, figure), d
                              in distributions.items() if sub is not None},
        stream_sketches={(run_id, sub, figure): s for (run_id, sub, figure), s
                         in sketches.items() if sub is not None},
    )


def _by_stream(frame: DataFrame, streams: PublisherStreams | None,
               per_stream: Column) -> DataFrame:
    """``frame`` (with run_id, publisher) tagged with a null ``stream`` (the level's own
    rows), plus a copy of its ``per_stream`` rows tagged with their publisher's stream."""
    from pyspark.sql import functions as F

    whole = frame.withColumn("stream", F.lit(None).cast("string"))
    if not streams:
        return whole
    tagged = (frame.where(per_stream).withColumn("stream", stream_of(streams))
              .where(F.col("stream").isNotNull()))
    return whole.unionByName(tagged)


def stream_of(streams: PublisherStreams) -> Column:
    """The stream of each row's (run_id, publisher); null for a publisher of none."""
    from pyspark.sql import functions as F

    by_run = literal_map({run_id: dict(publishers) for run_id, publishers in streams.items()})
    return lookup(lookup(by_run, F.col("run_id"), "map<string,string>"), F.col("publisher"),
                  "string")


def _per_level(frame: DataFrame, levels: Levels, only: str | None = None) -> DataFrame:
    """Repeat each row of ``frame`` once per level its run belongs to (of the ``only``
    level, if given), with columns ``level`` and ``key``; rows of other runs are dropped."""
    from pyspark.sql import functions as F

    of_run = literal_map({run_id: [Struct(level=level, key=key) for level, key in keys
                                   if only is None or level == only]
                          for run_id, keys in levels.items()})
    found = F.explode(lookup(of_run, F.col("run_id"), "array<struct<level:string,key:string>>"))
    return (frame.withColumn("_level", found)
            .select(*frame.columns, F.col("_level.level").alias("level"),
                    F.col("_level.key").alias("key")))


# -- the rows every figure starts from ------------------------------------------------


def _measured(events: DataFrame) -> DataFrame:
    """The events without warm-up messages (subscribe rows stay: a subscription is not
    a message) and without retained values (``retain``: set to be retained, or delivered
    as retained state; their latency means nothing: analytics.retained accounts for them)."""
    from pyspark.sql import functions as F

    return events.where((~F.col("warmup") | (F.col("kind") == EventKind.SUBSCRIBE.value))
                        & ~F.coalesce(F.col("retain"), F.lit(False)))


def _split_events(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Return (publishes, deliveries) without warm-up messages."""
    from pyspark.sql import functions as F

    kind = F.col("kind")
    measured = _measured(events)
    publishes = measured.where(kind == EventKind.PUBLISH.value).select(
        "run_id", "publisher", "seq", "topic", "t_pub_ns", "t_intended_ns",
        F.col("clock_offset_ns").alias("pub_offset_ns"))
    deliveries = measured.where(kind == EventKind.DELIVERY.value).select(
        "run_id", "publisher", "seq", "receiver", "t_pub_ns", "t_intended_ns", "t_recv_ns",
        F.col("clock_offset_ns").alias("recv_offset_ns"))
    return publishes, deliveries


def _expected_pairs(publishes: DataFrame, subscriptions: Sequence[dict[str, Any]]
                    ) -> DataFrame:
    """Return (run_id, publisher, seq, receiver) for each (publish, matching subscription).

    Callers take the distinct rows: a receiver whose overlapping filters both match a
    topic expects the message once (MQTT 3.1.1 section 3.3.5: one delivery, at the
    highest QoS of the matching subscriptions), and a publish recorded twice is one.

    ``subscriptions`` are the collected :func:`subscription_rows`. Filters without
    wildcards are looked up by topic name; each of the few wildcard filters is turned
    into a regex and matched with ``rlike``. A wildcard filter never equals a topic name
    (names cannot hold wildcards), so no pair is found twice.
    """
    from pyspark.sql import functions as F

    exact: dict[str, dict[str, set[str]]] = {}
    wild: dict[str, dict[str, set[str]]] = {}
    for row in subscriptions:
        topic_filter, receiver = row.get("topic_filter"), row.get("receiver")
        if topic_filter is None or receiver is None:
            continue
        if is_wildcard(topic_filter):
            wild.setdefault(topic_filter, {}).setdefault(row["run_id"], set()).add(receiver)
        else:
            exact.setdefault(row["run_id"], {}).setdefault(topic_filter, set()).add(receiver)
    none = F.array().cast("array<string>")

    by_topic = literal_map({run_id: {t: sorted(r) for t, r in topics.items()}
                            for run_id, topics in exact.items()})
    matching = F.coalesce(lookup(lookup(by_topic, F.col("run_id"), "map<string,array<string>>"),
                                 F.col("topic"), "array<string>"), none)
    for topic_filter in sorted(wild):
        of_run = literal_map({run_id: sorted(r) for run_id, r in wild[topic_filter].items()})
        matching = F.concat(matching, F.when(
            F.col("topic").rlike(topic_filter_regex(topic_filter)),
            F.coalesce(lookup(of_run, F.col("run_id"), "array<string>"), none)).otherwise(none))
    return publishes.select("run_id", "publisher", "seq",
                            F.explode(F.array_distinct(matching)).alias("receiver"))


def subscription_ends(subscriptions: Sequence[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """First and last subscribed receiver of each run, by (offset-corrected) SUBACK time
    (ties: by receiver), where they differ."""
    subacks: dict[str, dict[str, list[int]]] = {}
    for row in subscriptions:
        if row.get("receiver") is not None:
            times = subacks.setdefault(row["run_id"], {}).setdefault(row["receiver"], [])
            if row.get("suback_ns") is not None:
                times.append(row["suback_ns"])
    # as SQL's min: nulls ignored, null when there is nothing else
    first_suback = {run_id: {r: min(times, default=None) for r, times in receivers.items()}
                    for run_id, receivers in subacks.items()}
    ends = {}
    for run_id, receivers in first_suback.items():
        # SQL order: a null SUBACK time first
        ordered = sorted(receivers, key=lambda r: (receivers[r] is not None,
                                                   receivers[r] or 0, r))
        if ordered[0] != ordered[-1]:
            ends[run_id] = (ordered[0], ordered[-1])
    return ends


# -- the three families -----------------------------------------------------------------


def _count_rows(publishes: DataFrame, deliveries: DataFrame) -> DataFrame:
    """Return (run_id, publisher, figure, value): how many of ``figure`` a row counts."""
    from pyspark.sql import functions as F

    received = F.col("received")
    counted = {
        "messages_sent": (publishes, F.lit(1)),
        "deliveries_expected": (deliveries.where("expected"), F.lit(1)),
        "delivery_rows": (deliveries.where(received), F.col("copies")),
        "unique_deliveries": (deliveries.where(received), F.lit(1)),
        "deliveries_received": (deliveries.where(received & F.col("expected")), F.lit(1)),
        "reordered": (deliveries.where(F.col("reordered_copies") > 0),
                      F.col("reordered_copies")),
    }
    frames = [frame.select("run_id", "publisher", F.lit(figure).alias("figure"),
                           how_many.cast("double").alias("value"))
              for figure, (frame, how_many) in counted.items()]
    return union_all(frames)


def _distribution_rows(unique: DataFrame, ends: dict[str, tuple[str, str]],
                       publishes: DataFrame) -> DataFrame:
    """Return (run_id, publisher, figure, value) in us: latencies per delivery (from the
    actual and from the intended send time), spreads per message, send lag per publish.
    ``ends`` are the first and last subscribed receivers (:func:`subscription_ends`)."""
    from pyspark.sql import functions as F

    run_id = F.col("run_id")
    first = literal_map({r: first for r, (first, _) in ends.items()})
    last = literal_map({r: last for r, (_, last) in ends.items()})
    arrival = F.col("arrival_ns")
    messages = (
        unique.withColumn("first_receiver", lookup(first, run_id, "string"))
        .withColumn("last_receiver", lookup(last, run_id, "string"))
        .groupBy(*_MESSAGE_KEY)
        .agg(F.count("*").alias("receivers"),
             (F.max(arrival) - F.min(arrival)).alias("spread_ns"),
             F.max(F.when(F.col("receiver") == F.col("first_receiver"), arrival)).alias("first_ns"),
             F.max(F.when(F.col("receiver") == F.col("last_receiver"), arrival)).alias("last_ns")))
    first_last_ns = F.col("last_ns") - F.col("first_ns")   # null unless both received it
    send_lag_ns = F.col("t_pub_ns") - F.col("t_intended_ns")
    return (
        unique.select("run_id", "publisher", F.lit("latency_us").alias("figure"),
                      F.col("latency_us").alias("value"))
        .unionByName(unique.where(F.col("intended_latency_us").isNotNull()).select(
            "run_id", "publisher", F.lit("latency_from_intended_us").alias("figure"),
            F.col("intended_latency_us").alias("value")))
        .unionByName(publishes.where(send_lag_ns.isNotNull()).select(
            "run_id", "publisher", F.lit("send_lag_us").alias("figure"),
            (send_lag_ns.cast("double") / NS_PER_US).alias("value")))
        .unionByName(messages.where(F.col("receivers") >= 2).select(
            "run_id", "publisher", F.lit("sync_spread_us").alias("figure"),
            (F.col("spread_ns") / NS_PER_US).alias("value")))
        .unionByName(messages.where(first_last_ns.isNotNull()).select(
            "run_id", "publisher", F.lit("first_last_spread_us").alias("figure"),
            (first_last_ns / NS_PER_US).alias("value"))))


def _fault_rows(unique: DataFrame, faults: dict[str, int]) -> DataFrame:
    """Return (run_id, publisher (null), figure, value): how delivery came back after a
    run's fault.

    ``delivery_resumed_s``: per run, the longest time from the fault until a receiver got
    its first message sent after the fault (delivery has resumed everywhere then);
    ``receivers_not_resumed``: one row per receiver that received nothing sent after it.
    Receivers without any delivery in the run are not among either.
    """
    from pyspark.sql import functions as F

    no_publisher = F.lit(None).cast("string").alias("publisher")
    after = F.col("departure_ns") > F.col("fault_ns")
    fault_ns = lookup(literal_map(faults), F.col("run_id"), "bigint")
    per_receiver = (unique.where("expected").withColumn("fault_ns", fault_ns)
                    .where(F.col("fault_ns").isNotNull())
                    .groupBy("run_id", "receiver", "fault_ns")
                    .agg(F.min(F.when(after, F.col("arrival_ns"))).alias("resumed_ns")))
    resumed = (per_receiver.groupBy("run_id", "fault_ns")
               .agg(F.max("resumed_ns").alias("resumed_ns"))
               .where(F.col("resumed_ns").isNotNull())
               .select("run_id", no_publisher, F.lit("delivery_resumed_s").alias("figure"),
                       ((F.col("resumed_ns") - F.col("fault_ns")) / 1e9).alias("value")))
    not_resumed = (per_receiver.where(F.col("resumed_ns").isNull())
                   .select("run_id", no_publisher,
                           F.lit("receivers_not_resumed").alias("figure"),
                           F.lit(None).cast("double").alias("value")))
    return resumed.unionByName(not_resumed)


def _item_rows(unique: DataFrame, samples: DataFrame, publishes: DataFrame) -> DataFrame:
    """Return (run_id, figure, value): per-receiver, per-publisher, per-stream and per-run
    values."""
    from pyspark.sql import functions as F

    jitter_std = (unique.groupBy("run_id", "receiver")
                  .agg(F.stddev_samp("latency_us").alias("value"))
                  .select("run_id", F.lit("jitter_std_us").alias("figure"), "value"))
    # Received (expected) deliveries over the first-to-last arrival of any unique one.
    span_s = (F.max("arrival_ns") - F.min("arrival_ns")) / 1e9
    throughput = (unique.groupBy("run_id")
                  .agg(F.try_divide(F.sum(F.col("expected").cast("long")), span_s).alias("value"))
                  .select("run_id", F.lit("throughput_msgs_per_s").alias("figure"), "value"))
    # Per publisher: its measured publishes over their first-to-last send time; with
    # closed-loop pacing at QoS 2, the MQTT-ST paper's publication throughput.
    sent_span_s = (F.max("t_pub_ns") - F.min("t_pub_ns")) / 1e9
    publication = (publishes.groupBy("run_id", "publisher")
                   .agg(F.count("*").alias("n"), sent_span_s.alias("span_s"))
                   .where(F.col("n") >= 2)
                   .select("run_id", F.lit("publication_msgs_per_s").alias("figure"),
                           F.try_divide(F.col("n") - 1, F.col("span_s")).alias("value")))
    return (jitter_std.unionByName(_rfc3550_rows(unique)).unionByName(throughput)
            .unionByName(publication)
            .unionByName(_broker_rows(samples)).where(F.col("value").isNotNull()))


def _rfc3550_rows(unique: DataFrame) -> DataFrame:
    """Return (run_id, figure, value): the final RFC 3550 jitter of each stream, in us.

    A stream is (run, receiver, publisher) in arrival order; D_i compares the arrival
    gap with the send gap of the payload timestamps. Streams with fewer than two
    deliveries have no D and are left out.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    stream_cols = ("run_id", "receiver", "publisher")
    in_arrival_order = Window.partitionBy(*stream_cols).orderBy("t_recv_ns", "seq")
    transit_change = ((F.col("t_recv_ns") - F.lag("t_recv_ns").over(in_arrival_order))
                      - (F.col("t_pub_ns") - F.lag("t_pub_ns").over(in_arrival_order)))
    differences = (unique.withColumn("d_ns", transit_change.cast("double"))
                   .groupBy(*stream_cols)
                   .agg(F.sort_array(F.collect_list(F.when(
                       F.col("d_ns").isNotNull(), F.struct("t_recv_ns", "seq", "d_ns"))))
                       .alias("ds")))
    # in SQL: a Python lambda's variable gets a new name on every call, and with it the
    # generated code, compiled again each analysis (see passes.sketch)
    jitter_ns = F.expr(f"aggregate(transform(ds, x -> x.d_ns), 0.0D,"
                       f" (j, d) -> j + (abs(d) - j) / {RFC3550_GAIN})")
    return differences.where(F.size("ds") > 0).select(
        "run_id", F.lit("jitter_rfc3550_us").alias("figure"),
        (jitter_ns / NS_PER_US).alias("value"))


BROKER_FIGURES = ("samples", "cpu_percent_mean", "cpu_percent_max", "rss_bytes_max",
                  "net_recv_kb_per_s", "net_sent_kb_per_s")


def _broker_rows(samples: DataFrame) -> DataFrame:
    """Return (run_id, figure, value): each run's broker figures (BROKER_FIGURES)."""
    from pyspark.sql import functions as F

    duration_s = (F.max("t_ns") - F.min("t_ns")) / 1e9

    def kb_per_s(column: str) -> Column:
        grown = F.max_by(column, "t_ns") - F.min_by(column, "t_ns")
        return F.try_divide(grown / BYTES_PER_KB, duration_s)

    per_run = samples.groupBy("run_id").agg(
        F.count("*").cast("double").alias("samples"),
        F.avg("cpu_percent").alias("cpu_percent_mean"),
        F.max("cpu_percent").alias("cpu_percent_max"),
        F.max("rss_bytes").cast("double").alias("rss_bytes_max"),
        kb_per_s("bytes_recv").alias("net_recv_kb_per_s"),
        kb_per_s("bytes_sent").alias("net_sent_kb_per_s"))
    return per_run.unpivot("run_id", list(BROKER_FIGURES), "figure", "value")
