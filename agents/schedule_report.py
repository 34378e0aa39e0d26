"""How open-loop publishers kept their schedule: one definition for every session.

A publisher kept its rate when it sent every message and at least
:data:`RATE_KEPT_FRACTION` of its rate, the rate achieved being its messages over (last
send - first intended time + one period): a backlog it never caught up shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mqttbed.core.protocol import ClientAssignment

RATE_KEPT_FRACTION = 0.95


@dataclass(frozen=True)
class PublisherProgress:
    """What one open-loop publisher did of its schedule."""

    spec: ClientAssignment
    sent: int
    first_intended_ns: int | None
    last_pub_ns: int
    send_lag_max_ns: int


def schedule_fields(publishers: Iterable[PublisherProgress]) -> dict[str, Any]:
    """The schedule's fields of a :class:`~mqttbed.core.protocol.GeneratorReport`."""
    progress = list(publishers)
    achieved, behind, unsent = 0.0, [], 0
    for p in progress:
        spec = p.spec
        unsent += max(spec.messages - p.sent, 0)
        rate = 0.0
        if p.sent and p.first_intended_ns is not None:
            span_ns = p.last_pub_ns - p.first_intended_ns + 1e9 / spec.rate_hz
            rate = p.sent * 1e9 / span_ns
        achieved += rate
        if p.sent < spec.messages or rate < RATE_KEPT_FRACTION * spec.rate_hz:
            behind.append(spec.client_id)
    return {"open_loop_publishers": len(progress),
            "requested_msgs_per_s": sum(p.spec.rate_hz for p in progress),
            "achieved_msgs_per_s": achieved,
            "send_lag_max_ns": max((p.send_lag_max_ns for p in progress), default=0),
            "messages_unsent": unsent, "publishers_behind": behind[:100],
            "rate_kept": not behind}
