"""A command broker's readiness poll through the shared probe: what is retried, what is
final at once (named with the broker's address), with real Mosquittos and real sockets."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mqttbed.brokers.certificates import CertificateAuthority, write_server_tls
from mqttbed.brokers.command.backend import CommandBackend
from mqttbed.brokers.command.options import Options
from mqttbed.brokers.command.ready import probe_ready
from mqttbed.brokers.reachability import ConnectRefused, Unreachable
from mqttbed.core.backends import AccessRecord, BrokerAccess
from mqttbed.core.broker_access import (
    AuthSettings,
    ClientCredentials,
    EndpointTls,
    ListenerTransport,
)
from mqttbed.core.errors import BackendError
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import Endpoint
from tests.generic_support import (
    MOSQUITTO,
    free_port,
    mosquitto_running,
    refusing_broker,
    refusing_upgrade,
    write_password_file,
)

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="needs Mosquitto")]

USER, PASSWORD = "ready-user", "ready-Pw-3c9"


@pytest.fixture(scope="module")
def passworded(tmp_path_factory) -> Iterator[int]:
    """A Mosquitto refusing anonymous clients, with one user: its port."""
    directory = tmp_path_factory.mktemp("ready-mosquitto")
    passwords = write_password_file(directory / "passwords", {USER: PASSWORD})
    port = free_port()
    with mosquitto_running(directory, ["allow_anonymous false", f"password_file {passwords}",
                                       f"listener {port} 127.0.0.1"], [port]):
        yield port


def test_a_port_nobody_listens_on_is_retried_with_the_kernel_s_reason():
    with pytest.raises(Unreachable) as raised:
        probe_ready("command", Endpoint(host="127.0.0.1", port=free_port()), 1.0)
    assert not isinstance(raised.value, ConnectRefused) and not raised.value.lasting
    assert raised.value.reason == "connection refused (ECONNREFUSED)"


def test_a_connack_that_refuses_is_raised_as_such_with_its_code():
    with refusing_broker(5) as port, pytest.raises(ConnectRefused) as raised:
        probe_ready("command", Endpoint(host="127.0.0.1", port=port), 1.0)
    assert raised.value.code == 5 and "return code 5 not authorized" in raised.value.reason


@pytest.mark.integration  # Mosquitto
def test_the_run_s_user_and_mqtt_version_are_those_probed(passworded):
    endpoint = Endpoint(host="127.0.0.1", port=passworded)
    probe_ready("command", endpoint, 2.0,
                ClientCredentials(username=USER, password=PASSWORD), "5")
    wrong = ClientCredentials(username=USER, password="wrong")
    # the refusal comes in the version asked: an MQTT 5 reason code (Mosquitto 2.0.11 says
    # 0x87 to a wrong password), a 3.1.1 return code
    with pytest.raises(ConnectRefused) as refused5:
        probe_ready("command", endpoint, 2.0, wrong, "5")
    assert "reason code 0x87 Not authorized (user 'ready-user')" in str(refused5.value)
    with pytest.raises(ConnectRefused) as refused311:
        probe_ready("command", endpoint, 2.0, wrong, "3.1.1")
    assert "return code 5 not authorized (user 'ready-user')" in str(refused311.value)


def test_a_refused_websocket_upgrade_is_final_naming_the_url_and_the_http_status():
    with refusing_upgrade("HTTP/1.1 404 Not Found") as port, \
            pytest.raises(BackendError) as raised:
        probe_ready("rabbitmq", Endpoint(host="127.0.0.1", port=port,
                                         websocket_path="/mqtt"), 2.0)
    assert str(raised.value) == (f"broker rabbitmq at ws://127.0.0.1:{port}/mqtt: the "
                                 "WebSocket upgrade was refused: HTTP/1.1 404 Not Found")


class _StrangerCaBackend(CommandBackend):
    """A command broker whose clients trust another CA than the one that signed it."""

    stranger_pem = CertificateAuthority.create("a CA the broker never saw").cert_pem

    def _endpoint(self, address: str, port: int, options: Options) -> Endpoint:
        return Endpoint(host=address, port=port, tls=EndpointTls(ca_pem=self.stranger_pem))


@pytest.mark.integration  # Mosquitto
def test_a_certificate_that_does_not_verify_fails_the_deploy_at_once_and_leaves_nothing(
        tmp_path):
    tls = write_server_tls(tmp_path, ["127.0.0.1"])
    template = "\n".join([*(["user root"] if os.geteuid() == 0 else []),
                          "listener {port} 127.0.0.1", "allow_anonymous true",
                          f"certfile {tls.cert_file}", f"keyfile {tls.key_file}", ""])
    backend = _StrangerCaBackend()
    started = time.monotonic()
    with pytest.raises(BackendError) as raised:
        backend.deploy({"command": f"{MOSQUITTO} -c {{config}}", "config_template": template,
                        "ready_timeout_s": 20, "sys_topics": False}, LocalHost())
    # final on the first handshake: not polled until ready_timeout_s
    assert time.monotonic() - started < 5
    record = backend.deployment()
    assert str(raised.value).startswith(
        f"broker command at mqtts://127.0.0.1:{record.port}: TLS handshake failed: "
        "certificate verify failed: ")
    assert record.pid is not None and not psutil.pid_exists(record.pid)


def test_the_endpoint_s_url_is_as_a_user_writes_it():
    assert Endpoint(host="::1", port=8443, websocket_path="/mqtt",
                    tls=EndpointTls()).url == "wss://[::1]:8443/mqtt"
    assert Endpoint(host="127.0.0.1", port=1883).url == "mqtt://127.0.0.1:1883"


def test_the_access_record_fingerprints_the_ca_as_openssl_does(tmp_path):
    ca = CertificateAuthority.create()
    (tmp_path / "ca.crt").write_text(ca.cert_pem)
    printed = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "ca.crt"), "-noout",
                              "-fingerprint", "-sha256"], capture_output=True, text=True,
                             check=True, timeout=10).stdout
    access = BrokerAccess(transport=ListenerTransport.WSS,
                          auth=AuthSettings(username=USER, password_env="UNUSED_HERE"))
    record = AccessRecord.of(access, ca_pem=ca.cert_pem, certificate_names=["127.0.0.1"],
                             websocket_path="/mqtt")
    assert record.ca_sha256 == printed.split("=", 1)[1].strip().replace(":", "").lower()
    assert (record.username, record.certificate_names, record.websocket_path) == (
        USER, ["127.0.0.1"], "/mqtt")
    assert AccessRecord.of(access).ca_sha256 is None
