"""``campaigns/brokers.yaml`` over REST: five brokers on one workload, side by side.

Cut to one point per broker and one repetition (the whole campaign is 60 runs; its
measured table is in the closing note of the session that built it). What is checked is
what a user reads: every broker delivered every QoS 1 message to every subscriber, the
report has a curve and a ranking row per broker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mqttbed.api.report import render_report
from mqttbed.core.backends import unavailable_reason
from tests.conftest import Served

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.parallel,
              pytest.mark.timeout(600)]

CAMPAIGN = Path(__file__).resolve().parents[1] / "campaigns" / "brokers.yaml"
BROKERS = ("mosquitto", "forkpipe", "rabbitmq", "nats", "amqtt")


def test_five_brokers_deliver_every_qos1_message_and_the_report_ranks_them(tmp_path):
    missing = {b: r for b in BROKERS if (r := unavailable_reason(b)) is not None}
    assert missing == {}, "make install installs every broker of the campaign"
    spec = yaml.safe_load(CAMPAIGN.read_text())
    assert [s["broker.backend"] for s in spec["scenarios"]] == list(BROKERS)
    spec |= {"repetitions": 1, "sweep": {"workload.subscribers": [3]},
             "agents": {"count": 2}}
    spec["workload"] |= {"rate_hz": 200, "messages": 200}
    served = Served(tmp_path / "data")
    with served.server, served.client() as http:
        campaign_id = served.start_yaml_campaign(yaml.safe_dump(spec))
        served.wait_for_status(campaign_id, ("done",), 500)
        stats = http.get(f"/api/v1/campaigns/{campaign_id}/stats").json()
        html = render_report(served.controller, campaign_id, standalone=True)

    points = {p["backend"]: p for p in stats["points"]}
    assert sorted(points) == sorted(BROKERS)
    for broker, point in points.items():
        assert point["runs"] == 1 and point["runs_failed"] == 0, broker
        # QoS 1 on loopback: nothing lost, nothing duplicated, per broker
        assert point["deliveries_expected"] == 3 * (200 - 20), broker
        assert point["deliveries_received"] == point["deliveries_expected"], broker
        assert point["lost"] == 0 and point["duplicates"] == 0, broker
        assert point["latency_us"]["p50"] > 0, broker
    ranking = html.split('id="broker-ranking"', 1)[1].split("</table>", 1)[0]
    assert all(f'<td class="l">{b}</td>' in ranking for b in BROKERS)
