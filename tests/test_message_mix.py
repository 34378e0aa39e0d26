"""Message mixes (workload.streams): the spec, the assignments, the agent's session.

A mix puts several streams (topic, payload size, rate, publishers, QoS) into one run;
every subscriber subscribes to every stream's topic and expects every stream's messages.
"""

from __future__ import annotations

import copy

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import UDP_MAX_PAYLOAD, MqttSession
from mqttbed.campaigns.spec import expand_points, load_spec, parse_spec
from mqttbed.controller.assignments import (
    agents_needed,
    client_ids,
    plan_assignments,
    run_window_ns,
)
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.errors import SpecError
from mqttbed.core.events import decode_payload
from mqttbed.core.protocol import (
    ClientAssignment,
    Endpoint,
    Role,
    SubscribedStream,
    Transport,
)

MIX = {"name": "mix", "workload": {
    "subscribers": 3, "messages": 40, "warmup_messages": 4,
    "streams": [
        {"name": "small", "topic": "msg/small", "payload_bytes": 100, "rate_hz": 50,
         "publishers": 2},
        {"name": "large", "topic": "msg/large", "payload_bytes": 65_536, "period_s": 0.2,
         "messages": 10, "warmup_messages": 1, "qos": 1, "offset_s": 0.05}]}}


def mix(**workload) -> dict:
    data = copy.deepcopy(MIX)
    data["workload"].update(workload)
    return data


# -- the spec -----------------------------------------------------------------------------


def test_a_mix_resolves_each_streams_defaults_and_publisher_indexes():
    small, large = parse_spec(MIX).workload.resolved_streams()
    assert (small.name, small.rate_hz, small.messages, small.warmup_messages) == \
        ("small", 50, 40, 4)
    assert (large.rate_hz, large.messages, large.warmup_messages, large.qos) == (5, 10, 1, 1)
    assert (small.first_publisher, large.first_publisher) == (0, 2)


def test_a_workload_without_streams_is_its_one_stream():
    workload = parse_spec({"name": "one", "workload": {"publishers": 2, "topic": "a/b",
                                                       "payload_bytes": 80}}).workload
    (stream,) = workload.resolved_streams()
    assert (stream.name, stream.topic, stream.payload_bytes, stream.publishers) == \
        ("a/b", "a/b", 80, 2)
    assert workload.model_dump()["topic"] == "a/b"   # dumped as before


def test_a_stream_is_named_by_its_topic_unless_named():
    spec = parse_spec(mix(streams=[{"topic": "x/y", "payload_bytes": 64, "rate_hz": 1}]))
    assert spec.workload.resolved_streams()[0].name == "x/y"


@pytest.mark.parametrize(("change", "message"), [
    ({"topic": "old/topic"},
     r"workload: streams replaces topic \(each stream has its own\); drop topic"),
    ({"publishers": 1, "qos": 0}, r"streams replaces publishers, qos"),
    ({"streams": [{"topic": "a", "payload_bytes": 64, "rate_hz": 2, "period_s": 0.5}]},
     r"workload\.streams\.0: both rate_hz \(2\.0\) and period_s \(0\.5\): give exactly one"),
    ({"streams": [{"topic": "a", "payload_bytes": 64}]},
     r"workload\.streams\.0: neither rate_hz nor period_s"),
    ({"streams": [{"topic": "a", "payload_bytes": 64, "rate_hz": 1},
                  {"topic": "a", "payload_bytes": 2000, "rate_hz": 1}]},
     r"streams share the name 'a'.*give each stream a distinct name"),
    ({"streams": [{"topic": "a", "payload_bytes": 8, "rate_hz": 1}]},
     r"workload\.streams\.0\.payload_bytes: bad value 8"),
    ({"streams": [{"topic": "a/+", "payload_bytes": 64, "rate_hz": 1}]},
     r"workload\.streams\.0\.topic: bad value 'a/\+'.*without wildcards"),
    ({"streams": [{"topic": "a", "payload_bytes": 64, "rate_hz": 1, "messages": 3}]},
     r"streams\.0\.warmup_messages \(4\) must be less than its messages \(3\)"),
    ({"streams": [{"topic": "a", "payload_bytes": 64, "rate_hz": 1, "colour": "red"}]},
     r"workload\.streams\.0\.colour: unknown key \(value 'red'\)"),
    ({"streams": []}, r"workload\.streams: bad value \[\]"),
    ({"pacing": "closed-loop", "min_window_s": 1},
     r"QoS 0 has none \(streams small\); set qos to 1 or 2"),
])
def test_a_bad_mix_is_refused_naming_the_field_and_value(change, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(mix(**change))


def test_a_streams_field_is_swept_by_its_index_and_a_rate_by_either_spelling():
    data = mix()
    data["sweep"] = {"workload.streams.1.payload_bytes": [1024, 1_000_000],
                     "workload.streams.1.rate_hz": [2]}
    points = expand_points(parse_spec(data))
    assert [[(s.payload_bytes, s.rate_hz) for s in p.spec.workload.resolved_streams()]
            for p in points] == [[(100, 50), (1024, 2)], [(100, 50), (1_000_000, 2)]]


def test_a_whole_mix_is_a_scenario_of_a_single_stream_spec():
    data = {"name": "s", "workload": {"topic": "one/topic", "subscribers": 1},
            "scenarios": [{"name": "single"},
                          {"name": "mix", "workload.streams": MIX["workload"]["streams"]}]}
    single, mixed = expand_points(parse_spec(data))
    assert [s.name for s in single.spec.workload.resolved_streams()] == ["one/topic"]
    assert [s.name for s in mixed.spec.workload.resolved_streams()] == ["small", "large"]


@pytest.mark.parametrize(("sweep", "message"), [
    ({"workload.streams.2.qos": [1]}, r"workload\.streams\.2\.qos: the workload has 2 streams"),
    ({"workload.streams.one.qos": [1]}, r"use workload\.streams\.N\.FIELD"),
    ({"workload.streams.0.colour": [1]}, r"FIELD one of name, topic, payload_bytes"),
    ({"workload.payload_bytes": [64]},
     r"sweep point \(workload\.payload_bytes=64\): workload: streams replaces payload_bytes"),
])
def test_a_bad_sweep_of_a_mix_names_the_path(sweep, message):
    data = mix()
    data["sweep"] = sweep
    with pytest.raises(SpecError, match=message):
        parse_spec(data)


def test_a_mix_dumped_for_the_database_loads_again():
    spec = parse_spec(mix())
    dumped = spec.model_dump(mode="json")
    assert "topic" not in dumped["workload"] and "publishers" not in dumped["workload"]
    assert parse_spec(dumped).workload == spec.workload


def test_an_impaired_publisher_is_named_across_the_streams():
    data = mix()
    data["network"] = {"impairments": [{"group": "pub-2", "delay_ms": 5}]}
    parse_spec(data)   # the large stream's one publisher
    data["network"]["impairments"][0]["group"] = "pub-3"
    with pytest.raises(SpecError, match="no client 'pub-3': the workload has 3 publishers"):
        parse_spec(data)


def test_the_built_in_message_mix_campaign_is_the_papers_two_streams():
    spec = load_spec("campaigns/message-mix.yaml")
    small, large = spec.workload.resolved_streams()
    assert (small.payload_bytes, large.payload_bytes) == (100, 1_000_000)
    assert small.rate_hz == large.rate_hz == 0.25   # every 4 s


# -- the assignments ------------------------------------------------------------------------


def _assignments(data: dict, agents: int = 2) -> list[ClientAssignment]:
    spec = parse_spec(data)
    endpoint = Endpoint(host="127.0.0.1", port=1883)
    planned = plan_assignments(spec, "r", "c", endpoint, [f"a{i}" for i in range(agents)])
    return [client for a in planned.values() for client in a.clients]


def test_each_streams_publishers_are_clients_of_their_own_numbered_across_streams():
    clients = {c.client_id: c for c in _assignments(mix())}
    assert client_ids(parse_spec(mix())) == ["pub-0", "pub-1", "pub-2", "sub-0", "sub-1",
                                             "sub-2"]
    pubs = [clients[f"pub-{i}"] for i in range(3)]
    assert [p.publisher_index for p in pubs] == [0, 1, 2]
    assert [(p.topic, p.payload_bytes, p.rate_hz, p.messages, p.warmup_messages, p.qos)
            for p in pubs] == [("msg/small", 100, 50, 40, 4, 0)] * 2 + [
        ("msg/large", 65_536, 5, 10, 1, 1)]
    # staggered over their own stream's period, from the stream's offset
    assert [p.start_offset_ns for p in pubs] == [0, 10_000_000, 50_000_000]
    assert agents_needed(parse_spec(mix())) == 2


def test_every_subscriber_expects_every_message_of_every_stream_exactly():
    subscribers = [c for c in _assignments(mix(), agents=3) if c.role == Role.SUBSCRIBER]
    assert len(subscribers) == 3
    for sub in subscribers:
        assert sub.expected_messages == 2 * 40 + 1 * 10
        assert sub.subscriptions() == [("msg/small", 0), ("msg/large", 1)]
        assert sub.streams == [
            SubscribedStream(topic="msg/small", qos=0, first_publisher=0, publishers=2,
                             warmup_messages=4),
            SubscribedStream(topic="msg/large", qos=1, first_publisher=2, publishers=1,
                             warmup_messages=1)]


def test_streams_sharing_a_topic_share_one_subscription_at_the_higher_qos():
    data = mix(streams=[
        {"name": "small", "topic": "msg/all", "payload_bytes": 100, "rate_hz": 4},
        {"name": "large", "topic": "msg/all", "payload_bytes": 10_000, "rate_hz": 1, "qos": 1,
         "publishers": 3}])
    sub = next(c for c in _assignments(data) if c.role == Role.SUBSCRIBER)
    assert sub.subscriptions() == [("msg/all", 1)]
    assert sub.expected_messages == 40 + 3 * 40


def test_the_window_covers_the_slowest_stream_from_its_offset():
    # small: 40 at 50 Hz from 0 (the 2nd publisher 10 ms late): 0.81 s;
    # large: 10 at 5 Hz from 50 ms: 2.05 s
    assert run_window_ns(parse_spec(mix())) == 2_050_000_000


def test_a_single_stream_workload_is_assigned_as_before():
    data = {"name": "one", "workload": {"publishers": 2, "subscribers": 1, "topic": "t/x",
                                       "rate_hz": 100, "messages": 50, "qos": 1}}
    clients = {c.client_id: c for c in _assignments(data)}
    assert clients["pub-1"].start_offset_ns == 5_000_000
    sub = clients["sub-0"]
    assert (sub.topic, sub.qos, sub.expected_messages, sub.streams) == ("t/x", 1, 100, [])
    assert sub.subscriptions() == [("t/x", 1)]
    assert run_window_ns(parse_spec(data)) == 5_000_000 + 500_000_000


# -- the agent's session ---------------------------------------------------------------------


@pytest.mark.integration  # Mosquitto
@pytest.mark.parametrize("mqtt_client", ["native", "lean", "paho"])
def test_a_session_carries_100_byte_and_1_mb_messages_side_by_side(broker, mqtt_client):
    data = mix(subscribers=2, streams=[
        {"name": "small", "topic": "msg/small", "payload_bytes": 100, "rate_hz": 50,
         "messages": 20, "warmup_messages": 2},
        {"name": "large", "topic": "msg/large", "payload_bytes": 1_000_000, "rate_hz": 5,
         "messages": 4, "warmup_messages": 1, "qos": 1}])
    clients = _assignments(data, agents=1)
    events: list = []
    sizes: dict[tuple[str, int, str], int] = {}
    session = MqttSession(broker, clients, VirtualGpio(), events.append,
                          mqtt_client=mqtt_client)
    try:
        session.connect(timeout_s=10)
        for client in session._clients:   # keep the payload's length as received
            if client.spec.role == Role.SUBSCRIBER and mqtt_client == "lean":
                # the lean client hands over (buffer, start, end) of its receive buffer
                on_publish = client.conn._on_publish

                def keep_lean(topic, data, start, end, *rest, on_publish=on_publish,
                              name=client.spec.client_id):
                    seq, index, _, _ = decode_payload(bytes(data[start:end]))
                    sizes[(f"pub-{index}", seq, name)] = end - start
                    on_publish(topic, data, start, end, *rest)
                client.conn._on_publish = keep_lean
            elif client.spec.role == Role.SUBSCRIBER and mqtt_client == "paho":
                on_message = client.paho.on_message

                def keep(c, u, msg, on_message=on_message, name=client.spec.client_id):
                    seq, index, _, _ = decode_payload(msg.payload)
                    sizes[(f"pub-{index}", seq, name)] = len(msg.payload)
                    on_message(c, u, msg)
                client.paho.on_message = keep
        start = monotonic_ns() + 50_000_000
        session.run(start, start + 10_000_000_000, abort=lambda: False)
        counts = session.counts()
    finally:
        session.close()
    assert counts == (20 + 4, 2 * (20 + 4))   # every subscriber got every message
    assert session.native == (mqtt_client == "native")
    subscribed = [(e[3], e[4], e[6]) for e in events if e[0] == "subscribe"]
    assert subscribed == [("sub-0", "msg/small", 0), ("sub-0", "msg/large", 1),
                          ("sub-1", "msg/small", 0), ("sub-1", "msg/large", 1)]
    deliveries = [e for e in events if e[0] == "delivery"]
    for _, publisher, seq, receiver, topic, size, _, warmup, *_ in deliveries:
        small = publisher == "pub-0"
        assert (topic, size) == (("msg/small", 100) if small else ("msg/large", 1_000_000))
        # the engine records the payload's length as received (its payload_bytes column)
        assert mqtt_client == "native" or sizes[(publisher, seq, receiver)] == size
        assert warmup == (seq < (2 if small else 1))   # each stream's own warm-up


@pytest.mark.parametrize(("transport", "most"), [
    # a 3-byte remaining length, the topic's length and the 9-byte topic: 15 bytes
    (Transport.MQTT_UDP, UDP_MAX_PAYLOAD - 15),
    # a 3-byte length, type, flags, topic id and message id: 9 bytes
    (Transport.MQTT_SN_UDP, UDP_MAX_PAYLOAD - 9)])
def test_udp_transports_refuse_a_payload_beyond_one_datagram_naming_the_most(transport, most):
    endpoint = Endpoint(host="127.0.0.1", port=9, transport=transport)

    def publisher(payload_bytes: int) -> ClientAssignment:
        return ClientAssignment(client_id="pub-1", role=Role.PUBLISHER, topic="msg/large",
                                qos=0, gpio_pin=2, payload_bytes=payload_bytes, rate_hz=1,
                                messages=2)

    for too_large in (1_000_000, most + 1):
        with pytest.raises(ValueError, match=(
                rf"{transport} carries one PUBLISH per UDP datagram \(at most "
                rf"{UDP_MAX_PAYLOAD} bytes\); pub-1 publishes {too_large}-byte payloads on "
                rf"'msg/large': set its payload_bytes to at most {most}$")):
            MqttSession(endpoint, [publisher(too_large)], VirtualGpio(), lambda _e: None)
    MqttSession(endpoint, [publisher(most)], VirtualGpio(), lambda _e: None).close()
