"""The report's view of persistent sessions and reconnect storms (``workload.sessions``,
``workload.reconnect``).

Shown when a point has a ``sessions`` or ``reconnect`` section: for sessions, what the
subscribers that went away got of the stream (delivered live, late, lost while away or
while connected, duplicated) and how soon the backlog was drained after their return; for
a storm, how soon the clients were back after the broker's restart (each, and the last of
them, from the restart and from the broker listening again), when the stream flowed again,
and per kind of subscriber what the outage cost. Each also as a table in the report's
section-table form. A campaign without them reports as before.
"""

from __future__ import annotations

from typing import Any

from mqttbed.analytics.results import PointStats
from mqttbed.core.sections import Distribution

SESSIONS_NOTE = ("Per subscriber that went away, every message of the run classified by its "
                 "send time against the absence (the connection gone to the return's "
                 "CONNACK with the session kept, else its SUBACK); times on the controller's "
                 "clock. QoS 0 loses what was sent while away: counted, not a failure.")
RECONNECT_NOTE = ("The broker stopped (SIGTERM) and started again on the same listener; "
                  "clients reconnect with exponential backoff (no jitter). Outage: from a "
                  "subscriber's loss until it was back on its stream; publishers send "
                  "nothing while away (skipped, counted).")


def _bars(name: str, x: list[str], values: list[Distribution]) -> dict[str, Any]:
    """p50 bars whose error bar reaches up to the p99, in the values' unit."""
    return {"type": "bar", "name": f"{name} p50 (bar to p99)", "x": x,
            "y": [d.p50 for d in values],
            "error_y": {"type": "data", "symmetric": False,
                        "array": [0 if d.p50 is None or d.p99 is None else d.p99 - d.p50
                                  for d in values],
                        "arrayminus": [0] * len(values)}}


def away_figures(points: list[PointStats], labels: dict[int, str]
                 ) -> dict[str, dict[str, Any]]:
    """The report's plots (by element id) of the points' sessions and storms; none
    without."""
    figures: dict[str, dict[str, Any]] = {}
    sessions = [p for p in points if p.sessions is not None]
    if sessions:
        names = [labels[p.point_index] for p in sessions]
        counts = [("delivered live", "delivered_live"), ("delivered late", "delivered_late"),
                  ("lost while away", "lost_away"), ("lost while connected", "lost_live"),
                  ("duplicated", "duplicates")]
        figures["plot-sessions-counts"] = {"data": [
            {"type": "bar", "name": heading, "x": names,
             "y": [getattr(p.sessions, field) for p in sessions]} for heading, field in counts],
            "layout": {"title": {"text": "Persistent sessions: the stream of the subscribers "
                                         "that went away"},
                       "barmode": "stack", "yaxis": {"title": {"text": "messages"}}}}
        figures["plot-sessions-drain"] = {"data": [
            _bars("backlog drained after the return", names,
                  [p.sessions.backlog_drained_ms for p in sessions if p.sessions])],
            "layout": {"title": {"text": "Persistent sessions: the return's CONNACK to the "
                                         "last late message"},
                       "yaxis": {"title": {"text": "ms"}}}}
    storms = [p for p in points if p.reconnect is not None]
    if storms:
        names = [labels[p.point_index] for p in storms]
        figures["plot-reconnect-back"] = {"data": [
            _bars("client back after the restart", names,
                  [p.reconnect.back_after_restart_ms for p in storms if p.reconnect]),
            _bars("client back after listening again", names,
                  [p.reconnect.back_after_listening_ms for p in storms if p.reconnect]),
            _bars("stream again (first delivery sent after the restart)", names,
                  [p.reconnect.stream_resumed_ms for p in storms if p.reconnect])],
            "layout": {"title": {"text": "Reconnect storm: the broker restarted, the clients "
                                         "back"},
                       "barmode": "group", "yaxis": {"title": {"text": "ms"}}}}
    return figures


def away_tables(points: list[tuple[str, PointStats]]) -> list[dict[str, Any]]:
    """The sessions and storm tables, in the report's section-table form (none without)."""
    tables = []
    sessions = [(label, p.sessions) for label, p in points if p.sessions is not None]
    if sessions:
        tables.append({
            "key": "sessions", "title": "Persistent sessions", "note": SESSIONS_NOTE,
            "columns": ["away", "returned", "session present", "sent while away",
                        "delivered late", "lost while away", "delivered live",
                        "lost while connected", "duplicated", "away s p50",
                        "reconnect CONNACK µs p50", "backlog drained ms p50", "p99"],
            "rows": [{"label": label, "cells": [
                s.subscribers_away, s.returned, s.sessions_present, s.published_away,
                s.delivered_late, s.lost_away, s.delivered_live, s.lost_live, s.duplicates,
                s.away_s.p50, s.reconnect_connack_us.p50, s.backlog_drained_ms.p50,
                s.backlog_drained_ms.p99]} for label, s in sessions]})
    storms = [(label, p.reconnect) for label, p in points if p.reconnect is not None]
    if storms:
        tables.append({
            "key": "reconnect", "title": "Reconnect storm", "note": RECONNECT_NOTE,
            "columns": ["restarts", "down s", "clients", "back", "attempts p50", "max",
                        "all back after restart ms", "after listening ms",
                        "stream again ms p50", "session present", "subscribed again",
                        "publishes skipped", "in flight given up"],
            "rows": [{"label": label, "cells": [
                r.restarts, r.down_s.mean, r.clients, r.clients_back, r.attempts.p50,
                r.attempts.max, r.all_back_after_restart_ms.max,
                r.all_back_after_listening_ms.max, r.stream_resumed_ms.p50,
                r.sessions_present, r.resubscribed, r.publishes_skipped,
                r.publishes_abandoned]} for label, r in storms]})
        tables.append({
            "key": "reconnect-outage", "title": "Reconnect storm: what each kind of "
                                                 "subscriber lost of the outage",
            "note": "Sent during each subscriber's outage: delivered (late) or lost.",
            "columns": ["subscribers", "sent during outage", "delivered", "lost",
                        "lost outside the outage", "duplicated"],
            "rows": [{"label": f"{label}: QoS {kind.qos}, "
                               f"{'persistent' if kind.persistent else 'clean'} session",
                      "cells": [kind.subscribers, kind.published_during_outage,
                                kind.delivered, kind.lost, kind.lost_outside_outage,
                                kind.duplicates]}
                     for label, r in storms for kind in r.outage]})
    return tables
