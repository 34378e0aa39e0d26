"""Both shapes of this work through the controller: ``mqttbed run`` on a campaign whose
scenarios share a QoS 1 stream over a $share group on Mosquitto at MQTT 5, and
spread messages over a topic tree with wildcard subscribers on Mosquitto and on amqtt (a
third-party broker that declares wildcards; none of the third-party presets shares a
stream: see brokers/command/presets.py). The stats count each message once per group and
each filter's deliveries against what it matches."""

from __future__ import annotations

import json

import pytest

from mqttbed.campaigns.shapes import TopicTree, tree_messages_matching
from tests.test_spine_end_to_end import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.parallel,
              pytest.mark.timeout(300)]

MESSAGES, WARMUP = 120, 10
TREE = {"levels": 2, "fanout": 10, "filters": ["#", "+/3", "4/#"]}
SPEC = {
    "name": "shapes-h2",
    "broker": {"backend": "mosquitto"},
    "workload": {"publishers": 2, "subscribers": 3, "topic": "h2/shapes", "qos": 1,
                 "rate_hz": 200, "messages": MESSAGES, "warmup_messages": WARMUP},
    "timing": {"start_lead_s": 0.3, "drain_s": 1.0, "drain_idle_s": 0.4},
    "scenarios": [
        {"name": "shared-v5", "workload.shared": {"group": "w", "groups": 1},
         "workload.protocol": "5"},
        {"name": "tree-mosquitto", "workload.topic_tree": TREE},
        {"name": "tree-amqtt", "broker.backend": "amqtt", "workload.topic_tree": TREE},
    ],
}


def test_shared_groups_and_topic_trees_run_from_the_cli(tmp_path):
    done, stats_path = run_cli(SPEC, tmp_path)
    stats = json.loads(stats_path.read_text())
    points = {point["params"]["scenario"]: point for point in stats["points"]}
    measured = 2 * (MESSAGES - WARMUP)
    for name in ("shared-v5",):   # 3.1.1's form: tests/test_shared_subscriptions.py
        point = points[name]
        # one group of three: every message due once to the group, none per member
        assert (point["deliveries_expected"], point["deliveries_received"], point["lost"],
                point["duplicates"], point["deliveries_unexpected"]) == (
            measured, measured, 0, 0, 0), name
        group = point["shared"]["groups"]["$share/w-0"]
        assert (group["members"], group["delivered"], group["lost"], group["duplicated"]) == (
            3, measured, 0, 0), name
        assert sum(m["deliveries"] for m in group["by_member"].values()) == measured
        assert 0 < group["fairness"] <= 1
        assert point["topic_tree"] is None
    for name in ("tree-mosquitto", "tree-amqtt"):
        point = points[name]
        tree = point["topic_tree"]
        assert tree["topics_published"] == 100, name
        # each publisher's measured messages (after its warm-up) from its offset, counted
        # from the tree: what each filter's one subscriber is due
        due = {f"h2/shapes/{f}": sum(tree_messages_matching(
            TopicTree(**TREE), f, first + WARMUP, MESSAGES - WARMUP) for first in (0, 50))
            for f in TREE["filters"]}
        assert due["h2/shapes/#"] == measured and 0 < due["h2/shapes/+/3"] < measured
        assert {f: (t["matched"], t["delivered"], t["lost"], t["unexpected"])
                for f, t in tree["filters"].items()} == {
            f: (n, n, 0, 0) for f, n in due.items()}, name
        assert point["lost"] == point["duplicates"] == point["deliveries_unexpected"] == 0
        assert point["shared"] is None
    assert "tree-amqtt" in done.stdout
