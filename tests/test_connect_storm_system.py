"""A connection storm campaign end to end: through the controller, on Mosquitto and on a
third-party broker (NATS's MQTT), each storm's connects in the results and drawn in the
report."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqttbed.api.report import render_report
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.analysis import analyze_campaign
from tests.generic_support import MOSQUITTO

CLIENTS = 300

pytestmark = [pytest.mark.system, pytest.mark.integration, pytest.mark.timeout(240),
              pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="needs Mosquitto"),
              pytest.mark.skipif(not Path("/usr/sbin/nats-server").exists(),
                                 reason="needs nats-server")]


def test_a_storm_on_mosquitto_and_nats_runs_through_the_controller_into_the_report(
        inproc_controller, spark):
    """Spark (the session one, started once for every test using it) only pools what the
    storms' runs did not have: their figures come from the agents' outcomes."""
    controller = inproc_controller
    campaign_id = controller.engine.create_campaign(parse_spec({
        "name": "storm", "agents": {"count": 2},
        "workload": {"mode": "connect",
                     "connect": {"clients": CLIENTS, "rate_hz": 1000, "hold_s": 0.6}},
        "scenarios": [{"name": "mosquitto", "broker.backend": "mosquitto"},
                      {"name": "nats", "broker.backend": "nats"}]}))

    assert controller.engine.run_campaign(campaign_id) == "done"
    stats, _, _ = analyze_campaign(controller.sessions, controller.layout, campaign_id)
    by_broker = {point.backend: point.connect_storm for point in stats.points}
    assert set(by_broker) == {"mosquitto", "nats"}
    for broker, storm in by_broker.items():
        assert storm is not None, broker
        assert (storm.clients, storm.connected, storm.failed) == (CLIENTS, CLIENTS, 0), (
            broker, storm.failures)
        assert storm.connack_from_intended_us.count == CLIENTS
        assert storm.connect_lag_us.count == CLIENTS
        assert storm.requested_connects_per_s == 1000.0
        assert storm.achieved_connects_per_s is not None and storm.achieved_connects_per_s > 0
    # every run's own figures too, and the broker's memory from its samples in the hold
    assert all(run.connect_storm is not None and run.connect_storm.clients == CLIENTS
               for run in stats.runs)
    memory = by_broker["mosquitto"].broker_memory  # type: ignore[union-attr]
    assert memory is not None and memory.held_connections == CLIENTS

    html = render_report(controller, campaign_id, standalone=True)
    table = html[html.index('<table id="section-connect-storm"'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr><td class=\"l\">") == 2
    assert 'id="plot-connect-storm-latency"' in html and 'id="plot-connect-storm-rate"' in html
