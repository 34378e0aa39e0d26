"""Reconnect storms (``workload.reconnect``): the broker restarted mid-run, every client
back with backoff, and what the outage cost each kind of subscriber.

The backend reports each restart as a fault (``RunRecord.faults``): when the stop began
and when the broker listened again, on the controller's clock. Each client's agent
records its loss and its way back (:mod:`mqttbed.analytics.sessions`'
:class:`~mqttbed.analytics.sessions.AwayWindow`, also on the controller's clock): the
attempts its exponential backoff took and the CONNACK that ended them. From these, per run
or pooled over a point's done runs:

- the time until each client was back (its CONNACK), from the restart and from the broker
  listening again, and until every client was (per run: the last of them);
- the time until the stream flowed again for each subscriber: its first delivery of a
  message sent after the restart began;
- the attempts per client; the returns with the session kept (persistent subscribers of a
  broker that keeps sessions across a restart) and those that subscribed again;
- per kind of subscriber (QoS, persistent or clean session), what was published during its
  outage (from its loss until it was back on its stream) and what of it was delivered or
  lost: what QoS 0 loses against what a persistent QoS 1 session keeps. Publishers send
  nothing while they are away themselves (their skipped messages are counted apart).

The outage counts come from pass 1's away rows (:func:`mqttbed.analytics.sessions.
away_rows`); the rest from the run record, in plain Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.analytics.sessions import AwayWindow, away_subscribers, value_distribution
from mqttbed.core.sections import Distribution

Restart = tuple[int, int | None]   # (stop began, listening again), controller's clock, ns


class OutageCounts(BaseModel):
    """One kind of subscriber (QoS, session) through the outage: exact counts."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    qos: int
    persistent: bool
    subscribers: int = 0
    published_during_outage: int = Field(0, description="sent from each subscriber's loss "
                                                         "until it was back on its stream")
    delivered: int = Field(0, description="... delivered to it (late)")
    lost: int = Field(0, description="... never delivered")
    lost_outside_outage: int = Field(0, description="sent while it was connected, lost")
    duplicates: int = 0


class ReconnectFigures(BaseModel):
    """The broker restarted mid-run and every client came back (of a run, or pooled over a
    point's done runs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    clock: str = Field("controller CLOCK_MONOTONIC (agents' offsets taken off)")
    restarts: int = Field(0, description="broker restarts done")
    down_s: Distribution = Field(default_factory=Distribution,
                                 description="per restart: the stop to listening again")
    clients: int = Field(0, description="clients whose connection the restart took")
    clients_back: int = Field(0, description="... back (CONNACK) before the run ended")
    attempts: Distribution = Field(default_factory=Distribution,
                                   description="connects per client until one was accepted")
    back_after_restart_ms: Distribution = Field(
        default_factory=Distribution, description="per client: the restart to its CONNACK")
    back_after_listening_ms: Distribution = Field(
        default_factory=Distribution,
        description="per client: the broker listening again to its CONNACK (its backoff's "
                    "cost)")
    all_back_after_restart_ms: Distribution = Field(
        default_factory=Distribution, description="per run: the restart to its last "
                                                  "client's CONNACK")
    all_back_after_listening_ms: Distribution = Field(
        default_factory=Distribution, description="per run: listening again to the last "
                                                  "client's CONNACK")
    stream_resumed_ms: Distribution = Field(
        default_factory=Distribution,
        description="per subscriber: the restart to its first delivery of a message sent "
                    "after it")
    subscribers_not_resumed: int = Field(0, description="subscribers that received nothing "
                                                        "sent after the restart")
    sessions_present: int = Field(0, description="returns whose CONNACK said the session "
                                                 "was kept")
    resubscribed: int = Field(0, description="returns that subscribed again")
    publishes_skipped: int = Field(0, description="publishes due while their publisher was "
                                                  "away: not sent")
    publishes_abandoned: int = Field(0, description="QoS 1/2 publishes in flight when their "
                                                    "publisher's connection went")
    outage: list[OutageCounts] = Field(default_factory=list,
                                       description="per kind of subscriber")


def reconnect_figures(facts: Mapping[tuple[str, str], Mapping[str, Any]],
                      windows: Mapping[str, Sequence[AwayWindow]],
                      restarts: Mapping[str, Sequence[Restart]]) -> ReconnectFigures | None:
    """The reconnect block of a level (run id -> its absences, run id -> its restarts, the
    reconnect-storm runs only); None when none of its runs restarted the broker."""
    runs = [run_id for run_id in windows if restarts.get(run_id)]
    if not runs:
        return None
    back_restart, back_listening, all_restart, all_listening, attempts = [], [], [], [], []
    resumed: list[float | None] = []
    clients = back = present = again = skipped = abandoned = not_resumed = 0
    downs: list[float | None] = []
    for run_id in runs:
        t_restart, t_up = restarts[run_id][0]
        downs += [None if until is None else (until - at) / 1e9 for at, until in restarts[run_id]]
        lost = [w for w in windows[run_id] if w.t_lost_ns >= t_restart]
        clients += len({w.client_id for w in lost})
        firsts = {w.client_id: w for w in reversed(lost)}   # each client's first, after it
        returned = [w for w in firsts.values() if w.t_connack_ns is not None]
        back += len(returned)
        present += sum(bool(w.session_present) for w in returned)
        again += sum(w.resubscribed for w in returned)
        skipped += sum(w.publishes_skipped for w in lost)
        abandoned += sum(w.publishes_abandoned for w in lost)
        attempts += [float(w.attempts) for w in firsts.values()]
        times = [w.t_connack_ns for w in returned if w.t_connack_ns is not None]
        back_restart += [(t - t_restart) / 1e6 for t in times]
        if t_up is not None:
            back_listening += [(t - t_up) / 1e6 for t in times]
        if times and len(returned) == len(firsts):
            all_restart.append((max(times) - t_restart) / 1e6)
            if t_up is not None:
                all_listening.append((max(times) - t_up) / 1e6)
        for w in firsts.values():
            if w.role != "subscriber":
                continue
            first = facts.get((run_id, w.client_id), {}).get("first_after_ns")
            resumed.append(None if first is None else (int(first) - t_restart) / 1e6)
            not_resumed += first is None
    return ReconnectFigures(
        restarts=sum(len(restarts[run_id]) for run_id in runs),
        down_s=value_distribution(downs), clients=clients, clients_back=back,
        attempts=value_distribution(attempts),
        back_after_restart_ms=value_distribution(back_restart),
        back_after_listening_ms=value_distribution(back_listening),
        all_back_after_restart_ms=value_distribution(all_restart),
        all_back_after_listening_ms=value_distribution(all_listening),
        stream_resumed_ms=value_distribution(resumed),
        subscribers_not_resumed=not_resumed, sessions_present=present, resubscribed=again,
        publishes_skipped=skipped, publishes_abandoned=abandoned,
        outage=_outage(facts, {run_id: windows[run_id] for run_id in runs}))


def _outage(facts: Mapping[tuple[str, str], Mapping[str, Any]],
            windows: Mapping[str, Sequence[AwayWindow]]) -> list[OutageCounts]:
    """The subscribers' outage counts, per (QoS, persistent), in that order."""
    kinds: dict[tuple[int, bool], dict[str, int]] = {}
    for s in away_subscribers(facts, windows):
        counts = kinds.setdefault((s.qos, s.persistent), dict.fromkeys(
            ("subscribers", "published_during_outage", "delivered", "lost",
             "lost_outside_outage", "duplicates"), 0))
        counts["subscribers"] += 1
        counts["published_during_outage"] += s.published_away
        counts["delivered"] += s.delivered_late
        counts["lost"] += s.lost_away
        counts["lost_outside_outage"] += s.lost_live
        counts["duplicates"] += s.duplicates
    return [OutageCounts(qos=qos, persistent=persistent, **counts)
            for (qos, persistent), counts in sorted(kinds.items())]
