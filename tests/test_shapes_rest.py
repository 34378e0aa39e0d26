"""The six traffic shapes over REST: one campaign, submitted to a serving controller, whose
scenarios are a connection storm, a shared subscription, a topic tree, retained state,
persistent sessions and a reconnect storm, on Mosquitto and on NATS's MQTT (the one
third-party broker here that has every shape but shared subscriptions: none of the
presets shares a stream, see brokers/command/presets.py). The results come back from
``GET .../stats`` with exact accounting per shape, and the report draws each section.

From the CLI, on amqtt too: tests/test_shared_subscriptions_system.py (shared groups,
topic trees) and tests/test_retained_end_to_end.py (retained state); every shape on every
broker that has it: ``campaigns/broker-shapes.yaml``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mqttbed.api.report import render_report
from mqttbed.campaigns.shapes import TopicTree, tree_messages_matching
from mqttbed.controller.analysis import results_type
from tests.conftest import Served
from tests.generic_support import MOSQUITTO

pytestmark = [pytest.mark.system, pytest.mark.integration, pytest.mark.timeout(420),
              pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="needs Mosquitto"),
              pytest.mark.skipif(not Path("/usr/sbin/nats-server").exists(),
                                 reason="needs nats-server")]

CLIENTS = 300              # per storm
MESSAGES = 200             # 2 s at 100 Hz: the stream of every shape but the storms
WARMUP = 10
TREE = {"levels": 2, "fanout": 10, "filters": ["#", "+/3", "4/#"]}
TOPICS, UPDATES = 200, 2   # retained
SESSIONS = {"offline": 2, "offline_at_s": 0.4, "offline_for_s": 0.8}
RESTART = {"restart_at_s": 0.7, "down_s": 0.3, "backoff_initial_s": 0.05,
           "backoff_max_s": 0.4, "persistent": True}
STORM = {"workload.mode": "connect",
         "workload.connect": {"clients": CLIENTS, "rate_hz": 1000, "hold_s": 0.6}}
SUBSCRIBERS = {"workload.subscribers": 3}
RETAINED = {**SUBSCRIBERS, "workload.publishers": 2, "workload.rate_hz": 2000,
            "workload.retained": {"topics": TOPICS, "updates": UPDATES,
                                  "subscribe_after_s": 0.4}}
SPEC = {
    "name": "shapes-rest",
    "agents": {"count": 2},
    "broker": {"backend": "mosquitto"},
    # (the subscribers are the stream shapes': a storm takes none of its own)
    "workload": {"topic": "rest/shapes", "qos": 1,
                 "rate_hz": 100, "messages": MESSAGES, "warmup_messages": WARMUP,
                 "payload_bytes": 64},
    "timing": {"start_lead_s": 0.3, "drain_s": 1.0, "drain_idle_s": 0.3},
    "repetitions": 1,
    "scenarios": [
        {"name": "connect-mosquitto", **STORM},
        {"name": "connect-nats", "broker.backend": "nats", **STORM},
        {"name": "shared-mosquitto-5", **SUBSCRIBERS, "workload.protocol": "5",
         "workload.shared": {"group": "w", "groups": 1}},
        {"name": "tree-nats", "broker.backend": "nats", **SUBSCRIBERS,
         "workload.publishers": 2, "workload.topic_tree": TREE},
        {"name": "retained-nats", "broker.backend": "nats", **RETAINED},
        {"name": "sessions-mosquitto", **SUBSCRIBERS, "workload.sessions": SESSIONS},
        {"name": "sessions-nats", "broker.backend": "nats", **SUBSCRIBERS,
         "workload.sessions": SESSIONS},
        {"name": "reconnect-mosquitto", **SUBSCRIBERS, "workload.reconnect": RESTART},
        {"name": "reconnect-nats", "broker.backend": "nats", **SUBSCRIBERS,
         "workload.reconnect": RESTART},
    ],
}


def test_the_six_shapes_run_over_rest_on_mosquitto_and_nats_into_the_report(tmp_path):
    served = Served(tmp_path / "data")
    with served.server, served.client() as http:
        campaign_id = served.start_yaml_campaign(yaml.safe_dump(SPEC))
        served.wait_for_status(campaign_id, ("done",), 400)
        answer = http.get(f"/api/v1/campaigns/{campaign_id}/stats")
        assert answer.status_code == 200, answer.text
        html = render_report(served.controller, campaign_id, standalone=True)
    stats = results_type().model_validate(answer.json())
    points = {str(p.params["scenario"]): p for p in stats.points}
    assert sorted(points) == sorted(s["name"] for s in SPEC["scenarios"])
    assert all(p.runs_failed == 0 for p in stats.points)
    measured = MESSAGES - WARMUP

    # connection storms: every client's outcome, the broker's memory from its samples
    for name in ("connect-mosquitto", "connect-nats"):
        storm = points[name].connect_storm
        assert storm is not None, name
        assert (storm.clients, storm.connected, storm.failed) == (CLIENTS, CLIENTS, 0), (
            name, storm.failures)
        assert storm.connack_from_intended_us.count == storm.connect_lag_us.count == CLIENTS
        assert storm.requested_connects_per_s == 1000.0
        assert storm.achieved_connects_per_s is not None and storm.achieved_connects_per_s > 0
    memory = points["connect-mosquitto"].connect_storm.broker_memory  # type: ignore[union-attr]
    assert memory is not None and memory.held_connections == CLIENTS

    # a shared group of three at MQTT 5: each message once to the group
    shared = points["shared-mosquitto-5"]
    assert (shared.deliveries_expected, shared.deliveries_received, shared.lost,
            shared.duplicates, shared.deliveries_unexpected) == (measured, measured, 0, 0, 0)
    assert shared.shared is not None
    group = shared.shared.groups["$share/w-0"]
    assert (group.members, group.delivered, group.lost, group.duplicated) == (
        3, measured, 0, 0)
    assert sum(m.deliveries for m in group.by_member.values()) == measured

    # a topic tree on NATS: each filter's deliveries are what it matches
    tree = points["tree-nats"].topic_tree
    assert tree is not None and tree.topics_published == 100
    due = {f"rest/shapes/{f}": sum(tree_messages_matching(
        TopicTree(**TREE), f, first + WARMUP, measured) for first in (0, 50))
        for f in TREE["filters"]}
    assert due["rest/shapes/#"] == 2 * measured and 0 < due["rest/shapes/+/3"] < 2 * measured
    assert {f: (t.matched, t.delivered, t.lost, t.unexpected)
            for f, t in tree.filters.items()} == {f: (n, n, 0, 0) for f, n in due.items()}

    # retained state on NATS: every late subscriber holds each topic's latest value
    retained = points["retained-nats"].retained
    assert retained is not None
    assert (retained.topics, retained.values_set, retained.subscribers) == (
        TOPICS, TOPICS * UPDATES, 3)
    assert retained.delivered_latest == retained.expected == TOPICS * 3
    assert (retained.missing, retained.stale, retained.duplicates,
            retained.without_retain_flag, retained.live) == (0, 0, 0, 0, 0)

    # persistent sessions: Mosquitto keeps both, all sent while away comes late
    kept = points["sessions-mosquitto"].sessions
    assert kept is not None
    assert (kept.subscribers_away, kept.returned, kept.sessions_present) == (2, 2, 2)
    assert kept.published_away > 0.6 * 100 and kept.delivered_late == kept.published_away
    assert kept.lost_away == kept.lost_live == 0
    assert kept.delivered_live + kept.delivered_late == 2 * MESSAGES
    assert kept.backlog_drained_ms.count == kept.reconnect_connack_us.count == 2
    # NATS: what it did, counted exactly, whatever it was
    nats = points["sessions-nats"].sessions
    assert nats is not None and (nats.subscribers_away, nats.returned) == (2, 2)
    assert nats.delivered_late + nats.lost_away == nats.published_away > 0
    assert nats.delivered_live + nats.lost_live + nats.published_away == 2 * MESSAGES

    # the restarts: every client back, the persistent sessions kept, the stream again
    for name in ("reconnect-mosquitto", "reconnect-nats"):
        point = points[name]
        r = point.reconnect
        assert r is not None and point.fault is not None, name  # the restart is its fault
        assert r.restarts == 1 and r.down_s.count == 1 and r.down_s.mean >= 0.3, name
        assert (r.clients, r.clients_back) == (4, 4), name
        assert r.all_back_after_restart_ms.count == 1, name
        assert r.subscribers_not_resumed == 0 and r.stream_resumed_ms.count == 3, name
        [outage] = r.outage
        assert (outage.qos, outage.persistent, outage.subscribers) == (1, True, 3), name
        assert outage.delivered + outage.lost == outage.published_during_outage, name
    mosquitto = points["reconnect-mosquitto"].reconnect
    assert mosquitto is not None and mosquitto.sessions_present == 3  # its persistence
    assert mosquitto.resubscribed == 0 and mosquitto.outage[0].lost == 0

    # the report draws every shape's section
    for table in ("connect-storm", "sessions", "reconnect", "reconnect-outage"):
        assert f'<table id="section-{table}"' in html, table
    for plot in ("plot-connect-storm-latency", "plot-connect-storm-rate",
                 "plot-sessions-counts", "plot-sessions-drain", "plot-reconnect-back",
                 "plot-retained-hold", "plot-retained-topics", "plot-shared-shares",
                 "plot-shared-latency", "plot-tree-filters", "plot-tree-size"):
        assert f'id="{plot}"' in html, plot
