"""The agent's MQTT session against a real Mosquitto: sockets, schedule, events."""

from __future__ import annotations

import socket
import threading

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.events import PAYLOAD_MIN_BYTES, decode_payload, encode_payload
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import ClientAssignment, Role

RATE_HZ = 500
MESSAGES = 50


def clients(subscribers: int) -> list[ClientAssignment]:
    pub = ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="t/x", qos=0,
                           gpio_pin=2, payload_bytes=64, rate_hz=RATE_HZ, messages=MESSAGES,
                           warmup_messages=5)
    subs = [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER, topic="t/x", qos=0,
                             gpio_pin=3 + j, warmup_messages=5, expected_messages=MESSAGES,
                             subscribe_rank=j) for j in range(subscribers)]
    return [pub, *reversed(subs)]  # given out of order on purpose


def run_session(endpoint, subscribers=3):
    events, gpio = [], VirtualGpio()
    session = MqttSession(endpoint, clients(subscribers), gpio, events.append)
    try:
        session.connect(timeout_s=10)
        nodelay = [c.paho.socket().getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                   for c in session._clients]
        start = monotonic_ns() + 50_000_000
        session.run(start, start + 2_000_000_000, abort=lambda: False)
        counts = session.counts()
    finally:
        session.close()
    return events, gpio, nodelay, counts, start


@pytest.mark.integration  # Mosquitto
def test_every_mqtt_socket_has_tcp_nodelay(broker):
    _, _, nodelay, _, _ = run_session(broker)
    assert len(nodelay) == 4 and all(nodelay)


@pytest.mark.integration  # Mosquitto
def test_subscribers_subscribe_in_rank_order(broker):
    events, *_ = run_session(broker)
    subscribed = [e for e in events if e[0] == "subscribe"]
    assert [e[3] for e in sorted(subscribed, key=lambda e: e[10])] == ["sub-0", "sub-1", "sub-2"]


@pytest.mark.integration  # Mosquitto
def test_publishes_follow_the_open_loop_schedule(broker):
    events, _, _, counts, start = run_session(broker)
    published = [e for e in events if e[0] == "publish"]
    assert [e[2] for e in published] == list(range(MESSAGES))
    assert [e[8] for e in published] == [start + k * 1_000_000_000 // RATE_HZ
                                         for k in range(MESSAGES)]
    assert all(e[9] >= e[8] for e in published)  # never sent before it was due
    assert [e[7] for e in published] == [k < 5 for k in range(MESSAGES)]
    assert counts == (MESSAGES, 3 * MESSAGES)


@pytest.mark.integration  # Mosquitto
def test_every_delivery_carries_the_send_time_of_its_publish(broker):
    events, gpio, *_ = run_session(broker)
    sent = {e[2]: e[9] for e in events if e[0] == "publish"}
    deliveries = [e for e in events if e[0] == "delivery"]
    assert len(deliveries) == 3 * MESSAGES
    for (_, publisher, seq, receiver, topic, size, qos, warmup, _, t_pub, t_recv, source,
         t_user) in deliveries:
        # the kernel's receive stamp, mapped onto CLOCK_MONOTONIC, precedes the loop's read
        assert source == "kernel" and t_recv <= t_user
        assert receiver.startswith("sub-")
        assert (publisher, topic, size, qos) == ("pub-0", "t/x", 64, 0)
        assert t_pub == sent[seq] and t_recv > t_pub
        assert warmup == (seq < 5)
    # a GPIO edge per publish and per receipt
    assert len(gpio.edges()) == MESSAGES + 3 * MESSAGES


def test_payload_round_trips_and_has_the_requested_size():
    payload = encode_payload(7, 3, 123456789, 123456000, 64)
    assert len(payload) == 64
    assert decode_payload(payload) == (7, 3, 123456789, 123456000)
    assert len(encode_payload(0, 0, 0, 0, PAYLOAD_MIN_BYTES)) == PAYLOAD_MIN_BYTES
    with pytest.raises(ValueError):
        decode_payload(b"hello world, not ours at all....")


@pytest.mark.integration  # Mosquitto
def test_subscribe_takes_the_ranks_it_is_given_in_that_order_only(broker):
    events, gpio = [], VirtualGpio()
    session = MqttSession(broker, clients(3), gpio, events.append)
    try:
        session.open(timeout_s=10)
        assert session.subscriber_ranks() == [0, 1, 2]
        session.subscribe(10, [2])
        assert [e[3] for e in events if e[0] == "subscribe"] == ["sub-2"]
        session.subscribe(10, [0, 1])
        with pytest.raises(RuntimeError, match="no subscriber of rank 7"):
            session.subscribe(10, [7])
    finally:
        session.close()
    subacks = [(e[10], e[3]) for e in events if e[0] == "subscribe"]
    # each SUBSCRIBE left after the SUBACK before it: SUBACK times follow the given order
    assert [name for _, name in sorted(subacks)] == ["sub-2", "sub-0", "sub-1"]


@pytest.mark.integration  # Mosquitto
def test_waiting_between_barriers_keeps_the_clients_served(broker):
    events, gpio = [], VirtualGpio()
    session = MqttSession(broker, clients(2), gpio, events.append)
    go = threading.Event()
    try:
        session.connect(timeout_s=10)
        timer = threading.Timer(1.2, go.set)   # past one keep-alive housekeeping round
        started = monotonic_ns()   # before the timer starts: it fires 1.2 s after that
        timer.start()
        session.wait_for(go)
        waited_s = (monotonic_ns() - started) / 1e9
        assert all(c.connected and not c.failure for c in session._clients)
        start = monotonic_ns() + 50_000_000
        session.run(start, start + 2_000_000_000, abort=lambda: False)
        published, received = session.counts()
    finally:
        session.close()
    assert 1.2 <= waited_s < 3.0  # returns once the event is set (polled every 50 ms)
    assert received == 2 * published > 0  # still subscribed and delivering after the wait


@pytest.mark.integration  # Mosquitto
def test_closed_loop_publishes_each_message_after_the_last_is_acknowledged(broker):
    pub = ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="t/cl", qos=2,
                           gpio_pin=2, payload_bytes=64, rate_hz=100_000, messages=200,
                           closed_loop=True)
    sub = ClientAssignment(client_id="sub-0", role=Role.SUBSCRIBER, topic="t/cl", qos=2,
                           gpio_pin=3, expected_messages=200)
    events: list = []
    session = MqttSession(broker, [pub, sub], VirtualGpio(), events.append)
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + 10_000_000_000, abort=lambda: False)
        acked = session._clients[-1].acked
    finally:
        session.close()
    published = [e for e in events if e[0] == "publish"]
    assert [e[2] for e in published] == list(range(200)) and acked == 200
    # Message k + 1 became due only when k's PUBCOMP came back: after k was sent, and
    # later than its place on the 100 kHz schedule would have put it.
    for before, after in zip(published, published[1:], strict=False):
        assert after[8] > before[9]
    slower = sum(after[8] > start + after[2] * 10_000 for after in published[1:])
    assert slower >= 150, "a QoS 2 handshake over loopback takes longer than 10 us"
    assert len([e for e in events if e[0] == "delivery"]) == 200


@pytest.mark.integration  # Mosquitto
def test_each_client_uses_the_broker_its_assignment_names(broker):
    other = MosquittoBackend()
    elsewhere = other.deploy(Options(), LocalHost())
    try:
        pub, *_ = clients(0)
        subs = [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER, topic="t/x",
                                 qos=0, gpio_pin=3 + j, warmup_messages=5,
                                 expected_messages=MESSAGES, subscribe_rank=j,
                                 broker=elsewhere if j == 1 else None) for j in range(2)]
        events: list = []
        session = MqttSession(broker, [pub, *subs], VirtualGpio(), events.append)
        try:
            session.connect(timeout_s=10)
            peers = {c.spec.client_id: c.paho.socket().getpeername()[1]
                     for c in session._clients}
            start = monotonic_ns() + 20_000_000
            session.run(start, start + 500_000_000, abort=lambda: False)
        finally:
            session.close()
    finally:
        other.teardown()
    assert peers == {"pub-0": broker.port, "sub-0": broker.port, "sub-1": elsewhere.port}
    receivers = {e[3] for e in events if e[0] == "delivery"}
    assert receivers == {"sub-0"}   # two unbridged brokers: sub-1 hears nothing


@pytest.mark.integration  # Mosquitto
def test_an_idle_drain_ends_a_subscriber_that_waits_for_more_than_will_come(broker):
    """timing.drain_idle_s: a subscriber expecting messages that never come (lost, or a
    closed-loop count it cannot know) is done once nothing reached it for the idle time
    after the window; without it, it waits for the deadline."""
    waits = []
    for idle in (300_000_000, None):
        pub, *subs = clients(2)
        subs = [s.model_copy(update={"expected_messages": MESSAGES + 10}) for s in subs]
        events: list = []
        session = MqttSession(broker, [pub, *subs], VirtualGpio(), events.append)
        try:
            session.connect(timeout_s=10)
            start = monotonic_ns() + 50_000_000
            window_end = start + MESSAGES * 1_000_000_000 // RATE_HZ
            deadline = window_end + 3_000_000_000
            session.run(start, deadline, abort=lambda: False,
                        drain_idle=None if idle is None else (window_end, idle))
            ended = monotonic_ns()
            assert session.counts() == (MESSAGES, 2 * MESSAGES)
        finally:
            session.close()
        last = max(e[12] for e in events if e[0] == "delivery")
        waits.append((ended - max(last, window_end), ended - deadline))
    (idle_wait, idle_vs_deadline), (full_wait, full_vs_deadline) = waits
    # idle: done 0.3 s after the later of the last delivery and the window's end, long
    # before the deadline (the loop checks every 50 ms at most)
    assert 300_000_000 <= idle_wait < 1_500_000_000 and idle_vs_deadline < -1_000_000_000
    # no idle time: it waited out the deadline
    assert full_vs_deadline >= 0 and full_wait >= 3_000_000_000


@pytest.mark.integration  # Mosquitto
@pytest.mark.parametrize("mqtt_client", ["lean", "paho"])
def test_clients_connect_one_at_a_time_and_each_connection_is_timed(broker, mqtt_client):
    session = MqttSession(broker, clients(2), VirtualGpio(), lambda _e: None,
                          mqtt_client=mqtt_client)
    try:
        session.open(timeout_s=10)
    finally:
        session.close()
    phases = session.connect_phases()
    assert [p.client_id for p in phases] == ["sub-0", "sub-1", "pub-0"]
    for p in phases:
        # plain TCP: the TCP connect and CONNECT -> CONNACK, nothing made up for TLS or ws
        assert p.tcp_ns > 0 and p.connack_ns > 0
        assert (p.tls_ns, p.websocket_ns) == (None, None)
    for before, after in zip(phases, phases[1:], strict=False):
        # the next connect() began once the one before held its CONNACK
        assert after.t_start_ns >= before.t_start_ns + before.tcp_ns + before.connack_ns


@pytest.mark.integration  # Mosquitto, a controller, agents on threads
def test_an_agents_done_carries_each_clients_connection_phases(inproc_controller):
    from mqttbed.campaigns.spec import parse_spec
    from mqttbed.controller.db import RunRow
    from mqttbed.core.run_record import run_record

    spec = parse_spec({"name": "phases", "workload": {
        "publishers": 1, "subscribers": 2, "rate_hz": 100, "messages": 10,
        "warmup_messages": 0, "client": "lean"}})
    campaign_id = inproc_controller.engine.create_campaign(spec)
    inproc_controller.engine.run_campaign(campaign_id)
    with inproc_controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.state == "done", run.reason
    record = run_record(run.run_metadata, run.id)
    phases = [p for agent in record.connections.values() for p in agent]
    assert sorted(p.client_id for p in phases) == ["pub-0", "sub-0", "sub-1"]
    assert all(p.tcp_ns > 0 and p.connack_ns > 0 for p in phases)
