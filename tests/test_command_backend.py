"""The ``command`` backend: real Mosquitto (and real misbehaving commands) on loopback.

The campaign's agents are threads of this process (``inproc_controller``): what is checked
is the broker's and the engine's, met by the same agent program over the same HTTP routes
as a process, which records the same events (tests/test_inproc_agents.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from mqttbed.brokers.command import presets
from mqttbed.brokers.command.backend import CommandBackend
from mqttbed.brokers.command.options import Options
from mqttbed.brokers.command.presets import CommandPreset
from mqttbed.brokers.reachability import probe_mqtt_tcp
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow
from mqttbed.core.backends import BrokerBackend, BrokerFeatures, create_backend, declaration
from mqttbed.core.errors import BackendError, MissingSystemDependency, SpecError
from mqttbed.core.host import LocalHost, sha256_file
from mqttbed.core.samples import SysTopicsSource
from tests.conftest import child_processes, eventually, wait_until
from tests.generic_support import MOSQUITTO, MOSQUITTO_TEMPLATE, delivery_counts

pytestmark = pytest.mark.timeout(30)

MOSQUITTO_SPEC = {"command": f"{MOSQUITTO} -c {{config}}",
                  "config_template": MOSQUITTO_TEMPLATE.replace(
                      "log_dest file {dir}/mosquitto.log", "log_dest stderr"),
                  "version_command": f"sh -c '{MOSQUITTO} -h | head -n 1'"}


@pytest.fixture
def mosquitto_by_command():
    backend = CommandBackend()
    endpoint = backend.deploy(MOSQUITTO_SPEC, LocalHost())
    yield backend, endpoint
    backend.teardown()


@pytest.mark.integration  # Mosquitto
def test_mosquitto_from_a_template_runs_and_its_deployment_is_recorded():
    backend = create_backend("command")
    assert isinstance(backend, BrokerBackend) and isinstance(backend, SysTopicsSource)
    endpoint = backend.deploy(MOSQUITTO_SPEC, LocalHost())
    try:
        probe_mqtt_tcp(endpoint.host, endpoint.port, 1.0)   # a CONNECT gets its CONNACK
        record = backend.deployment()
        private_dir = Path(record.command[-1]).parent
        assert record.command == [MOSQUITTO, "-c", str(private_dir / "broker.conf")]
        assert f"listener {endpoint.port} 127.0.0.1" in record.config
        assert f"into {private_dir}/broker.conf" in record.config   # {config} in the text
        assert (private_dir / "broker.conf").read_text() == record.config
        assert record.config_sha256 == hashlib.sha256(record.config.encode()).hexdigest()
        assert record.binary == MOSQUITTO and record.binary_sha256 == sha256_file(
            Path(MOSQUITTO))
        assert record.version.startswith("mosquitto version 2.")
        assert record.pid == psutil.Process(record.pid).pid and record.managed
        assert backend.health() is None
    finally:
        backend.teardown()
    record = backend.deployment()
    assert record.exit_code == 0 and "terminating" in record.log_tail
    assert not private_dir.exists() and not psutil.pid_exists(record.pid)


@pytest.mark.integration
def test_a_command_that_exits_at_once_names_its_status_and_its_output():
    backend = CommandBackend()
    with pytest.raises(BackendError) as raised:
        backend.deploy({"command": "sh -c 'echo boom >&2; exit 3' {port}"}, LocalHost())
    message = str(raised.value)
    assert "exited with status 3 before it answered on 127.0.0.1:" in message
    assert message.endswith("its output ends:\nboom")
    assert backend.deployment().exit_code == 3


@pytest.mark.integration
def test_a_command_that_never_answers_times_out_naming_the_address_and_leaves_nothing():
    backend = CommandBackend()
    started = time.monotonic()
    with pytest.raises(BackendError) as raised:
        backend.deploy({"command": "sh -c 'exec sleep 67' {port}", "ready_timeout_s": 1},
                       LocalHost())
    assert time.monotonic() - started < 3
    port = backend.deployment().port
    assert (f"never became ready: no CONNACK from 127.0.0.1:{port} within 1.0 s (last try: "
            "connection refused (ECONNREFUSED))") in str(raised.value)
    assert child_processes("sleep 67") == []
    backend.teardown()   # after a failed deploy too: nothing more to do


@pytest.mark.integration
def test_teardown_twice_and_a_killed_broker_is_named_by_health(mosquitto_by_command):
    backend, _ = mosquitto_by_command
    victim = psutil.Process(backend.deployment().pid)
    victim.kill()
    assert eventually(lambda: backend.health() is not None, 3)
    assert f"broker command (pid {victim.pid}) exited with code -9 (killed by SIGKILL)" in \
        backend.health()
    backend.teardown()
    backend.teardown()
    assert backend.deployment().exit_code == -9


@pytest.mark.integration
def test_sys_samples_of_mosquitto_are_numbers(mosquitto_by_command):
    backend, _ = mosquitto_by_command
    # the template sets sys_interval 1
    wait_until(lambda: len(samples := backend.sys_samples()) > 10
               and "$SYS/broker/messages/received" in {s.topic for s in samples}, 10,
               "more than 10 $SYS samples, $SYS/broker/messages/received among them")
    backend.teardown()
    samples = backend.sys_samples()
    assert len(samples) > 10 and {s.topic[:5] for s in samples} == {"$SYS/"}
    assert all(isinstance(s.value, float) for s in samples)
    assert "$SYS/broker/messages/received" in {s.topic for s in samples}
    assert backend.deployment().sys_topics.samples == len(samples)


@pytest.mark.integration
def test_a_broker_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    # answers every CONNECT with CONNACK 0, and ignores SIGTERM
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, socket, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "server = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
        "while True:\n"
        "    conn, _ = server.accept()\n"
        "    conn.recv(1024)\n"
        "    conn.sendall(bytes((0x20, 2, 0, 0)))\n"
        "    conn.close()\n")
    backend = CommandBackend()
    backend.deploy({"command": f"{sys.executable} {script} {{port}}", "stop_grace_s": 0.5,
                    "sys_topics": False}, LocalHost())
    pid = backend.deployment().pid
    started = time.monotonic()
    backend.teardown()
    assert 0.5 <= time.monotonic() - started < 3
    assert backend.deployment().exit_code == -9 and not psutil.pid_exists(pid)


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="running a broker as another user needs root")
def test_a_broker_runs_as_the_user_asked_in_a_directory_made_theirs():
    backend = CommandBackend()
    backend.deploy({**MOSQUITTO_SPEC, "user": "nobody"}, LocalHost())
    try:
        record = backend.deployment()
        assert psutil.Process(record.pid).uids().real == 65534
        assert Path(record.command[-1]).parent.stat().st_uid == 65534
        assert record.user == "nobody"
    finally:
        backend.teardown()


# -- the options ------------------------------------------------------------------------

@pytest.mark.parametrize(("broker", "named"), [
    ({"command": "mosquitto -p {prot}"},
     "broker.command: bad value 'mosquitto -p {prot}': unknown placeholder {prot}; the "
     "placeholders are {port}, {config}, {dir} (write {{prot}} for a literal {prot})"),
    ({"command": "mosquitto -c {config}", "config_template": "listener {port} {addr}\n"},
     "broker.config_template: bad value"),
    ({"command": "mosquitto"}, "command 'mosquitto': {port} appears nowhere"),
    ({"command": "mosquitto -p {port}", "config_template": "x"},
     "config_template is written to {config}, but neither command nor env names {config}"),
    ({"preset": "no-such-broker"}, "broker.preset: bad value 'no-such-broker': unknown "
                                   "preset 'no-such-broker'; known presets: "),
    ({}, "give command (the broker's command line, with {port}) or a preset"),
    ({"command": "mosquitto -p {port} 'unclosed"}, "cannot split"),
    ({"command": "mosquitto -p {port}", "binary": "x"}, "broker.binary: unknown key"),
])
def test_bad_command_options_are_refused_naming_the_field(broker, named):
    with pytest.raises(SpecError) as raised:
        parse_spec({"name": "x", "broker": {"backend": "command", **broker}})
    assert named in str(raised.value)


def test_placeholders_render_per_word_and_escapes_and_other_braces_stay():
    options = Options(command="b --json '{\"a\": 1}' -d '{dir}/x y' {{port}} -p {port}",
                      env={"CONF": "{config}"})
    from mqttbed.brokers.command.templates import render_command
    assert render_command(options.command, {"port": "7", "dir": "/d d", "config": "c"}) == [
        "b", "--json", '{"a": 1}', "-d", "/d d/x y", "{port}", "-p", "7"]


def test_a_preset_fills_what_the_spec_leaves_out_and_the_spec_overrides(monkeypatch):
    qos0 = BrokerFeatures(qos=frozenset({0}), note="a test preset")
    monkeypatch.setitem(presets.PRESETS, "tiny", CommandPreset(
        command="tiny-broker --port {port}", version_command="tiny-broker --version",
        env={"A": "1", "B": "2"}, ready_timeout_s=7, features=qos0))
    filled = Options(preset="tiny", env={"B": "3"}, ready_timeout_s=2)
    assert filled.command == "tiny-broker --port {port}" and filled.ready_timeout_s == 2
    assert filled.env == {"A": "1", "B": "3"} and filled.broker_features() == qos0
    assert declaration("command").features_for(filled) == qos0
    assert Options(command="b {port}").broker_features() == BrokerFeatures()
    with pytest.raises(SpecError, match="workload.qos 1: broker command delivers QoS 0 only "
                                        r"\(a test preset\)"):
        parse_spec({"name": "x", "workload": {"qos": 1},
                    "broker": {"backend": "command", "preset": "tiny"}})


def test_a_preset_with_an_unknown_placeholder_is_refused_where_it_is_written():
    with pytest.raises(ValidationError, match="unknown placeholder {host}"):
        CommandPreset(command="b --bind {host}:{port}")
    assert presets.preset_names() == sorted(presets.PRESETS)


def test_a_program_that_is_not_installed_is_named():
    with pytest.raises(MissingSystemDependency, match="program 'no-such-broker-zz' is not "
                                                      "found"):
        CommandBackend().deploy({"command": "no-such-broker-zz -p {port}"}, LocalHost())


# -- a whole campaign -------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_campaign_on_a_command_broker_delivers_every_qos1_message(inproc_controller):
    controller = inproc_controller
    spec = parse_spec({
        "name": "command-qos1", "agents": {"count": 2},
        "broker": {"backend": "command", **MOSQUITTO_SPEC},
        "workload": {"publishers": 1, "subscribers": 3, "qos": 1, "rate_hz": 200,
                     "messages": 100, "warmup_messages": 10},
        "timing": {"start_lead_s": 0.3, "drain_s": 0.5}})
    campaign_id = controller.engine.create_campaign(spec)
    assert controller.engine.run_campaign(campaign_id) == "done"
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.state == "done", run.reason
    published, received, qos = delivery_counts(controller.layout.run_events(campaign_id,
                                                                            run.id))
    assert published == 100 and qos == {1}   # warm-up messages included
    assert received == {f"sub-{i}": published for i in range(3)}
    broker = json.loads((controller.layout.run_dir(campaign_id, run.id) / "run.json")
                        .read_text())["metadata"]["broker"]
    assert broker["backend"] == "command" and broker["exit_code"] == 0
    assert broker["version"].startswith("mosquitto version 2.")
    assert child_processes("mqttbed-command-") == [] and child_processes("mqttbed.agents") == []


@pytest.mark.integration  # mqttbed's own MQTT-SN gateway, started as any command
def test_a_udp_broker_is_ready_when_its_pingreq_is_answered():
    backend = CommandBackend()
    endpoint = backend.deploy({"command": f"{sys.executable} -m mqttbed.brokers.mqttsn "
                                          "--host 127.0.0.1 --port {port}",
                               "transport": "mqtt-sn-udp"}, LocalHost())
    try:
        assert endpoint.transport == "mqtt-sn-udp" and backend.health() is None
        external = create_backend("external")   # the same broker, reached by URL
        external.deploy({"url": f"mqtt-sn-udp://127.0.0.1:{endpoint.port}"}, LocalHost())
        assert external.health() is None
        external.teardown()
        assert external.deployment().sys_topics.error.startswith("not sampled: $SYS is read "
                                                                 "over MQTT/TCP")
    finally:
        backend.teardown()
