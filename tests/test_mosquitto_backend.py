"""The Mosquitto backend and the backend registry, against a real Mosquitto on loopback."""

from __future__ import annotations

import hashlib
import os
import re
import resource
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
import pytest
from pydantic import ValidationError

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, MosquittoLimits, Options
from mqttbed.core.backends import BrokerBackend, backend_names, create_backend, options_model
from mqttbed.core.errors import MissingSystemDependency
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import Endpoint, Transport

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def deployed() -> Iterator[tuple[MosquittoBackend, Endpoint]]:
    backend = MosquittoBackend()
    try:
        endpoint = backend.deploy(Options(), LocalHost())
        yield backend, endpoint
    finally:
        backend.teardown()


class Client:
    """A real paho client whose connect/subscribe/receive can be awaited."""

    def __init__(self, endpoint: Endpoint, client_id: str, clean_session: bool = True):
        self.messages: list[mqtt.MQTTMessage] = []
        self.received = threading.Condition()
        self._connected = threading.Event()
        self._subscribed = threading.Event()
        self.paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                clean_session=clean_session)
        self.paho.on_connect = lambda *_: self._connected.set()
        self.paho.on_subscribe = lambda *_: self._subscribed.set()
        self.paho.on_message = self._on_message
        self.paho.connect(endpoint.host, endpoint.port)
        self.paho.loop_start()
        assert self._connected.wait(3), f"{client_id} did not connect to {endpoint}"

    def _on_message(self, _client: mqtt.Client, _userdata: object,
                    message: mqtt.MQTTMessage) -> None:
        with self.received:
            self.messages.append(message)
            self.received.notify_all()

    def subscribe(self, topic: str, qos: int = 0) -> None:
        self._subscribed.clear()
        self.paho.subscribe(topic, qos)
        assert self._subscribed.wait(3), f"no SUBACK for {topic}"

    def wait_for(self, count: int, timeout_s: float) -> int:
        with self.received:
            self.received.wait_for(lambda: len(self.messages) >= count, timeout_s)
            return len(self.messages)

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


@pytest.mark.integration  # Mosquitto
def test_deployed_broker_relays_a_message_between_two_real_clients(deployed):
    _, endpoint = deployed
    assert endpoint.transport is Transport.MQTT_TCP
    subscriber = Client(endpoint, "subscriber")
    publisher = Client(endpoint, "publisher")
    try:
        subscriber.subscribe("bed/relay", qos=1)
        publisher.paho.publish("bed/relay", b"hello broker", qos=1).wait_for_publish(3)
        assert subscriber.wait_for(1, 3) == 1
        assert subscriber.messages[0].payload == b"hello broker"
        assert subscriber.messages[0].topic == "bed/relay"
    finally:
        subscriber.close()
        publisher.close()


@pytest.mark.integration  # Mosquitto
def test_deploy_accepts_the_spec_as_a_plain_mapping():
    backend = MosquittoBackend()
    try:
        endpoint = backend.deploy({"backend": "mosquitto", "max_queued_messages": 42},
                                  LocalHost())
        assert backend.health() is None
        assert backend.deployment().limits.max_queued_messages == 42
        with socket.create_connection((endpoint.host, endpoint.port), timeout=1):
            pass
    finally:
        backend.teardown()


@pytest.mark.integration  # Mosquitto
def test_teardown_leaves_no_broker_process():
    backend = MosquittoBackend()
    backend.deploy(Options(), LocalHost())
    record = backend.deployment()
    pid = record.pid
    conf_dir = Path(re.search(r"log_dest file (\S+)", record.config)[1]).parent
    assert psutil.pid_exists(pid) and conf_dir.is_dir()

    backend.teardown()

    assert not psutil.pid_exists(pid)
    assert not conf_dir.exists()
    assert backend.health() is not None
    backend.teardown()  # a second teardown is a no-op, not an error
    assert "mqttbed-mosquitto-" in str(conf_dir)


@pytest.mark.integration  # Mosquitto
def test_deployment_records_version_config_hash_and_queue_limits():
    backend = MosquittoBackend()
    try:
        backend.deploy(Options(max_queued_messages=7, max_inflight_messages=3,
                               set_tcp_nodelay=False), LocalHost())
        record = backend.deployment()
    finally:
        backend.teardown()

    assert record.backend == "mosquitto"
    assert record.version is not None and re.fullmatch(r"\d+\.\d+\.\d+", record.version)
    assert record.binary is not None and record.config is not None
    assert record.binary_sha256 == hashlib.sha256(Path(record.binary).read_bytes()).hexdigest()
    assert record.config_sha256 == hashlib.sha256(record.config.encode()).hexdigest()
    config_lines = record.config.splitlines()
    assert f"listener {record.port} 127.0.0.1" in config_lines
    assert "max_queued_messages 7" in config_lines
    assert "max_inflight_messages 3" in config_lines
    assert "set_tcp_nodelay false" in config_lines
    assert "persistence false" in config_lines
    assert record.limits == MosquittoLimits(
        max_queued_messages=7, max_inflight_messages=3, set_tcp_nodelay=False,
        max_connections=-1, nofile=resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    # The log outlives the directory it was written in.
    assert isinstance(backend.deployment().log_tail, str)
    assert backend.deployment().config == record.config


@pytest.mark.integration  # Mosquitto
def test_queue_limit_is_in_force_for_an_offline_subscriber():
    # Proves the recorded limit is the one the broker applies: messages beyond it vanish.
    backend = MosquittoBackend()
    try:
        endpoint = backend.deploy(Options(max_queued_messages=5), LocalHost())
        sleeper = Client(endpoint, "sleeper", clean_session=False)
        sleeper.subscribe("bed/queue", qos=1)
        sleeper.close()
        publisher = Client(endpoint, "publisher")
        for i in range(30):
            publisher.paho.publish("bed/queue", str(i).encode(), qos=1).wait_for_publish(3)
        publisher.close()
        woken = Client(endpoint, "sleeper", clean_session=False)
        woken.wait_for(30, 1.0)
        woken.close()
        assert len(woken.messages) == 5
    finally:
        backend.teardown()


@pytest.mark.integration  # Mosquitto
def test_health_reports_reason_when_broker_is_killed(deployed):
    backend, _ = deployed
    assert backend.health() is None
    pid = backend.deployment().pid
    assert pid is not None

    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 3
    while backend.health() is None and time.monotonic() < deadline:
        time.sleep(0.02)

    reason = backend.health()
    assert reason is not None
    assert f"pid {pid}" in reason
    assert "exited with code -9" in reason and "SIGKILL" in reason


@pytest.mark.integration  # Mosquitto
def test_stats_sample_the_running_broker(deployed):
    backend, _ = deployed
    deadline = time.monotonic() + 3
    while len(backend.resource_samples()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    samples = backend.resource_samples()
    assert len(samples) >= 2
    assert all(s.processes == 1 and s.rss_bytes > 0 for s in samples)
    assert samples[0].t_ns < samples[-1].t_ns


@pytest.mark.integration  # Mosquitto
def test_deploy_moves_to_a_new_port_when_the_offered_one_is_taken():
    # Another program grabs the port between free_port() and Mosquitto's bind: the
    # backend must notice (even though the port answers) and retry elsewhere.
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]

    class RacyHost(LocalHost):
        offered = 0

        def free_port(self) -> int:
            self.offered += 1
            return taken if self.offered == 1 else super().free_port()

    host = RacyHost()
    backend = MosquittoBackend()
    try:
        endpoint = backend.deploy(Options(), host)
        assert host.offered == 2
        assert endpoint.port != taken
        assert backend.health() is None
    finally:
        backend.teardown()
        squatter.close()


def test_missing_binary_names_the_install_command(tmp_path):
    backend = MosquittoBackend()
    with pytest.raises(MissingSystemDependency, match="apt-get install mosquitto") as err:
        backend.deploy(Options(binary=str(tmp_path / "no-mosquitto")), LocalHost())
    assert "no-mosquitto" in str(err.value)


def test_unknown_backend_names_the_available_ones():
    assert "mosquitto" in backend_names()
    with pytest.raises(ValueError, match=r"unknown broker backend 'hivemq'.*mosquitto"):
        create_backend("hivemq")
    with pytest.raises(ValueError, match=r"unknown broker backend 'hivemq'.*mosquitto"):
        options_model("hivemq")


def test_backend_registry_creates_a_backend_that_meets_the_contract():
    backend = create_backend("mosquitto")
    assert isinstance(backend, BrokerBackend)
    assert backend.name == "mosquitto"
    assert options_model("mosquitto") is Options


def test_options_reject_unknown_key_naming_it():
    model = options_model("mosquitto")
    with pytest.raises(ValidationError, match="max_queue_messages"):
        model.model_validate({"backend": "mosquitto", "max_queue_messages": 10})
    with pytest.raises(ValidationError, match="max_queued_messages"):
        model.model_validate({"max_queued_messages": -1})
    with pytest.raises(ValidationError, match="backend"):
        model.model_validate({"backend": "nanomq"})
