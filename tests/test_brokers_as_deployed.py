"""Issue 40's "done when": a broker mqttbed did not start, as it is deployed in production
(TLS with a CA of its own, a password file, MQTT 5, WebSocket), measured by whole campaigns
with exact delivery accounting, by the native engine.

The test starts one Mosquitto of its own (never mqttbed) with three listeners, each
refusing anonymous clients: MQTT over TLS, WebSocket and WebSocket over TLS. Campaigns
reach it as ``external`` brokers over ``mqtts``, ``ws`` and ``wss``, with
``broker.tls.ca_file`` and ``broker.auth.password_file``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mqttbed.brokers.certificates import CertificateAuthority, write_server_tls
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow
from tests.generic_support import (
    delivery_counts,
    free_port,
    mosquitto_running,
    tls_lines,
    write_password_file,
)

USER = "bench"
LISTENERS = ("mqtts", "ws", "wss")
MESSAGES, SUBSCRIBERS = 60, 3


@dataclass(frozen=True)
class DeployedBroker:
    """The test's Mosquitto: its process, a port per listener, the files a spec names."""

    proc: subprocess.Popen[bytes]
    ports: dict[str, int]
    ca_file: Path
    password_file: Path

    def url(self, scheme: str) -> str:
        path = "/mqtt" if scheme.startswith("ws") else ""
        return f"{scheme}://127.0.0.1:{self.ports[scheme]}{path}"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeployedBroker]:
    directory = tmp_path_factory.mktemp("as-deployed")
    tls = write_server_tls(directory, ["127.0.0.1", "localhost"],
                           CertificateAuthority.create("the broker operator's CA"))
    password = "as-deployed-password"
    password_file = directory / "bench-password"   # what the spec names (mqttbed reads it)
    password_file.write_text(password + "\n")
    passwd = write_password_file(directory / "passwd", {USER: password})
    ports = {name: free_port() for name in LISTENERS}
    lines = ["allow_anonymous false", f"password_file {passwd}", "persistence false",
             "max_inflight_messages 0", "max_queued_messages 0",
             f"listener {ports['mqtts']} 127.0.0.1", *tls_lines(tls),
             f"listener {ports['ws']} 127.0.0.1", "protocol websockets",
             f"listener {ports['wss']} 127.0.0.1", "protocol websockets", *tls_lines(tls)]
    with mosquitto_running(directory, lines, list(ports.values())) as proc:
        yield DeployedBroker(proc, ports, tls.ca_file, password_file)


def campaign(broker: DeployedBroker, name: str, url: str, **more: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name, "agents": {"count": 2},
        "broker": {"backend": "external", "url": url, "sys_topics": False,
                   "tls": {"ca_file": str(broker.ca_file)},
                   "auth": {"username": USER, "password_file": str(broker.password_file)}},
        "workload": {"publishers": 1, "subscribers": SUBSCRIBERS, "rate_hz": 200,
                     "messages": MESSAGES, "warmup_messages": 5, "protocol": "5",
                     "client": "native"},
        "timing": {"start_lead_s": 0.3, "drain_s": 0.5}}
    for key, value in more.items():
        spec[key] = value
    return spec


def measured_runs(controller: Any, spec: dict[str, Any]) -> list[tuple[RunRow, dict[str, Any]]]:
    """Run the campaign to its end; each run with its record's metadata."""
    campaign_id = controller.engine.create_campaign(parse_spec(spec))
    assert controller.engine.run_campaign(campaign_id) == "done"
    with controller.sessions() as s:
        runs = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(RunRow.ordinal).all()
    return [(run, json.loads((controller.layout.run_dir(campaign_id, run.id) / "run.json")
                             .read_text())) for run in runs]


def assert_every_message_counted_once_per_subscriber(controller: Any, run: RunRow,
                                                     record: dict[str, Any], qos: int) -> None:
    assert run.state == "done", run.reason
    published, received, levels = delivery_counts(
        controller.layout.run_events(run.campaign_id, run.id))
    assert published == MESSAGES and levels == {qos}
    assert received == {f"sub-{i}": MESSAGES for i in range(SUBSCRIBERS)}
    # the native engine ran every client (no fallback), and each connection was timed
    generators = list(record["metadata"]["generators"].values())
    assert len(generators) == 2
    assert {g["mqtt_client"] for g in generators} == {"native"}, generators
    assert {g["mqtt_client_reason"] for g in generators} == {""}
    connections = [c for agent in record["metadata"]["connections"].values() for c in agent]
    assert len(connections) == 1 + SUBSCRIBERS
    scheme = run.params.get("scenario", "mqtts")
    phases = {"tcp_ns", "connack_ns"} | ({"tls_ns"} if scheme != "ws" else set()) | (
        {"websocket_ns"} if scheme != "mqtts" else set())
    for connection in connections:
        assert {name for name, value in connection.items()
                if name.endswith("_ns") and name != "t_start_ns" and value} == phases


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_tls_broker_with_a_password_file_is_measured_over_mqtts_at_mqtt5_every_qos(
        deployed, controller):
    spec = campaign(deployed, "as-deployed-mqtts", deployed.url("mqtts"),
                    sweep={"workload.qos": [0, 1, 2]})
    runs = measured_runs(controller, spec)
    assert [run.params["workload.qos"] for run, _ in runs] == [0, 1, 2]
    for run, record in runs:
        assert_every_message_counted_once_per_subscriber(controller, run, record,
                                                         run.params["workload.qos"])
    assert deployed.proc.poll() is None, "mqttbed stopped a broker it did not start"


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_websocket_broker_is_measured_over_ws_and_wss(deployed, controller):
    # broker.tls is for wss only: a TLS setting nothing uses is refused
    spec = campaign(deployed, "as-deployed-ws", deployed.url("wss"), scenarios=[
        {"name": "ws", "broker.url": deployed.url("ws"), "broker.tls": None},
        {"name": "wss", "broker.url": deployed.url("wss")}])
    spec["workload"]["qos"] = 1
    runs = measured_runs(controller, spec)
    assert [run.params["scenario"] for run, _ in runs] == ["ws", "wss"]
    for run, record in runs:
        assert_every_message_counted_once_per_subscriber(controller, run, record, 1)
    assert deployed.proc.poll() is None
