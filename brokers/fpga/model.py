"""The FPGA MQTT broker's behaviour, one datagram in, the datagrams it sends out.

Sockets live in :mod:`mqttbed.brokers.fpga.server`; this module is the broker's logic
only, so tests can drive it byte for byte. What it does per packet (MQTT 3.1.1, one
packet per UDP datagram, seed 000 section 5):

- CONNECT: CONNACK 0 (accepted); protocol level other than 4 gets CONNACK 1. No session
  state is kept: the hardware has no connection table, a client is its address and port.
  A will is accepted and ignored (the hardware has no will), and counted.
- SUBSCRIBE: per filter, the subscriber is added to the tables (ID = count + 1) and
  granted QoS 0 (the only QoS the hardware has); a filter the hardware cannot serve
  (``+``, a bare ``#``, ``#`` not last) or a table that refuses the entry gets 0x80.
- PUBLISH: looked up under the topic and each rewritten prefix; one QoS 0 copy, retain
  flag cleared, to every destination found. QoS 1/2 PUBLISHes are forwarded at QoS 0 and
  not acknowledged; retain is not stored; both counted.
- UNSUBSCRIBE: tombstones the entry (see :mod:`.tables`); UNSUBACK always (3.10.4).
- PINGREQ: PINGRESP. DISCONNECT: the address's subscriptions are removed (MQTT 3.1.1
  clean session; without it a later process bound to the same port would receive them).
  This needs an address-to-filters index the paper's tables do not have; it is the
  model's, not the hardware's.
- Anything that is not one well-formed MQTT 3.1.1 packet is dropped and counted;
  well-formed packets a broker never receives (CONNACK, SUBACK, PUBACK, ...) likewise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mqttbed.brokers.fpga.tables import Address, Destination, TopicTables, filter_refusal
from mqttbed.core.mqtt_codec import (
    SUBACK_FAILURE,
    ConnAck,
    ConnackCode,
    Connect,
    Disconnect,
    MalformedPacket,
    PingReq,
    PingResp,
    Publish,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    decode,
    encode,
    encode_publish,
)

PROTOCOL_LEVEL_311 = 4
MALFORMED = "malformed"
UNSUPPORTED = "unsupported"


@dataclass(slots=True)
class Outcome:
    """What the broker does with one datagram: ``packet`` sent to each destination."""

    kind: str                                   # packet type, MALFORMED or UNSUPPORTED
    packet: bytes | None = None
    destinations: list[Destination] = field(default_factory=list)
    reason: str | None = None                   # why a datagram was dropped

    @property
    def addresses(self) -> list[Address]:
        return [d.address for d in self.destinations]


class BrokerModel:
    """The broker's state (its two tables) and what it answers to each datagram."""

    def __init__(self, tables: TopicTables | None = None):
        self.tables = tables or TopicTables()
        self.counters: Counter[str] = Counter()
        self.malformed_reasons: Counter[str] = Counter()
        self._filters_of: dict[Address, set[str]] = {}

    def handle(self, datagram: bytes, source: Address) -> Outcome:
        """Return what the broker sends for ``datagram`` received from ``source``."""
        try:
            packet = decode(datagram)
        except MalformedPacket as exc:
            self.counters["dropped_malformed"] += 1
            # Reasons keep their rule, not their values, so the counter stays small.
            self.malformed_reasons[str(exc).split(" (")[0][:80]] += 1
            return Outcome(MALFORMED, reason=str(exc))
        kind = type(packet)
        if type(packet) is Publish:
            return self._publish(packet)
        if type(packet) is Subscribe:
            return self._subscribe(packet, source)
        if type(packet) is Connect:
            return self._connect(packet, source)
        if kind is PingReq:
            self.counters["pingreq"] += 1
            return _reply("pingreq", encode(PingResp()), source)
        if type(packet) is Unsubscribe:
            return self._unsubscribe(packet, source)
        if kind is Disconnect:
            self.counters["disconnect"] += 1
            for topic_filter in self._filters_of.pop(source, set()):
                self.tables.unsubscribe(topic_filter, source)
            return Outcome("disconnect")
        self.counters["dropped_unsupported"] += 1
        return Outcome(UNSUPPORTED, reason=f"{kind.__name__} is not a packet a broker serves")

    def _connect(self, packet: Connect, source: Address) -> Outcome:
        self.counters["connect"] += 1
        if packet.will is not None:
            self.counters["will_ignored"] += 1
        code = (ConnackCode.ACCEPTED if packet.protocol_level == PROTOCOL_LEVEL_311
                and packet.protocol_name == "MQTT" else ConnackCode.UNACCEPTABLE_PROTOCOL_VERSION)
        if code:
            self.counters["connect_refused"] += 1
        return _reply("connect", encode(ConnAck(code)), source)

    def _subscribe(self, packet: Subscribe, source: Address) -> Outcome:
        self.counters["subscribe"] += 1
        codes = []
        for topic_filter, _requested_qos in packet.filters:
            if filter_refusal(topic_filter) is None and self.tables.subscribe(topic_filter,
                                                                              source):
                self._filters_of.setdefault(source, set()).add(topic_filter)
                codes.append(0)             # granted QoS 0, the hardware's only QoS
            else:
                self.counters["subscribe_refused"] += 1
                codes.append(SUBACK_FAILURE)
        return _reply("subscribe", encode(SubAck(packet.packet_id, tuple(codes))), source)

    def _unsubscribe(self, packet: Unsubscribe, source: Address) -> Outcome:
        self.counters["unsubscribe"] += 1
        held = self._filters_of.get(source, set())
        for topic_filter in packet.filters:
            if self.tables.unsubscribe(topic_filter, source):
                held.discard(topic_filter)
            else:
                self.counters["unsubscribe_unknown"] += 1
        if not held:
            self._filters_of.pop(source, None)
        return _reply("unsubscribe", encode(UnsubAck(packet.packet_id)), source)

    def _publish(self, packet: Publish) -> Outcome:
        self.counters["publish"] += 1
        if packet.qos:
            self.counters["publish_qos_downgraded"] += 1
        if packet.retain:
            self.counters["retain_ignored"] += 1
        destinations = self.tables.destinations(packet.topic)
        if not destinations:
            self.counters["publish_without_subscriber"] += 1
            return Outcome("publish")
        self.counters["publish_copies"] += len(destinations)
        return Outcome("publish", encode_publish(packet.topic, packet.payload), destinations)


def _reply(kind: str, packet: bytes, source: Address) -> Outcome:
    return Outcome(kind, packet, [Destination(source, 0)])
