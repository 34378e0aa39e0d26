"""RTT queries: the latency detector of the cloud-edge paper's broker (seed 003, Fig. 4).

Every ``rtt_query_period_s`` (the paper's ``TQ``) the broker sends each queried
subscriber a QoS 1 PUBLISH of ``rtt_query_bytes`` on :data:`QUERY_TOPIC`; the time from
writing it to the socket to the subscriber's PUBACK, on CLOCK_MONOTONIC, is one RTT
sample, ``RTT_latest`` of Eq. 1. The paper had a co-hosted publisher send the queries to
subscribers of a ``latency`` topic; here the broker sends them itself (no extra client,
no publisher-to-broker hop in the samples).

A query without an answer after ``timeout_s`` is given up (counted, its packet identifier
freed; a PUBACK arriving later is ignored): the subscriber keeps its last RTT estimate,
stale, and keeps being served. One that never answered has no estimate, and every
policy sends on no estimate (:meth:`~mqttbed.core.withholding.Withholding.sends_now`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

QUERY_TOPIC = "$adaptive/rtt"
RESERVED_PREFIX = "$adaptive/"   # clients cannot publish here (nobody can forge a query)
_QUERY_MAGIC = b"mqttbed-rtt-query"


def query_payload(size: int) -> bytes:
    """The payload of every RTT query: a marker, then zeros up to ``size`` bytes."""
    return _QUERY_MAGIC[:size] + bytes(max(0, size - len(_QUERY_MAGIC)))


@dataclass
class RttProbe:
    """One subscriber's queries in flight and its latest RTT."""

    timeout_ns: int
    outstanding: dict[int, int] = field(default_factory=dict)  # packet id -> sent at (ns)
    latest_s: float | None = None
    sent: int = 0
    answered: int = 0
    timed_out: int = 0

    def written(self, packet_id: int, now_ns: int) -> None:
        """The query with ``packet_id`` was handed to the socket at ``now_ns``."""
        self.outstanding[packet_id] = now_ns
        self.sent += 1

    def answer(self, packet_id: int, now_ns: int) -> float | None:
        """The PUBACK for ``packet_id`` came: the RTT in seconds, or None if not a query."""
        sent_ns = self.outstanding.pop(packet_id, None)
        if sent_ns is None:
            return None
        self.answered += 1
        self.latest_s = (now_ns - sent_ns) / 1e9
        return self.latest_s

    def expire(self, now_ns: int) -> list[int]:
        """Give up the queries older than the timeout; return their packet identifiers."""
        expired = [pid for pid, sent_ns in self.outstanding.items()
                   if now_ns - sent_ns >= self.timeout_ns]
        for packet_id in expired:
            del self.outstanding[packet_id]
        self.timed_out += len(expired)
        return expired
