"""The native engine over TLS and WebSocket: exact delivery at every QoS through a real
Mosquitto 2.0's TLS listeners (TLS 1.2 and 1.3, a client certificate required) and amqtt's
WebSocket listeners (ws and wss), each started by this module with its own config and a
throwaway CA (brokers/certificates.py); the connection's phases; and every way a
connection can be wrong, each named within seconds."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.agents.native import engine as native
from mqttbed.agents.native_session import NativeSession, unsupported_reason
from mqttbed.brokers.certificates import CertificateAuthority, write_server_tls
from mqttbed.core.broker_access import ClientCredentials, EndpointTls
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.events import encode_payload
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role
from tests.generic_support import (
    MOSQUITTO,
    WebSocketBroker,
    amqtt_websockets,
    free_port,
    mosquitto_running,
    refusing_upgrade,
    tls_lines,
)

SERVER_NAME = "broker.mqttbed.test"  # in the server certificate beside 127.0.0.1
MESSAGES = 60
RATE_HZ = 400
FAILS_WITHIN_S = 5.0  # every bad connection is named well within the connect timeout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60),
              pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="needs Mosquitto"),
              pytest.mark.skipif(native.unavailable_reason() is not None,
                                 reason=f"no native engine: {native.unavailable_reason()}")]


@dataclass(frozen=True)
class TlsMosquitto:
    """One Mosquitto, anonymous, with a listener per case."""

    ca: CertificateAuthority
    plain: int
    tls12: int
    tls13: int
    client_cert: int   # require_certificate true
    expired: int       # its server certificate expired yesterday

    def endpoint(self, port: int, *, ca_pem: str | None = None,
                 server_name: str | None = None, verify: bool = True) -> Endpoint:
        return Endpoint(host="127.0.0.1", port=port, tls=EndpointTls(
            ca_pem=ca_pem or self.ca.cert_pem, server_name=server_name, verify=verify))


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory) -> Iterator[TlsMosquitto]:
    directory = tmp_path_factory.mktemp("tls-mosquitto")
    ca = CertificateAuthority.create()
    good = write_server_tls(directory, ["127.0.0.1", SERVER_NAME], ca)
    expired_cert, expired_key = ca.issue(["127.0.0.1"], expired=True)
    (directory / "expired.crt").write_text(expired_cert)
    (directory / "expired.key").write_text(expired_key)
    expired_tls = replace(good, cert_file=directory / "expired.crt",
                          key_file=directory / "expired.key")
    plain, tls12, tls13, client_cert, expired = (free_port() for _ in range(5))
    common = ["per_listener_settings false", "allow_anonymous true", "persistence false",
                # past 20 unacknowledged QoS 1/2 messages Mosquitto acknowledges and
                # drops: the broker's count to report, not the engine's to lose
                "max_inflight_messages 0"]
    main = [*common, f"listener {plain} 127.0.0.1",
            f"listener {tls13} 127.0.0.1", *tls_lines(good), "tls_version tlsv1.3",
            f"listener {client_cert} 127.0.0.1", *tls_lines(good, require_certificate=True),
            f"listener {expired} 127.0.0.1", *tls_lines(expired_tls)]
    # Mosquitto's tls_version tlsv1.2 means "1.2 or later": TLS 1.2 alone takes OpenSSL's
    # MaxProtocol, which applies to a whole process, hence a second Mosquitto
    only_tls12 = [*common, f"listener {tls12} 127.0.0.1", *tls_lines(good)]
    openssl_conf = directory / "openssl-tls12.cnf"
    openssl_conf.write_text("openssl_conf = mqttbed\n[mqttbed]\nssl_conf = ssl\n"
                            "[ssl]\nsystem_default = tls12\n[tls12]\nMaxProtocol = TLSv1.2\n")
    with mosquitto_running(directory, main, [plain, tls13, client_cert, expired]), \
            mosquitto_running(directory, only_tls12, [tls12], name="mosquitto-tls12",
                              env={"OPENSSL_CONF": str(openssl_conf)}):
        yield TlsMosquitto(ca, plain, tls12, tls13, client_cert, expired)


@pytest.fixture(scope="module")
def amqtt(tmp_path_factory) -> Iterator[WebSocketBroker]:
    with amqtt_websockets(tmp_path_factory.mktemp("amqtt-ws")) as broker:
        yield broker


def fan_out(qos: int, subscribers: int = 3, topic: str = "n/tls") -> list[ClientAssignment]:
    pub = ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic=topic, qos=qos,
                           gpio_pin=2, payload_bytes=100, rate_hz=RATE_HZ, messages=MESSAGES,
                           warmup_messages=4)
    subs = [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER, topic=topic, qos=qos,
                             gpio_pin=3 + j, warmup_messages=4, expected_messages=MESSAGES,
                             subscribe_rank=j) for j in range(subscribers)]
    return [pub, *subs]


def run(endpoint: Endpoint, clients: list[ClientAssignment],
        credentials: ClientCredentials | None = None) -> tuple[NativeSession, list[tuple]]:
    """One run on the engine: connect, publish on schedule, receive; the closed session
    (its counts and figures stay readable) and the events."""
    events: list[tuple] = []
    session = NativeSession(endpoint, clients, VirtualGpio(), events.append,
                            credentials=credentials)
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + 10_000_000_000, abort=lambda: False)
    finally:
        session.close()
    return session, events


def assert_every_message_delivered_once(session: NativeSession, events: list[tuple],
                                        subscribers: int = 3) -> None:
    assert session.counts() == (MESSAGES, subscribers * MESSAGES)
    deliveries = [e for e in events if e[0] == "delivery"]
    assert sorted((e[3], e[2]) for e in deliveries) == sorted(
        (f"sub-{j}", k) for j in range(subscribers) for k in range(MESSAGES))


def connect_failure(endpoint: Endpoint, credentials: ClientCredentials | None = None) -> str:
    """What connecting one publisher to ``endpoint`` fails with; it must within seconds."""
    session = NativeSession(endpoint, fan_out(0, subscribers=0), VirtualGpio(),
                            lambda _event: None, credentials=credentials)
    started = monotonic_ns()
    try:
        with pytest.raises(RuntimeError) as failure:
            session.connect(timeout_s=FAILS_WITHIN_S)
    finally:
        session.close()
    assert (monotonic_ns() - started) / 1e9 < FAILS_WITHIN_S + 1
    return str(failure.value)


# -- TLS: delivery, versions, client certificates -----------------------------------------

@pytest.mark.parametrize("qos", [0, 1, 2])
def test_a_tls_run_delivers_every_message_once_with_kernel_stamps_both_ways(mosquitto, qos):
    session, events = run(mosquitto.endpoint(mosquitto.tls13), fan_out(qos))
    assert_every_message_delivered_once(session, events)
    sent = {e[2]: e[9] for e in events if e[0] == "publish"}
    for delivery in (e for e in events if e[0] == "delivery"):
        t_pub, t_recv, source, t_user = delivery[9:13]
        assert source == "kernel" and t_pub == sent[delivery[2]] < t_recv <= t_user
    report = session.generator_report()
    assert report.kernel_deliveries == 3 * MESSAGES and report.user_deliveries == 0
    # every publish's send stamp found through its record's socket bytes
    assert report.send_kernel_stamps == MESSAGES
    assert report.send_to_kernel_p50_ns is not None and report.send_to_kernel_p50_ns > 0
    assert set(session.tls_sessions().values()) == {"TLSv1.3 TLS_AES_256_GCM_SHA384"}


def test_an_agent_session_over_tls_runs_on_the_engine_with_a_client_certificate(mosquitto):
    # what the runner builds: the session picks the engine for mqtts and a client cert
    cert_pem, key_pem = mosquitto.ca.issue(["agent.mqttbed.test"], client=True)
    events: list[tuple] = []
    session = MqttSession(mosquitto.endpoint(mosquitto.client_cert), fan_out(1, subscribers=1),
                          VirtualGpio(), events.append,
                          credentials=ClientCredentials(cert_pem=cert_pem, key_pem=key_pem))
    try:
        assert session.native
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + 10_000_000_000, abort=lambda: False)
        assert session.counts() == (MESSAGES, MESSAGES)
        assert len(session.connect_phases()) == 2
    finally:
        session.close()
    report = session.generator_report()
    assert (report.mqtt_client, report.mqtt_client_reason) == ("native", "")


def test_the_connect_phases_of_a_tls_client_are_each_timed_in_order(mosquitto):
    session, _ = run(mosquitto.endpoint(mosquitto.tls13), fan_out(1, subscribers=1))
    phases = session.connect_phases()
    assert [p.client_id for p in phases] == ["sub-0", "pub-0"]
    for phase in phases:
        assert phase.t_start_ns > 0 and phase.websocket_ns is None
        assert phase.tcp_ns is not None and phase.tls_ns is not None
        assert phase.connack_ns is not None
        # a TCP connect on loopback, then a TLS handshake (two round trips and P-256
        # signing), then CONNECT to CONNACK: each measured, none longer than a second
        assert 0 < phase.tcp_ns < 1e9 and 0 < phase.tls_ns < 1e9 and 0 < phase.connack_ns < 1e9


def test_records_decoded_while_the_event_tables_are_full_wait_for_the_drain(mosquitto,
                                                                           monkeypatch):
    # tables of 130 rows (a turn publishes up to 64) against 2 x 400 deliveries of the
    # shortest publishes within a slice: a read's records are decoded only as far as the
    # tables take them, the rest waits (held) for the drain; nothing lost, nothing twice
    monkeypatch.setattr(native, "Engine", functools.partial(native.Engine, event_capacity=130))
    messages = 400
    clients = [c.model_copy(update={"messages": messages} if c.role == Role.PUBLISHER else
                            {"expected_messages": messages}) for c in fan_out(1, subscribers=2)]
    clients[0] = clients[0].model_copy(update={"rate_hz": 40_000.0, "payload_bytes": 32})
    session, events = run(mosquitto.endpoint(mosquitto.tls13), clients)
    assert session.counts() == (messages, 2 * messages)
    assert sorted((e[3], e[2]) for e in events if e[0] == "delivery") == sorted(
        (f"sub-{j}", k) for j in range(2) for k in range(messages))


@pytest.mark.parametrize(("listener", "version"), [("tls12", "TLSv1.2"), ("tls13", "TLSv1.3")])
def test_tls_1_2_and_1_3_are_each_spoken_as_the_broker_allows(mosquitto, listener, version):
    session, events = run(mosquitto.endpoint(getattr(mosquitto, listener)),
                          fan_out(1, subscribers=1))
    assert_every_message_delivered_once(session, events, subscribers=1)
    assert {tls.split()[0] for tls in session.tls_sessions().values()} == {version}


def test_a_client_certificate_the_broker_requires_is_presented(mosquitto):
    cert_pem, key_pem = mosquitto.ca.issue(["agent.mqttbed.test"], client=True)
    credentials = ClientCredentials(cert_pem=cert_pem, key_pem=key_pem)
    session, events = run(mosquitto.endpoint(mosquitto.client_cert), fan_out(2, subscribers=1),
                          credentials=credentials)
    assert_every_message_delivered_once(session, events, subscribers=1)


def test_without_the_required_client_certificate_the_broker_s_refusal_is_named(mosquitto):
    message = connect_failure(mosquitto.endpoint(mosquitto.client_cert))
    # TLS 1.3: the client's handshake ends before the broker has checked its certificate;
    # the broker's alert comes after, read even when the broker reset the connection
    assert (f"pub-0: TLS with broker 127.0.0.1:{mosquitto.client_cert} failed: tlsv13 alert "
            "certificate required") in message


def test_a_client_key_that_does_not_match_its_certificate_is_refused_before_connecting(
        mosquitto):
    cert_pem, _ = mosquitto.ca.issue(["agent.mqttbed.test"], client=True)
    _, other_key = mosquitto.ca.issue(["other.mqttbed.test"], client=True)
    with pytest.raises(ValueError, match=r"TLS settings: the client key \(key_file\) is not the "
                                         r"key of the client certificate \(cert_file\)"):
        NativeSession(mosquitto.endpoint(mosquitto.client_cert), fan_out(0, subscribers=0),
                      VirtualGpio(), lambda _e: None,
                      credentials=ClientCredentials(cert_pem=cert_pem, key_pem=other_key))


# -- TLS: what is wrong, named -------------------------------------------------------------

def test_a_ca_that_did_not_sign_the_server_certificate_is_named_with_openssl_s_reason(
        mosquitto):
    stranger = CertificateAuthority.create("another CA")
    message = connect_failure(mosquitto.endpoint(mosquitto.tls13, ca_pem=stranger.cert_pem))
    # OpenSSL's reason, and the X509 verify error of the chain Mosquitto sends (its
    # certificate and the CA's: a self-signed root nobody here trusts)
    assert (f"pub-0: TLS handshake with broker 127.0.0.1:{mosquitto.tls13} failed: "
            "certificate verify failed (self-signed certificate in certificate chain)"
            ) in message


def test_a_server_name_the_certificate_does_not_hold_is_named(mosquitto):
    message = connect_failure(mosquitto.endpoint(mosquitto.tls13, server_name="wrong.example"))
    assert (f"TLS handshake with broker 127.0.0.1:{mosquitto.tls13} failed: certificate "
            "verify failed (hostname mismatch)") in message


def test_the_server_name_given_is_the_one_verified(mosquitto):
    session, events = run(mosquitto.endpoint(mosquitto.tls13, server_name=SERVER_NAME),
                          fan_out(0, subscribers=1))
    assert_every_message_delivered_once(session, events, subscribers=1)


def test_an_expired_server_certificate_is_named(mosquitto):
    message = connect_failure(mosquitto.endpoint(mosquitto.expired))
    assert (f"TLS handshake with broker 127.0.0.1:{mosquitto.expired} failed: certificate "
            "verify failed (certificate has expired)") in message


def test_with_verify_off_an_unverifiable_broker_is_reached(mosquitto):
    stranger = CertificateAuthority.create("another CA")
    session, events = run(mosquitto.endpoint(mosquitto.expired, ca_pem=stranger.cert_pem,
                                             verify=False), fan_out(0, subscribers=1))
    assert_every_message_delivered_once(session, events, subscribers=1)


def test_a_plain_client_at_a_tls_port_is_told_within_the_connect_timeout(mosquitto):
    message = connect_failure(Endpoint(host="127.0.0.1", port=mosquitto.tls13))
    # Mosquitto either closes on the bytes that are no TLS record or waits for more of the
    # "record" they seem to start: either way the message says what to look at
    # Mosquitto resets the connection on bytes that are no TLS record (or, were it to wait
    # for more of the "record" they seem to start, the time-out says where the client is)
    assert (f"before its CONNACK (127.0.0.1:{mosquitto.tls13}: does the port speak plain "
            "MQTT?)" in message
            or "(pub-0: its CONNECT got no answer (a TLS or WebSocket port waits so on a "
               "plain MQTT client))" in message), message


def test_a_tls_client_at_a_plain_port_is_told_the_handshake_failed(mosquitto):
    message = connect_failure(mosquitto.endpoint(mosquitto.plain))
    assert f"pub-0: TLS handshake with broker 127.0.0.1:{mosquitto.plain} failed: " in message
    assert "does the port speak TLS?" in message


# -- WebSocket -------------------------------------------------------------------------------

@pytest.mark.parametrize("qos", [0, 1])
def test_a_websocket_run_through_amqtt_delivers_every_message_once(amqtt, qos):
    endpoint = Endpoint(host="127.0.0.1", port=amqtt.ws, websocket_path="/mqtt")
    session, events = run(endpoint, fan_out(qos, subscribers=2))
    assert_every_message_delivered_once(session, events, subscribers=2)
    phases = session.connect_phases()
    assert all(p.tls_ns is None and p.websocket_ns and p.websocket_ns > 0 and p.connack_ns
               for p in phases), phases


def test_a_websocket_run_over_tls_delivers_every_message_once(amqtt):
    endpoint = Endpoint(host="127.0.0.1", port=amqtt.wss, websocket_path="/mqtt",
                        tls=EndpointTls(ca_pem=amqtt.ca_pem))
    session, events = run(endpoint, fan_out(1, subscribers=2))
    assert_every_message_delivered_once(session, events, subscribers=2)
    for phase in session.connect_phases():
        assert phase.tcp_ns and phase.tls_ns and phase.websocket_ns and phase.connack_ns


def test_a_refused_websocket_upgrade_names_the_http_status():
    with refusing_upgrade() as port:
        message = connect_failure(Endpoint(host="127.0.0.1", port=port,
                                           websocket_path="/mqtt"))
    assert (f'pub-0: WebSocket upgrade to broker 127.0.0.1:{port}/mqtt: the WebSocket '
            f'upgrade was refused: "HTTP/1.1 403 Forbidden"') in message


def test_a_websocket_client_at_a_plain_mqtt_port_is_named(mosquitto):
    message = connect_failure(Endpoint(host="127.0.0.1", port=mosquitto.plain,
                                       websocket_path="/mqtt"))
    assert f"WebSocket upgrade to broker 127.0.0.1:{mosquitto.plain}/mqtt" in message


# -- WebSocket frames from a broker, fed to the engine ----------------------------------------

def _frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    if len(payload) < 126:
        return head + bytes([len(payload)]) + payload
    return head + bytes([126]) + len(payload).to_bytes(2, "big") + payload


CONNACK = bytes([0x20, 2, 0, 0])


def _publish(seq: int) -> bytes:
    payload = encode_payload(seq, 0, 1000 + seq, 1000 + seq, 40)
    body = b"\x00\x03f/x" + payload
    return bytes([0x30, len(body)]) + body


def _fed_websocket_subscriber() -> tuple[native.Engine, int]:
    engine = native.Engine(kernel_stamps=False, pulse_mode=False)
    client = engine.add_client(client_id="sub-0", host="127.0.0.1", port=1, publisher=False,
                               topic="f/x", qos=0, gpio_pin=3, publisher_index=0,
                               payload_bytes=0, rate_hz=0, messages=10, warmup_messages=0,
                               start_offset_ns=0, closed_loop=False)
    engine.set_websocket(client, "/mqtt")
    return engine, client


def test_mqtt_packets_split_across_frames_and_frames_holding_several_are_decoded():
    engine, client = _fed_websocket_subscriber()
    stream = CONNACK + b"".join(_publish(k) for k in range(4))
    # a packet cut across a fragmented message, pings between, then several in one frame
    frames = (_frame(2, stream[:7], fin=False) + _frame(9, b"hi")
              + _frame(0, stream[7:30], fin=False) + _frame(10, b"") + _frame(0, stream[30:]))
    for at in range(0, len(frames), 5):  # reads of 5 bytes: headers cut too
        assert engine.feed(client, frames[at:at + 5]), engine.failure(client)
    assert engine.client_counters(client).received_unique == 4
    assert engine.take(native.T_DELIVERY)["seq"] == [0, 1, 2, 3]
    engine.close()


@pytest.mark.parametrize(("frames", "reason"), [
    (_frame(1, b"text"), "a text frame: MQTT travels in binary frames only"),
    (bytes([0x82 | 0x40, 0]), "reserved bits set"),
    (bytes([0x83, 0]), "reserved opcode 3"),
    (bytes([0x82, 0x80 | 2, 1, 2, 3, 4, 0, 0]), "a masked frame from the server"),
    (bytes([0x82, 127]) + (1 << 40).to_bytes(8, "big"), "a frame of 1099511627776 bytes"),
    (_frame(0, CONNACK), "a continuation frame with no message open"),
    (_frame(8, b"\x03\xe9going away"), "WebSocket closed by broker 127.0.0.1:1/mqtt: close "
                                       "code 1001 (going away)"),
])
def test_a_frame_the_engine_cannot_take_fails_the_client_with_the_reason(frames, reason):
    engine, client = _fed_websocket_subscriber()
    assert not engine.feed(client, frames)
    assert reason in engine.failure(client)
    engine.close()


# What a WebSocket client may fail with when a broker sends anything at all (the MQTT ones
# as tests/test_native_engine.py accepts them).
WS_FAILURES = ("malformed WebSocket frame from broker 127.0.0.1:1/mqtt: ",
               "WebSocket closed by broker 127.0.0.1:1/mqtt: close code ",
               "malformed packet from the broker: ", "CONNACK refused", "SUBACK refused ",
               "event buffer full")
FUZZ_DIR = native.SOURCE_DIR / "fuzz"


def websocket_failures(data: bytes, read_bytes: int) -> list[str]:
    """``data`` in reads to a QoS 2 publisher and subscriber over WebSocket (as
    fuzz/replies.h feeds them); their failures."""
    engine = native.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=1024)
    try:
        common = {"host": "127.0.0.1", "port": 1, "topic": "f/x", "qos": 2,
                  "publisher_index": 0, "rate_hz": 1000.0, "messages": 10,
                  "warmup_messages": 1, "start_offset_ns": 0, "closed_loop": False}
        clients = [engine.add_client(client_id="ws-pub-0", publisher=True, gpio_pin=6,
                                     payload_bytes=64, **common),
                   engine.add_client(client_id="ws-sub-0", publisher=False, gpio_pin=7,
                                     payload_bytes=0, **common)]
        for client in clients:
            engine.set_websocket(client, "/mqtt")
        engine.subscribe(clients[1], "f/+", 2)
        for client in clients:
            for at in range(0, len(data), read_bytes):
                if not engine.feed(client, data[at:at + read_bytes]):
                    break
        return [engine.failure(client) for client in clients]
    finally:
        engine.close()


frames = st.lists(st.tuples(
    st.sampled_from([0, 1, 2, 2, 2, 3, 8, 9, 10]), st.booleans(), st.binary(max_size=140),
    st.sampled_from([0, 0, 0, 0x40, 0x80])  # now and then a reserved bit or a mask bit
).map(lambda f: bytes([(0x80 if f[1] else 0) | f[3] & 0x40 | f[0]])
      + (bytes([len(f[2]) | f[3] & 0x80]) if len(f[2]) < 126
         else bytes([126 | f[3] & 0x80]) + len(f[2]).to_bytes(2, "big")) + f[2]),
    max_size=10).map(b"".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames, st.integers(1, 64))
def test_any_frames_fail_a_websocket_client_only_with_a_named_reason(data, read_bytes):
    for failure in websocket_failures(data, read_bytes):
        assert failure == "" or failure.startswith(WS_FAILURES), failure


@pytest.mark.parametrize("path", sorted(p for d in ("seeds", "regressions")
                                        for p in (FUZZ_DIR / d).iterdir()
                                        if not p.name.startswith(".")),
                         ids=lambda p: p.name)
def test_fuzz_seeds_and_regressions_replay_cleanly_as_websocket_frames(path):
    data = path.read_bytes()
    for failure in websocket_failures(data[1:], (data[0] >> 1) + 1 if data else 1):
        assert failure == "" or failure.startswith(WS_FAILURES), failure


def test_tls_and_websocket_are_refused_only_where_the_engine_cannot_follow(mosquitto):
    clients = fan_out(0, subscribers=1)
    tls = mosquitto.endpoint(mosquitto.tls13)
    assert unsupported_reason(tls, clients, VirtualGpio()) is None
    ws = Endpoint(host="127.0.0.1", port=1, websocket_path="/mqtt", tls=tls.tls)
    assert unsupported_reason(ws, clients, VirtualGpio()) is None
    # two brokers of one agent trusting different CAs: the engine holds one TLS setting
    other = mosquitto.endpoint(mosquitto.tls12, ca_pem=CertificateAuthority.create().cert_pem)
    mixed = [clients[0], clients[1].model_copy(update={"broker": other})]
    assert unsupported_reason(tls, mixed, VirtualGpio()) == (
        "2 different TLS settings (CA, verify) among one agent's brokers: the native engine "
        "holds one per run")


# -- the selftest's TLS and WebSocket sections (the cross check compares them on arm) ------

@pytest.fixture(scope="module")
def selftest(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("selftest")
    made = subprocess.run(["make", "-C", str(native.SOURCE_DIR), f"BUILD={build}",
                           "CFLAGS=-O0 -g", "selftest"], capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    return build / "selftest"


def test_the_selftest_decodes_tls_records_fed_a_byte_at_a_time_as_plain_mqtt(selftest):
    done = subprocess.run([str(selftest), "replies"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    for version in ("TLSv1.2", "TLSv1.3"):
        assert (f"tls {version}: handshake done, the server's bytes fed one at a time\n"
                f"tls {version}: 466 MQTT bytes in 5 records, every byte of them fed alone\n"
                ) in done.stdout
        assert f"tls {version}: the same deliveries and answers as without TLS: yes" \
            in done.stdout
    # the generated frames reach the WebSocket clients: deliveries, pongs, named failures
    assert done.stdout.count("  ws-sent pong") > 3
    assert "malformed WebSocket frame from broker 127.0.0.1:1/mqtt: " in done.stdout
    assert "WebSocket closed by broker 127.0.0.1:1/mqtt: close code 1001" in done.stdout


def test_the_selftest_prints_websocket_frames_and_the_upgrade_as_rfc_6455_has_them(selftest):
    done = subprocess.run([str(selftest), "wire"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # RFC 6455 section 1.3's example: this nonce's key, and its Sec-WebSocket-Accept taken
    assert "ws-key dGhlIHNhbXBsZSBub25jZQ==" in lines
    assert "ws-answer 0: 159" in lines and "ws-answer 1: 155" in lines
    assert ('ws-answer 2: -1 the WebSocket upgrade was refused: "HTTP/1.1 403 Forbidden"'
            in lines)
    assert "ws-frame binary 65536: 10 fin 1 binary payload 65536" in lines
    assert "ws-frame masked: -1 a masked frame from the server (RFC 6455 section 5.1)" in lines
    assert "ws-masked in two parts: same" in lines
    assert sum("unmasked same" in line for line in lines) == 7
