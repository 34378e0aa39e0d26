"""The adaptive broker's shared state: configuration, routing, RTT queries, housekeeping.

One :class:`AdaptiveBroker` per process, driven by :mod:`.server`'s asyncio loop. It
routes each PUBLISH to the sessions whose filters match its topic (first every queue
gets its entry, and with eager allocation its copy, then every writer runs), sends the
RTT queries every ``rtt_query_period_s`` and re-applies the policy then and at each
RTT sample, and drops clients whose keep-alive ran out.

Who is *queried*, and so withheld from: with ``query_subscribers: all`` every client
with at least one subscription (the query arrives on :data:`~.rtt.QUERY_TOPIC`, which it
did not subscribe to; MQTT clients acknowledge a QoS 1 PUBLISH whatever its topic, and
mqttbed's agents ignore payloads that are not theirs). With ``opted_in``, only clients
subscribed to a filter matching :data:`~.rtt.QUERY_TOPIC` (the paper's SUB1; its other
76 subscribers got first-come-first-serve). Under ``policy: none`` queries are sent as
well, so both arms of a comparison carry the same query traffic; nobody is withheld from.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Literal

from mqttbed.brokers.adaptive.outbox import Message, PayloadLedger
from mqttbed.brokers.adaptive.rtt import QUERY_TOPIC, RESERVED_PREFIX, query_payload
from mqttbed.brokers.adaptive.session import ClientSession
from mqttbed.brokers.adaptive.tally import ClientTally, samples, totals
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.mqtt_codec import Publish
from mqttbed.core.mqttsn import topic_matches
from mqttbed.core.withholding import (
    PAPER_CONGESTION_RATE_PER_S,
    PAPER_QUERY_PERIOD_S,
    PAPER_STARVATION_S,
    PAPER_THRESHOLD_L_S,
    Withholding,
    WithholdingPolicy,
)

logger = logging.getLogger("mqttbed.adaptive")

POLICIES = ("none", "conservative", "probabilistic", "historic")
PAPER_THRESHOLD_BYTES = 10_240
CONNECT_GRACE_S = 10.0      # a connection must send CONNECT within this
REFUSAL_LOG_INTERVAL_S = 1.0


@dataclass(frozen=True)
class BrokerConfig:
    """Everything the broker is configured with (the paper's experiment by default)."""

    policy: Literal["none", "conservative", "probabilistic", "historic"] = "conservative"
    threshold_bytes: int = PAPER_THRESHOLD_BYTES        # threshold_s: larger is "large"
    threshold_l_s: float = PAPER_THRESHOLD_L_S
    starvation_s: float = PAPER_STARVATION_S            # D
    rtt_query_period_s: float = PAPER_QUERY_PERIOD_S    # TQ
    rtt_query_bytes: int = PAPER_THRESHOLD_BYTES        # the paper's 10 KB query
    rtt_query_timeout_s: float = 2 * PAPER_QUERY_PERIOD_S
    congestion_rate_per_s: float = PAPER_CONGESTION_RATE_PER_S   # λ, probabilistic
    latency_scale: float = 1.0
    lazy_allocation: bool = True
    query_subscribers: Literal["all", "opted_in"] = "all"
    max_queued_messages: int = 1000                     # per subscriber; 0: no limit
    max_packet_bytes: int = 16 << 20
    write_buffer_bytes: int = 64 << 10                  # a socket's high-water mark

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r}: must be one of {', '.join(POLICIES)}")
        self.withholding()   # validates the policy's parameters

    def withholding(self) -> Withholding | None:
        """The policy object a queried subscriber's outbox decides with; None: FCFS."""
        if self.policy == "none":
            return None
        return Withholding(WithholdingPolicy(self.policy), self.threshold_l_s,
                           self.rtt_query_period_s, self.starvation_s,
                           self.congestion_rate_per_s, self.latency_scale)


class ProtocolCounters:
    """Connections, bytes, and refusals by reason (logged at most once a second each)."""

    def __init__(self) -> None:
        self.connections = 0
        self.publishes_received = 0
        self.reserved_topic_dropped = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.internal_errors = 0
        self.refused: Counter[str] = Counter()
        self._logged_at: dict[str, float] = {}

    def refuse(self, reason: str, session: ClientSession, detail: str) -> None:
        self.refused[reason] += 1
        now = time.monotonic()
        if now - self._logged_at.get(reason, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
            self._logged_at[reason] = now
            logger.warning("%s from %r: %s (%d so far)", reason, session, detail,
                           self.refused[reason])


class AdaptiveBroker:
    """Sessions, subscriptions and the withholding machinery of one broker process."""

    def __init__(self, config: BrokerConfig):
        self.config = config
        self.policy = config.withholding()
        self.ledger = PayloadLedger(config.lazy_allocation)
        self.protocol = ProtocolCounters()
        self.connections: set[ClientSession] = set()
        self.sessions: dict[str, ClientSession] = {}
        self.tallies: dict[str, ClientTally] = {}      # every client id there was
        self.held_series: list[tuple[int, int]] = []   # (t_ns, held payload bytes)
        self.query_rounds = 0
        self._query = Message(QUERY_TOPIC, query_payload(config.rtt_query_bytes), 1, 0,
                              large=False, counted=False)
        self._client_numbers = itertools.count(1)

    # -- sessions --------------------------------------------------------------------------

    def connection_made(self, session: ClientSession) -> None:
        self.protocol.connections += 1
        self.connections.add(session)

    def new_client_id(self) -> str:
        """An id for a client that sent an empty one (with clean session)."""
        return f"adaptive-{next(self._client_numbers)}"

    def attach(self, session: ClientSession) -> None:
        """``session`` sent CONNECT: it takes its client id over from any older session,
        and the figures counted for that id so far."""
        client_id = session.client_id
        assert client_id is not None
        if (old := self.sessions.get(client_id)) is not None:
            self.protocol.refuse("client id taken over", old, "by a new connection")
            self.detach(old, publish_will=False)   # 3.1.1 3.1.4-2: the old one is disconnected
            old.abort()
        if (tally := self.tallies.get(client_id)) is None:
            self.tallies[client_id] = session.tally
        else:
            session.adopt(tally)
        self.sessions[client_id] = session

    def detach(self, session: ClientSession, publish_will: bool) -> None:
        """``session`` ended: drop its queues, publish its will if it ended abnormally."""
        self.connections.discard(session)
        if session.client_id is None or self.sessions.get(session.client_id) is not session:
            return
        del self.sessions[session.client_id]
        session.outbox.clear()
        if publish_will and session.will is not None:
            will, session.will = session.will, None
            self.route(Publish(will.topic, will.message, will.qos), monotonic_ns())

    def subscriptions_changed(self, session: ClientSession) -> None:
        """Decide again whether ``session`` is queried (and so under the policy)."""
        if self.config.query_subscribers == "all":
            queried = bool(session.subscriptions)
        else:
            queried = any(topic_matches(f, QUERY_TOPIC) for f in session.subscriptions)
        session.queried = queried
        if queried:
            session.outbox.policy = self.policy
        elif session.outbox.policy is not None:
            session.outbox.reconsider(monotonic_ns(), None)   # no estimate: all go
            session.outbox.policy = None
            session.pump()

    # -- messages --------------------------------------------------------------------------

    def route(self, publish: Publish, now_ns: int) -> None:
        """Queue ``publish`` to every matching session, then let their writers run."""
        self.protocol.publishes_received += 1
        if publish.topic.startswith(RESERVED_PREFIX):
            self.protocol.reserved_topic_dropped += 1
            return
        message = Message(publish.topic, publish.payload, publish.qos, now_ns,
                          large=len(publish.payload) > self.config.threshold_bytes)
        targets = []
        for session in self.sessions.values():
            granted = max((qos for topic_filter, qos in session.subscriptions.items()
                           if topic_matches(topic_filter, publish.topic)), default=None)
            if granted is None or session.closing:
                continue
            if session.outbox.offer(message, min(publish.qos, granted), now_ns,
                                    session.probe.latest_s):
                targets.append(session)
        for session in targets:
            session.pump()

    def rtt_sample(self, session: ClientSession, rtt_s: float) -> None:
        """A query was answered: decide again on what ``session`` holds."""
        if session.outbox.reconsider(monotonic_ns(), rtt_s):
            session.pump()

    # -- periodic --------------------------------------------------------------------------

    def query_round(self) -> None:
        """Every ``TQ``: give up old queries, query every queried session, decide again."""
        self.query_rounds += 1
        now_ns = monotonic_ns()
        for session in list(self.sessions.values()):
            if not session.queried or session.closing:
                continue
            session.probe.expire(now_ns)
            session.outbox.offer_query(self._query)
            session.outbox.reconsider(now_ns, session.probe.latest_s)
            session.pump()

    def housekeeping(self) -> None:
        """Drop connections whose keep-alive (or CONNECT grace) ran out; sample held bytes."""
        now_ns = monotonic_ns()
        for session in list(self.connections):
            if session.client_id is None:
                limit_s = CONNECT_GRACE_S
            elif session.keepalive_s:
                limit_s = 1.5 * session.keepalive_s
            else:
                continue
            if now_ns - session.last_heard_ns > limit_s * 1e9 and not session.closing:
                self.protocol.refuse("keep-alive expired", session, f"silent {limit_s:.1f} s")
                self.detach(session, publish_will=True)
                session.abort()
        self.held_series.append((now_ns, self.ledger.held_bytes))

    # -- reports -----------------------------------------------------------------------------

    def counters_snapshot(self) -> dict[str, Any]:
        """Counters and gauges now, in all and per client (written often)."""
        protocol = self.protocol
        return {
            "config": asdict(self.config),
            "connections": protocol.connections,
            "sessions": len(self.sessions),
            "publishes_received": protocol.publishes_received,
            "reserved_topic_dropped": protocol.reserved_topic_dropped,
            "bytes_in": protocol.bytes_in,
            "bytes_out": protocol.bytes_out,
            "internal_errors": protocol.internal_errors,
            "refused": dict(protocol.refused),
            **totals(self.tallies),
            "held_payload_bytes": self.ledger.held_bytes,
            "held_payload_bytes_peak": self.ledger.peak_bytes,
            "payload_copies_made": self.ledger.copies_made,
            "socket_buffered_bytes": sum(
                s.transport.get_write_buffer_size() for s in self.connections
                if s.transport is not None and not s.closing),
            "query_rounds": self.query_rounds,
            "clients": {client_id: self._client_figures(client_id, tally)
                        for client_id, tally in self.tallies.items() if tally.active()},
        }

    def _client_figures(self, client_id: str, tally: ClientTally) -> dict[str, Any]:
        session = self.sessions.get(client_id)
        figures = tally.figures(None if session is None else session.outbox,
                                session is not None and session.queried)
        figures["subscriptions"] = [] if session is None else sorted(session.subscriptions)
        return figures

    def records(self) -> dict[str, Any]:
        """Every sample kept: RTTs, withheld durations (pooled and per client), held bytes
        over time."""
        return {**samples(self.tallies),
                "held_payload_bytes": [list(p) for p in self.held_series]}
