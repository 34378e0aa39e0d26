"""workload.retained before a run: what each client is assigned, how long the window is,
and what is refused (a client that cannot set retained state, a broker that keeps none)."""

from __future__ import annotations

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.assignments import plan_assignments, run_window_ns
from mqttbed.core.errors import SpecError
from mqttbed.core.protocol import Endpoint, Role


def spec(**retained: object) -> dict:
    return {"name": "retained", "broker": {"backend": "mosquitto"}, "workload": {
        "publishers": 3, "subscribers": 2, "topic": "state", "rate_hz": 100, "qos": 1,
        "retained": {"topics": 10, "updates": 2, "subscribe_after_s": 0.5, **retained}}}


def test_publishers_share_the_topics_and_subscribers_subscribe_after_the_window():
    parsed = parse_spec(spec())
    (assignment,) = plan_assignments(parsed, "r", "c", Endpoint(host="h", port=1),
                                     ["a"]).values()
    publishers = [c for c in assignment.clients if c.role == Role.PUBLISHER]
    topics = []
    for client in publishers:
        plan = client.retained
        assert plan is not None and plan.stride == 3 and client.warmup_messages == 0
        assert client.messages == plan.count * 2
        topics += [plan.first + j * plan.stride for j in range(plan.count)]
    assert sorted(topics) == list(range(10))  # every topic set by exactly one publisher
    # the slowest publisher sets 4 topics twice at 100 Hz, starting 2/3 of a period late
    sending_ns = int(2 * 10_000_000 / 3) + 8 * 10_000_000
    assert run_window_ns(parsed) == sending_ns + 500_000_000
    for client in (c for c in assignment.clients if c.role == Role.SUBSCRIBER):
        assert (client.topic, client.expected_messages) == ("state/#", 10)
        assert client.retained is not None
        assert client.retained.subscribe_after_start_ns == run_window_ns(parsed)
        assert client.retained.subscribe_after_publishers_ns == 500_000_000


def test_more_publishers_than_topics_leaves_the_extra_ones_idle():
    parsed = parse_spec({**spec(topics=2), "workload": {**spec(topics=2)["workload"],
                                                        "publishers": 4}})
    (assignment,) = plan_assignments(parsed, "r", "c", Endpoint(host="h", port=1),
                                     ["a"]).values()
    counts = [c.messages for c in assignment.clients if c.role == Role.PUBLISHER]
    assert counts == [2, 2, 0, 0]


@pytest.mark.parametrize("client", ["lean", "paho"])
def test_a_python_client_is_refused_naming_workload_client(client):
    data = spec()
    data["workload"]["client"] = client
    with pytest.raises(SpecError, match=rf"workload.retained .* workload.client '{client}'"):
        parse_spec(data)


def test_a_broker_that_keeps_no_retained_state_under_wildcards_is_refused_by_name():
    data = spec()
    data["broker"] = {"backend": "rabbitmq"}
    with pytest.raises(SpecError, match=r"workload.retained: broker rabbitmq keeps no "
                                        r"retained messages .*exact topic only"):
        parse_spec(data)


def test_the_lean_fallback_refuses_retained_clients_before_connecting():
    parsed = parse_spec(spec())
    (assignment,) = plan_assignments(parsed, "r", "c", Endpoint(host="h", port=1),
                                     ["a"]).values()
    with pytest.raises(ValueError, match=r"workload.retained: client pub-0 .* the lean client"):
        MqttSession(assignment.broker, assignment.clients, VirtualGpio(), lambda e: None,
                    mqtt_client="lean")


def test_the_example_campaign_sweeps_10_to_10000_topics():
    from mqttbed.campaigns.spec import builtin_spec_path, expand_points, load_spec

    points = expand_points(load_spec(builtin_spec_path("retained")))
    topics = [p.spec.workload.retained.topics for p in points
              if p.spec.workload.retained is not None]
    assert topics == [10, 1000, 10000]
