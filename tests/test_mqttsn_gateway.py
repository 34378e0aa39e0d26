"""The MQTT-SN gateway as a real process: the protocol byte for byte, drops, the backend."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.brokers.mqttsn.backend import MqttSnBackend, Options
from mqttbed.core.backends import create_backend
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import LocalHost
from mqttbed.core.mqttsn import (
    Connack,
    Connect,
    Disconnect,
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
)
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role, Transport
from tests.conftest import child_processes, wait_until

pytestmark = pytest.mark.timeout(60)

NORMAL, PREDEFINED, SHORT = TopicIdType.NORMAL, TopicIdType.PREDEFINED, TopicIdType.SHORT_NAME


@pytest.fixture
def gateway():
    backend = MqttSnBackend()
    endpoint = backend.deploy({"predefined_topics": {7: "plant/pressure"}}, LocalHost())
    yield backend, endpoint
    backend.teardown()
    assert child_processes("mqttbed.brokers.mqttsn") == []


class RawClient:
    """A UDP socket that speaks MQTT-SN one packet at a time, for byte-level checks."""

    def __init__(self, endpoint: Endpoint):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(2)
        self.sock.connect((endpoint.host, endpoint.port))

    def send(self, packet: Packet | bytes) -> None:
        self.sock.send(packet if isinstance(packet, bytes) else encode(packet))

    def recv(self) -> Packet:
        return decode(self.sock.recv(65535))

    def ask(self, packet: Packet) -> Packet:
        self.send(packet)
        return self.recv()

    def nothing_arrives(self, within_s: float = 0.3) -> bool:
        self.sock.settimeout(within_s)
        try:
            self.sock.recv(65535)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(2)
        return False


def connected(endpoint: Endpoint, client_id: str, duration_s: int = 30) -> RawClient:
    client = RawClient(endpoint)
    assert client.ask(Connect(client_id, duration_s)) == Connack(ReturnCode.ACCEPTED)
    return client


def test_register_subscribe_publish_by_id_predefined_and_short_name(gateway):
    backend, endpoint = gateway
    assert endpoint.transport is Transport.MQTT_SN_UDP
    pub, exact, wild = (connected(endpoint, name) for name in ("pub", "exact", "wild"))
    regack = pub.ask(Register(0, 1, "plant/temp"))
    assert isinstance(regack, Regack) and regack.return_code == ReturnCode.ACCEPTED
    topic_id = regack.topic_id
    assert exact.ask(Subscribe(1, "plant/temp", NORMAL)) == Suback(topic_id, 1,
                                                                   ReturnCode.ACCEPTED)
    assert wild.ask(Subscribe(1, "plant/#", NORMAL)) == Suback(0, 1, ReturnCode.ACCEPTED)
    pub.send(Publish(topic_id, 0, b"21.5"))
    assert exact.recv() == Publish(topic_id, 0, b"21.5")
    # The wildcard subscriber learns the id by REGISTER; the PUBLISH waits for its REGACK.
    register = wild.recv()
    assert register == Register(topic_id, register.msg_id, "plant/temp")
    assert wild.nothing_arrives()
    wild.send(Regack(topic_id, register.msg_id, ReturnCode.ACCEPTED))
    assert wild.recv() == Publish(topic_id, 0, b"21.5")
    pub.send(Publish(topic_id, 0, b"21.6"))
    assert wild.recv() == Publish(topic_id, 0, b"21.6")   # no second REGISTER
    assert exact.recv() == Publish(topic_id, 0, b"21.6")
    # Pre-defined id, QoS 1 (acknowledged), matched by the wildcard filter too.
    assert exact.ask(Subscribe(2, 7, PREDEFINED)) == Suback(7, 2, ReturnCode.ACCEPTED)
    assert pub.ask(Publish(7, 5, b"1bar", qos=1, topic_id_type=PREDEFINED)) == Puback(
        7, 5, ReturnCode.ACCEPTED)
    assert exact.recv() == Publish(7, 0, b"1bar", topic_id_type=PREDEFINED)
    register = wild.recv()
    assert register.topic_name == "plant/pressure"
    wild.send(Regack(register.topic_id, register.msg_id, ReturnCode.ACCEPTED))
    assert wild.recv() == Publish(register.topic_id, 0, b"1bar")
    # QoS -1 on a short name needs no connection at all.
    short = short_name_id("ab")
    assert exact.ask(Subscribe(3, "ab", SHORT)) == Suback(0, 3, ReturnCode.ACCEPTED)
    RawClient(endpoint).send(Publish(short, 0, b"anon", qos=-1, topic_id_type=SHORT))
    assert exact.recv() == Publish(short, 0, b"anon", topic_id_type=SHORT)
    assert exact.ask(Unsubscribe(4, "ab", SHORT)) == Unsuback(4)
    RawClient(endpoint).send(Publish(short, 0, b"anon", qos=-1, topic_id_type=SHORT))
    assert exact.nothing_arrives()
    assert pub.ask(Pingreq()) == Pingresp()
    assert pub.ask(Disconnect()) == Disconnect()
    pub.send(Publish(topic_id, 0, b"gone"))   # no session any more: dropped, unanswered
    assert pub.nothing_arrives()
    backend.teardown()
    stats = backend.deployment().gateway_stats
    assert stats["dropped_by_reason"] == {"unknown client": 1}
    assert stats["sent_by_type"]["REGISTER"] == 2
    records = backend.section_records()
    assert records["broker_received"] == [stats["broker_received"]]
    assert records["broker_dropped"] == [1.0]


def test_unknown_ids_unknown_clients_and_malformed_datagrams_are_counted_as_drops(gateway):
    backend, endpoint = gateway
    client = connected(endpoint, "c")
    assert client.ask(Publish(99, 3, b"x")) == Puback(99, 3, ReturnCode.INVALID_TOPIC_ID)
    assert client.ask(Subscribe(1, 99, PREDEFINED)) == Suback(0, 1, ReturnCode.INVALID_TOPIC_ID)
    stranger = RawClient(endpoint)
    stranger.send(Subscribe(1, "a", NORMAL))
    stranger.send(b"\x05\x0c\x00")
    stranger.send(b"\x02\x03")
    assert stranger.ask(Connect("w", 30, will=True)) == Connack(ReturnCode.NOT_SUPPORTED)
    assert client.ask(Pingreq()) == Pingresp()   # everything before it was handled
    backend.teardown()
    stats = backend.deployment().gateway_stats
    assert stats["dropped_by_reason"] == {"unknown topic id": 1, "unknown pre-defined topic id": 1,
                                          "unknown client": 1, "malformed": 2,
                                          "will not supported": 1}
    assert stats["broker_dropped"] == 6 and stats["received_by_type"]["malformed"] == 2


def test_a_silent_client_is_dropped_after_one_and_a_half_keep_alive_periods(gateway):
    backend, endpoint = gateway
    client = connected(endpoint, "sleepy", duration_s=1)
    assert client.ask(Subscribe(1, "t", NORMAL)).return_code == ReturnCode.ACCEPTED
    silent_from = time.monotonic()
    log = backend._proc.dir / "gateway.log"
    wait_until(lambda: "keep-alive expired" in log.read_text(), 10,
               "the gateway to drop the silent client (keep-alive 1 s)")
    assert time.monotonic() - silent_from > 1.0, "dropped before one keep-alive period"
    client.send(Subscribe(2, "t", NORMAL))
    assert client.nothing_arrives()
    backend.teardown()
    reasons = backend.deployment().gateway_stats["dropped_by_reason"]
    assert reasons == {"keep-alive expired": 1, "unknown client": 1}


def test_the_gateway_writes_its_counters_every_second_and_health_names_a_killed_gateway(gateway):
    backend, _ = gateway
    assert backend.health() is None
    stats_file = backend._proc.dir / "stats.json"
    first = stats_file.stat().st_mtime_ns
    wait_until(lambda: stats_file.stat().st_mtime_ns > first, 2.5,
               f"the gateway to rewrite {stats_file} (every second)")
    os.kill(backend._proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while backend.health() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.health().startswith("broker died: broker mqtt-sn")
    assert "SIGKILL" in backend.health()


def test_a_bad_option_names_the_field_and_the_value():
    with pytest.raises(ValueError, match="pre-defined topic 7='a/#'"):
        Options.model_validate({"predefined_topics": {7: "a/#"}})
    assert isinstance(create_backend("mqtt-sn"), MqttSnBackend)


def agent_clients(filters: tuple[str, ...], messages: int) -> list[ClientAssignment]:
    pub = ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="t/x", qos=0,
                           gpio_pin=2, payload_bytes=64, rate_hz=500, messages=messages,
                           warmup_messages=5)
    subs = [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER,
                             topic=filters[j % len(filters)], qos=0, gpio_pin=3 + j,
                             warmup_messages=5, expected_messages=messages, subscribe_rank=j)
            for j in range(4)]
    return [pub, *subs]


def test_the_agents_session_speaks_mqtt_sn_with_exact_and_wildcard_subscribers(gateway):
    backend, endpoint = gateway
    events, gpio = [], VirtualGpio()
    session = MqttSession(endpoint, agent_clients(("t/x", "t/+"), 50), gpio, events.append)
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 50_000_000
        session.run(start, start + 3_000_000_000, abort=lambda: False)
        assert session.counts() == (50, 4 * 50)
    finally:
        session.close()
    deliveries = [e for e in events if e[0] == "delivery"]
    assert {(e[4], e[5]) for e in deliveries} == {("t/x", 64)}
    assert all(e[9] < e[10] for e in deliveries)
    assert len(gpio.edges()) == 50 + 4 * 50
    backend.teardown()
    stats = backend.deployment().gateway_stats
    assert stats["received_by_type"]["PUBLISH"] == 50 and stats["sent_by_type"]["PUBLISH"] == 200
    assert stats["received_by_type"]["DISCONNECT"] == 5 and stats["broker_dropped"] == 0
