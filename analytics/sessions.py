"""Persistent sessions (``workload.sessions``): what subscribers got of what was published
while they were away, and how soon they had it.

Some subscribers of such a run keep a persistent session, go away mid-run and come back
with the same client id. Their agents record each absence (``Done.reconnects``, kept in the
run's record): when the connection went, when the CONNACK of the return came and with
which session present flag, the return's connect phases. :func:`away_windows` turns them
into :class:`AwayWindow` values on the controller's clock (each agent's offset taken off),
which the analysis is handed in ``RunInfo.away``.

Spark reduces the run's events to one row per (run, subscriber that went away) in pass 1
(:func:`away_rows`): every message published in the run is classified by its send time
(offset-corrected) against that subscriber's absence, from the moment the connection went
to the moment it was back (its CONNACK with the session present, else the SUBACK of its
subscribe again); the subscriber's deliveries are matched to them by (publisher, seq).
Counted, per subscriber: delivered live (published while it was connected), delivered late
(published while away, delivered after its return), lost (either way), duplicated copies,
and the arrival of the last late message: the backlog drained. The block is then built here
in plain Python, pooled over a point's done runs (distributions over subscribers, exact
percentiles as :mod:`mqttbed.analytics.connections` takes them). A QoS 0 subscriber loses
what was published while it was away: counted as lost, never as a failure of the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.analytics.connections import phase_distribution
from mqttbed.analytics.passes import PERCENTILES, quantile_at
from mqttbed.core.events import EventKind
from mqttbed.core.protocol import ClientReconnects, ClockEstimate
from mqttbed.core.sections import Distribution

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SESSIONS_SHAPE = "sessions"
RECONNECT_SHAPE = "reconnect"
AWAY_SHAPES = (SESSIONS_SHAPE, RECONNECT_SHAPE)
_COUNTS = ("published", "published_away", "delivered_live", "delivered_late", "duplicates")


@dataclass(frozen=True)
class AwayWindow:
    """One absence of a client and its return, on the controller's CLOCK_MONOTONIC (ns;
    None: not reached before the run ended)."""

    client_id: str
    role: str
    qos: int
    persistent: bool
    scheduled: bool
    t_lost_ns: int
    t_connack_ns: int | None       # the return's CONNACK
    t_back_ns: int | None          # back on its stream: CONNACK with the session kept,
                                   # else its subscribe again's SUBACK
    connack_ns: int | None         # the return's CONNECT written to CONNACK read
    attempts: int
    session_present: bool | None   # the return's CONNACK flag
    resubscribed: bool
    first_session_present: bool | None   # the client's first CONNACK, before any absence
    publishes_skipped: int = 0
    publishes_abandoned: int = 0


def away_windows(reconnects: Mapping[str, Sequence[ClientReconnects]],
                 clocks: Mapping[str, ClockEstimate]) -> tuple[AwayWindow, ...]:
    """Every absence the run's agents recorded (the record's ``reconnects``, agent id ->
    its clients), agent by agent in the order of their ids, on the controller's clock."""
    found = []
    for agent_id in sorted(reconnects):
        clock = clocks.get(agent_id)
        offset = 0 if clock is None else clock.offset_ns   # agent = controller + offset

        def controller(t: int | None, offset: int = offset) -> int | None:
            return None if t is None else t - offset

        for client in reconnects[agent_id]:
            for r in client.reconnects:
                kept = bool(client.persistent and r.session_present)
                back = r.t_connack_ns if kept or r.t_subscribed_ns is None \
                    else r.t_subscribed_ns
                found.append(AwayWindow(
                    client_id=client.client_id, role=str(client.role), qos=client.qos,
                    persistent=client.persistent, scheduled=r.scheduled,
                    t_lost_ns=r.t_lost_ns - offset, t_connack_ns=controller(r.t_connack_ns),
                    t_back_ns=controller(back), connack_ns=r.connack_ns, attempts=r.attempts,
                    session_present=r.session_present,
                    resubscribed=r.t_subscribed_ns is not None,
                    first_session_present=client.session_present,
                    publishes_skipped=r.publishes_skipped,
                    publishes_abandoned=r.publishes_abandoned))
    return tuple(found)


def first_absences(windows: Sequence[AwayWindow]) -> list[AwayWindow]:
    """Each subscriber's first absence (the one its stream is accounted against)."""
    seen: dict[str, AwayWindow] = {}
    for window in windows:
        if window.role == "subscriber" and window.client_id not in seen:
            seen[window.client_id] = window
    return list(seen.values())


def away_rows(events: DataFrame, windows: Mapping[str, Sequence[AwayWindow]]) -> DataFrame:
    """One row per (run, subscriber that went away) of ``windows`` (run id -> absences):
    every message published in the run classified against the subscriber's absence by its
    send time, and the subscriber's deliveries of them (see the module docstring). Times
    offset-corrected (the controller's clock)."""
    from pyspark.sql import functions as F

    rows = [(run_id, w.client_id, w.t_lost_ns, w.t_back_ns)
            for run_id, of_run in windows.items() for w in first_absences(of_run)]
    spark = events.sparkSession
    away = spark.createDataFrame(rows, "run_id string, receiver string, lost_ns long, "
                                       "back_ns long")
    of_runs = events.where(F.col("run_id").isin(list(windows)))
    kind = F.col("kind")
    sent = (of_runs.where(kind == EventKind.PUBLISH.value)
            .select("run_id", "publisher", "seq",
                    (F.col("t_pub_ns") - F.col("clock_offset_ns")).alias("sent_ns")))
    # the receive loop's time (user space), the clock the return's CONNACK is read on: a
    # kernel stamp comes before the read that also brought the CONNACK
    arrival = F.coalesce(F.col("t_recv_user_ns"), F.col("t_recv_ns")) - F.col("clock_offset_ns")
    got = (of_runs.where(kind == EventKind.DELIVERY.value)
           .groupBy("run_id", "receiver", "publisher", "seq")
           .agg(F.count("*").alias("copies"), F.min(arrival).alias("arrival_ns")))
    while_away = (F.col("sent_ns") >= F.col("lost_ns")) & (
        F.col("back_ns").isNull() | (F.col("sent_ns") < F.col("back_ns")))
    delivered = F.col("copies").isNotNull()
    return (sent.join(away, "run_id")
            .join(got, ["run_id", "receiver", "publisher", "seq"], "left")
            .withColumn("away", while_away)
            .groupBy("run_id", "receiver")
            .agg(F.count("*").alias("published"),
                 F.count(F.when(F.col("away"), 1)).alias("published_away"),
                 F.count(F.when(delivered & ~F.col("away"), 1)).alias("delivered_live"),
                 F.count(F.when(delivered & F.col("away"), 1)).alias("delivered_late"),
                 F.coalesce(F.sum(F.col("copies") - 1), F.lit(0)).alias("duplicates"),
                 F.max(F.when(delivered & F.col("away"), F.col("arrival_ns")))
                 .alias("last_late_ns"),
                 F.min(F.when(delivered & (F.col("sent_ns") >= F.col("lost_ns")),
                              F.col("arrival_ns"))).alias("first_after_ns")))


class AwaySubscriber(BaseModel):
    """One subscriber that went away: its messages, classified by when they were sent."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    run_id: str
    client_id: str
    qos: int
    persistent: bool
    session_present: bool | None = Field(None, description="its return's CONNACK flag")
    away_s: float | None = Field(None, description="from the connection gone to back on "
                                                   "its stream")
    published: int = Field(0, description="messages published in the run")
    published_away: int = Field(0, description="... while it was away")
    delivered_live: int = Field(0, description="published while connected, delivered")
    delivered_late: int = Field(0, description="published while away, delivered after "
                                               "its return")
    lost_live: int = 0
    lost_away: int = Field(0, description="published while away, never delivered")
    duplicates: int = Field(0, description="copies beyond the first")
    backlog_drained_ms: float | None = Field(
        None, description="from back on its stream to the last late message delivered")


class SessionFigures(BaseModel):
    """Subscribers with persistent sessions that went away and came back (of a run, or
    pooled over a point's done runs): exact counts and how soon they had their backlog."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    clock: str = Field("controller CLOCK_MONOTONIC (agents' offsets taken off)",
                       description="what the absences and send times are compared on")
    subscribers_away: int = Field(0, description="subscribers that went away")
    returned: int = Field(0, description="... and were back before the run ended")
    sessions_present: int = Field(0, description="returns whose CONNACK said the session "
                                                 "was kept (session present)")
    first_sessions_present: int = Field(
        0, description="first CONNACKs (before any absence) that said a session was "
                       "present already: one left by an earlier run with the same id")
    published_away: int = 0
    delivered_live: int = 0
    delivered_late: int = 0
    lost_live: int = 0
    lost_away: int = Field(0, description="published while away and never delivered: "
                                          "what QoS 0 loses, what a kept QoS 1/2 session "
                                          "must not")
    duplicates: int = 0
    away_s: Distribution = Field(default_factory=Distribution,
                                 description="per subscriber, in seconds")
    reconnect_connack_us: Distribution = Field(
        default_factory=Distribution, description="the return's CONNECT to its CONNACK")
    backlog_drained_ms: Distribution = Field(
        default_factory=Distribution,
        description="per subscriber with a late message: back on its stream to the last "
                    "late message delivered")
    subscribers: list[AwaySubscriber] = Field(default_factory=list)


def away_facts(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Pass 1's away rows by (run, subscriber)."""
    return {(row["run_id"], row["receiver"]): row for row in rows}


def away_subscribers(facts: Mapping[tuple[str, str], Mapping[str, Any]],
                     windows: Mapping[str, Sequence[AwayWindow]]) -> list[AwaySubscriber]:
    """Each subscriber that went away in ``windows`` (run id -> absences), with its counts
    (none counted when its run's events had no publish)."""
    found = []
    for run_id, of_run in windows.items():
        for w in first_absences(of_run):
            row = facts.get((run_id, w.client_id), {})
            counts = {name: int(row.get(name) or 0) for name in _COUNTS}
            last_late = row.get("last_late_ns")
            found.append(AwaySubscriber(
                run_id=run_id, client_id=w.client_id, qos=w.qos, persistent=w.persistent,
                session_present=w.session_present,
                away_s=None if w.t_back_ns is None else (w.t_back_ns - w.t_lost_ns) / 1e9,
                published=counts["published"], published_away=counts["published_away"],
                delivered_live=counts["delivered_live"],
                delivered_late=counts["delivered_late"],
                lost_live=counts["published"] - counts["published_away"]
                - counts["delivered_live"],
                lost_away=counts["published_away"] - counts["delivered_late"],
                duplicates=counts["duplicates"],
                backlog_drained_ms=None if last_late is None or w.t_back_ns is None
                else (int(last_late) - w.t_back_ns) / 1e6))
    return found


def session_figures(facts: Mapping[tuple[str, str], Mapping[str, Any]],
                    windows: Mapping[str, Sequence[AwayWindow]]) -> SessionFigures | None:
    """The sessions block of a level from its runs' absences (run id -> windows, the
    persistent-session runs only); None when none of them went away."""
    subscribers = away_subscribers(facts, windows)
    if not subscribers:
        return None
    firsts = {(run_id, w.client_id): w for run_id, of_run in windows.items()
              for w in first_absences(of_run)}
    returns = [w for w in firsts.values() if w.t_connack_ns is not None]
    return SessionFigures(
        subscribers_away=len(subscribers), returned=len(returns),
        sessions_present=sum(bool(w.session_present) for w in returns),
        first_sessions_present=sum(bool(w.first_session_present) for w in firsts.values()),
        **{name: sum(getattr(s, name) for s in subscribers) for name in (
            "published_away", "delivered_live", "delivered_late", "lost_live", "lost_away",
            "duplicates")},
        away_s=value_distribution([s.away_s for s in subscribers]),
        reconnect_connack_us=phase_distribution([w.connack_ns for w in returns]),
        backlog_drained_ms=value_distribution([s.backlog_drained_ms for s in subscribers]),
        subscribers=subscribers)


def value_distribution(values: Sequence[float | None]) -> Distribution:
    """count, mean, sample std, exact percentiles and max of values in their own unit (the
    rule of :func:`~mqttbed.analytics.connections.phase_distribution`), None left out."""
    ordered = sorted(v for v in values if v is not None)
    n = len(ordered)
    if n == 0:
        return Distribution()
    mean = math.fsum(ordered) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in ordered) / (n - 1)) if n > 1 else None
    by_rank = dict(enumerate(ordered))
    return Distribution(count=n, mean=mean, std=std, max=ordered[-1],
                        **{name: quantile_at(by_rank, n, q) for name, q in PERCENTILES.items()})
