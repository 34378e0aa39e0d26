"""The report's view of how clients connected: a row per point, a bar per connect phase.

Shown when a point has connection figures (``connections`` in the results: the agents
timed each client's TCP connect, TLS handshake, WebSocket upgrade and CONNECT -> CONNACK);
a campaign without them reports exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqttbed.analytics.connections import CONNECT_CLOCK, ConnectionFigures
from mqttbed.analytics.results import PointStats
from mqttbed.core.sections import Distribution

# (heading in the report, the phase's figures), in the order a connection goes through them
CONNECT_PHASES: tuple[tuple[str, Callable[[ConnectionFigures], Distribution]], ...] = (
    ("TCP connect", lambda c: c.tcp_connect_us),
    ("TLS handshake", lambda c: c.tls_handshake_us),
    ("WebSocket upgrade", lambda c: c.websocket_upgrade_us),
    ("CONNECT → CONNACK", lambda c: c.connack_us))


def connection_rows(points: list[tuple[str, PointStats]]) -> list[dict[str, Any]]:
    """A row per (label, point) with connection figures: each phase's count, p50 and p99."""
    rows = []
    for label, point in points:
        if (figures := point.connections) is None:
            continue
        rows.append({"label": label, "connections": figures.connections,
                     "without_connack": figures.without_connack,
                     "phases": [of(figures) for _, of in CONNECT_PHASES]})
    return rows


def connection_figure(points: list[PointStats], labels: dict[int, str]
                      ) -> dict[str, Any] | None:
    """Each connect phase's p50 per point as bars, the error bar reaching up to its p99;
    None when no point has connection figures. A phase no point went through (e.g. TLS in
    a campaign over plain TCP) draws no bars."""
    timed = [p for p in points if p.connections is not None]
    if not timed:
        return None
    names = [labels[p.point_index] for p in timed]
    data = []
    for heading, of in CONNECT_PHASES:
        phases = [of(p.connections) for p in timed if p.connections is not None]
        if not any(d.count for d in phases):
            continue
        data.append({"type": "bar", "name": f"{heading} p50 (bar to p99)", "x": names,
                     "y": [d.p50 for d in phases],
                     "error_y": {"type": "data", "symmetric": False,
                                 "array": [0 if d.p50 is None or d.p99 is None
                                           else d.p99 - d.p50 for d in phases],
                                 "arrayminus": [0] * len(phases)}})
    return {"data": data, "layout": {
        "title": {"text": f"Connect phases per client ({CONNECT_CLOCK})"},
        "barmode": "group", "yaxis": {"title": {"text": "µs"}}}}
