"""``mqttbed broker run fpga`` over real UDP sockets, with clients that know only MQTT."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from mqttbed.brokers.fpga.model import BrokerModel
from mqttbed.brokers.fpga.tables import TopicTables
from mqttbed.core.mqtt_codec import (
    Connect,
    PingReq,
    Publish,
    Subscribe,
    Unsubscribe,
    encode,
    encode_publish,
)
from tests.conftest import child_processes

pytestmark = pytest.mark.timeout(60)

CLI = Path(sys.executable).with_name("mqttbed")

# Hand-written MQTT 3.1.1 bytes, straight from the standard's layouts (no codec involved).
# CONNECT: protocol "MQTT" level 4, clean session, keep alive 60, client id "c1".
CONNECT = bytes.fromhex("10 0e 0004 4d515454 04 02 003c 0002 6331")
CONNACK = bytes.fromhex("20 02 00 00")
PINGREQ, PINGRESP = bytes.fromhex("c0 00"), bytes.fromhex("d0 00")


def subscribe_bytes(packet_id: int, topic_filter: str) -> bytes:
    body = packet_id.to_bytes(2, "big") + len(topic_filter).to_bytes(2, "big") \
        + topic_filter.encode() + b"\x00"
    return bytes([0x82, len(body)]) + body


def publish_bytes(topic: str, payload: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic.encode() + payload
    return bytes([0x30, len(body)]) + body


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ModelProcess:
    """``mqttbed broker run fpga`` started from the command line, on a given port."""

    def __init__(self, tmp_path: Path, *extra: str):
        self.port = free_udp_port()
        self.stats_file = tmp_path / "model-stats.json"
        self.proc = subprocess.Popen(
            [str(CLI), "broker", "run", "fpga", "--port", str(self.port),
             "--stats-file", str(self.stats_file), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert f"listening on udp://127.0.0.1:{self.port}" in line, (
            line + self.proc.stderr.read())

    def stop(self) -> dict:
        """SIGTERM the model; return the stats it wrote."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(10) == 0
        self.proc.stdout.close()
        self.proc.stderr.close()
        return json.loads(self.stats_file.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def model(tmp_path):
    process = ModelProcess(tmp_path)
    yield process
    process.kill()
    assert child_processes("broker run fpga") == []


def udp_client(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(2)
    return sock


def test_hand_written_mqtt_clients_subscribe_exact_and_hash_and_receive_publishes(model):
    exact = [udp_client(model.port) for _ in range(3)]
    wildcard = [udp_client(model.port) for _ in range(3)]
    publisher = udp_client(model.port)
    try:
        for n, sock in enumerate(exact + wildcard + [publisher]):
            sock.send(CONNECT)
            assert sock.recv(64) == CONNACK
            if sock is publisher:
                continue
            topic_filter = "sensors/room1/temp" if sock in exact else "sensors/#"
            sock.send(subscribe_bytes(n + 1, topic_filter))
            assert sock.recv(64) == bytes([0x90, 0x03, 0x00, n + 1, 0x00])   # SUBACK, QoS 0
        publisher.send(publish_bytes("sensors/room1/temp", b"21.5C"))
        publisher.send(publish_bytes("sensors/room2/temp", b"19.0C"))
        for sock in exact:
            assert sock.recv(256) == publish_bytes("sensors/room1/temp", b"21.5C")
        for sock in wildcard:
            assert sock.recv(256) == publish_bytes("sensors/room1/temp", b"21.5C")
            assert sock.recv(256) == publish_bytes("sensors/room2/temp", b"19.0C")
        publisher.send(PINGREQ)
        assert publisher.recv(64) == PINGRESP
        for sock in exact:                       # nothing more arrived for exact subscribers
            sock.settimeout(0.05)
            with pytest.raises(TimeoutError):
                sock.recv(256)
    finally:
        for sock in exact + wildcard + [publisher]:
            sock.close()
    stats = model.stop()
    assert stats["counters"]["publish"] == 2
    assert stats["counters"]["publish_copies"] == 3 + 6
    assert stats["tables"]["topic_table"]["used_words"] == 2
    assert stats["tables"]["subscriber_table"]["used_words"] == 6


class TcpToUdpRelay:
    """Carries a TCP-only MQTT client's packets to the UDP broker, one datagram per packet.

    Framing is done here from the fixed header alone, so the only MQTT implementation in
    the path is the client's own (paho) and the model's.
    """

    def __init__(self, broker_port: int):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.connect(("127.0.0.1", broker_port))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.listener.settimeout(5)
        conn, _ = self.listener.accept()
        buffer = b""
        with conn:
            while not self._stop.is_set():
                readable, _, _ = select.select([conn, self.udp], [], [], 0.05)
                if self.udp in readable:
                    conn.sendall(self.udp.recv(65_535))
                if conn in readable:
                    chunk = conn.recv(65_536)
                    if not chunk:
                        return
                    buffer += chunk
                    while (packet := _take_packet(buffer)) is not None:
                        buffer = buffer[len(packet):]
                        self.udp.send(packet)

    def close(self, drain_s: float = 5.0) -> None:
        """Close once the client hung up and everything it sent went on (its DISCONNECT
        too), or after ``drain_s``."""
        self._thread.join(drain_s)
        self._stop.set()
        self._thread.join(2)
        self.listener.close()
        self.udp.close()


def _take_packet(buffer: bytes) -> bytes | None:
    length, multiplier, pos = 0, 1, 1
    while pos < len(buffer) and pos <= 4:
        length += (buffer[pos] & 0x7F) * multiplier
        multiplier *= 128
        pos += 1
        if not buffer[pos - 1] & 0x80:
            return buffer[:pos + length] if len(buffer) >= pos + length else None
    return None


def test_paho_clients_subscribe_and_receive_through_the_model(model):
    relays, clients = [], []
    received: dict[str, list[tuple[str, bytes]]] = {"hash": [], "exact": []}
    done = threading.Condition()

    def make(name: str) -> mqtt.Client:
        relay = TcpToUdpRelay(model.port)
        relays.append(relay)
        subscribed = threading.Event()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name,
                             protocol=mqtt.MQTTv311)
        client.on_subscribe = lambda *_a: subscribed.set()

        def on_message(_c, _u, msg, name=name):
            with done:
                received[name].append((msg.topic, msg.payload))
                done.notify_all()

        client.on_message = on_message
        client.connect("127.0.0.1", relay.port)
        client.loop_start()
        clients.append(client)
        client.subscribed = subscribed  # type: ignore[attr-defined]  # the test's own mark
        return client

    try:
        hash_sub, exact_sub, publisher = make("hash"), make("exact"), make("pub")
        hash_sub.subscribe("plant/#", 0)
        exact_sub.subscribe("plant/line1/pressure", 1)      # granted QoS 0
        assert hash_sub.subscribed.wait(5) and exact_sub.subscribed.wait(5)
        publisher.publish("plant/line1/pressure", b"1.2 bar", qos=0)
        publisher.publish("plant/line2/pressure", b"0.9 bar", qos=0)
        with done:
            assert done.wait_for(lambda: len(received["hash"]) == 2
                                 and len(received["exact"]) == 1, 5), received
        assert received["exact"] == [("plant/line1/pressure", b"1.2 bar")]
        assert sorted(received["hash"]) == [("plant/line1/pressure", b"1.2 bar"),
                                            ("plant/line2/pressure", b"0.9 bar")]
    finally:
        for client in clients:
            client.disconnect()
            client.loop_stop()
        for relay in relays:
            relay.close()
    counters = model.stop()["counters"]
    assert counters["connect"] == 3 and counters["disconnect"] == 3


def test_model_stats_report_modelled_hardware_latency_beside_measured(model):
    subscribers = [udp_client(model.port) for _ in range(5)]
    publisher = udp_client(model.port)
    try:
        for n, sock in enumerate(subscribers):
            sock.send(subscribe_bytes(n + 1, "sync/pmu"))
            sock.recv(64)
        payload = bytes(64)
        for _ in range(20):
            publisher.send(publish_bytes("sync/pmu", payload))
            for sock in subscribers:
                sock.recv(256)
    finally:
        for sock in subscribers + [publisher]:
            sock.close()
    stats = model.stop()
    publish = stats["latency_ns"]["publish"]
    assert publish["packets"] == 20
    assert publish["modelled_first_copy"]["mean"] == pytest.approx(799.2)
    # 76-byte PUBLISH: each further copy waits one 113.6 ns frame on the 10 Gbit/s line
    assert publish["modelled_last_copy"]["max"] == pytest.approx(799.2 + 4 * 113.6)
    assert 0 < publish["measured_first_copy"]["p50"] <= publish["measured_last_copy"]["p50"]
    assert stats["latency_ns"]["subscribe"]["modelled_first_copy"]["mean"] == pytest.approx(799.2)
    assert stats["counters"]["datagrams_out"] == 5 + 20 * 5


def guaranteed_malformed(rng: random.Random) -> list[bytes]:
    """Datagrams that break MQTT 3.1.1 by construction, from valid packets and noise."""
    valid = [CONNECT, subscribe_bytes(1, "a/#"), publish_bytes("a/b", b"payload"),
             encode(Unsubscribe(2, ("a/#",))), PINGREQ]
    out = []
    for _ in range(300):
        packet = rng.choice(valid)
        cut = rng.randrange(0, len(packet))
        out.append(packet[:cut])                                   # truncated
        out.append(packet + bytes([rng.randrange(256)]))           # one byte too many
        out.append(bytes([rng.choice((0x00, 0xF0)) | rng.randrange(16)])
                   + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))))
    out.append(b"\x30\xff\xff\xff\xff\x01")                        # 5-byte remaining length
    return out


def test_malformed_datagrams_are_dropped_and_counted_and_the_model_keeps_serving(model):
    rng = random.Random(6)
    fuzz = guaranteed_malformed(rng)
    sock = udp_client(model.port)
    try:
        sent = 0
        for start in range(0, len(fuzz), 100):
            for datagram in fuzz[start:start + 100]:
                sock.send(datagram)
                sent += 1
            sock.send(PINGREQ)             # a sync point: the model read everything before
            assert sock.recv(64) == PINGRESP
        sock.send(subscribe_bytes(9, "still/alive"))
        assert sock.recv(64) == bytes([0x90, 0x03, 0x00, 0x09, 0x00])
    finally:
        sock.close()
    stats = model.stop()
    assert stats["counters"]["dropped_malformed"] == sent == len(fuzz)
    assert stats["counters"]["internal_errors"] == 0
    assert stats["counters"]["datagrams_in"] == sent + len(range(0, len(fuzz), 100)) + 1
    assert stats["malformed_reasons"]


def test_random_datagrams_never_raise_from_the_model_and_each_is_accounted_for():
    rng = random.Random(66)
    model = BrokerModel(TopicTables(topic_depth=64, subscriber_depth=64, probe_window=8))
    seeds = [encode(Connect("x", will=None)), encode(Subscribe(3, (("f/#", 1),))),
             encode_publish("f/g", b"abc"), encode(Unsubscribe(4, ("f/#",))),
             encode(Publish("f", b"q", qos=2, packet_id=5)), encode(PingReq())]
    handled = 0
    for n in range(20_000):
        if n % 3 == 0:
            datagram = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 24)))
        else:
            mutated = bytearray(rng.choice(seeds))
            for _ in range(rng.randrange(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            datagram = bytes(mutated)
        source = ("10.0.0.1", 1000 + n % 50)
        model.handle(datagram, source)     # must not raise, whatever the bytes
        handled += 1
    counted = sum(v for k, v in model.counters.items()
                  if k in ("dropped_malformed", "dropped_unsupported", "connect", "subscribe",
                           "publish", "unsubscribe", "pingreq", "disconnect"))
    assert counted == handled == 20_000
    assert model.counters["dropped_malformed"] > 10_000


def test_the_model_started_on_a_port_in_use_says_so_and_exits_2(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        done = subprocess.run([str(CLI), "broker", "run", "fpga", "--port", str(port)],
                              capture_output=True, text=True, timeout=20,
                              env={**os.environ})
    assert done.returncode == 2
    assert "cannot start" in done.stderr and "Address already in use" in done.stderr


def test_the_model_stops_within_a_second_of_sigterm(model):
    started = time.monotonic()
    model.stop()
    assert time.monotonic() - started < 1.0
