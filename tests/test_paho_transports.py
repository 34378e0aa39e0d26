"""The agent's paho and lean clients on brokers as deployed: TLS, credentials, MQTT 5 and
WebSocket, against a real Mosquitto 2.0 (TLS listeners, a password file) and amqtt's
WebSocket listeners, each started by this module with a config of its own."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.main import CommandsUnreadable, parse_commands
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.agents.native import engine as native
from mqttbed.brokers.certificates import CertificateAuthority, write_server_tls
from mqttbed.core.broker_access import ClientCredentials, EndpointTls, MqttProtocol
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import ClientAssignment, Done, Endpoint, Role
from tests.generic_support import (
    MOSQUITTO,
    WebSocketBroker,
    amqtt_websockets,
    free_port,
    mosquitto_running,
    refusing_upgrade,
    tls_lines,
    write_password_file,
)

USER = "agent-user"
CANARY = "canary-Pw-5f1e0c2b"  # the password: searched for in everything a run leaves
SERVER_NAME = "broker.mqttbed.test"  # in the server certificate beside 127.0.0.1
MESSAGES = 40
RATE_HZ = 400

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="needs Mosquitto")]


@dataclass(frozen=True)
class SecuredBroker:
    """A Mosquitto requiring a password on every listener: plain, TLS, TLS with a client
    certificate required."""

    ca: CertificateAuthority
    plain: int
    tls: int
    client_cert_tls: int

    def endpoint(self, port: int | None = None, server_name: str | None = None,
                 ca_pem: str | None = None) -> Endpoint:
        return Endpoint(host="127.0.0.1", port=port or self.tls,
                        tls=EndpointTls(ca_pem=ca_pem or self.ca.cert_pem,
                                        server_name=server_name))


@pytest.fixture(scope="module")
def secured(tmp_path_factory) -> Iterator[SecuredBroker]:
    directory = tmp_path_factory.mktemp("secured-mosquitto")
    ca = CertificateAuthority.create()
    files = write_server_tls(directory, ["127.0.0.1", SERVER_NAME], ca)
    passwords = write_password_file(directory / "passwords", {USER: CANARY})
    plain, tls, client_cert_tls = free_port(), free_port(), free_port()
    with mosquitto_running(directory, [
            "per_listener_settings false", "allow_anonymous false",
            f"password_file {passwords}", "persistence false",
            f"listener {plain} 127.0.0.1",
            f"listener {tls} 127.0.0.1", *tls_lines(files),
            f"listener {client_cert_tls} 127.0.0.1",
            *tls_lines(files, require_certificate=True)], [plain, tls, client_cert_tls]):
        yield SecuredBroker(ca, plain, tls, client_cert_tls)


@pytest.fixture(scope="module")
def websocket_broker(tmp_path_factory) -> Iterator[WebSocketBroker]:
    with amqtt_websockets(tmp_path_factory.mktemp("amqtt-ws")) as broker:
        yield broker


def fan_out(qos: int, subscribers: int = 2, topic: str = "t/secured") -> list[ClientAssignment]:
    pub = ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic=topic, qos=qos,
                           gpio_pin=2, payload_bytes=64, rate_hz=RATE_HZ, messages=MESSAGES)
    subs = [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER, topic=topic, qos=qos,
                             gpio_pin=3 + j, expected_messages=MESSAGES, subscribe_rank=j)
            for j in range(subscribers)]
    return [pub, *subs]


def password(secret: str = CANARY) -> ClientCredentials:
    return ClientCredentials(username=USER, password=secret)


@dataclass
class Outcome:
    session: MqttSession
    events: list[tuple]
    counts: tuple[int, int]

    def deliveries(self) -> list[tuple]:
        return [e for e in self.events if e[0] == "delivery"]


def run(endpoint: Endpoint, clients: list[ClientAssignment], *, mqtt_client: str = "paho",
        protocol: MqttProtocol = "3.1.1",
        credentials: ClientCredentials | None = None) -> Outcome:
    events: list[tuple] = []
    session = MqttSession(endpoint, clients, VirtualGpio(), events.append,
                          mqtt_client=mqtt_client, credentials=credentials, protocol=protocol)
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 50_000_000
        session.run(start, start + 5_000_000_000, abort=lambda: False)
        counts = session.counts()
    finally:
        session.close()
    return Outcome(session, events, counts)


def connect_failure(endpoint: Endpoint, *, mqtt_client: str = "paho",
                    protocol: MqttProtocol = "3.1.1",
                    credentials: ClientCredentials | None = None) -> str:
    """The error a session's connect raises (it must raise within seconds)."""
    session = MqttSession(endpoint, fan_out(0, subscribers=0), VirtualGpio(), lambda _e: None,
                          mqtt_client=mqtt_client, credentials=credentials, protocol=protocol)
    started = monotonic_ns()
    try:
        with pytest.raises(RuntimeError) as failure:
            session.connect(timeout_s=5)
    finally:
        session.close()
    assert monotonic_ns() - started < 6_000_000_000
    return str(failure.value)


def assert_exact_delivery(outcome: Outcome, qos: int, subscribers: int = 2) -> None:
    """Every message published once reached every subscriber, and (but at QoS 1, where
    a duplicate is allowed) exactly once."""
    assert outcome.counts == (MESSAGES, subscribers * MESSAGES)
    deliveries = outcome.deliveries()
    assert {(e[3], e[2]) for e in deliveries} == {
        (f"sub-{j}", seq) for j in range(subscribers) for seq in range(MESSAGES)}
    if qos != 1:
        assert len(deliveries) == subscribers * MESSAGES
    assert {e[6] for e in deliveries} == {qos}


# -- paho over TLS with a password, MQTT 5 and 3.1.1 -------------------------------------

@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_over_tls_with_a_password_at_mqtt5_delivers_every_message_once(secured, qos):
    outcome = run(secured.endpoint(), fan_out(qos), protocol="5", credentials=password())
    assert_exact_delivery(outcome, qos)
    report = outcome.session.generator_report()
    assert (report.mqtt_client, report.mqtt_client_reason) == ("paho", "")
    phases = outcome.session.connect_phases()
    assert [p.client_id for p in phases] == ["sub-0", "sub-1", "pub-0"]
    for p in phases:
        # TCP, then the handshake, then CONNECT -> CONNACK: each seen, none made up
        assert p.tcp_ns > 0 and p.tls_ns > 0 and p.connack_ns > 0 and p.websocket_ns is None
        assert p.tcp_ns + p.tls_ns + p.connack_ns < 5_000_000_000


def test_paho_over_tls_at_mqtt_3_1_1_with_a_password(secured):
    outcome = run(secured.endpoint(), fan_out(1), credentials=password())
    assert_exact_delivery(outcome, 1)


def test_the_server_name_is_sent_and_verified_instead_of_the_host(secured):
    # the certificate names 127.0.0.1 and SERVER_NAME: each passes, another name does not
    outcome = run(secured.endpoint(server_name=SERVER_NAME), fan_out(0, subscribers=1),
                  credentials=password())
    assert outcome.counts == (MESSAGES, MESSAGES)
    reason = connect_failure(secured.endpoint(server_name="other.mqttbed.test"),
                             credentials=password())
    assert f"mqtts://127.0.0.1:{secured.tls}" in reason
    assert "certificate verify failed: Hostname mismatch" in reason
    assert "other.mqttbed.test" in reason


def test_a_ca_that_did_not_sign_the_broker_certificate_is_named(secured):
    stranger = CertificateAuthority.create("another CA")
    reason = connect_failure(secured.endpoint(ca_pem=stranger.cert_pem),
                             credentials=password())
    assert reason.startswith(f"pub-0: cannot connect: mqtts://127.0.0.1:{secured.tls}: ")
    # Mosquitto sends its CA beside its certificate: OpenSSL's reason is the chain's
    assert ("certificate verify failed: self-signed certificate in certificate chain" in reason
            or "certificate verify failed: unable to get local issuer certificate" in reason)


def test_verify_off_accepts_a_certificate_no_trusted_ca_signed(secured):
    endpoint = Endpoint(host="127.0.0.1", port=secured.tls,
                        tls=EndpointTls(ca_pem=CertificateAuthority.create().cert_pem,
                                        server_name="not.its.name", verify=False))
    outcome = run(endpoint, fan_out(0, subscribers=1), credentials=password())
    assert outcome.counts == (MESSAGES, MESSAGES)


def test_a_plain_client_at_a_tls_port_fails_within_the_timeout_naming_the_address(secured):
    reason = connect_failure(Endpoint(host="127.0.0.1", port=secured.tls),
                             credentials=password())
    assert f"127.0.0.1:{secured.tls}" in reason


def test_a_tls_client_at_a_plain_port_fails_naming_the_handshake(secured):
    reason = connect_failure(secured.endpoint(port=secured.plain), credentials=password())
    assert f"mqtts://127.0.0.1:{secured.plain}" in reason
    assert "TLS handshake failed: " in reason  # Mosquitto resets it: a ClientHello is no CONNECT


def test_a_client_certificate_from_pem_text_is_presented_and_its_files_are_gone(
        secured, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the key file goes
    cert_pem, key_pem = secured.ca.issue(["mqttbed-agent"], client=True)
    credentials = ClientCredentials(username=USER, password=CANARY, cert_pem=cert_pem,
                                    key_pem=key_pem)
    outcome = run(secured.endpoint(port=secured.client_cert_tls), fan_out(0, subscribers=1),
                  credentials=credentials)
    assert outcome.counts == (MESSAGES, MESSAGES)
    assert list(tmp_path.iterdir()) == []  # the key's directory went once loaded
    # the same listener refuses a client without a certificate
    reason = connect_failure(secured.endpoint(port=secured.client_cert_tls),
                             credentials=password())
    # TLS 1.3: the server refuses the certificate after the client's handshake is done,
    # so the refusal arrives as CONNECT is written, or as its answer is read
    assert f"127.0.0.1:{secured.client_cert_tls}" in reason
    assert ("the connection closed as CONNECT was written: The connection was lost. "
            "(failed to receive on socket: " in reason or "lost: " in reason)


def test_a_key_that_does_not_match_its_certificate_is_named_without_its_text(secured):
    cert_pem, _ = secured.ca.issue(["mqttbed-agent"], client=True)
    _, other_key = secured.ca.issue(["someone-else"], client=True)
    credentials = ClientCredentials(username=USER, cert_pem=cert_pem, key_pem=other_key)
    with pytest.raises(ValueError) as refused:
        MqttSession(secured.endpoint(port=secured.client_cert_tls), fan_out(0, 0),
                    VirtualGpio(), lambda _e: None, mqtt_client="paho", credentials=credentials)
    assert "credentials.cert_pem and key_pem" in str(refused.value)
    assert "PRIVATE KEY" not in str(refused.value)


# -- refusals named, and no secret in any of them -----------------------------------------

@pytest.mark.parametrize(("protocol", "named"), [
    ("3.1.1", "return code 5 (not authorized)"),
    ("5", "reason code 0x87 (Not authorized)"),
])
def test_a_wrong_password_is_refused_naming_the_connack_code(secured, protocol, named):
    reason = connect_failure(secured.endpoint(), protocol=protocol,
                             credentials=password(CANARY + "-wrong"))
    assert f"CONNACK refused by 127.0.0.1:{secured.tls}: {named}" in reason
    assert CANARY not in reason


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_no_password_at_all_is_refused_naming_the_connack_code(secured, protocol):
    reason = connect_failure(secured.endpoint(), protocol=protocol)
    assert f"CONNACK refused by 127.0.0.1:{secured.tls}: " in reason
    assert ("return code 5" if protocol == "3.1.1" else "reason code 0x87") in reason


def test_the_lean_client_sends_the_user_name_and_password_and_names_a_refusal(secured):
    plain = Endpoint(host="127.0.0.1", port=secured.plain)
    outcome = run(plain, fan_out(2), mqtt_client="lean", credentials=password())
    assert_exact_delivery(outcome, 2)
    assert outcome.session.generator_report().mqtt_client == "lean"
    for phases in outcome.session.connect_phases():
        # the lean client owns its socket: the TCP connect is its own; no TLS, no WebSocket
        assert phases.tcp_ns > 0 and phases.connack_ns > 0
        assert phases.tls_ns is None and phases.websocket_ns is None
    reason = connect_failure(plain, mqtt_client="lean", credentials=password("wrong"))
    assert f"CONNACK refused by 127.0.0.1:{secured.plain}: return code 5 (not authorized)" \
        in reason


def test_nothing_a_run_leaves_carries_the_password(secured):
    outcome = run(secured.endpoint(), fan_out(1, subscribers=1), protocol="5",
                  credentials=password())
    session = outcome.session
    done = Done(run_id="r", agent_id="a", chunks=0, published=outcome.counts[0],
                received=outcome.counts[1], generator=session.generator_report(),
                connections=session.connect_phases())
    left = [done.model_dump_json(), repr(done), repr(outcome.events),
            repr(password()), password().model_dump_json()]
    assert not [text for text in left if CANARY in text]
    assert done.connections and done.generator is not None


def test_an_unreadable_assignment_is_named_by_field_never_by_its_password():
    # a field of a newer protocol beside the password: the error names the field only
    assignment = {
        "type": "assignment", "run_id": "r", "campaign_id": "c",
        "broker": {"host": "127.0.0.1", "port": 1}, "clients": [],
        "credentials": {"username": USER, "password": CANARY, "cert_pem": 7},
        "no_such_field": CANARY}
    with pytest.raises(CommandsUnreadable) as unreadable:
        parse_commands(json.dumps({"commands": [assignment]}).encode())
    text = str(unreadable.value)
    assert "credentials.cert_pem" in text and "no_such_field" in text
    assert CANARY not in text


# -- which client runs: the lean one refuses, the fallback is paho ----------------------

def test_the_lean_client_asked_by_name_refuses_what_it_does_not_speak():
    endpoint = Endpoint(host="127.0.0.1", port=8883, tls=EndpointTls(), websocket_path="/mqtt")
    with pytest.raises(ValueError) as refused:
        MqttSession(endpoint, fan_out(0, 1), VirtualGpio(), lambda _e: None,
                    mqtt_client="lean", protocol="5")
    assert str(refused.value) == (
        "workload.client 'lean' speaks plain MQTT 3.1.1 over TCP; this run needs TLS "
        "(wss://127.0.0.1:8883), WebSocket (wss://127.0.0.1:8883/mqtt), MQTT 5 "
        "(workload.protocol): set workload.client to 'native' or 'paho'")


def test_where_the_engine_cannot_run_a_tls_run_falls_back_to_paho_and_says_why(
        secured, monkeypatch):
    monkeypatch.setattr(native, "unavailable_reason", lambda: "engine not built (test)")
    outcome = run(secured.endpoint(), fan_out(2), mqtt_client="native", protocol="5",
                  credentials=password())
    assert_exact_delivery(outcome, 2)
    report = outcome.session.generator_report()
    assert report.mqtt_client == "paho"
    assert report.mqtt_client_reason == (
        f"engine not built (test); the lean client speaks plain MQTT 3.1.1 over TCP and this "
        f"run needs TLS (mqtts://127.0.0.1:{secured.tls}), MQTT 5 (workload.protocol): "
        "paho runs")


def test_where_the_engine_cannot_run_a_plain_run_with_a_password_stays_lean(secured,
                                                                             monkeypatch):
    monkeypatch.setattr(native, "unavailable_reason", lambda: "engine not built (test)")
    outcome = run(Endpoint(host="127.0.0.1", port=secured.plain), fan_out(0),
                  mqtt_client="native", credentials=password())
    assert outcome.counts == (MESSAGES, 2 * MESSAGES)
    report = outcome.session.generator_report()
    assert (report.mqtt_client, report.mqtt_client_reason) == ("lean", "engine not built (test)")


# -- paho over WebSocket ----------------------------------------------------------------

@pytest.mark.parametrize(("scheme", "qos"), [("ws", 0), ("ws", 1), ("wss", 1), ("wss", 2)])
def test_paho_over_websocket_delivers_every_message(websocket_broker, scheme, qos):
    tls = scheme == "wss"
    endpoint = Endpoint(host="127.0.0.1", websocket_path="/mqtt",
                        port=websocket_broker.wss if tls else websocket_broker.ws,
                        tls=EndpointTls(ca_pem=websocket_broker.ca_pem) if tls else None)
    events: list[tuple] = []
    session = MqttSession(endpoint, fan_out(qos), VirtualGpio(), events.append,
                          mqtt_client="paho")
    try:
        session.connect(timeout_s=10)
        nodelay = [_nodelay(c.conn.socket()) for c in session._clients]
        start = monotonic_ns() + 50_000_000
        session.run(start, start + 5_000_000_000, abort=lambda: False)
        outcome = Outcome(session, events, session.counts())
    finally:
        session.close()
    assert nodelay == [1, 1, 1]  # on the socket under paho's WebSocket wrapper too
    assert_exact_delivery(outcome, qos)
    for phases in session.connect_phases():
        assert phases.connack_ns > 0
        if tls:  # the handshake hands over the TCP socket: each phase seen apart
            assert phases.tcp_ns > 0 and phases.tls_ns > 0 and phases.websocket_ns > 0
        else:  # paho connects and upgrades in one call: neither is made up
            assert (phases.tcp_ns, phases.tls_ns, phases.websocket_ns) == (None, None, None)


def _nodelay(sock) -> int:
    with socket.socket(fileno=os.dup(sock.fileno())) as duplicate:
        return duplicate.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_refused_websocket_upgrade_names_the_http_status():
    with refusing_upgrade() as port:
        reason = connect_failure(Endpoint(host="127.0.0.1", port=port,
                                          websocket_path="/mqtt"))
    assert (f"pub-0: cannot connect: ws://127.0.0.1:{port}/mqtt: WebSocket upgrade "
            f"refused: HTTP/1.1 403 Forbidden") in reason

