"""The agent's MQTT session over mqtt-udp against the FPGA model: same events as over TCP."""

from __future__ import annotations

import socket
import threading

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.agents.mqtt_udp import UdpMqttClient
from mqttbed.brokers.fpga.backend import FpgaBackend, Options
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import LocalHost
from mqttbed.core.mqtt_codec import ConnAck, Connect, SubAck, Subscribe, decode, encode
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role, Transport
from tests.conftest import child_processes

pytestmark = pytest.mark.timeout(30)

RATE_HZ = 500
MESSAGES = 50


@pytest.fixture
def fpga_model():
    backend = FpgaBackend()
    endpoint = backend.deploy(Options(), LocalHost())
    yield endpoint
    backend.teardown()
    assert child_processes("mqttbed.brokers.fpga") == []


def clients(subscribers: int, topic_filters=("t/x",), qos: int = 0) -> list[ClientAssignment]:
    pub = ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="t/x", qos=qos,
                           gpio_pin=2, payload_bytes=64, rate_hz=RATE_HZ, messages=MESSAGES,
                           warmup_messages=5)
    subs = [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER,
                             topic=topic_filters[j % len(topic_filters)], qos=qos,
                             gpio_pin=3 + j, warmup_messages=5, expected_messages=MESSAGES,
                             subscribe_rank=j) for j in range(subscribers)]
    return [pub, *reversed(subs)]


def run_session(endpoint, assignments):
    events, gpio = [], VirtualGpio()
    session = MqttSession(endpoint, assignments, gpio, events.append)
    try:
        session.connect(timeout_s=10)
        addresses = [c.conn.socket().getsockname() for c in session._clients]
        start = monotonic_ns() + 50_000_000
        session.run(start, start + 3_000_000_000, abort=lambda: False)
        counts = session.counts()
    finally:
        session.close()
    return events, gpio, addresses, counts, start


def test_udp_session_records_the_same_events_as_tcp(fpga_model):
    assert fpga_model.transport is Transport.MQTT_UDP
    events, gpio, _, counts, start = run_session(fpga_model, clients(4, ("t/x", "t/#")))
    subscribed = sorted((e for e in events if e[0] == "subscribe"), key=lambda e: e[10])
    assert [e[3] for e in subscribed] == ["sub-0", "sub-1", "sub-2", "sub-3"]
    assert [e[4] for e in subscribed] == ["t/x", "t/#", "t/x", "t/#"]
    published = [e for e in events if e[0] == "publish"]
    assert [e[8] for e in published] == [start + k * 1_000_000_000 // RATE_HZ
                                         for k in range(MESSAGES)]
    sent = {e[2]: e[9] for e in published}
    deliveries = [e for e in events if e[0] == "delivery"]
    assert counts == (MESSAGES, 4 * MESSAGES) and len(deliveries) == 4 * MESSAGES
    for (_, publisher, seq, receiver, topic, size, qos, warmup, _, t_pub, t_recv, source,
         t_user) in deliveries:
        # the kernel's receive stamp, mapped onto CLOCK_MONOTONIC, precedes the loop's read
        assert source == "kernel" and t_recv <= t_user
        assert receiver.startswith("sub-")
        assert (publisher, topic, size, qos) == ("pub-0", "t/x", 64, 0)
        assert t_pub == sent[seq] < t_recv
        assert warmup == (seq < 5)
    assert len(gpio.edges()) == MESSAGES + 4 * MESSAGES


def test_each_udp_client_is_its_own_address_at_the_broker(fpga_model):
    _, _, addresses, _, _ = run_session(fpga_model, clients(3))
    assert len(set(addresses)) == 4


def test_udp_session_refuses_qos_above_0_and_names_the_fix():
    endpoint = Endpoint(host="127.0.0.1", port=9, transport=Transport.MQTT_UDP)
    with pytest.raises(ValueError, match="QoS 0 only.*set workload.qos to 0"):
        MqttSession(endpoint, clients(1, qos=1), VirtualGpio(), lambda _e: None)


def test_a_full_table_fails_set_up_with_the_suback_refusal():
    backend = FpgaBackend()
    endpoint = backend.deploy(Options(topic_table_depth=1, subscriber_table_depth=1,
                                      probe_window=1), LocalHost())
    try:
        session = MqttSession(endpoint, clients(2, ("a/x", "b/x")), VirtualGpio(),
                              lambda _e: None)
        try:
            with pytest.raises(RuntimeError, match="sub-1: SUBACK refused 'b/x'.*0x80"):
                session.connect(timeout_s=5)
        finally:
            session.close()
    finally:
        backend.teardown()
    model_stats = backend.deployment().model_stats
    assert model_stats is not None and model_stats["counters"]["subscribe_refused"] == 1


def test_an_unanswered_udp_broker_fails_set_up_with_its_address():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = Endpoint(host="127.0.0.1", port=port, transport=Transport.MQTT_UDP)
    session = MqttSession(endpoint, clients(1), VirtualGpio(), lambda _e: None)
    try:
        with pytest.raises(RuntimeError, match=f"unreachable|no CONNACK.*127.0.0.1:{port}"):
            session.connect(timeout_s=1.5)
    finally:
        session.close()


def test_a_lost_subscribe_is_sent_again_until_its_suback_arrives():
    broker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    broker.bind(("127.0.0.1", 0))
    broker.settimeout(3)
    seen: list[object] = []

    def lossy_broker() -> None:
        # Answers CONNECT, drops the first SUBSCRIBE, answers its resent copy.
        for _ in range(3):
            datagram, source = broker.recvfrom(512)
            packet = decode(datagram)
            seen.append(packet)
            if isinstance(packet, Connect):
                broker.sendto(encode(ConnAck(0)), source)
            elif isinstance(packet, Subscribe) and len(seen) == 3:
                broker.sendto(encode(SubAck(packet.packet_id, (0,))), source)

    thread = threading.Thread(target=lossy_broker, daemon=True)
    thread.start()
    acks: list[tuple[int, ...]] = []
    client = UdpMqttClient("resender", on_connack=lambda _c: None, on_suback=acks.append,
                           on_message=lambda _m: None, on_failure=pytest.fail, resend_s=0.1)
    try:
        client.connect(*broker.getsockname(), keepalive=30)
        deadline = monotonic_ns() + 3_000_000_000
        client.subscribe("t/x", 0)
        while not acks and monotonic_ns() < deadline:
            client.loop_read()
            if client.want_write():
                client.loop_write()
        thread.join(3)
    finally:
        client.close()
        broker.close()
    assert acks == [(0,)]
    assert [type(p).__name__ for p in seen] == ["Connect", "Subscribe", "Subscribe"]
    assert seen[1] == seen[2] and client.resent >= 1
