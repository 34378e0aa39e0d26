"""Clients not written here, and garbage, against the running MQTT-SN gateway.

The independent client is ``mqtt-sn-12`` (PyPI, module ``mqttsn12``, in the dev extra):
it registers before each PUBLISH, subscribes by name, short name and pre-defined id,
answers the gateway's REGISTER with REGACK and matches wildcard filters itself. (The
other PyPI client, ``mqttsn`` 0.0.4, cannot publish to a normal topic id by name, prints
every PUBLISH and asserts on its internal queues when stopped; it was not used.)
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqttsn12.client.MqttSnClient import MqttSnClient as LibraryClient
from mqttsn12.client.MqttSnClient import MqttSnListener, MqttSnMessage

from mqttbed.brokers.mqttsn.backend import MqttSnBackend
from mqttbed.core.host import LocalHost
from mqttbed.core.mqttsn import (
    Connack,
    Connect,
    Pingreq,
    Pingresp,
    Publish,
    Regack,
    Register,
    ReturnCode,
    Subscribe,
    TopicIdType,
    decode,
    encode,
)
from tests.conftest import child_processes, wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def gateway():
    backend = MqttSnBackend()
    endpoint = backend.deploy({"predefined_topics": {42: "plant/alarm"}}, LocalHost())
    yield backend, endpoint
    backend.teardown()
    assert child_processes("mqttbed.brokers.mqttsn") == []


class Inbox(MqttSnListener):
    def __init__(self) -> None:
        self.messages: list[tuple[str | None, bytes]] = []

    def message_arrived(self, msg: MqttSnMessage) -> None:
        self.messages.append((msg.get_topic_name(), bytes(msg.get_payload())))


def library_client(endpoint, client_id: str) -> LibraryClient:
    client = LibraryClient()
    client.set_client_id(client_id)
    client.set_timeout(3)
    client.open(endpoint.host, endpoint.port)
    client.send_connect()
    return client


def poll_until(clients: list[tuple[LibraryClient, Inbox]], count: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for client, _ in clients:
            client.polling()
        if all(len(inbox.messages) >= count for _, inbox in clients):
            return
        time.sleep(0.005)


def test_an_independent_client_publishes_and_subscribes_with_wildcards(gateway):
    _, endpoint = gateway
    exact, wild, short, predefined = Inbox(), Inbox(), Inbox(), Inbox()
    sub_exact = library_client(endpoint, "lib-exact")
    sub_exact.send_subscribe("plant/temp", 0, exact)
    sub_wild = library_client(endpoint, "lib-wild")
    sub_wild.send_subscribe("plant/+", 0, wild)
    sub_short = library_client(endpoint, "lib-short")
    sub_short.send_subscribe("ab", 0, short)
    sub_short.send_subscribe_predefined(42, 0, predefined)
    publisher = library_client(endpoint, "lib-pub")
    try:
        for k in range(3):
            publisher.send_publish("plant/temp", f"t{k}".encode(), 0)
        publisher.send_publish("plant/temp", b"q1", 1)   # waits for its PUBACK
        publisher.send_publish("ab", b"short", 0)
        publisher.send_publish_predefined(42, b"alarm", 0)
        poll_until([(sub_exact, exact)], 4)
        poll_until([(sub_wild, wild)], 5)
        poll_until([(sub_short, short), (sub_short, predefined)], 1)
    finally:
        for client in (publisher, sub_exact, sub_wild, sub_short):
            client.send_disconnect()
            client.close()
    sent = [b"t0", b"t1", b"t2", b"q1"]
    assert exact.messages == [("plant/temp", p) for p in sent]
    # The wildcard subscriber learnt the names by the gateway's REGISTER.
    assert wild.messages == [("plant/temp", p) for p in sent] + [("plant/alarm", b"alarm")]
    assert (short.messages, predefined.messages) == ([(None, b"short")], [(None, b"alarm")])


# Datagrams worth mutating: valid packets of every kind a client sends.
SEEDS = [encode(p) for p in (
    Connect("fuzz", 30), Register(0, 1, "f/z"), Publish(1, 0, b"x" * 20),
    Publish(0x6162, 0, b"y", qos=-1, topic_id_type=TopicIdType.SHORT_NAME),
    Subscribe(2, "f/#", TopicIdType.NORMAL), Regack(1, 1, ReturnCode.ACCEPTED), Pingreq())]


@st.composite
def hostile_datagrams(draw: st.DrawFn) -> bytes:
    """Random bytes, or a valid packet with a few bytes flipped, cut or appended."""
    if draw(st.booleans()):
        return draw(st.binary(min_size=0, max_size=80))
    datagram = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        position = draw(st.integers(0, len(datagram) - 1))
        datagram[position] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        datagram = datagram[:draw(st.integers(0, len(datagram)))]
    return bytes(datagram) + draw(st.binary(max_size=4))


def test_fuzzed_datagrams_are_dropped_and_counted_and_a_good_client_is_still_served(gateway):
    backend, endpoint = gateway
    sent: list[bytes] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as fuzzer:
        fuzzer.connect((endpoint.host, endpoint.port))
        fuzzer.setblocking(False)

        @settings(max_examples=1500, derandomize=True, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(hostile_datagrams())
        def send(datagram: bytes) -> None:
            sent.append(datagram)
            try:
                fuzzer.send(datagram)
            except (BlockingIOError, ConnectionRefusedError):
                pytest.fail("the gateway stopped reading or went away")
            if len(sent) % 100 == 0:
                time.sleep(0.01)  # window: a fuzzer, not a flood: the receive buffer keeps up
        send()
    malformed = sum(1 for d in sent if not _decodes(d))
    assert malformed > len(sent) // 2
    # It is alive and serves a well-behaved client.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as good:
        good.settimeout(2)
        good.connect((endpoint.host, endpoint.port))
        good.send(encode(Connect("good", 30)))
        assert decode(good.recv(64)) == Connack(ReturnCode.ACCEPTED)
        good.send(encode(Pingreq()))
        assert decode(good.recv(64)) == Pingresp()
    assert backend.health() is None
    # The stats file is rewritten (replaced) every second, between datagrams: one written
    # after the PINGRESP above counts every datagram sent here.
    stats_file = backend._proc.dir / "stats.json"
    written = file_version(stats_file)
    wait_until(lambda: file_version(stats_file) != written, 10,
               f"the gateway to rewrite {stats_file}")
    stats = json.loads(stats_file.read_text())
    assert stats["received_by_type"]["malformed"] == malformed
    assert stats["broker_dropped"] >= malformed
    assert stats["internal_errors"] == 0 and stats["receive_errors"] == 0


def file_version(path: Path) -> tuple[int, int]:
    """Inode and modification time of ``path``: another pair once it was replaced."""
    status = path.stat()
    return status.st_ino, status.st_mtime_ns


def _decodes(datagram: bytes) -> bool:
    try:
        decode(datagram)
    except ValueError:
        return False
    return True
