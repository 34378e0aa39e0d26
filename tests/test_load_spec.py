"""The workload options of load generation: the client, per-publisher topics."""

from __future__ import annotations

import pytest

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
