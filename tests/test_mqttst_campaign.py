"""The mqtt-st backend end to end: K real Mosquittos with tree nodes, agents, Spark.

From the CLI: the root killed mid-run (the next capability takes over, delivery resumes,
the recovery is measured, nothing is left). Over the REST API: the paper's three
placements in closed loop at QoS 2. And the spec errors a user meets first.
"""

from __future__ import annotations

import pytest

from mqttbed.campaigns.spec import builtin_spec_path, expand_points, load_spec, parse_spec
from mqttbed.core.errors import SpecError
from tests.conftest import eventually, processes_mentioning
from tests.mqttst_support import run_campaign

pytestmark = pytest.mark.integration

FAILURE = {
    "name": "mqtt-st-failure-smoke",
    "broker": {"backend": "mqtt-st", "brokers": 3, "keepalive_s": 2,
               "capabilities": {0: 900, 1: 800, 2: 700}, "fail": {"broker": "root", "at_s": 1.0}},
    "workload": {"placement": "distributed", "publishers": 2, "subscribers": 4,
                 "topic": "mqttst/fail", "rate_hz": 200, "messages": 500, "qos": 1,
                 "warmup_messages": 20},
    "agents": {"count": 2},
    "timing": {"drain_s": 1, "heartbeat_timeout_s": 10},
}
PLACEMENTS = {
    "name": "mqtt-st-placements-smoke",
    # No queue limit: three closed-loop native publishers send ~14,000 msg/s, and a
    # subscriber's agent stalled for a moment on a loaded 2-core machine fills its
    # in-flight window; Mosquitto 2.0.11 with a queue limit then loses completed QoS 2
    # messages for it (329 deliveries in one CI run), with none it does not:
    # test_a_full_queue_is_the_brokers_loss below and docs/validation/mqtt-st.md.
    "broker": {"backend": "mqtt-st", "brokers": 3, "max_queued_messages": 0},
    "workload": {"pacing": "closed-loop", "qos": 2, "publishers": 3, "subscribers": 3,
                 "topic": "mqttst/local", "rate_hz": 10000, "messages": 100000,
                 "min_window_s": 1.0, "warmup_messages": 10},
    "agents": {"count": 2},
    # closed loop: a publisher's next message waits for its own broker's PUBCOMP, not for
    # the tree, so forwarding may trail by thousands of messages on a loaded machine (a
    # tail of 1,882 seen in CI after a 1 s drain): drain until the subscribers fall idle
    "timing": {"drain_s": 60, "drain_idle_s": 2, "heartbeat_timeout_s": 10},
    "scenarios": [{"name": name, "workload.placement": name}
                  for name in ("benchmark", "distributed", "locality")],
}


def tree_processes() -> set[int]:
    return {p.pid for p in processes_mentioning("mqttbed.brokers.mqttst")}


@pytest.mark.system
@pytest.mark.timeout(300)
def test_killing_the_root_elects_the_next_and_delivery_resumes(tmp_path):
    before = tree_processes()
    (point,) = run_campaign(FAILURE, tmp_path)
    tree = point["sections"]["mqtt_st"]
    assert tree["brokers_deployed"] == 3
    assert tree["root"] == 0 and tree["root_after_failure"] == 1   # by capability
    # a full mesh of 3 as a star around the root: two active links, one blocked
    assert tree["links"] == {"root": 2, "designated": 2, "blocked": 1}
    assert 0 < tree["reconvergence_s"]["max"] < 5
    assert tree["pingreq_bytes_plain"] == 2 and tree["pingreq_bytes_mqtt_st"] > 2
    assert set(tree["brokers"]) == {"0", "1", "2"}
    fault = point["fault"]
    assert fault["faults"][0].endswith("killed broker 0 (the root)")
    assert fault["at_s"] == pytest.approx(1.0, abs=0.2)
    # every subscriber (on brokers 1 and 2) received messages sent after the root died
    assert fault["receivers_not_resumed"] == 0
    assert 0 < fault["delivery_resumed_s"]["max"] < 5
    # what did not arrive is counted, nothing arrived twice
    assert point["deliveries_received"] + point["lost"] == point["deliveries_expected"]
    assert point["deliveries_expected"] == 4 * 2 * 480 and point["duplicates"] == 0
    assert tree_processes() <= before


@pytest.mark.system
@pytest.mark.parallel   # counts and text only; the recovery times are the test above's
@pytest.mark.timeout(400)
def test_the_three_placements_over_the_rest_api(tmp_path):
    from tests.conftest import Served

    served = Served(tmp_path / "served")
    with served.server, served.client() as http:
        created = http.post("/api/v1/campaigns", json=PLACEMENTS)
        assert created.status_code == 201, created.text
        campaign_id = created.json()["id"]
        assert http.post(f"/api/v1/campaigns/{campaign_id}/start").status_code == 200
        served.wait_for_status(campaign_id, ("done",), 360)
        points = {p["params"]["scenario"]: p
                  for p in http.get(f"/api/v1/campaigns/{campaign_id}/stats").json()["points"]}
        report = http.get(f"/campaigns/{campaign_id}")
    assert set(points) == {"benchmark", "distributed", "locality"}
    for point in points.values():
        assert point["lost"] == 0 and point["duplicates"] == 0
        assert point["deliveries_received"] == 3 * point["messages_sent"]
        assert point["publication_msgs_per_s"] > 0
    assert points["benchmark"]["sections"]["mqtt_st"] is None   # one plain Mosquitto
    for name in ("distributed", "locality"):
        assert points[name]["sections"]["mqtt_st"]["brokers_deployed"] == 3
    # locality keeps every client on broker 0, yet every message is replicated
    assert points["locality"]["sections"]["mqtt_st"]["forwarded"] >= 2 * (
        points["locality"]["messages_sent"])
    assert report.status_code == 200
    assert "plot-publication" in report.text and "plot-mean-delay" in report.text


def test_placement_needs_a_backend_with_several_brokers():
    with pytest.raises(SpecError, match=r"workload.placement 'locality': backend mosquitto"):
        parse_spec({"name": "x", "workload": {"placement": "locality"}})


@pytest.mark.parametrize(("broker", "message"), [
    ({"fail": {"broker": 3, "at_s": 1}}, r"fail.broker 3 is not one of the brokers 0..2"),
    ({"locality_broker": 5}, r"locality_broker 5 is not one of the brokers 0..2"),
    ({"topology": "0-1,1-7"}, r"0-1,1-7"),
    ({"topology": "star"}, r"star"),
    ({"capabilities": {1: -4}}, r"capabilities\[1\] = -4"),
    ({"brokers": 1}, r"brokers"),
])
def test_a_wrong_mqtt_st_section_names_the_field_and_value(broker, message):
    with pytest.raises(SpecError, match=message):
        parse_spec({"name": "x", "broker": {"backend": "mqtt-st", **broker}})


def test_closed_loop_pacing_needs_acknowledgements_and_a_window():
    with pytest.raises(SpecError, match="QoS 0 has none"):
        parse_spec({"name": "x", "workload": {"pacing": "closed-loop", "min_window_s": 1}})
    with pytest.raises(SpecError, match="needs min_window_s > 0"):
        parse_spec({"name": "x", "workload": {"pacing": "closed-loop", "qos": 2}})


@pytest.mark.parametrize(("name", "points"), [("mqtt-st-local", 24), ("mqtt-st-failure", 2)])
def test_the_mqtt_st_campaigns_load(name, points):
    spec = load_spec(builtin_spec_path(name))
    assert len(expand_points(spec)) == points
    assert spec.broker.backend == "mqtt-st"



@pytest.mark.parametrize("max_queued", [5, 1000])
def test_a_full_queue_is_the_brokers_loss(max_queued):
    """A QoS 2 subscriber stops acknowledging while 50 messages are published, then reads
    again. Mosquitto 2.0.11 with a queue limit (5, or its default 1000) completes every
    publish (PUBCOMP) yet hands the subscriber only some of them (6 here, whichever the
    limit; its $SYS dropped counter counts none of them). So a QoS 2 loss with a lagging
    subscriber is the broker's, not the agents' (PLACEMENTS above). With no limit (0) it
    was seen to hold the publisher back instead, or to drop its connection: not a
    behaviour to assert, but one that loses nothing the publisher counts as sent."""
    import threading
    import time

    import paho.mqtt.client as mqtt

    from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options
    from mqttbed.core.host import LocalHost

    inflight, sent = 2, 50
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(max_inflight_messages=inflight,
                                      max_queued_messages=max_queued, sys_topics=False),
                              LocalHost())
    clients: list[mqtt.Client] = []

    def client(name: str) -> mqtt.Client:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name, clean_session=True)
        c.connect(endpoint.host, endpoint.port)
        clients.append(c)
        return c

    try:
        received: list[bytes] = []
        slow = client("slow-subscriber")
        slow.on_message = lambda _c, _u, msg: received.append(msg.payload)
        subscribed = threading.Event()
        slow.on_subscribe = lambda *_: subscribed.set()
        slow.subscribe("queue/test", qos=2)
        while not subscribed.is_set():
            slow.loop(timeout=0.1)
        # from here the subscriber reads nothing: no PUBREC goes back, its window fills
        publisher = client("publisher")
        publisher.loop_start()
        infos = [publisher.publish("queue/test", str(i).encode(), qos=2) for i in range(sent)]
        completed = lambda: sum(info.is_published() for info in infos)  # noqa: E731
        assert eventually(lambda: completed() == sent, timeout_s=20)
        end = time.monotonic() + 3.0     # the subscriber reads again
        while time.monotonic() < end and len(received) < sent:
            slow.loop(timeout=0.1)
        assert inflight <= len(received) < sent
    finally:
        for c in clients:
            c.loop_stop()
            c.disconnect()
        backend.teardown()
