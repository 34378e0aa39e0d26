"""Topic trees (``workload.topic_tree``): deliveries per wildcard filter, checked against
what each filter matches.

The publishers of a tree run spread their messages over ``fanout ** levels`` topics; each
subscriber holds one filter over the tree. The delivery accounting of
:func:`mqttbed.analytics.figures.delivery_rows` already expects a message at every
receiver whose filter matches its topic (the filters matched as regexes); this section
splits that accounting by filter: per filter, the messages it matched (summed over its
subscribers), those delivered, lost, unexpected (delivered but not matched) and
duplicated, and the latency of its deliveries; and the topics the run's publishers sent
to. The broker's CPU against the tree's size is the run's ``broker`` block, and a sweep
over ``workload.topic_tree.fanout`` or ``levels`` puts one point per size side by side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field

from mqttbed.analytics.passes import (
    Aggregate,
    GroupKey,
    figure_rows,
    literal_map,
    lookup,
    union_all,
)
from mqttbed.core.sections import Distribution, SectionBlock

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

FAMILY = "topic_tree"


def filters_of(subscriptions: Iterable[Mapping[str, Any]], runs: Sequence[str]
               ) -> dict[str, dict[str, str]]:
    """run id -> receiver -> its filter, for the tree runs ``runs`` (a receiver of several
    filters is under the last in name order: a tree's subscribers hold one each)."""
    wanted = set(runs)
    found: dict[str, dict[str, str]] = {}
    for row in sorted(subscriptions, key=lambda r: str(r.get("topic_filter"))):
        if row.get("run_id") in wanted and row.get("receiver") and row.get("topic_filter"):
            found.setdefault(row["run_id"], {})[row["receiver"]] = row["topic_filter"]
    return found


def tree_rows(deliveries: DataFrame, publishes: DataFrame,
              filters: Mapping[str, Mapping[str, str]], per_level: Any) -> DataFrame | None:
    """The ``topic_tree`` family's figure rows of the tree runs in ``filters``
    (:func:`filters_of`), None without any.

    ``deliveries`` are :func:`~mqttbed.analytics.figures.delivery_rows`, ``publishes``
    the measured publish events (run_id, topic), ``per_level`` repeats a frame's rows per
    level (``figures._per_level`` with the analysis's levels). Per filter (sub: the
    filter): ``matched`` (expected deliveries), ``delivered``, ``unexpected``,
    ``duplicated`` (messages with more than one copy) and ``latency_us``; per level:
    ``topics``, a row per (run, topic) published to."""
    from pyspark.sql import functions as F

    if not filters:
        return None
    by_run = literal_map({run_id: dict(of) for run_id, of in filters.items()})
    topic_filter = lookup(lookup(by_run, F.col("run_id"), "map<string,string>"),
                          F.col("receiver"), "string")
    rows = per_level(deliveries.withColumn("topic_filter", topic_filter)
                     .where(F.col("topic_filter").isNotNull()))
    received, expected = F.col("received"), F.col("expected")
    counted = {
        "matched": expected,
        "delivered": expected & received,
        "unexpected": ~expected & received,
        "duplicated": received & (F.col("copies") > 1),
    }
    frames = [figure_rows(rows.where(condition), FAMILY, sub="topic_filter",
                          figure=F.lit(figure), value=None)
              for figure, condition in counted.items()]
    frames.append(figure_rows(rows.where(received), FAMILY, sub="topic_filter",
                              figure=F.lit("latency_us"), value="latency_us"))
    topics = per_level(publishes.where(F.col("run_id").isin(sorted(filters)))
                       .select("run_id", "topic").distinct())
    frames.append(figure_rows(topics, FAMILY, figure=F.lit("topics"), value=None))
    return union_all(frames)


# -- the results ------------------------------------------------------------------------


class FilterFigures(SectionBlock):
    """One filter over the tree: what it matched against what its subscribers received."""

    subscribers: int = Field(0, description="receivers holding the filter (summed over a "
                                            "point's runs)")
    matched: int = Field(0, description="deliveries due: messages it matches, times its "
                                        "subscribers")
    delivered: int = Field(0, description="of those, received")
    lost: int = Field(0, description="of those, never received")
    unexpected: int = Field(0, description="received, but the filter does not match the "
                                           "message's topic")
    duplicated: int = Field(0, description="deliveries received more than once")
    latency_us: Distribution = Field(default_factory=Distribution)


class TopicTreeFigures(SectionBlock):
    """A topic tree's run, or a point's done runs pooled: per filter, deliveries against
    matches, and latency."""

    topics_published: float | None = Field(
        None, description="distinct topics the publishers sent to per run (mean over a "
                          "point's runs)")
    filters: dict[str, FilterFigures] = Field(default_factory=dict,
                                              description="by filter, as subscribed")


def topic_tree_figures(groups: Mapping[GroupKey, Aggregate], level: tuple[str, str],
                       filters: Mapping[str, Mapping[str, str]], runs: Sequence[str]
                       ) -> TopicTreeFigures | None:
    """The ``topic_tree`` section of one level (its ``runs``) from the aggregated figure
    groups and the tree runs' filters (:func:`filters_of`); None for a level without a
    tree run."""
    tree_runs = [run_id for run_id in runs if run_id in filters]
    if not tree_runs:
        return None
    found: dict[str | None, dict[str, Aggregate]] = {}
    for (family, lvl, key, sub, figure), aggregate in groups.items():
        if family == FAMILY and (lvl, key) == level:
            found.setdefault(sub, {})[figure] = aggregate
    subscribers: dict[str, int] = {}
    for run_id in tree_runs:
        for topic_filter in filters[run_id].values():
            subscribers[topic_filter] = subscribers.get(topic_filter, 0) + 1
    by_filter = {}
    for topic_filter in sorted(subscribers):
        own = found.get(topic_filter, {})

        def rows(figure: str, own: dict[str, Aggregate] = own) -> int:
            return own[figure].rows if figure in own else 0

        latency = own.get("latency_us")
        by_filter[topic_filter] = FilterFigures(
            subscribers=subscribers[topic_filter], matched=rows("matched"),
            delivered=rows("delivered"), lost=rows("matched") - rows("delivered"),
            unexpected=rows("unexpected"), duplicated=rows("duplicated"),
            latency_us=Distribution(**latency.distribution()) if latency else Distribution())
    topics = found.get(None, {}).get("topics")
    return TopicTreeFigures(
        topics_published=topics.rows / len(tree_runs) if topics else None,
        filters=by_filter)
