"""Shared subscriptions (``$share/GROUP/FILTER``): each group, not each member, receives
every message, and the figures of how the group shared the stream.

A member's SUBSCRIBE to ``$share/G/F`` asks for F's messages *once per group*: at QoS >= 1
every message matching F reaches exactly one member of G. So the delivery accounting of
:func:`mqttbed.analytics.figures.delivery_rows` takes the *group* as the receiver of a
shared subscription (:func:`grouped_subscriptions`, :func:`group_of_receiver`): a message
is expected once per group, received once it reached any member, lost when it reached
none, and every further copy (at another member, or twice at one) is a duplicate. Each
delivery row keeps the ``member`` whose copy arrived first.

The ``shared`` section of a run or point (:class:`SharedSubscriptionFigures`) then says,
per group, how many messages were delivered once, lost or duplicated, and per member its
share of the group's stream (the messages whose first copy it received) and its latency;
how evenly the group shared it is the smallest and largest share and Jain's fairness
index, (sum x)^2 / (n sum x^2): 1 when every member took as many, 1/n when one took all.
Members are the receivers that subscribed to the group, whether or not they received
anything (a member that got nothing weighs in the fairness as 0).
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
    from pyspark.sql import Column, DataFrame

SHARE_PREFIX = "$share/"
FAMILY = "shared"
MEMBER_SEPARATOR = "\x1f"   # a group's name, then a member's client id, in a row's sub


def split_shared(topic_filter: str) -> tuple[str, str] | None:
    """``$share/G/F`` as (``$share/G``, F): the group (as the receiver the accounting
    counts) and the filter its members share; None for any other filter."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, _, shared = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not group or not shared:
        return None
    return f"{SHARE_PREFIX}{group}", shared


def grouped_subscriptions(subscriptions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The collected subscription rows with each shared one as its group's: receiver
    ``$share/G``, filter F (the first SUBACK of its members). Other rows stay as they are;
    applied twice, the same rows."""
    grouped: dict[tuple[Any, str, str], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for row in subscriptions:
        split = split_shared(row.get("topic_filter") or "")
        if split is None or row.get("receiver") is None:
            rows.append(dict(row))
            continue
        group, shared = split
        key = (row["run_id"], group, shared)
        suback = row.get("suback_ns")
        if key not in grouped:
            grouped[key] = {**row, "receiver": group, "topic_filter": shared}
            rows.append(grouped[key])
        elif suback is not None and (grouped[key].get("suback_ns") is None
                                     or suback < grouped[key]["suback_ns"]):
            grouped[key]["suback_ns"] = suback
    return rows


def members(subscriptions: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, set[str]]]:
    """run id -> group -> the receivers that subscribed to it."""
    found: dict[str, dict[str, set[str]]] = {}
    for row in subscriptions:
        split = split_shared(row.get("topic_filter") or "")
        if split is not None and row.get("receiver") is not None:
            found.setdefault(row["run_id"], {}).setdefault(split[0], set()).add(row["receiver"])
    return found


def group_of_receiver(subscriptions: Sequence[Mapping[str, Any]]) -> Column | None:
    """A column: the group a delivery's receiver is a member of in its run (null for a
    receiver of no shared subscription); None when no run has one."""
    from pyspark.sql import functions as F

    by_run = {run_id: {member: group for group, of in groups.items() for member in sorted(of)}
              for run_id, groups in members(subscriptions).items()}
    if not by_run:
        return None
    return lookup(lookup(literal_map(by_run), F.col("run_id"), "map<string,string>"),
                  F.col("receiver"), "string")


def shared_deliveries(deliveries: DataFrame) -> DataFrame:
    """The delivery rows whose receiver is a shared-subscription group."""
    from pyspark.sql import functions as F

    return deliveries.where(F.col("receiver").startswith(SHARE_PREFIX))


def shared_rows(levelled: DataFrame) -> DataFrame:
    """The ``shared`` family's figure rows of the groups' delivery rows
    (:func:`shared_deliveries` of :func:`~mqttbed.analytics.figures.delivery_rows`),
    repeated per level (columns ``level`` and ``key``).

    Per group (sub ``$share/G``): ``expected``, ``delivered`` (expected and received),
    ``unexpected``, ``duplicated`` (expected messages with more than one copy) and
    ``copies`` (rows received); per member (sub ``$share/G<US>member``): ``deliveries``
    and ``latency_us`` of the messages whose first copy it received."""
    from pyspark.sql import functions as F

    received, expected = F.col("received"), F.col("expected")
    group_figures = {
        "expected": expected,
        "delivered": expected & received,
        "unexpected": ~expected & received,
        "duplicated": expected & (F.col("copies") > 1),
    }
    frames = [figure_rows(levelled.where(condition), FAMILY, sub="receiver",
                          figure=F.lit(figure), value=None)
              for figure, condition in group_figures.items()]
    first = levelled.where(received)
    frames.append(figure_rows(first, FAMILY, sub="receiver", figure=F.lit("copies"),
                              value="copies"))
    member = F.concat(F.col("receiver"), F.lit(MEMBER_SEPARATOR), F.col("member"))
    frames.append(figure_rows(first, FAMILY, sub=member, figure=F.lit("deliveries"),
                              value=None))
    frames.append(figure_rows(first, FAMILY, sub=member, figure=F.lit("latency_us"),
                              value="latency_us"))
    return union_all(frames)


# -- the results ------------------------------------------------------------------------


class SharedMember(SectionBlock):
    """One member of a shared-subscription group: its share of the group's stream."""

    deliveries: int = Field(0, description="messages whose first copy this member received")
    share: float | None = Field(None, description="deliveries / the group's messages "
                                                  "delivered")
    latency_us: Distribution = Field(default_factory=Distribution,
                                     description="of those deliveries")


class SharedGroup(SectionBlock):
    """One shared-subscription group: the stream it received once, and how its members
    shared it."""

    members: int = Field(0, description="receivers that subscribed to the group")
    expected: int = Field(0, description="messages its filter matched: each due once to "
                                         "the group")
    delivered: int = Field(0, description="of those, received by a member")
    lost: int = Field(0, description="of those, received by no member")
    duplicated: int = Field(0, description="messages received more than once in the group "
                                           "(by two members, or twice by one)")
    extra_copies: int = Field(0, description="copies beyond each message's first")
    unexpected: int = Field(0, description="messages received that its filter does not match")
    share_min: float | None = Field(None, description="the smallest member's share")
    share_max: float | None = Field(None, description="the largest member's share")
    fairness: float | None = Field(None, description="Jain's index over the members' "
                                                     "deliveries: 1 even, 1/members one "
                                                     "took all")
    by_member: dict[str, SharedMember] = Field(default_factory=dict)


class SharedSubscriptionFigures(SectionBlock):
    """Shared subscriptions (``$share/GROUP/FILTER``) of a run, or pooled over a point's
    done runs: per group, exact accounting; per member, its share and latency."""

    groups: dict[str, SharedGroup] = Field(default_factory=dict,
                                           description="by group ($share/NAME)")
    delivered_once: int = Field(0, description="over the groups: (message, group) received "
                                               "by exactly one member, once")
    lost: int = 0
    duplicated: int = 0


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index of ``values`` (None for none, or all zero)."""
    total, squares = sum(values), sum(v * v for v in values)
    return None if not values or squares == 0 else total * total / (len(values) * squares)


def shared_figures(groups: Mapping[GroupKey, Aggregate], level: tuple[str, str],
                   level_members: Mapping[str, set[str]]) -> SharedSubscriptionFigures | None:
    """The ``shared`` section of one level from the aggregated figure groups, with the
    members each group had in the level's runs; None without shared subscriptions."""
    if not level_members:
        return None
    found: dict[str, dict[str, Aggregate]] = {}
    for (family, lvl, key, sub, figure), aggregate in groups.items():
        if family == FAMILY and (lvl, key) == level and sub is not None:
            found.setdefault(sub, {})[figure] = aggregate
    by_group: dict[str, SharedGroup] = {}
    for group, of in sorted(level_members.items()):
        own = found.get(group, {})

        def rows(figure: str, own: dict[str, Aggregate] = own) -> int:
            return own[figure].rows if figure in own else 0

        copies = own.get("copies")
        delivered = rows("delivered")
        member_figures = {}
        for member in sorted(of):
            mine = found.get(f"{group}{MEMBER_SEPARATOR}{member}", {})
            taken = mine["deliveries"].rows if "deliveries" in mine else 0
            latency = mine.get("latency_us")
            member_figures[member] = SharedMember(
                deliveries=taken, share=taken / delivered if delivered else None,
                latency_us=Distribution(**latency.distribution()) if latency else Distribution())
        shares = [m.share for m in member_figures.values() if m.share is not None]
        received_copies = int(copies.sum or 0) if copies else 0
        by_group[group] = SharedGroup(
            members=len(of), expected=rows("expected"), delivered=delivered,
            lost=rows("expected") - delivered, duplicated=rows("duplicated"),
            extra_copies=received_copies - rows("copies"), unexpected=rows("unexpected"),
            share_min=min(shares, default=None), share_max=max(shares, default=None),
            fairness=jain_index([m.deliveries for m in member_figures.values()]),
            by_member=member_figures)
    return SharedSubscriptionFigures(
        groups=by_group,
        delivered_once=sum(g.delivered - g.duplicated for g in by_group.values()),
        lost=sum(g.lost for g in by_group.values()),
        duplicated=sum(g.duplicated for g in by_group.values()))
