"""The native engine on mqtt-sn-udp against the repo's MQTT-SN gateway (real sockets on
loopback): the same assignment run by the engine and by the lean Python client
(agents/mqtt_sn.py) delivers the same exact counts; garbage from the gateway's side is
dropped and counted while the run goes on (through a UDP relay that also loses the first
CONNECT, REGISTER and SUBSCRIBE, so the resends are exercised); refusals name the
return code; what an MQTT-SN client cannot carry is named before anything is sent."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.agents.native import engine as native
from mqttbed.brokers.mqttsn.backend import MqttSnBackend
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import LocalHost
from mqttbed.core.mqttsn import (
    Connack,
    Connect,
    Disconnect,
    MsgType,
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
    decode,
    encode,
)
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role, Transport
from tests.conftest import child_processes, wait_until

pytestmark = pytest.mark.timeout(90)

MESSAGES = 80
RATE_HZ = 400


@pytest.fixture(scope="module")
def gateway() -> Iterator[Endpoint]:
    backend = MqttSnBackend()
    endpoint = backend.deploy({}, LocalHost())
    yield endpoint
    backend.teardown()
    assert child_processes("mqttbed.brokers.mqttsn") == []


def fan_out(qos: int, topic: str, subscribe_to: str | None = None,
            subscribers: int = 3) -> list[ClientAssignment]:
    pub = ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic=topic, qos=qos,
                           gpio_pin=2, payload_bytes=100, rate_hz=RATE_HZ, messages=MESSAGES,
                           warmup_messages=4)
    subs = [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER,
                             topic=subscribe_to or topic, qos=qos, gpio_pin=3 + j,
                             warmup_messages=4, expected_messages=MESSAGES, subscribe_rank=j)
            for j in range(subscribers)]
    return [pub, *subs]


def run(endpoint: Endpoint, clients: list[ClientAssignment], mqtt_client: str = "native",
        linger_s: float = 0.0) -> tuple[MqttSession, list]:
    """Connect, subscribe, run; then serve the sockets ``linger_s`` more before closing."""
    events: list = []
    session = MqttSession(endpoint, clients, VirtualGpio(), events.append,
                          mqtt_client=mqtt_client)
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + 10_000_000_000, abort=lambda: False)
        if linger_s:
            done = threading.Event()
            timer = threading.Timer(linger_s, done.set)
            timer.start()
            session.wait_for(done)
    finally:
        session.close()
    return session, events


def summary(events: list) -> dict[str, list[tuple]]:
    """What both clients must agree on: every publish, every delivery by receiver, seq,
    topic, QoS and size, every subscription."""
    return {"published": sorted((e[1], e[2]) for e in events if e[0] == "publish"),
            "deliveries": sorted((e[3], e[2], e[4], e[6], e[5]) for e in events
                                 if e[0] == "delivery"),
            "subscribed": sorted((e[3], e[4], e[6]) for e in events if e[0] == "subscribe")}


@pytest.mark.parametrize(("qos", "topic", "subscribe_to"), [
    (0, "sn/n/plain", None), (1, "sn/n/acked", None), (1, "sn/n/room/7", "sn/n/+/7")],
    ids=["qos0", "qos1", "qos1-wildcard"])
def test_the_engine_and_the_lean_client_deliver_the_same_exact_counts(gateway, qos, topic,
                                                                      subscribe_to):
    clients = fan_out(qos, topic, subscribe_to)
    engine_session, engine_events = run(gateway, clients)
    lean_session, lean_events = run(gateway, clients, mqtt_client="lean")
    assert engine_session.native and not lean_session.native
    assert engine_session.generator_report().mqtt_client == "native"
    assert engine_session.counts() == lean_session.counts() == (MESSAGES, 3 * MESSAGES)
    engine_summary = summary(engine_events)
    assert engine_summary == summary(lean_events)
    deliveries = engine_summary["deliveries"]
    assert len(deliveries) == 3 * MESSAGES
    assert {(receiver, seq) for receiver, seq, *_ in deliveries} == {
        (f"sub-{j}", k) for j in range(3) for k in range(MESSAGES)}
    # each delivery under the topic it was published on (a wildcard's names came by
    # the gateway's REGISTER), at the QoS the gateway delivers (0), once
    assert {d[2:] for d in deliveries} == {(topic, 0, 100)}
    assert engine_summary["subscribed"] == [(f"sub-{j}", subscribe_to or topic, qos)
                                            for j in range(3)]
    publisher = next(c for c in engine_session._clients if c.spec.role == Role.PUBLISHER)
    assert publisher.acked == (MESSAGES if qos else 0)   # every PUBACK counted, once
    # the engine read each datagram's kernel receive stamp
    report = engine_session.generator_report()
    assert report.kernel_deliveries == 3 * MESSAGES and report.user_deliveries == 0
    assert report.datagrams_dropped == 0


# -- a relay between the engine and the gateway: loss on the way in, garbage on the way out

GARBAGE = [
    b"\x00",                                              # shorter than a header
    b"\x05\x0c\x00",                                      # length says 5, holds 3
    b"\x03\x03\x00",                                      # a reserved message type
    encode(Connect("gw", 30)),                            # not what a gateway sends
    encode(Puback(1, 0x7777, ReturnCode.ACCEPTED)),       # acknowledges nothing awaited
    encode(Publish(0x0777, 0, b"MQB1" + bytes(40))),      # a topic id never learnt
    encode(Regack(5, 0x6666, ReturnCode.ACCEPTED)),       # answers no REGISTER
    encode(Suback(5, 0x6666, ReturnCode.ACCEPTED)),       # answers no SUBSCRIBE
]


class Relay:
    """A UDP relay in front of ``gateway``: one upstream socket per client address (the
    gateway knows a client by its address), the first CONNECT, REGISTER and SUBSCRIBE of
    each client lost, one of GARBAGE sent to the client before every tenth datagram the
    gateway sends it (and before its first two)."""

    def __init__(self, gateway: Endpoint):
        self._gateway = (gateway.host, gateway.port)
        self._front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._front.bind(("127.0.0.1", 0))
        self._front.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.endpoint = Endpoint(host="127.0.0.1", port=self._front.getsockname()[1],
                                 transport=Transport.MQTT_SN_UDP)
        self._upstream: dict[tuple, socket.socket] = {}
        self._lost: set[tuple[tuple, int]] = set()
        self._to_client: dict[tuple, int] = {}
        self.seen: dict[tuple[tuple, int], int] = {}  # (client, msg type) -> datagrams
        self.injected = 0
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._front, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.05):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                with contextlib.suppress(BlockingIOError, ConnectionRefusedError):
                    if key.data is None:
                        self._from_client(*sock.recvfrom(65535))
                    else:
                        self._from_gateway(key.data, sock.recv(65535))

    def _from_client(self, datagram: bytes, client: tuple) -> None:
        upstream = self._upstream.get(client)
        if upstream is None:
            upstream = self._upstream[client] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            upstream.connect(self._gateway)
            self._selector.register(upstream, selectors.EVENT_READ, client)
        msg_type = datagram[1] if len(datagram) > 1 else -1
        self.seen[client, msg_type] = self.seen.get((client, msg_type), 0) + 1
        if msg_type in (MsgType.CONNECT, MsgType.REGISTER, MsgType.SUBSCRIBE) and (
                client, msg_type) not in self._lost:
            self._lost.add((client, msg_type))
            return
        upstream.send(datagram)

    def _from_gateway(self, client: tuple, datagram: bytes) -> None:
        count = self._to_client[client] = self._to_client.get(client, 0) + 1
        if count <= 2 or count % 10 == 0:
            self._front.sendto(GARBAGE[self.injected % len(GARBAGE)], client)
            self.injected += 1
        self._front.sendto(datagram, client)

    def resent(self, msg_type: int) -> list[int]:
        """How often each client sent a message of this type (one of them was lost)."""
        return sorted(n for (_, t), n in self.seen.items() if t == msg_type)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for sock in [self._front, *self._upstream.values()]:
            sock.close()
        self._selector.close()


@contextlib.contextmanager
def relay_to(gateway: Endpoint) -> Iterator[Relay]:
    relay = Relay(gateway)
    try:
        yield relay
    finally:
        relay.close()


def test_garbage_from_the_gateway_is_dropped_and_counted_and_lost_handshakes_are_resent(
        gateway):
    with relay_to(gateway) as relay:
        session, events = run(relay.endpoint, fan_out(1, "sn/g/x", "sn/g/#"), linger_s=0.3)
    assert session.native
    assert session.counts() == (MESSAGES, 3 * MESSAGES)   # the run went on, nothing lost
    dropped = [c.dropped for c in session._clients]
    assert relay.injected >= 4 * 2 + (3 * MESSAGES + MESSAGES) // 10
    assert sum(dropped) == relay.injected and all(dropped)
    assert session.generator_report().datagrams_dropped == relay.injected
    assert all(c.failure is None for c in session._clients)
    # the lost CONNECT, REGISTER and SUBSCRIBE were each sent again, and answered once
    assert relay.resent(MsgType.CONNECT) == [2, 2, 2, 2]
    assert relay.resent(MsgType.REGISTER) == [2]
    assert relay.resent(MsgType.SUBSCRIBE) == [2, 2, 2]
    assert [e[4] for e in events if e[0] == "subscribe"] == ["sn/g/#"] * 3


# -- refusals: a scripted gateway on a UDP socket ---------------------------------------

Answer = Callable[[object], bytes | None]


@contextlib.contextmanager
def scripted_gateway(answer: Answer) -> Iterator[Endpoint]:
    """A UDP socket answering each decoded datagram with ``answer(packet)`` (None: nothing)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.05)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                datagram, client = sock.recvfrom(65535)
            except (TimeoutError, OSError):
                continue
            reply = answer(decode(datagram))
            if reply is not None:
                sock.sendto(reply, client)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield Endpoint(host="127.0.0.1", port=sock.getsockname()[1],
                       transport=Transport.MQTT_SN_UDP)
    finally:
        done.set()
        thread.join(2)
        sock.close()


def refusing(stage: str, code: ReturnCode, client: str) -> Answer:
    """Accept everything but ``stage`` (of ``client`` only, for CONNECT: one refusal, so
    the failure the session reports first is that one)."""
    def answer(packet: object) -> bytes | None:
        match packet:
            case Connect():
                refused = stage == "CONNECT" and packet.client_id == client
                return encode(Connack(code if refused else ReturnCode.ACCEPTED))
            case Register():
                return encode(Regack(0 if stage == "REGISTER" else 1, packet.msg_id,
                                     code if stage == "REGISTER" else ReturnCode.ACCEPTED))
            case Subscribe():
                return encode(Suback(0, packet.msg_id, code))
        return None
    return answer


@pytest.mark.parametrize(("stage", "code", "client", "reason"), [
    ("CONNECT", ReturnCode.NOT_SUPPORTED, "pub-0",
     r"CONNACK refused: return code 3 \(rejected: not supported\)"),
    ("CONNECT", ReturnCode.CONGESTION, "sub-0",
     r"CONNACK refused: return code 1 \(rejected: congestion\)"),
    ("REGISTER", ReturnCode.CONGESTION, "pub-0",
     r"REGACK refused topic 'sn/r/x': return code 1 \(rejected: congestion\)"),
    ("SUBSCRIBE", ReturnCode.INVALID_TOPIC_ID, "sub-0",
     r"SUBACK refused 'sn/r/x': return code 2 \(rejected: invalid topic ID\)"),
])
def test_a_refusal_fails_the_run_naming_the_return_code(stage, code, client, reason):
    with scripted_gateway(refusing(stage, code, client)) as endpoint:
        session = MqttSession(endpoint, fan_out(0, "sn/r/x", subscribers=1), VirtualGpio(),
                              lambda _e: None)
        try:
            assert session.native
            with pytest.raises(RuntimeError, match=rf"{client}: {reason}"):
                session.connect(timeout_s=5)
        finally:
            session.close()


def test_a_refused_puback_fails_the_publisher_naming_the_topic_id():
    def answer(packet: object) -> bytes | None:
        match packet:
            case Connect():
                return encode(Connack(ReturnCode.ACCEPTED))
            case Register():
                return encode(Regack(9, packet.msg_id, ReturnCode.ACCEPTED))
            case Publish():
                return encode(Puback(packet.topic_id, packet.msg_id,
                                     ReturnCode.INVALID_TOPIC_ID))
        return None

    with scripted_gateway(answer) as endpoint:
        session = MqttSession(endpoint, fan_out(1, "sn/p/x", subscribers=0), VirtualGpio(),
                              lambda _e: None)
        try:
            session.connect(timeout_s=5)
            start = monotonic_ns()
            with pytest.raises(RuntimeError, match=r"pub-0: PUBACK refused topic id 0x0009: "
                                                   r"return code 2 \(rejected: invalid topic ID\)"):
                session.run(start, start + 3_000_000_000, abort=lambda: False)
        finally:
            session.close()


def test_what_an_mqtt_sn_client_cannot_carry_is_named_before_anything_is_sent():
    engine = native.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=16)
    try:
        common = {"host": "127.0.0.1", "port": 1, "publisher": True, "topic": "t", "gpio_pin": 2,
                  "publisher_index": 0, "rate_hz": 10.0, "messages": 1, "warmup_messages": 0,
                  "start_offset_ns": 0, "closed_loop": False}
        long_id = engine.add_client(client_id="p" * 24, qos=0, payload_bytes=64, **common)
        with pytest.raises(ValueError, match=f"client {'p' * 24}: an MQTT-SN client id is "
                                             f"1..23 octets, not 24"):
            engine.set_mqttsn(long_id)
        qos2 = engine.add_client(client_id="q", qos=2, payload_bytes=64, **common)
        with pytest.raises(ValueError, match="client q: mqtt-sn-udp carries QoS 0 and 1 here, "
                                             "not 2"):
            engine.set_mqttsn(qos2)
        big = engine.add_client(client_id="b", qos=0, payload_bytes=65527, **common)
        with pytest.raises(ValueError, match="client b: payload_bytes 65527 exceeds the 65526"):
            engine.set_mqttsn(big)
    finally:
        engine.close()


# -- datagrams fed without a socket: what a subscriber makes of each --------------------

def test_a_wildcard_subscriber_learns_names_by_register_and_drops_what_it_cannot_place():
    engine = native.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=64)
    try:
        sub = engine.add_client(client_id="sub-0", host="127.0.0.1", port=1, publisher=False,
                                topic="f/+", qos=1, gpio_pin=3, publisher_index=0,
                                payload_bytes=0, rate_hz=0, messages=2, warmup_messages=0,
                                start_offset_ns=0, closed_loop=False)
        engine.set_mqttsn(sub)
        engine.subscribe(sub, "f/+", 1)     # msg id 1, queued (no socket)
        payload = b"MQB1" + (3).to_bytes(8, "little") + bytes(4) + (20).to_bytes(8, "little") \
            + (19).to_bytes(8, "little")
        assert engine.feed(sub, encode(Connack(ReturnCode.ACCEPTED)))
        assert engine.feed(sub, encode(Suback(0, 1, ReturnCode.ACCEPTED)))
        assert engine.feed(sub, encode(Publish(4, 0, payload)))         # id 4: not learnt
        assert engine.feed(sub, encode(Register(4, 1, "f/a")))
        assert engine.feed(sub, encode(Publish(4, 7, payload, qos=1)))
        assert engine.feed(sub, encode(Suback(0, 1, ReturnCode.ACCEPTED)))  # a resent copy
        assert engine.feed(sub, b"\x07\x0c\x00\x00\x04\x00")           # length 7, 6 octets
        engine.subscribe(sub, "g/x", 0)     # msg id 2: the SUBACK's id names g/x
        assert engine.feed(sub, encode(Suback(5, 2, ReturnCode.ACCEPTED)))
        assert engine.feed(sub, encode(Suback(0, 1, ReturnCode.ACCEPTED)))  # a late copy
        assert engine.feed(sub, encode(Suback(0, 3, ReturnCode.ACCEPTED)))  # no SUBSCRIBE 3
        assert engine.feed(sub, encode(Publish(5, 0, payload)))
        deliveries = engine.take(native.T_DELIVERY)
        topics = engine.topics()
        assert [topics[t] for t in deliveries["topic"]] == ["f/a", "g/x"]
        assert (deliveries["seq"], deliveries["qos"], deliveries["t_pub"]) == (
            [3, 3], [1, 0], [20, 20])
        assert [topics[t] for t in engine.take(native.T_SUBSCRIBE)["topic"]] == ["f/+", "g/x"]
        counters = engine.client_counters(sub)
        assert (counters.subscribed, counters.received_unique, counters.dropped) == (1, 1, 3)
        assert engine.failure(sub) == ""
    finally:
        engine.close()


# -- any datagram a gateway may send ---------------------------------------------------

GATEWAY_SEEDS = [encode(p) for p in (
    Connack(ReturnCode.ACCEPTED), Suback(0, 1, ReturnCode.ACCEPTED),
    Suback(3, 1, ReturnCode.ACCEPTED, qos=1), Register(4, 2, "f/\u00e9"),
    Regack(4, 1, ReturnCode.ACCEPTED), Publish(4, 0, b"MQB1" + bytes(40)),
    Publish(4, 9, b"MQB1" + bytes(300), qos=1),
    Publish(0x6162, 0, b"x" * 40, qos=-1, topic_id_type=TopicIdType.SHORT_NAME),
    Puback(4, 1, ReturnCode.ACCEPTED), Pingresp(), Disconnect())]


@st.composite
def gateway_datagrams(draw: st.DrawFn) -> bytes:
    """Random bytes, or a gateway message with a few bytes flipped, cut or appended."""
    if draw(st.booleans()):
        return draw(st.binary(min_size=0, max_size=40))
    datagram = bytearray(draw(st.sampled_from(GATEWAY_SEEDS)))
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):
            datagram[draw(st.integers(0, len(datagram) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        datagram = datagram[:draw(st.integers(0, len(datagram)))]
    return bytes(datagram)


def _malformed(datagram: bytes) -> bool:
    try:
        decode(datagram)
    except ValueError:
        return True
    return False


REFUSALS = ("CONNACK refused: ", "REGACK refused topic ", "REGACK accepted topic ",
            "SUBACK refused ", "PUBACK refused topic id ", "gateway 127.0.0.1:1 ended")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(gateway_datagrams(), max_size=16))
def test_any_gateway_datagram_is_handled_or_dropped_and_counted_never_a_crash(sequence):
    engine = native.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=64)
    try:
        common = {"host": "127.0.0.1", "port": 1, "topic": "f/x", "qos": 1, "gpio_pin": 2,
                  "publisher_index": 0, "rate_hz": 10.0, "messages": 5, "warmup_messages": 0,
                  "start_offset_ns": 0, "closed_loop": False}
        clients = [engine.add_client(client_id="pub-0", publisher=True, payload_bytes=64,
                                     **common),
                   engine.add_client(client_id="sub-0", publisher=False, payload_bytes=0,
                                     **common)]
        for client in clients:
            engine.set_mqttsn(client)
        engine.subscribe(clients[1], "f/#", 1)
        for client in clients:
            malformed = 0
            for datagram in sequence:
                malformed += _malformed(datagram)
                if not engine.feed(client, datagram):
                    break
            failure = engine.failure(client)
            assert failure == "" or failure.startswith(REFUSALS), failure
            if not failure:   # whatever core/mqttsn.py refuses, the engine counts
                assert engine.client_counters(client).dropped >= malformed
    finally:
        engine.close()


def test_a_quiet_client_sends_pingreq_each_keepalive_and_disconnect_at_the_end():
    seen: list[tuple[str, int]] = []

    def answer(packet: object) -> bytes | None:
        seen.append((type(packet).__name__, monotonic_ns()))
        match packet:
            case Connect():
                return encode(Connack(ReturnCode.ACCEPTED))
            case Pingreq():
                return encode(Pingresp())
        return None

    with scripted_gateway(answer) as endpoint:
        engine = native.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=16)
        try:
            sub = engine.add_client(client_id="sub-0", host=endpoint.host, port=endpoint.port,
                                    publisher=False, topic="t", qos=0, gpio_pin=3,
                                    publisher_index=0, payload_bytes=0, rate_hz=0, messages=0,
                                    warmup_messages=0, start_offset_ns=0, closed_loop=False)
            engine.set_mqttsn(sub)
            engine.connect_all(keepalive_s=1, timeout_s=5)
            deadline = monotonic_ns() + 4_000_000_000
            while sum(kind == "Pingreq" for kind, _ in seen) < 2 and monotonic_ns() < deadline:
                assert engine.poll(100_000_000), engine.failure(sub)
            assert engine.client_counters(sub).connected == 1
        finally:
            engine.close()
        wait_until(lambda: seen and seen[-1][0] == "Disconnect", 2, "the DISCONNECT")
    kinds = [kind for kind, _ in seen]
    assert kinds[0] == "Connect" and kinds[-1] == "Disconnect"
    pings = [t for kind, t in seen if kind == "Pingreq"]
    assert len(pings) == 2   # after ~1 s of silence, and ~1 s after that
    assert pings[0] - seen[0][1] >= 0.9e9 and 0.9e9 <= pings[1] - pings[0] <= 2e9
    assert engine.client_counters(sub).dropped == 0   # each PINGRESP taken, none dropped
