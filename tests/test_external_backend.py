"""The ``external`` backend against a real Mosquitto the test owns, on loopback.

mqttbed checks the broker before and during the run, samples it, reads its $SYS
topics, and never starts, stops or signals it.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time

import psutil
import pytest
from pydantic import ValidationError

from mqttbed.brokers.external.backend import ExternalBackend
from mqttbed.brokers.external.options import Options
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow
from mqttbed.core.backends import BrokerBackend, RunsOnLabHost, create_backend, declaration
from mqttbed.core.errors import BackendError, SpecError
from mqttbed.core.host import LocalHost
from mqttbed.core.samples import SysTopicsSource
from tests.conftest import eventually, wait_until
from tests.generic_support import (
    MOSQUITTO,
    delivery_counts,
    free_port,
    own_mosquitto,
    refusing_broker,
)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.integration  # Mosquitto
def test_a_running_broker_is_measured_and_left_running_after_teardown(tmp_path):
    with own_mosquitto(tmp_path) as (broker, port):
        backend = create_backend("external")
        assert isinstance(backend, BrokerBackend) and isinstance(backend, SysTopicsSource)
        endpoint = backend.deploy({"url": f"mqtt://127.0.0.1:{port}",
                                   "sample": {"pid": broker.pid, "interval_s": 0.05}},
                                  LocalHost())
        assert (endpoint.host, endpoint.port, endpoint.transport) == ("127.0.0.1", port,
                                                                      "mqtt-tcp")
        assert backend.health() is None
        assert eventually(lambda: len(backend.resource_samples()) >= 2, 3)
        backend.teardown()
        backend.teardown()  # twice: nothing more happens

        assert broker.poll() is None and psutil.Process(broker.pid).status() != "zombie"
        record = backend.deployment()
        assert record.managed is False and record.pid == broker.pid
        assert record.binary == MOSQUITTO and len(record.binary_sha256 or "") == 64
        assert record.sampled_process.cmdline[0] == MOSQUITTO
        assert record.version.startswith("mosquitto version ")   # from $SYS/broker/version
        assert backend.health() is not None   # torn down: no longer usable
        assert all(s.processes == 1 for s in backend.resource_samples())


@pytest.mark.integration
def test_nothing_listening_fails_within_seconds_naming_address_and_os_error():
    url = f"mqtt://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(BackendError) as raised:
        ExternalBackend().deploy({"url": url}, LocalHost())
    assert time.monotonic() - started < 5
    assert str(raised.value) == f"external broker {url}: connection refused (ECONNREFUSED)"


def test_a_udp_broker_that_is_not_there_is_named_by_its_os_error():
    url = f"mqtt-sn-udp://127.0.0.1:{free_port()}"
    with pytest.raises(BackendError, match=f"external broker {url}: connection refused "
                                           r"\(ECONNREFUSED\)"):
        ExternalBackend().deploy({"url": url}, LocalHost())


def test_a_refused_connect_names_the_connack_code_and_its_meaning():
    refused = (r"external broker mqtt://127\.0\.0\.1:\d+: CONNECT refused with CONNACK "
               r"return code 5 not authorized")
    with refusing_broker(5) as port, pytest.raises(BackendError, match=refused):
        ExternalBackend().deploy({"url": f"mqtt://127.0.0.1:{port}"}, LocalHost())


@pytest.mark.integration
def test_a_broker_killed_mid_run_makes_health_say_why(tmp_path):
    with own_mosquitto(tmp_path) as (broker, port):
        url = f"mqtt://127.0.0.1:{port}"
        watched, unwatched = ExternalBackend(), ExternalBackend()
        watched.deploy({"url": url, "sample": {"pid": broker.pid}, "sys_topics": False},
                       LocalHost())
        unwatched.deploy({"url": url, "sys_topics": False}, LocalHost())
        by_sys = ExternalBackend()   # its $SYS session stands for the broker while it is up
        by_sys.deploy({"url": url}, LocalHost())
        assert watched.health() is None and unwatched.health() is None
        assert by_sys.health() is None
        broker.kill()
        broker.wait(5)
        assert eventually(lambda: watched.health() is not None, 3)
        assert watched.health() == (f"external broker {url}: its process {broker.pid} "
                                    "(mosquitto) has ended")
        assert eventually(lambda: unwatched.health() is not None, 3)
        assert unwatched.health() == f"external broker {url}: connection refused (ECONNREFUSED)"
        assert eventually(lambda: by_sys.health() is not None, 3)
        assert by_sys.health() == unwatched.health()
        for backend in (watched, unwatched, by_sys):
            backend.teardown()


@pytest.mark.integration
def test_sys_topics_of_mosquitto_are_kept_as_numbers(tmp_path):
    with own_mosquitto(tmp_path) as (_, port):
        backend = ExternalBackend()
        backend.deploy({"url": f"mqtt://127.0.0.1:{port}"}, LocalHost())
        # Mosquitto publishes $SYS every sys_interval (1 s here)
        wait_until(lambda: "$SYS/broker/clients/connected" in {
            s.topic for s in backend.sys_samples()}, 10,
            "Mosquitto to publish $SYS/broker/clients/connected")
        backend.teardown()
    samples = backend.sys_samples()
    topics = {s.topic for s in samples}
    assert "$SYS/broker/clients/connected" in topics
    assert all(s.topic.startswith("$SYS/") and isinstance(s.value, float) for s in samples)
    assert [s.t_ns for s in samples] == sorted(s.t_ns for s in samples)
    assert backend.deployment().sys_topics.samples == len(samples) > 0


@pytest.mark.integration
def test_the_process_is_found_by_name_and_its_whole_tree_sampled(tmp_path):
    # a name no other test's Mosquitto has: a link to the binary, named for this test
    renamed = tmp_path / "ext-broker-x"
    renamed.symlink_to(MOSQUITTO)
    with own_mosquitto(tmp_path, binary=str(renamed)) as (broker, port):
        backend = ExternalBackend()
        backend.deploy({"url": f"mqtt://127.0.0.1:{port}", "sys_topics": False,
                        "sample": {"process_name": "ext-broker-x", "interval_s": 0.05}},
                       LocalHost())
        assert eventually(lambda: len(backend.resource_samples()) >= 2, 3)
        backend.teardown()
        assert backend.deployment().pid == broker.pid and broker.poll() is None


def test_a_process_name_nothing_runs_under_is_an_error_naming_it():
    missing = "process_name 'no-such-broker-zz': no process"
    with refusing_broker(0) as port, pytest.raises(BackendError, match=missing):
        ExternalBackend().deploy({"url": f"mqtt://127.0.0.1:{port}", "sys_topics": False,
                                  "sample": {"process_name": "no-such-broker-zz"}},
                                 LocalHost())


@pytest.mark.parametrize(("url", "named"), [
    ("http://127.0.0.1:1883", "the scheme must be one of mqtt, mqtts, ws, wss, mqtt-udp, "
                              "mqtt-sn-udp"),
    ("mqtt://:1883", "names no host"),
    ("mqtt://127.0.0.1:99999", "the port must be a number from 1 to 65535"),
    ("mqtt-sn-udp://127.0.0.1", "give the port"),
    ("mqtt://user:pw@127.0.0.1", "a user name or password does not go in the url (the spec "
                                 "is stored, and the password with it): give broker.auth"),
    ("mqtts://user@127.0.0.1", "give broker.auth"),
    ("mqtt://127.0.0.1:1883/topic", "without a path (a path is for ws:// and wss://)"),
    ("mqtts://127.0.0.1/mqtt", "without a path"),
    ("wss://127.0.0.1/mqtt?token=1", "no query or fragment"),
])
def test_a_bad_url_is_refused_by_the_spec_naming_the_field(url, named):
    with pytest.raises(SpecError) as raised:
        parse_spec({"name": "x", "broker": {"backend": "external", "url": url}})
    assert "broker.url" in str(raised.value) and named in str(raised.value)


def test_a_url_password_is_not_repeated_in_the_reason():
    with pytest.raises(ValueError) as raised:
        Options.model_validate({"url": "mqtts://alice:canary-pw-42@broker.example"})
    reason = raised.value.errors()[0]["msg"]
    assert "'mqtts://broker.example'" in reason and "canary-pw-42" not in reason


@pytest.mark.parametrize(("url", "port", "tls", "path"), [
    ("mqtt://h", 1883, False, None),
    ("mqtts://h", 8883, True, None),
    ("ws://h", 80, False, "/mqtt"),
    ("wss://h", 443, True, "/mqtt"),
    ("ws://h:8080/", 8080, False, "/"),
    ("wss://h:8443/a/mqtt", 8443, True, "/a/mqtt"),
])
def test_stream_schemes_give_the_default_port_tls_and_websocket_path(url, port, tls, path):
    endpoint = Options(url=url).broker_url().endpoint()
    assert (endpoint.port, endpoint.tls is not None, endpoint.websocket_path) == (port, tls,
                                                                                  path)
    assert endpoint.scheme == url.split(":")[0]


def test_features_follow_the_url_unless_declared():
    wss = Options(url="wss://h").broker_features()
    assert (wss.protocols, wss.transports, wss.auth) == ({"3.1.1", "5"}, {"wss"}, True)
    udp = Options(url="mqtt-udp://h:1").broker_features()
    assert (udp.protocols, udp.auth) == ({"3.1.1"}, False)
    declared = Options(url="mqtts://h", features={"qos": [0, 1], "protocols": ["3.1.1"]})
    features = declared.broker_features()
    assert (features.qos, features.protocols, features.transports) == ({0, 1}, {"3.1.1"},
                                                                       {"tls"})


def test_urls_give_the_transport_and_the_default_port():
    assert Options(url="mqtt://localhost").broker_url().endpoint().port == 1883
    assert Options(url="mqtt-udp://10.0.0.2:5000").broker_url().transport == "mqtt-udp"
    sn = Options(url="mqtt-sn-udp://[::1]:1884").broker_url()
    assert (sn.host, sn.port, sn.transport) == ("::1", 1884, "mqtt-sn-udp")


def test_sample_options_name_what_is_wrong():
    with pytest.raises(ValidationError, match="exactly one of pid and process_name"):
        Options(url="mqtt://h", sample={"pid": 1, "process_name": "x"})
    with pytest.raises(ValidationError, match="give exactly one of pid and process_name"):
        Options(url="mqtt://h", sample={"interval_s": 1})
    with pytest.raises(ValidationError, match=re.escape(
            "lab_host 'pi-1': the lab host is broker.host, not a sample option: write "
            "host: pi-1 beside backend: external in the broker section")):
        Options(url="mqtt://h", sample={"process_name": "x", "lab_host": "pi-1"})
    with pytest.raises(ValidationError, match="Extra inputs"):
        Options(url="mqtt://h", port=1)


def test_a_broker_on_a_lab_host_is_named_by_broker_host_not_by_sample():
    spec = parse_spec({"name": "x", "broker": {
        "backend": "external", "url": "mqtt://10.0.0.5", "host": "lab-broker",
        "sample": {"process_name": "mosquitto"}}})
    assert spec.broker.host == "lab-broker"
    assert spec.broker.options().sample.process_name == "mosquitto"
    assert declaration("external").supports(RunsOnLabHost)
    with pytest.raises(SpecError) as raised:
        parse_spec({"name": "x", "broker": {"backend": "external", "url": "mqtt://10.0.0.5",
                                            "sample": {"pid": 7, "lab_host": "lab-broker"}}})
    assert str(raised.value).startswith("broker.sample: ")
    assert "lab_host 'lab-broker': the lab host is broker.host" in str(raised.value)


def test_declared_features_decide_what_a_workload_may_ask():
    with pytest.raises(SpecError, match="workload.qos 1: broker external delivers QoS 0 only"):
        parse_spec({"name": "x", "workload": {"qos": 1},
                    "broker": {"backend": "external", "url": "mqtt-udp://10.0.0.2:5000",
                               "features": {"qos": [0]}}})
    assert declaration("external").summary.startswith("a broker that is already running")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_campaign_against_an_external_broker_delivers_every_qos1_message(tmp_path,
                                                                            controller):
    with own_mosquitto(tmp_path) as (broker, port):
        spec = parse_spec({
            "name": "external-qos1", "agents": {"count": 2},
            "broker": {"backend": "external", "url": f"mqtt://127.0.0.1:{port}",
                       "sample": {"pid": broker.pid}},
            "workload": {"publishers": 1, "subscribers": 3, "qos": 1, "rate_hz": 200,
                         "messages": 100, "warmup_messages": 10},
            "timing": {"start_lead_s": 0.3, "drain_s": 0.5}})
        campaign_id = controller.engine.create_campaign(spec)
        assert controller.engine.run_campaign(campaign_id) == "done"
        assert broker.poll() is None, "mqttbed stopped a broker it did not start"
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.state == "done", run.reason
    published, received, qos = delivery_counts(controller.layout.run_events(campaign_id,
                                                                            run.id))
    assert published == 100 and qos == {1}   # warm-up messages included
    assert received == {f"sub-{i}": published for i in range(3)}
    metadata = json.loads((controller.layout.run_dir(campaign_id, run.id) / "run.json")
                          .read_text())["metadata"]
    assert metadata["broker"]["managed"] is False
    assert metadata["broker"]["sampled_process"]["pid"] == broker.pid


class DroppingRelay:
    """A TCP relay in front of a broker that, told to, closes every client's connection
    and then each new one as soon as it opens: a broker that drops all its clients
    mid-run, and those that come back.

    It keeps listening, so a liveness probe (a TCP connect) still succeeds and the run's
    reason is what the clients saw, every time: a relay that stopped listening would race
    the clients' reports against the probe's "connection refused".
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.dropped = False
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                if self.dropped:
                    client.close()
                    continue
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
                for sock in (client, upstream):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def drop_everyone(self) -> None:
        with self.lock:
            self.dropped = True
            for pair in self.pairs:
                for sock in pair:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    sock.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)   # wakes the blocked accept()
        self.server.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_broker_that_drops_every_client_mid_run_fails_the_run_and_keeps_its_events(
        tmp_path, controller, updates, request):
    from tests.conftest import wait_until
    from tests.test_engine_failures import dataset_rows, start_campaign, stored_rows

    with own_mosquitto(tmp_path) as (broker, port):
        relay = DroppingRelay(port)
        request.addfinalizer(relay.close)
        spec = {"name": "dropped", "agents": {"count": 2},
                "broker": {"backend": "external", "url": f"mqtt://127.0.0.1:{relay.port}",
                           "sys_topics": False},
                "workload": {"publishers": 1, "subscribers": 2, "rate_hz": 200,
                             "messages": 2000, "warmup_messages": 0},
                "timing": {"heartbeat_timeout_s": 5.0, "upload_interval_s": 0.25}}
        campaign_id, thread, result = start_campaign(controller, spec)
        run_id = f"{campaign_id}-r0000"
        wait_until(lambda: "running" in updates.states(run_id), 60, "run to start")
        wait_until(lambda: sum(stored_rows(controller, run_id).values()) > 50, 15,
                 "some chunks")
        relay.drop_everyone()
        thread.join(60)
        assert not thread.is_alive()
        assert broker.poll() is None   # the broker itself was never touched
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.state == "failed" and result["status"] == "failed"
    # the clients say so: "agent …: RuntimeError: sub-0: broker closed the connection; …"
    # (a reset can come first: "connection lost: [Errno 104] Connection reset by peer")
    assert re.search(r"(sub|pub)-\d: (broker closed the connection|connection lost)",
                     run.reason), run.reason
    stored = sum(stored_rows(controller, run_id).values())
    assert stored > 50 and dataset_rows(controller, campaign_id, run_id) == stored
