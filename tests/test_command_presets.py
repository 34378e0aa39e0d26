"""The third-party broker presets of the ``command`` backend: what they render to, and each
one started for real (where installed) carrying 1,000 QoS 0 and 1,000 QoS 1 messages."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import yaml

from mqttbed.brokers.command import presets
from mqttbed.brokers.command.backend import CommandBackend
from mqttbed.brokers.command.options import Options
from mqttbed.brokers.command.templates import placeholders_in, render, render_command
from mqttbed.core.host import LocalHost
from mqttbed.core.procfs import is_live
from tests.conftest import TEST_TAG, processes_tagged

PORT = 41883
RUN_DIR = Path("/tmp/mqttbed-command-run")
VALUES = {"port": str(PORT), "config": str(RUN_DIR / "broker.conf"), "dir": str(RUN_DIR)}

# The program each preset needs on this machine (argv[0] of rabbitmq's is its launch shell).
PROGRAMS = {
    "rabbitmq": "/usr/lib/rabbitmq/bin/rabbitmq-server",
    "nats": "nats-server",
    "amqtt": str(Path(sys.executable).parent / "amqtt"),
    "activemq": "/usr/share/activemq/bin/activemq.jar",
    "ejabberd": "erl",
}
MESSAGES = 1000


def rendered(name: str) -> tuple[list[str], dict[str, str], str]:
    """The preset's command line, environment and config as the backend renders them."""
    preset = presets.preset(name)
    env = {key: render(value, VALUES) for key, value in preset.env.items()}
    config = render(preset.config_template or "", VALUES)
    return render_command(preset.command, VALUES), env, config


# -- rendering ------------------------------------------------------------------------------

def test_the_presets_are_the_five_named_brokers_and_an_unknown_name_lists_them():
    assert presets.preset_names() == ["activemq", "amqtt", "ejabberd", "nats", "rabbitmq"]
    with pytest.raises(ValueError, match="unknown preset 'mosquito'; known presets: "
                                         "activemq, amqtt, ejabberd, nats, rabbitmq"):
        presets.preset("mosquito")


ALL = ["rabbitmq", "nats", "amqtt", "activemq", "ejabberd"]


@pytest.mark.parametrize("name", ALL)
def test_each_preset_is_a_valid_command_broker_section(name):
    options = Options.model_validate({"preset": name})
    assert options.command == presets.preset(name).command
    assert options.broker_features() == presets.preset(name).features


@pytest.mark.parametrize("name", ALL)
def test_a_rendered_preset_keeps_no_placeholder_and_listens_on_loopback_only(name):
    argv, env, config = rendered(name)
    for text in [*argv, *env.values(), config]:
        assert placeholders_in(text) == set(), text
    assert f"127.0.0.1:{PORT}" in config or (f"port: {PORT}" in config
                                            and "ip: 127.0.0.1" in config)
    assert "0.0.0.0" not in config and "0.0.0.0" not in " ".join(argv)


def test_rabbitmq_keeps_its_node_data_logs_and_cookie_in_the_run_directory():
    argv, env, config = rendered("rabbitmq")
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[2].rstrip().endswith("exec /usr/lib/rabbitmq/bin/rabbitmq-server")
    assert env["RABBITMQ_CONFIG_FILE"] == VALUES["config"]
    assert env["HOME"] == str(RUN_DIR)   # Erlang's cookie file
    assert env["RABBITMQ_NODENAME"] == f"mqttbed-{PORT}@localhost"
    paths = {key: value for key, value in env.items() if value.startswith("/")}
    assert {"RABBITMQ_CONF_ENV_FILE", "RABBITMQ_MNESIA_BASE", "RABBITMQ_LOG_BASE",
            "RABBITMQ_ENABLED_PLUGINS_FILE", "RABBITMQ_ADVANCED_CONFIG_FILE"} <= set(paths)
    assert all(Path(value).is_relative_to(RUN_DIR) for value in paths.values()), paths
    assert env["RABBITMQ_ENABLED_PLUGINS"] == "rabbitmq_mqtt"
    # no Erlang VM of the run may start an epmd that outlives it
    assert "-start_epmd false" in env["ERL_AFLAGS"]
    assert "listeners.tcp = none" in config.splitlines()
    assert presets.preset("rabbitmq").user == "rabbitmq"


@pytest.mark.parametrize("name", ["rabbitmq", "activemq", "ejabberd"])
def test_each_launch_script_passes_shellcheck(tmp_path, name):
    shellcheck = Path(sys.executable).parent / "shellcheck"   # the dev extra's
    script = tmp_path / "launch.sh"
    argv, _, _ = rendered(name)
    assert argv[:2] == ["/bin/sh", "-c"]
    script.write_text("#!/bin/sh\n" + argv[2])
    checked = subprocess.run([str(shellcheck), str(script)], capture_output=True, text=True)
    assert (checked.returncode, checked.stdout) == (0, "")


def test_nats_keeps_jetstream_in_the_run_directory_under_a_server_name_of_the_port():
    argv, _, config = rendered("nats")
    assert argv == ["nats-server", "-c", VALUES["config"]]
    assert f'store_dir: "{RUN_DIR}/jetstream"' in config
    assert f"server_name: mqttbed_{PORT}" in config
    assert "jetstream {" in config and "mqtt {" in config   # NATS' braces are kept


def test_amqtt_runs_the_script_beside_this_interpreter_with_a_yaml_tcp_listener():
    argv, _, config = rendered("amqtt")
    assert argv == [PROGRAMS["amqtt"], "-c", VALUES["config"]]
    parsed = yaml.safe_load(config)
    assert parsed["listeners"]["default"] == {"type": "tcp", "bind": f"127.0.0.1:{PORT}"}
    assert list(parsed["plugins"]) == ["amqtt.plugins.authentication.AnonymousAuthPlugin"]


def test_declared_features_are_the_measured_ones():
    assert presets.preset("rabbitmq").features.qos == {0, 1}
    assert presets.preset("nats").features.qos == {0, 1}
    assert presets.preset("amqtt").features.qos == {0, 1, 2}
    assert presets.preset("activemq").features.qos == {0, 1, 2}
    assert presets.preset("ejabberd").features.qos == {0, 1, 2}
    for name in presets.preset_names():
        features = presets.preset(name).features
        assert features.wildcards and features.note
        # RabbitMQ 3.10 sends a retained message to an exact-topic subscription only
        assert features.retained == (name != "rabbitmq")


# -- each broker for real -------------------------------------------------------------------

def installed(name: str) -> bool:
    program = PROGRAMS[name]
    return shutil.which(program) is not None or Path(program).is_file()


def exchange(port: int, qos: int, count: int) -> Counter[int]:
    """Publish ``count`` numbered messages at ``qos`` to one subscriber; return how often
    each number arrived (the publisher waits for every PUBACK at QoS 1)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    topic = f"presets/qos{qos}"
    arrived: Counter[int] = Counter()
    subscribed = threading.Event()

    def client(role: str) -> mqtt.Client:
        made = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{role}-{qos}-{port}",
                           protocol=mqtt.MQTTv311)
        made.connect("127.0.0.1", port)
        made.loop_start()
        return made

    subscriber = client("sub")
    subscriber.on_message = lambda _c, _u, message: arrived.update(
        [int.from_bytes(message.payload, "big")])
    subscriber.on_subscribe = lambda *_: subscribed.set()
    subscriber.subscribe(topic, qos)
    publisher = client("pub")
    try:
        assert subscribed.wait(5), f"no SUBACK on port {port}"
        sent = [publisher.publish(topic, number.to_bytes(4, "big"), qos)
                for number in range(count)]
        for info in sent:
            info.wait_for_publish(10)
        deadline = time.monotonic() + 10
        while arrived.total() < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # window: a late duplicate would show up within it
    finally:
        for made in (publisher, subscriber):
            made.disconnect()
            made.loop_stop()
    return arrived


@pytest.mark.integration  # RabbitMQ, NATS server, amqtt
@pytest.mark.system
@pytest.mark.parallel
@pytest.mark.xdist_group("rabbitmq")   # one RabbitMQ boot at a time: each takes a core
@pytest.mark.timeout(120)  # RabbitMQ alone takes 7-12 s to answer
@pytest.mark.parametrize("name", ["rabbitmq", "nats", "amqtt", "activemq"])
def test_each_installed_preset_carries_1000_qos0_and_1000_qos1_messages_and_leaves_nothing(
        name, tmp_path, monkeypatch):
    if not installed(name):
        pytest.skip(f"{PROGRAMS[name]} is not installed (make install)")
    # Everything the broker starts inherits the tag (LocalHost.spawn passes this process's
    # environment on, setpriv keeps it): what is left is this broker's, not another test's
    # beam.smp, epmd or nats-server.
    tag = str(tmp_path)
    monkeypatch.setenv(TEST_TAG, tag)
    # Through the command backend, the way a campaign starts a preset: the preset's user,
    # environment and private directory are what is tested, not a copy of them here.
    backend = CommandBackend()
    endpoint = backend.deploy({"preset": name, "sys_topics": False}, LocalHost())
    try:
        record = backend.deployment()
        tree = [psutil.Process(record.pid), *psutil.Process(record.pid).children(recursive=True)]
        # the tag reached the broker's whole tree (one that ended meanwhile is no miss)
        untagged = {proc.pid for proc in tree} - processes_tagged(tag)
        assert record.pid not in untagged and not any(
            is_live(pid) for pid in untagged), f"{name}: untagged {untagged}"
        if presets.preset(name).user is not None:
            assert {proc.username() for proc in tree} == {presets.preset(name).user}
        for qos in (0, 1):
            arrived = exchange(endpoint.port, qos, MESSAGES)
            assert sorted(arrived) == list(range(MESSAGES)), f"{name} QoS {qos}: lost"
            assert set(arrived.values()) == {1}, f"{name} QoS {qos}: duplicated"
        assert record.version, shlex.join(record.command)
    finally:
        backend.teardown()
    assert not any(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
                   for proc in tree), f"{name}: part of its process tree still runs"
    assert processes_tagged(tag) == set(), f"{name} left a process running"
