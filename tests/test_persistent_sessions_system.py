"""Persistent sessions and a reconnect storm end to end: through the controller, on
Mosquitto (both shapes) and NATS's MQTT (sessions), the accounting in the results and
drawn in the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqttbed.api.report import render_report
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.analysis import analyze_campaign
from tests.generic_support import MOSQUITTO

MESSAGES = 200          # 2 s at 100 Hz

pytestmark = [pytest.mark.system, pytest.mark.integration, pytest.mark.timeout(240),
              pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="needs Mosquitto"),
              pytest.mark.skipif(not Path("/usr/sbin/nats-server").exists(),
                                 reason="needs nats-server")]


def test_sessions_and_a_restart_run_through_the_controller_into_the_report(
        inproc_controller, spark):
    controller = inproc_controller
    sessions = {"offline": 2, "offline_at_s": 0.4, "offline_for_s": 0.8}
    storm = {"restart_at_s": 0.7, "down_s": 0.3, "backoff_initial_s": 0.05,
             "backoff_max_s": 0.4, "persistent": True}
    campaign_id = controller.engine.create_campaign(parse_spec({
        "name": "away",
        "workload": {"publishers": 1, "subscribers": 3, "qos": 1, "rate_hz": 100,
                     "messages": MESSAGES, "payload_bytes": 64},
        "timing": {"drain_s": 1.0, "drain_idle_s": 0.3},
        "scenarios": [
            {"name": "sessions-mosquitto", "broker.backend": "mosquitto",
             "workload.sessions": sessions},
            {"name": "sessions-nats", "broker.backend": "nats", "workload.sessions": sessions},
            {"name": "storm-mosquitto", "broker.backend": "mosquitto",
             "workload.reconnect": storm}]}))

    assert controller.engine.run_campaign(campaign_id) == "done"
    stats, _, _ = analyze_campaign(controller.sessions, controller.layout, campaign_id)
    kept, nats, restarted = sorted(stats.points, key=lambda p: p.point_index)

    # Mosquitto keeps both sessions: all that was sent while they were away comes late
    s = kept.sessions
    assert s is not None and kept.reconnect is None
    assert (s.subscribers_away, s.returned, s.sessions_present) == (2, 2, 2)
    assert s.published_away > 120 and s.delivered_late == s.published_away
    assert s.lost_away == 0 and s.lost_live == 0
    assert s.delivered_live + s.delivered_late == 2 * MESSAGES
    assert s.backlog_drained_ms.count == 2 and s.reconnect_connack_us.count == 2
    assert kept.lost == 0
    # NATS: what it did, counted exactly, whatever it was
    n = nats.sessions
    assert n is not None and n.subscribers_away == 2 and n.returned == 2
    assert n.delivered_late + n.lost_away == n.published_away > 0
    assert n.delivered_live + n.lost_live + n.published_away == 2 * MESSAGES

    # the restart: every client back, the sessions kept, the stream again
    r = restarted.reconnect
    assert r is not None and restarted.sessions is None
    assert r.restarts == 1 and r.down_s.count == 1 and r.down_s.mean >= 0.3
    assert (r.clients, r.clients_back) == (4, 4)
    assert r.sessions_present == 3 and r.resubscribed == 0   # the publisher's is clean
    assert r.attempts.count == 4 and r.attempts.p50 is not None and r.attempts.p50 >= 2
    assert r.all_back_after_restart_ms.count == 1 and r.stream_resumed_ms.count == 3
    assert r.subscribers_not_resumed == 0
    [outage] = r.outage
    assert (outage.qos, outage.persistent, outage.subscribers) == (1, True, 3)
    assert outage.lost == 0 and outage.delivered == outage.published_during_outage
    assert restarted.fault is not None      # the restart is the run's fault too

    html = render_report(controller, campaign_id, standalone=True)
    for table in ("sessions", "reconnect", "reconnect-outage"):
        assert f'<table id="section-{table}"' in html
    for plot in ("plot-sessions-counts", "plot-sessions-drain", "plot-reconnect-back"):
        assert f'id="{plot}"' in html
