"""The native engine speaks MQTT 5 beside 3.1.1 and sends a user name and password.

Runs go through a real Mosquitto 2.0.11 started here with a config of its own (anonymous
clients refused, a password file made with ``mosquitto_passwd -b``), with exact delivery
accounting at every subscriber. Refusals are named by their code in both versions; MQTT 5's
replies (reason codes, properties, the broker's DISCONNECT) are fed to the engine as a
broker would send them, for the codes Mosquitto 2.0.11 never sends (it answers a wrong
password with 5 / 0x87, never 4 / 0x86, and closes a taken-over session without a
DISCONNECT). A canary password is searched for in every failure text.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.agents.native import engine as native
from mqttbed.core.broker_access import ClientCredentials, MqttProtocol
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role
from tests.generic_support import eventually, free_port

MOSQUITTO = "/usr/sbin/mosquitto"
CANARY = "canary-7f3a9e-pässwörd"  # non-ASCII: CONNECT carries it as UTF-8
USER = "alice"
MESSAGES = 60
RATE_HZ = 300

needs_mosquitto = pytest.mark.skipif(
    not (Path(MOSQUITTO).exists() and shutil.which("mosquitto_passwd")),
    reason="Mosquitto 2.0.11 and mosquitto_passwd (Debian's mosquitto) are not installed")


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """A Mosquitto that refuses anonymous clients and knows one user (CANARY its password)."""
    directory = tmp_path_factory.mktemp("mosquitto-auth")
    passwords = directory / "passwords"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwords), USER, CANARY], check=True,
                   capture_output=True)
    port = free_port()
    conf = directory / "mosquitto.conf"
    # Mosquitto's defaults otherwise: max_inflight_messages 20 is the Receive Maximum its
    # CONNACK gives an MQTT 5 client, which the engine's publishers keep to
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous false\n"
                    f"password_file {passwords}\npersistence false\n"
                    # started as root, Mosquitto would drop to user `mosquitto`, which cannot
                    # read the password file in pytest's private (0700) directory
                    + ("user root\n" if os.geteuid() == 0 else ""))
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert eventually(lambda: _accepts(port), 5), "the test's Mosquitto did not start"
        yield Endpoint(host="127.0.0.1", port=port)
    finally:
        proc.kill()
        proc.wait(5)


def credentials(password: str = CANARY, username: str | None = USER) -> ClientCredentials:
    return ClientCredentials(username=username, password=SecretStr(password))


def fan_out(qos: int, subscribers: int = 2, topic: str = "m5/x") -> list[ClientAssignment]:
    pub = ClientAssignment(client_id=f"m5-pub-{qos}", role=Role.PUBLISHER, topic=topic, qos=qos,
                           gpio_pin=2, payload_bytes=100, rate_hz=RATE_HZ, messages=MESSAGES,
                           warmup_messages=4)
    subs = [ClientAssignment(client_id=f"m5-sub-{qos}-{j}", role=Role.SUBSCRIBER, topic=topic,
                             qos=qos, gpio_pin=3 + j, warmup_messages=4,
                             expected_messages=MESSAGES, subscribe_rank=j)
            for j in range(subscribers)]
    return [pub, *subs]


def run(endpoint: Endpoint, clients: list[ClientAssignment], protocol: MqttProtocol,
        proof: ClientCredentials | None) -> tuple[MqttSession, list]:
    events: list = []
    session = MqttSession(endpoint, clients, VirtualGpio(), events.append,
                          credentials=proof, protocol=protocol)
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + 5_000_000_000, abort=lambda: False)
    finally:
        session.close()
    return session, events


# -- runs through Mosquitto ----------------------------------------------------------------

@needs_mosquitto
@pytest.mark.integration  # Mosquitto
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqtt5_delivers_every_message_once_to_every_subscriber(broker, qos):
    clients = fan_out(qos)
    session, events = run(broker, clients, "5", credentials())
    assert session.native
    assert session.counts() == (MESSAGES, 2 * MESSAGES)
    deliveries = [e for e in events if e[0] == "delivery"]
    # each (subscriber, seq) exactly once: nothing lost, nothing twice
    assert sorted((e[3], e[2]) for e in deliveries) == sorted(
        (f"m5-sub-{qos}-{j}", k) for j in range(2) for k in range(MESSAGES))
    sent = {e[2]: e[9] for e in events if e[0] == "publish"}
    assert sorted(sent) == list(range(MESSAGES))
    for (_, publisher, seq, _, topic, size, got_qos, warmup, _, t_pub, t_recv, _,
         t_user) in deliveries:
        # the payload after MQTT 5's property length is the one sent, byte for byte
        assert (publisher, topic, size, got_qos) == ("pub-0", "m5/x", 100, qos)
        assert t_pub == sent[seq] < t_recv <= t_user
        assert warmup == (seq < 4)
    assert session.generator_report().mqtt_client == "native"


@needs_mosquitto
@pytest.mark.integration  # Mosquitto
@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_a_user_name_and_password_are_accepted_in_both_versions(broker, protocol):
    session, events = run(broker, fan_out(1, subscribers=1), protocol, credentials())
    assert session.native
    assert session.counts() == (MESSAGES, MESSAGES)
    assert sorted(e[2] for e in events if e[0] == "delivery") == list(range(MESSAGES))


@needs_mosquitto
@pytest.mark.integration  # Mosquitto
@pytest.mark.parametrize(("protocol", "proof", "named"), [
    ("3.1.1", credentials("wrong-" + CANARY), "return code 5 not authorized"),
    ("5", credentials("wrong-" + CANARY), "reason code 0x87 Not authorized"),
    ("3.1.1", None, "return code 5 not authorized"),  # anonymous, where none is allowed
    ("5", None, "reason code 0x87 Not authorized"),
])
def test_mosquitto_s_refusal_names_the_code_and_never_the_password(broker, protocol, proof,
                                                                    named):
    session = MqttSession(broker, fan_out(0, subscribers=1), VirtualGpio(), lambda _e: None,
                          credentials=proof, protocol=protocol)
    try:
        started = monotonic_ns()
        with pytest.raises(RuntimeError) as raised:
            session.connect(timeout_s=5)
        assert monotonic_ns() - started < 3_000_000_000  # the refusal, not a time-out
        assert session.native
    finally:
        session.close()
    message = str(raised.value)
    assert f"CONNACK refused: {named} (broker 127.0.0.1:{broker.port})" in message
    assert CANARY not in message and "wrong-" not in message


@needs_mosquitto
@pytest.mark.integration  # Mosquitto
def test_a_qos2_burst_keeps_to_the_broker_s_receive_maximum_and_loses_nothing(broker):
    # 400 messages due within 20 ms; Mosquitto's Receive Maximum is 20: past it, it would
    # answer PUBREC 0x97 Quota exceeded. The publishes wait for acks and leave late instead.
    engine = native.Engine(kernel_stamps=False, pulse_mode=False)
    try:
        sub, pub = (engine.add_client(
            client_id=f"burst-{role}", host=broker.host, port=broker.port,
            publisher=role == "pub", topic="m5/burst", qos=2, gpio_pin=2 + (role == "sub"),
            publisher_index=0, payload_bytes=64, rate_hz=20000.0, messages=400,
            warmup_messages=0, start_offset_ns=0, closed_loop=False) for role in ("sub", "pub"))
        for client in (sub, pub):
            engine.set_session(client, protocol_level=5, username=USER,
                               password=CANARY.encode())
        engine.connect_all(keepalive_s=10, timeout_s=5)
        assert eventually(lambda: engine.poll(20_000_000) and all(
            engine.client_counters(c).connected for c in (sub, pub)), 5)
        engine.subscribe(sub, "m5/burst", 2)
        assert eventually(lambda: engine.poll(20_000_000)
                          and engine.client_counters(sub).subscribed, 5)
        start = monotonic_ns() + 10_000_000
        engine.run_begin(start, start + 10_000_000_000, start + 10_000_000_000,
                         start + 10_000_000_000, 300_000_000)
        seqs: list[int] = []
        status = native.SLICE
        while status in (native.SLICE, native.DRAIN, native.WOKEN):
            status = engine.step(monotonic_ns() + 50_000_000)
            seqs += engine.take(native.T_DELIVERY)["seq"]
            for table in (native.T_PUBLISH, native.T_SUBSCRIBE, native.T_TX, native.T_EDGE):
                engine.take(table)
        sent = engine.client_counters(pub)
        assert (status, engine.failure(pub), engine.failure(sub)) == (native.DONE, "", "")
        assert (sent.sent, sent.acked, sorted(seqs)) == (400, 400, list(range(400)))
    finally:
        engine.close()


# -- what the engine makes of replies (fed as a socket would read them) --------------------

def engine_client(level: int, *, publisher: bool = True, qos: int = 1,
                  password: bytes | None = CANARY.encode()) -> tuple[native.Engine, int]:
    engine = native.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=64)
    client = engine.add_client(
        client_id="m5-0", host="127.0.0.1", port=1, publisher=publisher, topic="f/x", qos=qos,
        gpio_pin=2, publisher_index=0, payload_bytes=64 if publisher else 0, rate_hz=10.0,
        messages=10, warmup_messages=0, start_offset_ns=0, closed_loop=False)
    engine.set_session(client, protocol_level=level, username=USER, password=password)
    return engine, client


def fed_failure(level: int, reply: bytes, **client) -> str:
    engine, index = engine_client(level, **client)
    try:
        engine.feed(index, reply)
        return engine.failure(index)
    finally:
        engine.close()


@pytest.mark.parametrize(("code", "name"), [
    (1, "unacceptable protocol version"), (2, "identifier rejected"),
    (3, "server unavailable"), (4, "bad user name or password"), (5, "not authorized"),
    (6, "reserved")])
def test_every_3_1_1_connack_return_code_is_named(code, name):
    failure = fed_failure(4, bytes([0x20, 2, 0, code]))
    assert failure == f"CONNACK refused: return code {code} {name} (broker 127.0.0.1:1)"


@pytest.mark.parametrize(("code", "name"), [
    (0x84, "Unsupported Protocol Version"), (0x85, "Client Identifier not valid"),
    (0x86, "Bad User Name or Password"), (0x87, "Not authorized"), (0x8A, "Banned"),
    (0x9F, "Connection rate exceeded")])
def test_every_mqtt5_connack_reason_code_is_named(code, name):
    failure = fed_failure(5, bytes([0x20, 3, 0, code, 0]))
    assert failure == f"CONNACK refused: reason code 0x{code:02X} {name} (broker 127.0.0.1:1)"


def test_a_refusal_carries_the_broker_s_reason_string_printable_only():
    said = b"go away\x1b[31m"
    reply = bytes([0x20, 6 + len(said), 0, 0x86, 3 + len(said), 0x1F, 0, len(said)]) + said
    assert fed_failure(5, reply) == ('CONNACK refused: reason code 0x86 Bad User Name or '
                                     'Password (the broker says "go away?[31m") (broker '
                                     '127.0.0.1:1)')


def test_a_3_1_1_refusal_of_an_mqtt5_connect_says_the_broker_lacks_mqtt5():
    assert fed_failure(5, b"\x20\x02\x00\x01") == (
        "CONNACK refused: return code 1 unacceptable protocol version, in MQTT 3.1.1's form: "
        "broker 127.0.0.1:1 does not take MQTT 5 (workload.protocol)")


def test_connack_grants_are_applied_and_a_lower_maximum_qos_is_named():
    # Receive Maximum 20, Topic Alias Maximum 10, Maximum QoS 1, Maximum Packet Size 1 MiB
    grants = b"\x21\x00\x14\x22\x00\x0a\x24\x01\x27\x00\x10\x00\x00"
    connack = bytes([0x20, 3 + len(grants), 0, 0, len(grants)]) + grants
    assert fed_failure(5, connack, qos=1) == ""
    assert fed_failure(5, connack, qos=2) == (
        "CONNACK: broker 127.0.0.1:1 takes QoS 1 at most (Maximum QoS), below this "
        "publisher's QoS 2 (MQTT 5 section 3.2.2.3.4)")
    assert fed_failure(5, connack, qos=2, publisher=False) == ""  # its SUBACK grants less
    small = b"\x27\x00\x00\x00\x40"  # 64 bytes: the publisher's PUBLISH takes 74
    assert "smaller than this publisher's PUBLISH of 74 (MQTT 5" in fed_failure(
        5, bytes([0x20, 3 + len(small), 0, 0, len(small)]) + small)


def _payload(seq: int) -> bytes:
    return b"MQB1" + struct.pack("<QIqq", seq, 0, 1000 + seq, 999 + seq)


def test_mqtt5_deliveries_skip_their_properties_and_are_acknowledged():
    engine, sub = engine_client(5, publisher=False, qos=2)
    try:
        engine.subscribe(sub, "f/+", 2)
        properties = (b"\x02\x00\x00\x00\x3c" + b"\x03\x00\x01x" + b"\x26\x00\x01k\x00\x01v"
                      + b"\x0b\x07")
        body = b"\x00\x03f/x\x00\x05" + bytes([len(properties)]) + properties + _payload(1)
        publish = bytes([0x34, len(body)]) + body
        plain = b"\x00\x03f/y" + b"\x00" + _payload(2)  # QoS 0, property length 0
        assert engine.feed(sub, b"\x20\x03\x00\x00\x00" + b"\x90\x04\x00\x01\x00\x02"
                           + publish + bytes([0x30, len(plain)]) + plain
                           + b"\x62\x03\x00\x05\x00")
        deliveries = engine.take(native.T_DELIVERY)
        assert deliveries["seq"] == [1, 2] and deliveries["payload_bytes"] == [32, 32]
        assert deliveries["t_pub"] == [1001, 1002] and deliveries["qos"] == [2, 0]
        assert engine.failure(sub) == ""
    finally:
        engine.close()


@pytest.mark.parametrize(("reply", "failure"), [
    (b"\x40\x03\x00\x01\x97", "PUBACK refused packet id 1: reason code 0x97 Quota exceeded"),
    (b"\x40\x08\x00\x01\x87\x04\x1f\x00\x01x",
     'PUBACK refused packet id 1: reason code 0x87 Not authorized (the broker says "x")'),
    (b"\x90\x04\x00\x01\x00\x87", "SUBACK refused 'f/x': reason code 0x87 Not authorized"),
    (b"\xe0\x01\x8e", "broker 127.0.0.1:1 ended the session (DISCONNECT): reason code 0x8E "
                      "Session taken over"),
    (b"\x30\x0b\x00\x03f/x\x03\x23\x00\x01MQ",
     "malformed packet from the broker: PUBLISH carries a Topic Alias, which this client "
     "never allows"),
    (b"\x40\x04\x00\x01\x00\x05", "malformed packet from the broker: PUBACK properties of 5 "
                                  "bytes run past the packet"),
    (b"\x40\x03\x00\x01\x92", "malformed packet from the broker: PUBACK reason code 0x92 is "
                              "not one it may carry"),
])
def test_mqtt5_failures_from_the_broker_are_named(reply, failure):
    engine, sub = engine_client(5, publisher=False, qos=1)
    try:
        engine.subscribe(sub, "f/x", 1)
        engine.feed(sub, b"\x20\x03\x00\x00\x00" + reply)
        assert engine.failure(sub).startswith(failure), engine.failure(sub)
    finally:
        engine.close()


@needs_mosquitto
@pytest.mark.integration  # Mosquitto
@pytest.mark.parametrize("qos", [1, 2])
def test_an_mqtt5_publisher_without_subscribers_has_every_publish_acknowledged(broker, qos):
    # Mosquitto answers with reason code 0x10 No matching subscribers: a success
    engine = native.Engine(kernel_stamps=False, pulse_mode=False)
    try:
        pub = engine.add_client(
            client_id=f"lonely-{qos}", host=broker.host, port=broker.port, publisher=True,
            topic="m5/nobody", qos=qos, gpio_pin=2, publisher_index=0, payload_bytes=64,
            rate_hz=500.0, messages=20, warmup_messages=0, start_offset_ns=0,
            closed_loop=False)
        engine.set_session(pub, protocol_level=5, username=USER, password=CANARY.encode())
        engine.connect_all(keepalive_s=10, timeout_s=5)
        assert eventually(lambda: engine.poll(20_000_000) and engine.client_counters(pub).connected,
                          5), engine.failure(pub)
        start = monotonic_ns() + 10_000_000
        engine.run_begin(start, start + 5_000_000_000, start + 5_000_000_000, 0, 0)
        status = native.SLICE
        while status in (native.SLICE, native.DRAIN, native.WOKEN):
            status = engine.step(monotonic_ns() + 50_000_000)
            for table in range(5):
                engine.take(table)
        counters = engine.client_counters(pub)
        assert (status, counters.sent, counters.acked, engine.failure(pub)) == (
            native.DONE, 20, 20, "")
    finally:
        engine.close()


def test_session_settings_the_engine_cannot_send_are_refused_without_the_password():
    engine = native.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=16)
    try:
        client = engine.add_client(
            client_id="c-0", host="127.0.0.1", port=1, publisher=True, topic="t", qos=0,
            gpio_pin=2, publisher_index=0, payload_bytes=64, rate_hz=10.0, messages=1,
            warmup_messages=0, start_offset_ns=0, closed_loop=False)
        for level, username, password, why in [
                (3, USER, CANARY.encode(), "protocol level 3 is neither 4"),
                (4, None, CANARY.encode(), "MQTT 3.1.1 sends a password only with a user name"),
                (5, USER, CANARY.encode() * 3000, "a password of 72000 bytes is longer")]:
            with pytest.raises(ValueError, match=why) as raised:
                engine.set_session(client, protocol_level=level, username=username,
                                   password=password)
            assert "canary" not in str(raised.value)
        udp = engine.add_client(
            client_id="u-0", host="127.0.0.1", port=1, publisher=True, topic="t", qos=0,
            gpio_pin=3, publisher_index=1, payload_bytes=64, rate_hz=10.0, messages=1,
            warmup_messages=0, start_offset_ns=0, closed_loop=False)
        engine.set_udp(udp)
        with pytest.raises(ValueError, match="u-0: MQTT 5 and a user name or password ride "
                                             "on mqtt-tcp only, not mqtt-udp"):
            engine.set_session(udp, protocol_level=5)
    finally:
        engine.close()


# -- any reply: an MQTT 5 client fails only with a named reason ----------------------------

MQTT5_NAMED = ("malformed packet from the broker: ", "CONNACK refused: ", "CONNACK: broker ",
               "SUBACK refused ", "PUBACK refused ", "PUBREC refused ", "PUBREL refused ",
               "PUBCOMP refused ", "broker 127.0.0.1:1 ended the session (DISCONNECT): ",
               "event buffer full")

properties = st.lists(st.one_of(
    st.sampled_from([b"\x1f\x00\x02ok", b"\x26\x00\x01k\x00\x01v", b"\x21\x00\x14", b"\x24\x01",
                     b"\x02\x00\x00\x00\x3c", b"\x0b\x07", b"\x23\x00\x01", b"\x24\x02"]),
    st.binary(max_size=6)), max_size=4).map(b"".join)
mqtt5_packets = st.one_of(
    st.binary(max_size=48),
    st.tuples(st.sampled_from([0x20, 0x30, 0x32, 0x34, 0x40, 0x50, 0x62, 0x70, 0x90, 0xE0,
                               0xF0]),
              st.binary(max_size=3), properties, st.binary(max_size=40)).map(
        lambda p: bytes([p[0], len(p[1]) + 1 + len(p[2]) + len(p[3])]) + p[1]
        + bytes([len(p[2])]) + p[2] + p[3]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mqtt5_packets, max_size=10).map(b"".join), st.integers(1, 64))
def test_any_reply_fails_an_mqtt5_client_only_with_a_named_reason(data, read_bytes):
    engine = native.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=1024)
    try:
        clients = []
        for publisher in (True, False):
            client = engine.add_client(
                client_id=f"v5-{publisher}", host="127.0.0.1", port=1, publisher=publisher,
                topic="f/x", qos=2, gpio_pin=2 + publisher, publisher_index=0,
                payload_bytes=64, rate_hz=1000.0, messages=10, warmup_messages=1,
                start_offset_ns=0, closed_loop=False)
            engine.set_session(client, protocol_level=5, username=USER,
                               password=CANARY.encode())
            clients.append(client)
        engine.subscribe(clients[1], "f/+", 2)
        for client in clients:
            for at in range(0, len(data), read_bytes):
                if not engine.feed(client, data[at:at + read_bytes]):
                    break
            failure = engine.failure(client)
            assert failure == "" or failure.startswith(MQTT5_NAMED), failure
            assert "canary" not in failure
    finally:
        engine.close()
