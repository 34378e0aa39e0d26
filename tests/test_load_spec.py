"""The workload options of load generation: the client, per-publisher topics."""

from __future__ import annotations

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.assignments import plan_assignments
from mqttbed.core.errors import SpecError
from mqttbed.core.protocol import Endpoint, Role, Transport


def test_an_unknown_client_is_refused_naming_the_field_and_the_choices():
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "x", "workload": {"client": "asyncio"}})
    assert "workload.client" in str(err.value) and "'lean' or 'paho'" in str(err.value)


def test_per_publisher_topics_refuse_streams():
    with pytest.raises(SpecError, match="per-publisher.*leave topics out"):
        parse_spec({"name": "x", "workload": {"topics": "per-publisher", "streams": [
            {"topic": "a", "payload_bytes": 64, "rate_hz": 1, "publishers": 1}]}})


def test_per_publisher_topics_pair_each_subscriber_with_one_publisher():
    spec = parse_spec({"name": "x", "workload": {
        "publishers": 2, "subscribers": 3, "topics": "per-publisher", "topic": "p/t",
        "messages": 7, "warmup_messages": 1, "client": "paho"}})
    endpoint = Endpoint(host="127.0.0.1", port=1883, transport=Transport.MQTT_TCP)
    assignment = plan_assignments(spec, "r", "c", endpoint, ["a"])["a"]
    assert assignment.mqtt_client == "paho"
    assert [(c.client_id, c.topic, c.expected_messages) for c in assignment.clients] == [
        ("pub-0", "p/t/0", 0), ("pub-1", "p/t/1", 0),
        ("sub-0", "p/t/0", 7), ("sub-1", "p/t/1", 7), ("sub-2", "p/t/0", 7)]
    assert all(c.role == Role.PUBLISHER for c in assignment.clients[:2])


def test_the_generator_report_keeps_or_flags_the_rate_by_its_definition():
    spec = parse_spec({"name": "x", "workload": {
        "publishers": 3, "subscribers": 0, "rate_hz": 100, "messages": 101,
        "warmup_messages": 1}})
    endpoint = Endpoint(host="127.0.0.1", port=1883, transport=Transport.MQTT_TCP)
    clients = plan_assignments(spec, "r", "c", endpoint, ["a"])["a"].clients
    # the Python clients' counters are set by hand here; both sessions report through
    # agents.schedule_report, which this checks
    session = MqttSession(endpoint, clients, VirtualGpio(), lambda _e: None, mqtt_client="lean")
    pub0, pub1, pub2 = session._clients
    # pub-0: on time (100 messages over 1 s + one period: exactly 100/s)
    pub0.sent, pub0.first_intended_ns, pub0.last_pub_ns = 101, 0, 1_000_000_000
    # pub-1: a 60 ms backlog at the end: 101 / 1.07 s = 94.4/s < 95 % of 100/s
    pub1.sent, pub1.first_intended_ns, pub1.last_pub_ns = 101, 0, 1_060_000_000
    pub1.send_lag_max_ns = 60_000_000
    # pub-2: on time but one message never sent
    pub2.sent, pub2.first_intended_ns, pub2.last_pub_ns = 100, 0, 990_000_000
    report = session.generator_report()
    session.close()
    assert report.open_loop_publishers == 3 and report.requested_msgs_per_s == 300
    assert report.publishers_behind == ["pub-1", "pub-2"] and report.rate_kept is False
    assert report.messages_unsent == 1 and report.send_lag_max_ns == 60_000_000
    assert round(report.achieved_msgs_per_s, 3) == round(100 + 101 / 1.07 + 100, 3)
