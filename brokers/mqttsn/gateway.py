"""What the MQTT-SN gateway answers to each datagram: sessions, topic ids, fan-out.

The gateway of seed 004's "software broker" (they ran RSMB), written from MQTT-SN 1.2.
A client is its source address; CONNECT opens its session. Topic ids of normal topic
names are gateway-wide (one name, one id, for every client), so one PUBLISH datagram
serves every subscriber of a topic, and a switch that copies it (PAMS) needs to rewrite
addresses only; each session remembers which ids its client has learnt (by REGISTER,
by SUBACK, or from the gateway's REGISTER before the first PUBLISH on a topic that
matched a wildcard filter), and a PUBLISH to a client waits for its REGACK.

Implemented: CONNECT/CONNACK (clean session; will is refused with "not supported"),
REGISTER/REGACK both ways, PUBLISH QoS -1 (no session needed), 0 and 1 (PUBACK to the
publisher; delivery is QoS 0, granted QoS 0 in SUBACK), normal ids, pre-defined ids
(from options) and short names, SUBSCRIBE/UNSUBSCRIBE by name with ``+``/``#``, by
pre-defined id and by short name, PINGREQ/PINGRESP, DISCONNECT (with a duration too: no
sleeping clients, the session ends), keep-alive expiry after 1.5 x the duration.
Not implemented: QoS 2, will, retained messages, sleeping clients, gateway discovery.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mqttbed.brokers.mqttsn.counters import PacketCounters
from mqttbed.core.mqttsn import (
    Connack,
    Connect,
    Disconnect,
    MqttSnError,
    MsgType,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Regack,
    Register,
    ReturnCode,
    Suback,
    Subscribe,
    TopicIdType,
    Unsuback,
    Unsubscribe,
    decode,
    encode,
    short_name_id,
    short_name_of,
    topic_matches,
)

Address = tuple
# Sends one datagram to an address; the gateway never touches a socket itself.
Sender = Callable[[bytes, Address], None]

KEEPALIVE_GRACE = 1.5           # a session ends after 1.5 x its keep-alive duration (6.14)
REGISTER_RESEND_NS = 500_000_000
REGISTER_ATTEMPTS = 5
MAX_QUEUED_PER_REGISTER = 1_000
MAX_TOPIC_ID = 0xFFFE           # 0x0000 and 0xFFFF are reserved


@dataclass
class Subscription:
    """One filter of one client, and how its deliveries name the topic."""

    filter: str
    kind: TopicIdType
    predefined_id: int | None = None


@dataclass
class PendingRegister:
    """A REGISTER the gateway sent and the PUBLISH datagrams waiting for its REGACK."""

    topic_id: int
    datagram: bytes
    queued: list[bytes] = field(default_factory=list)
    sent_at_ns: int = 0
    attempts: int = 1


@dataclass
class Session:
    """One connected client: its address, keep-alive, known ids and subscriptions."""

    address: Address
    client_id: str
    duration_s: int
    last_heard_ns: int
    known_ids: set[int] = field(default_factory=set)
    subscriptions: dict[tuple[TopicIdType, str], Subscription] = field(default_factory=dict)
    pending: dict[int, PendingRegister] = field(default_factory=dict)  # by msg id
    next_msg_id: int = 0

    def new_msg_id(self) -> int:
        self.next_msg_id = self.next_msg_id % 0xFFFF + 1
        return self.next_msg_id


@dataclass(frozen=True)
class Route:
    """Where one PUBLISH on one topic name goes: a session, and the form it receives."""

    session: Session
    kind: TopicIdType
    topic_id: int


class Gateway:
    """The gateway's state and its answer to every datagram (no socket, no clock of its own)."""

    def __init__(self, send: Sender, predefined: Mapping[int, str] | None = None):
        self._send_raw = send
        self.counters = PacketCounters()
        self.predefined = dict(predefined or {})
        self.sessions: dict[Address, Session] = {}
        self._topic_ids: dict[str, int] = {}
        self._topic_names: dict[int, str] = {}
        self._routes: dict[str, tuple[Route, ...]] = {}
        self._now_ns = 0

    # -- entry points -------------------------------------------------------------------

    def handle(self, datagram: bytes, source: Address, now_ns: int) -> None:
        """Decode one datagram from ``source`` and act on it; never raises MqttSnError."""
        self._now_ns = now_ns
        try:
            packet = decode(datagram)
        except MqttSnError as exc:
            self.counters.count_received(len(datagram), "malformed")
            self.counters.drop("malformed", source, str(exc))
            return
        self.counters.count_received(len(datagram), type(packet).__name__.upper())
        session = self.sessions.get(source)
        if session is not None:
            session.last_heard_ns = now_ns
        self._dispatch(packet, source, session, now_ns)

    def tick(self, now_ns: int) -> None:
        """End sessions silent past their keep-alive; resend unanswered REGISTERs."""
        self._now_ns = now_ns
        for session in list(self.sessions.values()):
            limit_ns = int(session.duration_s * KEEPALIVE_GRACE * 1e9)
            if session.duration_s and now_ns - session.last_heard_ns > limit_ns:
                self.counters.drop("keep-alive expired", session.address, session.client_id)
                self._end_session(session)
                continue
            self._resend_registers(session, now_ns)

    def topic_count(self) -> int:
        return len(self._topic_ids)

    # -- dispatch -----------------------------------------------------------------------

    def _dispatch(self, packet: Packet, source: Address, session: Session | None,
                  now_ns: int) -> None:
        match packet:
            case Publish():
                self._publish(packet, source, session)
            case Connect():
                self._connect(packet, source, now_ns)
            case Pingreq():
                self._send(encode(Pingresp()), source, MsgType.PINGRESP)
            case _ if session is None:
                self.counters.drop("unknown client", source, type(packet).__name__)
            case Register():
                self._register(packet, session)
            case Regack():
                self._regack(packet, session)
            case Subscribe():
                self._subscribe(packet, session)
            case Unsubscribe():
                self._unsubscribe(packet, session)
            case Disconnect():
                self._send(encode(Disconnect()), source, MsgType.DISCONNECT)
                self._end_session(session)
            case _:
                self.counters.drop("unexpected message type", source, type(packet).__name__)

    def _send(self, datagram: bytes, address: Address, msg_type: MsgType) -> None:
        self.counters.count_sent(len(datagram), msg_type.name)
        self._send_raw(datagram, address)

    # -- sessions -----------------------------------------------------------------------

    def _connect(self, packet: Connect, source: Address, now_ns: int) -> None:
        old = self.sessions.get(source)
        if old is not None:
            self._end_session(old)   # clean session, or not: state is never kept over
        if packet.will:
            self.counters.drop("will not supported", source, packet.client_id)
            self._send(encode(Connack(ReturnCode.NOT_SUPPORTED)), source, MsgType.CONNACK)
            return
        self.sessions[source] = Session(source, packet.client_id, packet.duration_s, now_ns)
        self._send(encode(Connack(ReturnCode.ACCEPTED)), source, MsgType.CONNACK)

    def _end_session(self, session: Session) -> None:
        del self.sessions[session.address]
        if session.subscriptions:
            self._routes.clear()

    # -- topic ids ----------------------------------------------------------------------

    def _topic_id(self, name: str) -> int | None:
        """The gateway-wide id of a normal topic name, assigned on first use (None: full)."""
        topic_id = self._topic_ids.get(name)
        if topic_id is None:
            if len(self._topic_ids) >= MAX_TOPIC_ID:
                return None
            topic_id = self._topic_ids[name] = len(self._topic_ids) + 1
            self._topic_names[topic_id] = name
        return topic_id

    def _register(self, packet: Register, session: Session) -> None:
        topic_id = self._topic_id(packet.topic_name)
        if topic_id is None:
            self.counters.drop("topic ids exhausted", session.address, packet.topic_name)
            reply = Regack(0, packet.msg_id, ReturnCode.CONGESTION)
        else:
            session.known_ids.add(topic_id)
            reply = Regack(topic_id, packet.msg_id, ReturnCode.ACCEPTED)
        self._send(encode(reply), session.address, MsgType.REGACK)

    def _regack(self, packet: Regack, session: Session) -> None:
        pending = session.pending.pop(packet.msg_id, None)
        if pending is None or pending.topic_id != packet.topic_id:
            self.counters.drop("REGACK for no pending REGISTER", session.address)
            return
        if packet.return_code != ReturnCode.ACCEPTED:
            for _ in pending.queued:
                self.counters.drop("subscriber refused REGISTER", session.address)
            return
        session.known_ids.add(pending.topic_id)
        for datagram in pending.queued:
            self._send(datagram, session.address, MsgType.PUBLISH)

    def _resend_registers(self, session: Session, now_ns: int) -> None:
        for msg_id, pending in list(session.pending.items()):
            if now_ns - pending.sent_at_ns < REGISTER_RESEND_NS:
                continue
            if pending.attempts >= REGISTER_ATTEMPTS:
                del session.pending[msg_id]
                for _ in pending.queued:
                    self.counters.drop("REGISTER unanswered", session.address)
                continue
            pending.attempts += 1
            pending.sent_at_ns = now_ns
            self._send(pending.datagram, session.address, MsgType.REGISTER)

    # -- subscriptions ------------------------------------------------------------------

    def _subscription_of(self, packet: Subscribe | Unsubscribe) -> Subscription | None:
        """The subscription a SUBSCRIBE/UNSUBSCRIBE names (None: an unknown pre-defined id)."""
        if packet.topic_id_type == TopicIdType.PREDEFINED:
            topic_id = int(packet.topic)
            name = self.predefined.get(topic_id)
            return None if name is None else Subscription(name, TopicIdType.PREDEFINED, topic_id)
        return Subscription(str(packet.topic), packet.topic_id_type)

    def _subscribe(self, packet: Subscribe, session: Session) -> None:
        subscription = self._subscription_of(packet)
        reply_id, code = 0, ReturnCode.ACCEPTED
        if subscription is None:
            self.counters.drop("unknown pre-defined topic id", session.address, str(packet.topic))
            code = ReturnCode.INVALID_TOPIC_ID
        elif subscription.kind == TopicIdType.PREDEFINED:
            reply_id = subscription.predefined_id or 0
        elif subscription.kind == TopicIdType.SHORT_NAME:
            pass   # the id is "not relevant" for a short name (5.4.16): 0x0000, as for '+'/'#'
        elif not set("+#") & set(subscription.filter):
            topic_id = self._topic_id(subscription.filter)
            if topic_id is None:
                self.counters.drop("topic ids exhausted", session.address, subscription.filter)
                subscription, code = None, ReturnCode.CONGESTION
            else:
                reply_id = topic_id
                session.known_ids.add(topic_id)
        if subscription is not None:
            session.subscriptions[(subscription.kind, subscription.filter)] = subscription
            self._routes.clear()
        self._send(encode(Suback(reply_id, packet.msg_id, code)), session.address,
                   MsgType.SUBACK)

    def _unsubscribe(self, packet: Unsubscribe, session: Session) -> None:
        subscription = self._subscription_of(packet)
        if subscription is not None and session.subscriptions.pop(
                (subscription.kind, subscription.filter), None) is not None:
            self._routes.clear()
        self._send(encode(Unsuback(packet.msg_id)), session.address, MsgType.UNSUBACK)

    # -- publish ------------------------------------------------------------------------

    def _topic_name(self, packet: Publish) -> str | None:
        if packet.topic_id_type == TopicIdType.SHORT_NAME:
            return short_name_of(packet.topic_id)
        if packet.topic_id_type == TopicIdType.PREDEFINED:
            return self.predefined.get(packet.topic_id)
        return self._topic_names.get(packet.topic_id)

    def _publish(self, packet: Publish, source: Address, session: Session | None) -> None:
        if packet.qos != -1 and session is None:
            self.counters.drop("unknown client", source, "PUBLISH")
            return
        name = self._topic_name(packet)
        known = packet.topic_id_type != TopicIdType.NORMAL or (
            session is not None and packet.topic_id in session.known_ids)
        if name is None or not known:
            self.counters.drop("unknown topic id", source, f"{packet.topic_id:#06x}")
            if packet.qos != -1:
                self._send(encode(Puback(packet.topic_id, packet.msg_id,
                                         ReturnCode.INVALID_TOPIC_ID)), source, MsgType.PUBACK)
            return
        if packet.qos == 2:
            self.counters.drop("QoS 2 not supported", source)
            self._send(encode(Puback(packet.topic_id, packet.msg_id, ReturnCode.NOT_SUPPORTED)),
                       source, MsgType.PUBACK)
            return
        self._fan_out(name, packet.data)
        if packet.qos == 1:
            self._send(encode(Puback(packet.topic_id, packet.msg_id, ReturnCode.ACCEPTED)),
                       source, MsgType.PUBACK)

    def _fan_out(self, name: str, data: bytes) -> None:
        """Send one QoS 0 copy to every session with a matching subscription."""
        routes = self._routes.get(name)
        if routes is None:
            routes = self._routes[name] = self._find_routes(name)
        datagrams: dict[tuple[TopicIdType, int], bytes] = {}
        for route in routes:
            key = (route.kind, route.topic_id)
            datagram = datagrams.get(key)
            if datagram is None:
                datagram = datagrams[key] = encode(Publish(route.topic_id, 0, data,
                                                           topic_id_type=route.kind))
            session = route.session
            if route.kind == TopicIdType.NORMAL and route.topic_id not in session.known_ids:
                self._queue_behind_register(session, route.topic_id, name, datagram)
            else:
                self._send(datagram, session.address, MsgType.PUBLISH)

    def _find_routes(self, name: str) -> tuple[Route, ...]:
        """One route per session whose filters match ``name`` (one copy even if several do)."""
        routes = []
        for session in self.sessions.values():
            for subscription in session.subscriptions.values():
                if not topic_matches(subscription.filter, name):
                    continue
                if subscription.kind == TopicIdType.PREDEFINED:
                    route = Route(session, TopicIdType.PREDEFINED, subscription.predefined_id or 0)
                elif len(name) == 2 and subscription.kind == TopicIdType.SHORT_NAME:
                    route = Route(session, TopicIdType.SHORT_NAME, short_name_id(name))
                else:
                    topic_id = self._topic_id(name)
                    if topic_id is None:
                        continue
                    route = Route(session, TopicIdType.NORMAL, topic_id)
                routes.append(route)
                break
        return tuple(routes)

    def _queue_behind_register(self, session: Session, topic_id: int, name: str,
                               datagram: bytes) -> None:
        """REGISTER ``name`` to ``session`` (once) and hold ``datagram`` until its REGACK."""
        pending = next((p for p in session.pending.values() if p.topic_id == topic_id), None)
        if pending is None:
            msg_id = session.new_msg_id()
            register = encode(Register(topic_id, msg_id, name))
            pending = PendingRegister(topic_id, register, sent_at_ns=self._now_ns)
            session.pending[msg_id] = pending
            self._send(register, session.address, MsgType.REGISTER)
        if len(pending.queued) >= MAX_QUEUED_PER_REGISTER:
            self.counters.drop("queue behind REGISTER full", session.address, name)
            return
        pending.queued.append(datagram)
