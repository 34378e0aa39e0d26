"""The fork/pipe broker speaks MQTT 3.1.1, byte for byte, over real sockets.

Every test runs twice: against the release build and against the AddressSanitizer +
UndefinedBehaviorSanitizer build, which must finish without a single sanitizer report
(memory errors, undefined behaviour, or leaks in any of the forked processes). Every
test also checks that teardown left no process and no pipe behind.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from mqttbed.brokers.forkpipe.backend import (
    COUNTERS_FILE,
    ForkPipeBackend,
    ForkPipeLeftovers,
    Options,
    read_socket_bytes,
)
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import Endpoint
from tests.conftest import eventually

# integration: the C broker
pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CONNACK, PUBLISH, PUBACK, PUBREC, PUBCOMP = 0x20, 0x30, 0x40, 0x50, 0x70
SUBACK, UNSUBACK, PINGRESP = 0x90, 0xB0, 0xD0
PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"
# Short, so that a deleted pipe stops its process (and the tests) quickly.
SELECT_TIMEOUT_MS = 20


# -- the wire format, written out independently of the broker's C code ---------------------

def remaining_length(n: int) -> bytes:
    """MQTT's variable-length encoding of a remaining length."""
    out = bytearray()
    while True:
        digit, n = n % 128, n // 128
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + remaining_length(len(body)) + body


def prefixed(data: str | bytes) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack("!H", len(raw)) + raw


def connect(client_id: str = "t", keepalive: int = 60, *, clean: bool = True, level: int = 4,
            name: bytes = b"MQTT", will: tuple[str, bytes] | None = None,
            username: str | None = None, password: bytes | None = None) -> bytes:
    flags = (0x02 if clean else 0) | (0x04 if will else 0) | (0x80 if username else 0) | (
        0x40 if password is not None else 0)
    body = prefixed(name) + bytes([level, flags]) + struct.pack("!H", keepalive)
    body += prefixed(client_id)
    if will:
        body += prefixed(will[0]) + prefixed(will[1])
    if username:
        body += prefixed(username)
    if password is not None:
        body += prefixed(password)
    return packet(0x10, body)


def subscribe(packet_id: int, *filters: tuple[str | bytes, int]) -> bytes:
    body = struct.pack("!H", packet_id) + b"".join(prefixed(f) + bytes([q]) for f, q in filters)
    return packet(0x82, body)


def unsubscribe(packet_id: int, *filters: str) -> bytes:
    return packet(0xA2, struct.pack("!H", packet_id) + b"".join(prefixed(f) for f in filters))


def publish(topic: str, payload: bytes, qos: int = 0, *, retain: bool = False,
            packet_id: int = 1) -> bytes:
    body = prefixed(topic) + (struct.pack("!H", packet_id) if qos else b"") + payload
    return packet(0x30 | qos << 1 | int(retain), body)


def parse_publish(body: bytes) -> tuple[str, bytes]:
    (length,) = struct.unpack("!H", body[:2])
    return body[2:2 + length].decode(), body[2 + length:]


class RawClient:
    """A TCP connection that sends bytes and reads whole MQTT packets, nothing more."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 3.0):
        self.sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, n: int, timeout_s: float) -> None:
        self.sock.settimeout(timeout_s)
        while len(self._buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed by the broker")
            self._buffer += chunk

    def read_packet(self, timeout_s: float = 3.0) -> tuple[int, bytes]:
        """Return (first byte, body) of the next packet."""
        self._fill(2, timeout_s)
        length, multiplier, i = 0, 1, 1
        while True:
            self._fill(i + 1, timeout_s)
            byte = self._buffer[i]
            length += (byte & 0x7F) * multiplier
            multiplier *= 128
            i += 1
            if not byte & 0x80:
                break
        self._fill(i + length, timeout_s)
        first, body = self._buffer[0], self._buffer[i:i + length]
        self._buffer = self._buffer[i + length:]
        return first, body

    def expect(self, first: int, body: bytes | None = None) -> bytes:
        got_first, got_body = self.read_packet()
        assert got_first == first, f"expected packet 0x{first:02x}, got 0x{got_first:02x}"
        if body is not None:
            assert got_body == body
        return got_body

    def closed_by_broker(self, within_s: float = 3.0) -> bool:
        """True if the broker closes the connection within ``within_s`` (sending nothing)."""
        self.sock.settimeout(within_s)
        try:
            return self.sock.recv(1 << 16) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def silent_for(self, seconds: float) -> bool:
        """True if nothing arrives (and the connection stays open) for ``seconds``."""
        self.sock.settimeout(seconds)
        try:
            self.sock.recv(1 << 16)
        except TimeoutError:
            return True
        return False

    def handshake(self, client_id: str = "t", keepalive: int = 60) -> None:
        self.send(connect(client_id, keepalive))
        self.expect(CONNACK, b"\x00\x00")

    def subscribe(self, *filters: str, packet_id: int = 7) -> bytes:
        self.send(subscribe(packet_id, *((f, 0) for f in filters)))
        body = self.expect(SUBACK)
        assert body[:2] == struct.pack("!H", packet_id)
        return body[2:]

    def next_message(self, timeout_s: float = 3.0) -> tuple[str, bytes]:
        first, body = self.read_packet(timeout_s)
        assert first == PUBLISH, f"expected a QoS 0 PUBLISH, got 0x{first:02x}"
        return parse_publish(body)

    def close(self) -> None:
        self.sock.close()


# -- fixtures ---------------------------------------------------------------------------

@dataclass
class Deployed:
    backend: ForkPipeBackend
    endpoint: Endpoint
    clients: list[RawClient] = field(default_factory=list)

    def client(self, client_id: str = "t", keepalive: int = 60) -> RawClient:
        """A connected client, closed at teardown if the test has not closed it."""
        raw = RawClient(self.endpoint)
        self.clients.append(raw)
        raw.handshake(client_id, keepalive)
        return raw

    @property
    def state(self) -> Path:
        assert self.backend.state_dir is not None
        return self.backend.state_dir

    def pipes(self) -> list[str]:
        """Pipe names ("<client pid>/<encoded filter>") present right now.

        A client's directory may go while it is listed (its process ending): that
        client then has no pipes, which is what the listing says.
        """
        names: list[str] = []
        for client in self.state.iterdir():
            try:
                names.extend(f"{client.name}/{pipe.name}" for pipe in client.iterdir())
            except (FileNotFoundError, NotADirectoryError):
                continue
        return sorted(names)

    def processes(self) -> int:
        """Live processes in the broker's tree, the listener included."""
        root = psutil.Process(self.backend.deployment().pid)
        return 1 + sum(_alive(p) for p in root.children(recursive=True))


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie; a child that ended since it was listed is not alive."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def deploy(sanitizers: bool, **options: object) -> Deployed:
    backend = ForkPipeBackend()
    endpoint = backend.deploy(
        Options(sanitizers=sanitizers, select_timeout_ms=SELECT_TIMEOUT_MS, **options),
        LocalHost())
    return Deployed(backend, endpoint)


def assert_clean_teardown(deployed: Deployed) -> None:
    """Hang up the test's clients (as agents do at a run's end), tear down, check the rest."""
    for client in deployed.clients:
        client.close()
    deployed.backend.teardown()
    record = deployed.backend.deployment()
    assert record.sanitizer_reports == [], record.sanitizer_reports[0]
    assert record.leftovers == ForkPipeLeftovers(processes=0, pipes=0)
    assert record.process_failure is None


@pytest.fixture(params=["release", "sanitized"])
def broker(request) -> Iterator[Deployed]:
    deployed = deploy(request.param == "sanitized")
    try:
        yield deployed
    finally:
        assert_clean_teardown(deployed)


# -- socket byte counters -----------------------------------------------------------------

def test_socket_bytes_of_every_process_are_counted_once_and_pipes_not_at_all(broker):
    counters = broker.backend._proc.dir / COUNTERS_FILE
    assert read_socket_bytes(counters) == (0, 0)  # deploy's port probe sent nothing
    subscriber = broker.client("s")
    subscriber.subscribe("c/t")
    publisher = broker.client("p")
    message = publish("c/t", b"x" * 10)
    publisher.send(message)
    assert subscriber.next_message() == ("c/t", b"x" * 10)
    # in: two CONNECTs, a SUBSCRIBE, the PUBLISH; out: two CONNACKs, a SUBACK, the
    # delivery, written by the subscription process (its pipe traffic does not count)
    expected_in = (len(connect("s")) + len(subscribe(7, ("c/t", 0))) + len(connect("p"))
                   + len(message))
    expected_out = 4 + 5 + 4 + len(message)
    assert eventually(lambda: read_socket_bytes(counters) == (expected_in, expected_out)), \
        read_socket_bytes(counters)


# -- CONNECT ------------------------------------------------------------------------------

def test_connect_is_answered_with_connack_accepted_and_creates_the_client_directory(broker):
    client = RawClient(broker.endpoint)
    client.send(connect("alice", will=("last/will", b"bye"), username="u", password=b"p"))
    assert client.read_packet() == (CONNACK, b"\x00\x00")
    assert eventually(lambda: len(list(broker.state.iterdir())) == 1)
    client.close()


@pytest.mark.parametrize("first_packet", [PINGREQ, subscribe(1, ("a", 0)), publish("a", b"x"),
                                          DISCONNECT])
def test_a_first_packet_other_than_connect_closes_the_connection(broker, first_packet):
    client = RawClient(broker.endpoint)
    client.send(first_packet)
    assert client.closed_by_broker()
    assert list(broker.state.iterdir()) == []


def test_a_second_connect_closes_the_connection(broker):
    client = broker.client()
    client.send(connect("again"))
    assert client.closed_by_broker()


def test_a_protocol_level_other_than_3_1_1_is_refused_with_connack_1(broker):
    client = RawClient(broker.endpoint)
    client.send(connect(level=5))
    assert client.read_packet() == (CONNACK, b"\x00\x01")
    assert client.closed_by_broker()


def test_an_empty_client_id_without_clean_session_is_refused_with_connack_2(broker):
    client = RawClient(broker.endpoint)
    client.send(connect("", clean=False))
    assert client.read_packet() == (CONNACK, b"\x00\x02")
    assert client.closed_by_broker()


# -- SUBSCRIBE / PUBLISH ------------------------------------------------------------------

def test_subscribe_grants_qos_0_to_every_filter_whatever_was_requested(broker):
    client = broker.client()
    client.send(subscribe(0x1234, ("a/b", 0), ("c/d", 1), ("e/+/f", 2)))
    assert client.read_packet() == (SUBACK, b"\x12\x34\x00\x00\x00")


def test_publish_on_a_multi_level_topic_reaches_its_subscribers_only(broker):
    deep, other = broker.client("deep"), broker.client("other")
    deep.subscribe("building/3/room 12/temp.c")
    other.subscribe("building/3/room 12")
    publisher = broker.client("pub")
    publisher.send(publish("building/3/room 12/temp.c", b"21.5"))
    assert deep.next_message() == ("building/3/room 12/temp.c", b"21.5")
    assert other.silent_for(0.3)


def test_each_filter_is_one_pipe_named_by_its_percent_encoding(broker):
    client = broker.client()
    client.subscribe("a/b.c", "x/+/#")
    assert [p.split("/")[1] for p in broker.pipes()] == ["a%2Fb%2Ec", "x%2F%2B%2F%23"]


def test_wildcards_match_by_the_mqtt_rules(broker):
    client = broker.client()
    assert client.subscribe("sport/+/player1", "finance/#", "#") == b"\x00\x00\x00"
    publisher = broker.client("pub")
    for topic in ("sport/tennis/player1", "sport/tennis/x/player1", "finance", "$SYS/uptime"):
        publisher.send(publish(topic, topic.encode()))
    # Each subscription is its own process: copies arrive in no particular order.
    received = sorted(client.next_message()[0] for _ in range(5))
    # "#" takes every topic but $SYS; each matching filter delivers its own copy.
    assert received == ["finance", "finance", "sport/tennis/player1", "sport/tennis/player1",
                        "sport/tennis/x/player1"]
    assert client.silent_for(0.3)


def test_subscribing_twice_to_one_filter_keeps_one_subscription(broker):
    client = broker.client()
    client.subscribe("dup/t")
    # listener + client + one subscription, once the processes a fork leaves behind are
    # gone (a single read saw 5, then 4, in CI under load)
    assert eventually(lambda: broker.processes() == 3)
    (pipe,) = broker.pipes()
    client.subscribe("dup/t", packet_id=8)
    assert eventually(lambda: broker.processes() == 3) and broker.pipes() == [pipe]
    broker.client("pub").send(publish("dup/t", b"once"))
    assert client.next_message() == ("dup/t", b"once")
    assert client.silent_for(0.3)


def test_a_process_per_client_and_a_process_per_subscription(broker):
    clients = [broker.client(f"c{i}") for i in range(3)]
    clients[0].subscribe("a", "b")
    clients[1].subscribe("c")
    # listener + 3 client processes + 3 subscription processes
    assert eventually(lambda: broker.processes() == 7)


def test_qos1_publish_is_acknowledged_and_delivered_at_qos_0(broker):
    subscriber = broker.client("sub")
    subscriber.subscribe("q/1")
    publisher = broker.client("pub")
    publisher.send(publish("q/1", b"hello", qos=1, packet_id=0x0102))
    assert publisher.read_packet() == (PUBACK, b"\x01\x02")
    first, body = subscriber.read_packet()
    assert first == PUBLISH and parse_publish(body) == ("q/1", b"hello")


def test_qos2_publish_completes_its_flow_and_is_delivered_once_at_qos_0(broker):
    subscriber = broker.client("sub")
    subscriber.subscribe("q/2")
    publisher = broker.client("pub")
    publisher.send(publish("q/2", b"exactly", qos=2, packet_id=9))
    assert publisher.read_packet() == (PUBREC, b"\x00\x09")
    publisher.send(packet(0x62, b"\x00\x09"))
    assert publisher.read_packet() == (PUBCOMP, b"\x00\x09")
    assert subscriber.read_packet() == (PUBLISH, prefixed("q/2") + b"exactly")
    assert subscriber.silent_for(0.3)


def test_a_retained_publish_is_delivered_without_retain_and_not_kept(broker):
    early = broker.client("early")
    early.subscribe("r/t")
    broker.client("pub").send(publish("r/t", b"kept?", retain=True))
    assert early.read_packet() == (PUBLISH, prefixed("r/t") + b"kept?")
    late = broker.client("late")
    late.subscribe("r/t")
    assert late.silent_for(0.3)


def test_a_four_byte_remaining_length_carries_a_large_message(broker):
    payload = bytes(range(256)) * 8300  # 2,124,800 bytes: the length needs four bytes
    assert len(remaining_length(len(payload) + 8)) == 4
    subscriber = broker.client("sub")
    subscriber.subscribe("big/one")
    broker.client("pub").send(publish("big/one", payload))
    assert subscriber.next_message(timeout_s=10) == ("big/one", payload)


def test_a_filter_too_long_for_a_file_name_is_refused_with_suback_0x80(broker):
    client = broker.client()
    assert client.subscribe("ok", "é" * 50) == b"\x00\x80"  # 50 x 6 = 300 encoded bytes


# -- UNSUBSCRIBE, PINGREQ, DISCONNECT ---------------------------------------------------------

def test_unsubscribe_deletes_the_pipe_stops_its_process_and_delivery(broker):
    client = broker.client()
    client.subscribe("u/a", "u/b")
    assert eventually(lambda: broker.processes() == 4)
    client.send(unsubscribe(0x0A0B, "u/a"))
    assert client.read_packet() == (UNSUBACK, b"\x0a\x0b")
    assert [p.split("/")[1] for p in broker.pipes()] == ["u%2Fb"]
    assert eventually(lambda: broker.processes() == 3)
    publisher = broker.client("pub")
    publisher.send(publish("u/a", b"gone"))
    publisher.send(publish("u/b", b"still"))
    assert client.next_message() == ("u/b", b"still")


def test_unsubscribing_from_a_filter_never_subscribed_is_acknowledged(broker):
    client = broker.client()
    client.send(unsubscribe(3, "never/subscribed"))
    assert client.read_packet() == (UNSUBACK, b"\x00\x03")


def test_pingreq_is_answered_with_pingresp_and_keeps_the_connection_alive(broker):
    client = broker.client(keepalive=1)
    for _ in range(3):  # 3 x 0.6 s: past the 1.5 s a silent client would be allowed
        time.sleep(0.6)  # window: a quiet spell shorter than 1.5 keep-alives
        client.send(PINGREQ)
        assert client.read_packet() == (PINGRESP, b"")


def test_a_client_silent_past_one_and_a_half_keep_alives_is_disconnected(broker):
    client = broker.client(keepalive=1)
    started = time.monotonic()
    assert client.closed_by_broker(within_s=4.0)
    assert 1.4 < time.monotonic() - started < 3.0
    assert eventually(lambda: list(broker.state.iterdir()) == [])


def test_disconnect_deletes_the_client_directory_and_its_processes(broker):
    client = broker.client()
    client.subscribe("d/1", "d/2")
    assert eventually(lambda: broker.processes() == 4)
    client.send(DISCONNECT)
    assert client.closed_by_broker()
    assert eventually(lambda: list(broker.state.iterdir()) == [] and broker.processes() == 1)


def test_a_dropped_connection_deletes_the_client_directory_and_its_processes(broker):
    client = broker.client()
    client.subscribe("drop/1")
    client.close()
    assert eventually(lambda: list(broker.state.iterdir()) == [] and broker.processes() == 1)


# -- malformed packets --------------------------------------------------------------------

@pytest.mark.parametrize("malformed", [
    pytest.param(b"\x30\xff\xff\xff\xff\x01", id="five-byte-remaining-length"),
    pytest.param(packet(0x30, b"\x00\x05ab"), id="topic-longer-than-packet"),
    pytest.param(publish("a/+", b"x"), id="wildcard-in-publish-topic"),
    pytest.param(packet(0x36, prefixed("a") + b"\x00\x01"), id="publish-qos-3"),
    pytest.param(packet(0x80, b"\x00\x01" + prefixed("a") + b"\x00"), id="subscribe-bad-flags"),
    pytest.param(subscribe(1, ("a/#/b", 0)), id="hash-not-last"),
    pytest.param(subscribe(1, ("a+", 0)), id="plus-inside-a-level"),
    pytest.param(subscribe(0, ("a", 0)), id="packet-id-0"),
    pytest.param(subscribe(1, ("a", 3)), id="requested-qos-3"),
    pytest.param(subscribe(1, (b"a\xc0\xaf", 0)), id="overlong-utf8"),
    pytest.param(packet(0x82, b"\x00\x01"), id="subscribe-without-filters"),
    pytest.param(b"\xc0\x01\x00", id="pingreq-with-body"),
    pytest.param(b"\x20\x02\x00\x00", id="connack-from-a-client"),
    pytest.param(b"\xf0\x00", id="reserved-type-15"),
])
def test_a_malformed_packet_closes_that_client_only(broker, malformed):
    bystander = broker.client("bystander")
    bystander.subscribe("still/served")
    offender = broker.client("offender")
    offender.send(malformed)
    assert offender.closed_by_broker()
    broker.client("pub").send(publish("still/served", b"yes"))
    assert bystander.next_message() == ("still/served", b"yes")
    assert broker.backend.health() is None


def test_a_packet_over_max_packet_bytes_closes_the_connection():
    deployed = deploy(sanitizers=False, max_packet_bytes=1024)
    try:
        client = deployed.client()
        client.send(publish("big", b"x" * 2000))
        assert client.closed_by_broker()
        assert deployed.client("next").subscribe("ok") == b"\x00"
    finally:
        assert_clean_teardown(deployed)
