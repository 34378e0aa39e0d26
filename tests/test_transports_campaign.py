"""``campaigns/transports.yaml`` runs from the CLI and over REST: its scenarios as they ship
(their brokers, transports and MQTT versions), a few of them each way, one repetition of
a shorter workload, real brokers mqttbed starts with a TLS listener and a CA made per run.

The whole campaign (22 scenarios x 3 repetitions, RabbitMQ's start-up each time) is what a
user runs for the table in the docs; here every scenario's layer is exercised once:
through ``mqttbed run`` the Mosquitto, amqtt and NATS ones that differ in layer, over REST
ejabberd (MQTT 5 over TLS, a password made per run) and Mosquitto over ws.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mqttbed.campaigns.spec import builtin_spec_path
from tests.conftest import Served
from tests.test_spine_end_to_end import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.parallel,
              pytest.mark.timeout(300)]

MESSAGES, WARMUP, SUBSCRIBERS = 60, 10, 2
CLI_SCENARIOS = ("mosquitto-tls-v5", "mosquitto-wss", "amqtt-wss", "nats-tls")
REST_SCENARIOS = ("mosquitto-ws", "ejabberd-tls-v5")


def shipped(scenarios: tuple[str, ...]) -> dict[str, Any]:
    """The built-in campaign with only these scenarios, once each, on a short workload."""
    spec = yaml.safe_load(builtin_spec_path("transports").read_text())
    by_name = {scenario["name"]: scenario for scenario in spec["scenarios"]}
    spec["scenarios"] = [by_name[name] for name in scenarios]
    spec["repetitions"] = 1
    spec["workload"].update(messages=MESSAGES, warmup_messages=WARMUP,
                            subscribers=SUBSCRIBERS)
    spec["timing"] = {"start_lead_s": 0.3, "drain_s": 0.5}
    return spec


def assert_each_scenario_delivered_every_message_over_its_layers(
        stats: dict[str, Any], scenarios: tuple[str, ...]) -> None:
    points = {point["params"]["scenario"]: point for point in stats["points"]}
    assert sorted(points) == sorted(scenarios)
    sent = MESSAGES - WARMUP
    for name, point in points.items():
        assert point["messages_sent"] == sent, name
        assert point["deliveries_received"] == SUBSCRIBERS * sent, name
        assert point["lost"] == point["duplicates"] == 0, name
        connections = point["connections"]
        assert connections["connections"] == 1 + SUBSCRIBERS
        assert connections["without_connack"] == 0
        assert connections["connack_us"]["count"] == 1 + SUBSCRIBERS
        # the layers each scenario's name says its clients went through, timed
        tls = "tls" in name or "wss" in name
        websocket = "-ws" in name
        assert connections["tls_handshake_us"]["count"] == (1 + SUBSCRIBERS if tls else 0)
        assert connections["websocket_upgrade_us"]["count"] == (
            1 + SUBSCRIBERS if websocket else 0), name


def test_the_transports_campaign_runs_from_the_cli(tmp_path):
    done, stats_path = run_cli(shipped(CLI_SCENARIOS), tmp_path)
    assert_each_scenario_delivered_every_message_over_its_layers(
        json.loads(stats_path.read_text()), CLI_SCENARIOS)
    for name in CLI_SCENARIOS:
        assert name in done.stdout


def test_the_transports_campaign_runs_over_rest(tmp_path: Path):
    served = Served(tmp_path / "data")
    with served.server:
        campaign_id = served.start_yaml_campaign(yaml.safe_dump(shipped(REST_SCENARIOS)))
        campaign = served.wait_for_status(campaign_id, ("done", "failed"), 240)
        assert campaign["status"] == "done", campaign
        with served.client() as http:
            stats = http.get(f"/api/v1/campaigns/{campaign_id}/stats").json()
    assert_each_scenario_delivered_every_message_over_its_layers(stats, REST_SCENARIOS)
