"""RTT queries: the latency detector of the cloud-edge paper's broker (seed 003, Fig. 4).

Every ``rtt_query_period_s`` (the paper's ``TQ``) the broker sends each queried
subscriber a QoS 1 PUBLISH of ``rtt_query_bytes`` on :data:`QUERY_TOPIC`; the time from
writing it to the socket to the subscriber's PUBACK, on CLOCK_MONOTONIC, is one RTT
sample, ``RTT_latest`` of Eq. 1. The paper had a co-hosted publisher send the queries to
subscribers of a ``latency`` topic; here the broker sends them itself (no extra client,
no publisher-to-broker hop in the samples).

A query without an answer after ``timeout_s`` is counted as timed out; its PUBACK, if it
comes later, is still an RTT sample (a long one: the congestion the policy is there
for). At most :data:`MAX_OUTSTANDING` queries per subscriber are remembered; beyond
that the oldest is given up for good (its packet identifier freed, a later PUBACK
ignored). A subscriber that stops answering keeps its last RTT estimate, stale, and keeps
being served; one that never answered has no estimate, and every policy sends on no
estimate (:meth:`~mqttbed.core.withholding.Withholding.sends_now`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

QUERY_TOPIC = "$adaptive/rtt"
RESERVED_PREFIX = "$adaptive/"   # clients cannot publish here (nobody can forge a query)
_QUERY_MAGIC = b"mqttbed-rtt-query"
MAX_OUTSTANDING = 64


def query_payload(size: int) -> bytes:
    """The payload of every RTT query: a marker, then zeros up to ``size`` bytes."""
    return _QUERY_MAGIC[:size] + bytes(max(0, size - len(_QUERY_MAGIC)))


@dataclass
class RttProbe:
    """One client's queries in flight, its RTT samples and latest RTT (kept across its
    connections: a client that reconnects keeps its estimate)."""

    timeout_ns: int
    outstanding: dict[int, int] = field(default_factory=dict)  # packet id -> sent at (ns)
    latest_s: float | None = None
    sent: int = 0
    answered: int = 0
    answered_late: int = 0    # after the timeout
    timed_out: int = 0
    given_up: int = 0         # forgotten: more than MAX_OUTSTANDING unanswered
    samples_ms: list[float] = field(default_factory=list)
    _late: set[int] = field(default_factory=set)   # outstanding ids already timed out

    def written(self, packet_id: int, now_ns: int) -> None:
        """The query with ``packet_id`` was handed to the socket at ``now_ns``."""
        if len(self.outstanding) >= MAX_OUTSTANDING:
            oldest = next(iter(self.outstanding))
            del self.outstanding[oldest]
            self._late.discard(oldest)
            self.given_up += 1
        self.outstanding[packet_id] = now_ns
        self.sent += 1

    def answer(self, packet_id: int, now_ns: int) -> float | None:
        """The PUBACK for ``packet_id`` came: the RTT in seconds, or None if not a query."""
        sent_ns = self.outstanding.pop(packet_id, None)
        if sent_ns is None:
            return None
        self.answered += 1
        if packet_id in self._late:
            self._late.discard(packet_id)
            self.answered_late += 1
        self.latest_s = (now_ns - sent_ns) / 1e9
        self.samples_ms.append(self.latest_s * 1e3)
        return self.latest_s

    def new_connection(self) -> None:
        """The client connected again: the old connection's queries will never be answered."""
        self.given_up += len(self.outstanding)
        self.outstanding.clear()
        self._late.clear()

    def counts(self) -> dict[str, int]:
        """Queries sent, answered (late ones among them), timed out, given up."""
        return {"sent": self.sent, "answered": self.answered,
                "answered_late": self.answered_late, "timed_out": self.timed_out,
                "given_up": self.given_up}

    def expire(self, now_ns: int) -> int:
        """Count the queries that just passed the timeout unanswered; return how many."""
        late = [pid for pid, sent_ns in self.outstanding.items()
                if pid not in self._late and now_ns - sent_ns >= self.timeout_ns]
        self._late.update(late)
        self.timed_out += len(late)
        return len(late)
