"""A managed Mosquitto as deployed: TLS with a CA made per run, a password file, MQTT 5,
WebSocket; against the real Mosquitto 2.0.11 with real paho clients and real OpenSSL."""

from __future__ import annotations

import re
import socket
import ssl
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
import pytest
from pydantic import SecretStr

from mqttbed.brokers.certificates import CertificateAuthority
from mqttbed.brokers.mosquitto import access as listener
from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options
from mqttbed.brokers.mosquitto.declaration import DECLARATION
from mqttbed.core.backends import BrokerAccess, ConfiguresAccess
from mqttbed.core.broker_access import (
    AuthSettings,
    ClientCredentials,
    EndpointTls,
    ListenerTransport,
    TlsSettings,
)
from mqttbed.core.errors import BackendError
from mqttbed.core.host import LocalHost
from mqttbed.core.mqtt_codec import ConnAck, Connect, encode
from mqttbed.core.mqtt_stream import read_packet
from mqttbed.core.protocol import Endpoint
from mqttbed.core.ssh import SshHost, SshTarget
from tests.conftest import eventually
from tests.generic_support import refusing_broker
from tests.sshd import LocalSshd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]   # a real Mosquitto

USER = "bench"
# a canary: searched for in everything a deploy leaves
PASSWORD = "canary-pw-7f3a91c2"


def access(transport: ListenerTransport, *, tls: TlsSettings | None = None,
           password: str | None = PASSWORD, protocol: str = "5") -> BrokerAccess:
    return BrokerAccess(transport=transport, protocol=protocol,  # type: ignore[arg-type]
                        tls=tls, auth=AuthSettings(username=USER, password_env="UNUSED"),
                        password=None if password is None else SecretStr(password))


def deploy(asked: BrokerAccess, **options: object) -> tuple[MosquittoBackend, Endpoint]:
    backend = MosquittoBackend()
    backend.configure_access(asked)
    try:
        return backend, backend.deploy(Options(**{"sys_topics": False, **options}),
                                       LocalHost())
    except BaseException:
        backend.teardown()
        raise


@pytest.fixture(scope="module")
def tls_broker() -> Iterator[tuple[MosquittoBackend, Endpoint]]:
    backend, endpoint = deploy(access(ListenerTransport.TLS), sys_topics=True)
    yield backend, endpoint
    backend.teardown()


@pytest.fixture(scope="module")
def wss_broker() -> Iterator[tuple[MosquittoBackend, Endpoint]]:
    backend, endpoint = deploy(access(ListenerTransport.WSS), sys_topics=True)
    yield backend, endpoint
    backend.teardown()


def context_of(endpoint: Endpoint) -> ssl.SSLContext:
    """What an agent trusts: the endpoint's CA alone."""
    assert endpoint.tls is not None and endpoint.tls.ca_pem is not None
    return ssl.create_default_context(cadata=endpoint.tls.ca_pem)


class Paho:
    """A paho client of the endpoint (TLS, WebSocket, MQTT 5 as it says), awaited."""

    def __init__(self, endpoint: Endpoint, client_id: str, password: str = PASSWORD,
                 protocol: int = mqtt.MQTTv5):
        self.reason: mqtt.ReasonCode | None = None
        self.messages: list[bytes] = []
        self._connack = threading.Event()
        self._subscribed = threading.Event()
        self._received = threading.Condition()
        transport = "websockets" if endpoint.websocket_path else "tcp"
        self.paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                protocol=protocol, transport=transport)
        if endpoint.websocket_path:
            self.paho.ws_set_options(path=endpoint.websocket_path)
        if endpoint.tls is not None:
            self.paho.tls_set_context(context_of(endpoint))
        self.paho.username_pw_set(USER, password)
        self.paho.on_connect = self._on_connect
        self.paho.on_subscribe = lambda *_: self._subscribed.set()
        self.paho.on_message = self._on_message
        self.paho.connect(endpoint.host, endpoint.port)
        self.paho.loop_start()
        assert self._connack.wait(5), f"{client_id}: no CONNACK from {endpoint}"

    def _on_connect(self, _c: object, _u: object, _f: object, reason: mqtt.ReasonCode,
                    _p: object) -> None:
        self.reason = reason
        self._connack.set()

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        with self._received:
            self.messages.append(message.payload)
            self._received.notify_all()

    def subscribe(self, topic: str) -> None:
        self.paho.subscribe(topic, qos=1)
        assert self._subscribed.wait(5), f"no SUBACK for {topic}"

    def wait_for(self, count: int) -> list[bytes]:
        with self._received:
            self._received.wait_for(lambda: len(self.messages) >= count, 5)
            return list(self.messages)

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


def relay_one_message(endpoint: Endpoint) -> list[bytes]:
    """Subscribe, publish one QoS 1 message, return what the subscriber got."""
    sub, pub = Paho(endpoint, "sub"), Paho(endpoint, "pub")
    try:
        assert (sub.reason, pub.reason) == (0, 0)
        sub.subscribe("t/access")
        pub.paho.publish("t/access", b"over " + endpoint.scheme.encode(), qos=1)
        return sub.wait_for(1)
    finally:
        sub.close()
        pub.close()


def connack_311(endpoint: Endpoint, password: str) -> int:
    """The return code of a raw MQTT 3.1.1 CONNECT over the endpoint's TLS."""
    raw = socket.create_connection((endpoint.host, endpoint.port), timeout=3)
    with context_of(endpoint).wrap_socket(raw, server_hostname=endpoint.host) as sock:
        sock.sendall(encode(Connect("raw-311", username=USER, password=password.encode())))
        answer = read_packet(sock)
    assert isinstance(answer, ConnAck)
    return answer.return_code


def test_the_declaration_says_what_mosquitto_takes_and_the_backend_configures_it():
    features = DECLARATION.features
    assert features.protocols == {"3.1.1", "5"} and features.auth
    assert features.transports == set(ListenerTransport)
    assert DECLARATION.supports(ConfiguresAccess)


def test_tls_listener_is_verified_with_the_runs_ca_alone_and_relays_mqtt5(tls_broker):
    backend, endpoint = tls_broker
    assert endpoint.scheme == "mqtts" and endpoint.tls is not None
    assert endpoint.tls.server_name is None and endpoint.tls.verify
    assert relay_one_message(endpoint) == [b"over mqtts"]
    # the system's CAs do not know the run's CA: OpenSSL refuses the chain
    raw = socket.create_connection((endpoint.host, endpoint.port), timeout=3)
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        ssl.create_default_context().wrap_socket(raw, server_hostname=endpoint.host)
    raw.close()
    # the certificate names the listen address and localhost, nothing else
    record = backend.deployment().access
    assert record is not None and record.certificate_names == ["127.0.0.1", "localhost"]
    assert record.transport == ListenerTransport.TLS and record.username == USER


def test_a_plain_client_at_the_tls_port_gets_no_connack(tls_broker):
    _, endpoint = tls_broker
    with socket.create_connection((endpoint.host, endpoint.port), timeout=3) as sock:
        sock.sendall(encode(Connect("plain-at-tls", username=USER, password=b"x")))
        # Mosquitto reads the CONNECT as a bad TLS record and drops the connection
        try:
            answer = sock.recv(64)
        except ConnectionResetError:
            answer = b""
        assert answer == b""


def test_the_password_file_admits_the_right_password_only_with_the_connack_code(tls_broker):
    _, endpoint = tls_broker
    assert connack_311(endpoint, PASSWORD) == 0
    assert connack_311(endpoint, PASSWORD + "x") == 5   # 3.1.1: 5 not authorized
    wrong = Paho(endpoint, "v5-wrong", password="not the password")
    wrong.close()
    assert wrong.reason is not None and wrong.reason.value == 0x87   # MQTT 5: not authorized
    assert str(wrong.reason) == "Not authorized"
    right = Paho(endpoint, "v5-right")
    right.close()
    assert right.reason == 0


def test_the_password_never_reaches_the_record_the_config_or_the_directory(tls_broker):
    backend, _ = tls_broker
    record = backend.deployment()
    assert PASSWORD not in record.model_dump_json()
    assert record.config is not None and "password_file" in record.config
    directory = Path(record.config.split("password_file ")[1].split("\n")[0]).parent
    for path in directory.iterdir():
        assert PASSWORD.encode() not in path.read_bytes(), path
    # the hash is Mosquitto 2.0's own format, the key and the hash private to the owner
    line = (directory / "passwords").read_text()
    assert line.startswith(f"{USER}:$7$101$") and line.endswith("\n")
    for name in ("passwords", "server.key"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name


def test_websocket_over_tls_upgrades_to_mqtt_and_relays_mqtt5(wss_broker):
    backend, endpoint = wss_broker
    assert endpoint.scheme == "wss" and endpoint.websocket_path == "/mqtt"
    assert relay_one_message(endpoint) == [b"over wss"]
    record = backend.deployment().access
    assert record is not None and record.plain_port is not None


def test_the_sys_sampler_logs_in_as_the_run_over_tls_and_beside_a_wss_listener(
        tls_broker, wss_broker):
    # the password file refuses anonymous clients: samples mean the sampler sent the
    # run's user and password (over TLS, in MQTT 5; at the plain listener beside wss)
    for backend, _ in (tls_broker, wss_broker):
        assert eventually(lambda b=backend: len(b.sys_samples()) > 0, 4)
        record = backend.deployment().sys_topics
        assert record is not None and record.error is None and record.samples > 0


def test_the_deploy_probe_names_the_address_and_openssl_s_reason(tls_broker):
    _, endpoint = tls_broker
    stranger = EndpointTls(ca_pem=CertificateAuthority.create("another CA").cert_pem)
    with pytest.raises(BackendError) as refused:
        listener.probe(endpoint.model_copy(update={"tls": stranger}), "5",
                       ClientCredentials(username=USER, password=PASSWORD))
    assert str(refused.value).startswith(
        f"mosquitto at mqtts://127.0.0.1:{endpoint.port}: TLS handshake failed: certificate "
        "verify failed: ")


def test_the_deploy_probe_names_the_connack_code_and_the_user_never_the_password():
    with refusing_broker(5) as port, pytest.raises(BackendError) as refused:
        listener.probe(Endpoint(host="127.0.0.1", port=port), "3.1.1",
                       ClientCredentials(username=USER, password=PASSWORD))
    assert str(refused.value) == (f"mosquitto at mqtt://127.0.0.1:{port}: CONNECT refused "
                                  "with CONNACK return code 5 not authorized (user 'bench')")


def test_plain_websocket_relays_mqtt_311():
    backend, endpoint = deploy(access(ListenerTransport.WS, protocol="3.1.1"))
    try:
        assert endpoint.scheme == "ws" and endpoint.tls is None
        sub = Paho(endpoint, "ws-311", protocol=mqtt.MQTTv311)
        sub.close()
        assert sub.reason == 0
        assert relay_one_message(endpoint) == [b"over ws"]
    finally:
        backend.teardown()


def test_teardown_leaves_no_process_no_directory_and_no_key():
    backend, endpoint = deploy(access(ListenerTransport.WSS))
    record = backend.deployment()
    assert record.pid is not None and record.config is not None
    directory = Path(record.config.split("keyfile ")[1].split("\n")[0]).parent
    assert (directory / "server.key").exists()
    backend.teardown()
    assert not directory.exists()
    assert not psutil.pid_exists(record.pid) or \
        psutil.Process(record.pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(OSError):
        socket.create_connection((endpoint.host, endpoint.port), timeout=1).close()


def test_a_client_certificate_is_required_when_the_run_has_one(tmp_path):
    client_ca = CertificateAuthority.create("a client CA")
    cert_pem, key_pem = client_ca.issue(["agent"], client=True)
    (tmp_path / "client.crt").write_text(cert_pem + client_ca.cert_pem)
    (tmp_path / "client.key").write_text(key_pem)
    tls = TlsSettings(cert_file=str(tmp_path / "client.crt"),
                      key_file=str(tmp_path / "client.key"))
    # the deploy probe presents the certificate: had the broker refused it, deploy raised
    backend, endpoint = deploy(access(ListenerTransport.TLS, tls=tls))
    try:
        record = backend.deployment().access
        assert record is not None and record.client_certificates

        def attempt(certificate: bool) -> str:
            context = context_of(endpoint)
            if certificate:
                context.load_cert_chain(tls.cert_file or "", tls.key_file)
            raw = socket.create_connection((endpoint.host, endpoint.port), timeout=3)
            try:
                with context.wrap_socket(raw, server_hostname=endpoint.host) as sock:
                    sock.sendall(encode(Connect("cert", username=USER,
                                                password=PASSWORD.encode())))
                    answer = read_packet(sock)
                    assert isinstance(answer, ConnAck)
                    return f"CONNACK {answer.return_code}"
            except (ssl.SSLError, ConnectionError) as exc:
                return f"refused: {type(exc).__name__}: {exc}"

        assert attempt(certificate=True) == "CONNACK 0"
        # without one, Mosquitto ends the TLS 1.3 session after the handshake: an alert
        # (certificate required) or the connection closed, depending on who reads first
        refused = attempt(certificate=False)
        assert re.match(r"refused: (SSLError: .*certificate required|SSLEOFError|StreamClosed"
                        r"|ConnectionResetError)", refused), refused
    finally:
        backend.teardown()


def test_a_server_name_asked_for_is_in_the_certificate_and_the_endpoint():
    tls = TlsSettings(server_name="broker.lab.example")
    backend, endpoint = deploy(access(ListenerTransport.TLS, tls=tls))
    try:
        assert endpoint.tls is not None and endpoint.tls.server_name == "broker.lab.example"
        raw = socket.create_connection((endpoint.host, endpoint.port), timeout=3)
        with context_of(endpoint).wrap_socket(raw, server_hostname="broker.lab.example"):
            pass
    finally:
        backend.teardown()


@pytest.mark.parametrize(("asked", "named"), [
    (access(ListenerTransport.TCP, password=None), "broker.auth: user 'bench' has no password"),
    (BrokerAccess(transport=ListenerTransport.TLS, tls=TlsSettings(ca_file="/x/ca.pem")),
     "broker.tls.ca_file '/x/ca.pem': a managed Mosquitto"),
    (BrokerAccess(tls=TlsSettings()), "broker.tls is given but broker.transport is 'tcp'"),
    (BrokerAccess(auth=AuthSettings(username="a:b", password_env="X"),
                  password=SecretStr("p")), "broker.auth.username 'a:b'"),
])
def test_what_mosquitto_cannot_be_given_is_refused_naming_the_field(asked, named):
    backend = MosquittoBackend()
    backend.configure_access(asked)
    with pytest.raises(BackendError) as refused:
        backend.deploy(Options(sys_topics=False), LocalHost())
    assert named in str(refused.value)
    assert backend.deployment().pid is None   # refused before anything started


def test_this_mosquitto_has_websockets_and_one_without_is_refused_naming_it(tmp_path):
    # Debian 12's 2.0.11 carries libwebsockets 4.1.6 (linked in): the probe says so
    binary = "/usr/sbin/mosquitto"
    conf = tmp_path / "probe.conf"
    conf.write_text(listener.WEBSOCKETS_PROBE_CONFIG)
    printed = subprocess.run([binary, "-c", str(conf)], capture_output=True, text=True,
                             timeout=5)
    assert listener.websockets_verdict(printed.stdout + printed.stderr, binary, "2.0.11") is None
    # A build without WITH_WEBSOCKETS stops at the `protocol websockets` line with this
    # message (Mosquitto's conf.c); no such binary is installed here, so a stand-in prints
    # it for the probe config and runs the real broker otherwise.
    stand_in = tmp_path / "mosquitto-without-ws"
    stand_in.write_text(
        "#!/bin/sh\n"
        'if grep -q mqttbed_websockets_probe "$2" 2>/dev/null; then\n'
        '  echo "1: Error: Websockets support not available."; echo "1: Error found at '
        '$2:2."; exit 3\nfi\n'
        f'exec {binary} "$@"\n')
    stand_in.chmod(0o755)
    backend = MosquittoBackend()
    backend.configure_access(BrokerAccess(transport=ListenerTransport.WS))
    with pytest.raises(BackendError) as refused:
        backend.deploy(Options(binary=str(stand_in), sys_topics=False), LocalHost())
    assert str(refused.value) == (
        f"broker.transport 'ws': this Mosquitto ({stand_in} 2.0.11) is built without "
        "WebSockets; build it WITH_WEBSOCKETS=yes or measure ws on rabbitmq or amqtt")
    assert backend.deployment().pid is None   # refused before the broker started


def test_on_a_lab_host_the_tls_files_and_password_file_are_carried_there(tmp_path):
    sshd = LocalSshd(tmp_path)
    host = SshHost(SshTarget(**sshd.target()))
    backend = MosquittoBackend()
    try:
        backend.configure_access(access(ListenerTransport.TLS))
        endpoint = backend.deploy_on_lab_host(Options(sys_topics=False), host)
        assert endpoint.tls is not None and endpoint.host == host.address
        assert relay_one_message(endpoint) == [b"over mqtts"]
        config = backend.deployment().config
        assert config is not None
        remote_dir = Path(config.split("keyfile ")[1].split("\n")[0]).parent
        # (the lab host is this machine: its files can be looked at directly)
        assert stat.S_IMODE((remote_dir / "server.key").stat().st_mode) == 0o600
        assert PASSWORD.encode() not in (remote_dir / "passwords").read_bytes()
        backend.teardown()
        assert not remote_dir.exists()
    finally:
        backend.teardown()
        host.close()
        sshd.stop()
