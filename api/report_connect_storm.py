"""The report's view of connection storms (``connect_storm`` in the results): a table row
per point (connects made and failed by reason, the rate asked and achieved, the broker's
memory per held connection) and two figures: each connect from its intended time, phase
by phase, and the rate achieved against the one asked. A campaign without a storm reports
exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqttbed.analytics.connect_storm import FAILURES, ConnectStormFigures
from mqttbed.analytics.connections import CONNECT_CLOCK
from mqttbed.analytics.results import PointStats
from mqttbed.core.sections import Distribution

# (heading, the figure): how long after its intended time a connect reached each phase
FROM_INTENDED: tuple[tuple[str, Callable[[ConnectStormFigures], Distribution]], ...] = (
    ("connect() called", lambda s: s.connect_lag_us),
    ("TCP established", lambda s: s.tcp_from_intended_us),
    ("TLS done", lambda s: s.tls_from_intended_us),
    ("WebSocket 101", lambda s: s.websocket_from_intended_us),
    ("CONNACK", lambda s: s.connack_from_intended_us))
NOTE = ("Each storm client's connect, timed by its agent on the agent's CLOCK_MONOTONIC in "
        "user space from the client's intended connect time (client k at k / rate_hz): a "
        "storm that falls behind its schedule shows it in the connect() lag, as the send lag "
        "does for publishes. Failures by reason: connack (refused by CONNACK, codes in the "
        "results), refused (TCP RST), reset, closed (before CONNACK), timeout, tls, "
        "websocket, other, pending (never opened). Achieved rate: connects accepted over "
        "(last CONNACK - first intended time + one period). Broker bytes per connection: "
        "its RSS while every connection was held (median of its resource samples) minus "
        "the last sample before the storm, over the connections held.")


def connect_storm_tables(points: list[tuple[str, PointStats]]) -> list[dict[str, Any]]:
    """The storm table, in the report's section-table form (none without a storm)."""
    storms = [(label, p.connect_storm) for label, p in points if p.connect_storm is not None]
    if not storms:
        return []
    reasons = [why for why in FAILURES if any(s.failures.get(why) for _, s in storms)]
    columns = ["clients", "connected", *(f"failed: {why}" for why in reasons),
               "lost while held", "requested /s", "achieved /s", "connect() lag p99 µs",
               "CONNACK from intended p50 µs", "p99 µs", "broker bytes per connection"]
    rows = []
    for label, s in storms:
        memory = s.broker_memory
        rows.append({"label": label, "cells": [
            s.clients, s.connected, *(s.failures.get(why, 0) for why in reasons),
            s.lost_while_held, s.requested_connects_per_s, s.achieved_connects_per_s,
            s.connect_lag_us.p99, s.connack_from_intended_us.p50,
            s.connack_from_intended_us.p99,
            None if memory is None else memory.bytes_per_connection]})
    return [{"key": "connect-storm", "title": "Connection storm", "note": NOTE,
             "columns": columns, "rows": rows}]


def connect_storm_figures(points: list[PointStats], labels: dict[int, str]
                          ) -> dict[str, dict[str, Any]]:
    """The storm's figures by plot id: connect phases from the intended time (p50 bars,
    error bars to p99) and the rate achieved beside the one asked; none without a storm."""
    storms = [p for p in points if p.connect_storm is not None]
    if not storms:
        return {}
    names = [labels[p.point_index] for p in storms]
    figures = [p.connect_storm for p in storms if p.connect_storm is not None]
    phases = []
    for heading, of in FROM_INTENDED:
        values = [of(s) for s in figures]
        if not any(d.count for d in values):
            continue  # e.g. TLS in a storm over plain TCP
        phases.append({"type": "bar", "name": f"{heading} p50 (bar to p99)", "x": names,
                       "y": [d.p50 for d in values],
                       "error_y": {"type": "data", "symmetric": False,
                                   "array": [0 if d.p50 is None or d.p99 is None
                                             else d.p99 - d.p50 for d in values],
                                   "arrayminus": [0] * len(values)}})
    rate = [{"type": "bar", "name": "requested", "x": names,
             "y": [s.requested_connects_per_s for s in figures]},
            {"type": "bar", "name": "achieved", "x": names,
             "y": [s.achieved_connects_per_s for s in figures]}]
    return {
        "plot-connect-storm-latency": {"data": phases, "layout": {
            "title": {"text": f"Storm: each connect from its intended time ({CONNECT_CLOCK})"},
            "barmode": "group", "yaxis": {"title": {"text": "µs"}, "type": "log"}}},
        "plot-connect-storm-rate": {"data": rate, "layout": {
            "title": {"text": "Storm: connects per second, requested (none: all at once) "
                              "and achieved"},
            "barmode": "group", "yaxis": {"title": {"text": "connects/s"}}}}}
