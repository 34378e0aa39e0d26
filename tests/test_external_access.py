"""The ``external`` backend reaching a broker as it is deployed: TLS, credentials, MQTT 5,
WebSocket; and each bad input failing deploy within seconds, naming the address and why.

One real Mosquitto 2.0.11 per module, started by the test (never by mqttbed), with a
password file made by ``mosquitto_passwd -b`` and six listeners: plain, TLS, TLS with an
expired certificate, TLS requiring a client certificate, ws and wss. Its certificates
come from :mod:`mqttbed.brokers.certificates`. The WebSocket client and the MQTT 5 codec
mqttbed's probes use are checked byte by byte here too.
"""

from __future__ import annotations

import http.server
import socket
import struct
import subprocess
import threading
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import given
from pydantic import SecretStr

from mqttbed.brokers.certificates import CertificateAuthority
from mqttbed.brokers.external.backend import ExternalBackend
from mqttbed.brokers.reachability import Liveness
from mqttbed.campaigns.spec import parse_spec
from mqttbed.core import mqtt5_codec
from mqttbed.core.backends import BrokerAccess, ConfiguresAccess
from mqttbed.core.broker_access import AuthSettings, MqttProtocol, TlsSettings
from mqttbed.core.errors import BackendError, SpecError
from mqttbed.core.host import LocalHost
from mqttbed.core.mqtt_codec import Connect, MalformedPacket, Publish, SubAck
from mqttbed.core.protocol import Endpoint
from mqttbed.core.websocket import (
    OP_BINARY,
    OP_CLOSE,
    OP_CONTINUATION,
    OP_PING,
    OP_PONG,
    WebSocketError,
    WebSocketStream,
    mask,
)
from tests.conftest import eventually
from tests.fuzzing import FUZZ, datagrams
from tests.generic_support import free_port, mosquitto_running, write_password_file

pytestmark = pytest.mark.timeout(30)

USER, PASSWORD = "alice", "canary-7f3e-password"
LISTENERS = ("plain", "tls", "expired", "mtls", "ws", "wss")


@dataclass(frozen=True)
class Secured:
    """The module's Mosquitto: its process, a port per listener, its files."""

    proc: subprocess.Popen[bytes]
    ports: dict[str, int]
    dir: Path

    def url(self, scheme: str, listener: str, host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.ports[listener]}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    directory = tmp_path_factory.mktemp("secured-mosquitto")
    ca, other = CertificateAuthority.create(), CertificateAuthority.create("another CA")
    files = {"ca.crt": ca.cert_pem, "other-ca.crt": other.cert_pem}
    for name, (cert, key) in {"server": ca.issue(["127.0.0.1", "localhost"]),
                              "expired": ca.issue(["127.0.0.1"], expired=True),
                              "client": ca.issue(["mqttbed-client"], client=True)}.items():
        files[f"{name}.crt"], files[f"{name}.key"] = cert, key
    for name, text in files.items():
        (directory / name).write_text(text)
    passwd = write_password_file(directory / "passwd", {USER: PASSWORD})
    ports = {name: free_port() for name in LISTENERS}
    d = directory
    server = [f"certfile {d}/server.crt", f"keyfile {d}/server.key"]
    with mosquitto_running(directory, [
            "allow_anonymous false", f"password_file {passwd}", "sys_interval 1",
            "persistence false", f"log_dest file {d}/mosquitto.log",
            f"listener {ports['plain']} 127.0.0.1",
            f"listener {ports['tls']} 127.0.0.1", *server,
            f"listener {ports['expired']} 127.0.0.1",
            f"certfile {d}/expired.crt", f"keyfile {d}/expired.key",
            f"listener {ports['mtls']} 127.0.0.1", *server, f"cafile {d}/ca.crt",
            "require_certificate true",
            f"listener {ports['ws']} 127.0.0.1", "protocol websockets",
            f"listener {ports['wss']} 127.0.0.1", "protocol websockets", *server],
            list(ports.values())) as proc:
        yield Secured(proc, ports, directory)


def _established(pid: int) -> list[Any]:
    return [c for c in psutil.Process(pid).net_connections("tcp")
            if c.status == psutil.CONN_ESTABLISHED]


def access(protocol: MqttProtocol = "3.1.1", tls: TlsSettings | None = None,
           password: str | None = PASSWORD, user: str | None = USER) -> BrokerAccess:
    """The run's access as the controller hands it over (password read already)."""
    return BrokerAccess(protocol=protocol, tls=tls,
                        auth=None if user is None else AuthSettings(username=user,
                                                                    password_env="UNUSED"),
                        password=None if password is None else SecretStr(password))


def trusting(secured: Secured, **more: object) -> TlsSettings:
    return TlsSettings(ca_file=str(secured.dir / "ca.crt"), **more)


def deployed(url: str, run_access: BrokerAccess, sys_topics: bool = False,
             timeout_s: float = 2.0) -> tuple[ExternalBackend, Endpoint]:
    backend = ExternalBackend()
    backend.configure_access(run_access)
    endpoint = backend.deploy({"url": url, "sys_topics": sys_topics,
                               "connect_timeout_s": timeout_s}, LocalHost())
    return backend, endpoint


def refused(url: str, run_access: BrokerAccess, timeout_s: float = 2.0) -> str:
    """Deploy's error, once it came within seconds."""
    started = time.monotonic()
    with pytest.raises(BackendError) as raised:
        deployed(url, run_access, sys_topics=True, timeout_s=timeout_s)
    assert time.monotonic() - started < timeout_s + 1.5
    return str(raised.value)


# -- a broker as it is deployed is reached and sampled ---------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(("scheme", "listener", "protocol"), [
    ("mqtts", "tls", "5"), ("mqtts", "tls", "3.1.1"), ("mqtt", "plain", "5"),
    ("ws", "ws", "3.1.1"), ("wss", "wss", "5"),
])
def test_the_broker_is_reached_and_its_sys_topics_read_over_the_runs_layers(
        secured, scheme, listener, protocol):
    tls = trusting(secured) if scheme in ("mqtts", "wss") else None
    backend, endpoint = deployed(secured.url(scheme, listener), access(protocol, tls),
                                 sys_topics=True)
    try:
        assert endpoint.scheme == scheme
        assert (endpoint.tls is not None) == (tls is not None)
        if tls is not None:
            assert endpoint.tls.ca_pem == (secured.dir / "ca.crt").read_text()
        assert endpoint.websocket_path == ("/mqtt" if scheme.startswith("ws") else None)
        # the $SYS sampler got in with the run's user, version and layers (sys_interval 1)
        assert eventually(lambda: len(backend.sys_samples()) > 5, 4)
        assert backend.health() is None
        assert backend.deployment().sys_topics.error is None
        assert backend.deployment().username == USER
    finally:
        backend.teardown()
    assert backend.deployment().version.startswith("mosquitto version 2.0")


@pytest.mark.integration
def test_liveness_opens_the_tls_stream_and_fails_once_it_cannot(secured):
    backend, endpoint = deployed(secured.url("mqtts", "tls"), access("5", trusting(secured)))
    try:
        assert backend.sys_samples() == [] and backend.health() is None   # no $SYS session
    finally:
        backend.teardown()
    assert Liveness(endpoint).check() is None
    # the same TLS client at the plain listener: a handshake, not a TCP connect, is checked
    at_plain = Liveness(endpoint.model_copy(update={"port": secured.ports["plain"]}))
    reason = at_plain.check()
    assert reason is not None and reason.startswith("TLS")
    assert reason.endswith("is the port a TLS one?")


@pytest.mark.integration
def test_a_client_certificate_is_presented_where_the_listener_requires_one(secured):
    url = secured.url("mqtts", "mtls")
    d = secured.dir
    backend, _ = deployed(url, access("5", trusting(secured, cert_file=str(d / "client.crt"),
                                                    key_file=str(d / "client.key"))))
    backend.teardown()
    reason = refused(url, access("5", trusting(secured)))
    # In TLS 1.3 the client's handshake is done before the server has read its (empty)
    # certificate: the client reads either the server's certificate_required alert or,
    # when the close overtakes it, the end of the stream. Either is said as such.
    assert reason in (
        f"external broker {url}: TLS handshake failed: the server requires a client "
        "certificate (TLS alert certificate_required): give broker.tls.cert_file and key_file",
        f"external broker {url}: TLS failed: the server closed the connection during or "
        "right after the handshake: is the port a TLS one; or it requires a client "
        "certificate: give broker.tls.cert_file and key_file?")


# -- bad input: each an error within seconds, naming the address and the reason --------


@pytest.mark.integration
@pytest.mark.parametrize(("listener", "tls", "reason"), [
    ("tls", {"ca_file": "other-ca.crt"},
     "TLS handshake failed: certificate verify failed: unable to get local issuer "
     "certificate"),
    ("tls", {"ca_file": "ca.crt", "server_name": "wrong.example"},
     "TLS handshake failed: certificate verify failed: Hostname mismatch, certificate is "
     "not valid for 'wrong.example'."),
    ("expired", {"ca_file": "ca.crt"},
     "TLS handshake failed: certificate verify failed: certificate has expired"),
])
def test_a_certificate_that_does_not_verify_is_named_as_openssl_names_it(
        secured, listener, tls, reason):
    settings = TlsSettings(**{**tls, "ca_file": str(secured.dir / tls["ca_file"])})
    url = secured.url("mqtts", listener)
    assert refused(url, access("5", settings)) == f"external broker {url}: {reason}"


@pytest.mark.integration
def test_the_server_name_sent_is_the_one_verified(secured):
    # the certificate names localhost too: by that name it verifies at 127.0.0.1
    backend, endpoint = deployed(secured.url("mqtts", "tls"),
                                 access(tls=trusting(secured, server_name="localhost")))
    backend.teardown()
    assert endpoint.tls is not None and endpoint.tls.server_name == "localhost"


@pytest.mark.integration
def test_a_plain_client_at_a_tls_port_is_told_to_use_mqtts(secured):
    url = secured.url("mqtt", "tls")
    assert refused(url, access()) == (
        f"external broker {url}: connection reset by peer (ECONNRESET) (the client spoke "
        "without TLS, as the url's scheme mqtt says; if this port is a TLS listener, use "
        "mqtts://)")


@pytest.mark.integration
def test_a_plain_client_at_a_silent_tls_port_is_told_within_the_connect_timeout():
    # a TLS server that waits for a ClientHello (as many do) rather than closing
    server = socket.create_server(("127.0.0.1", 0))
    with server:
        url = f"mqtt://127.0.0.1:{server.getsockname()[1]}"
        reason = refused(url, access(password=None, user=None), timeout_s=1.0)
    assert reason == (f"external broker {url}: no answer (timed out) (the client spoke "
                      "without TLS, as the url's scheme mqtt says; if this port is a TLS "
                      "listener, use mqtts://)")


@pytest.mark.integration
def test_a_tls_client_at_a_plain_port_is_told_the_port_is_not_tls(secured):
    url = secured.url("mqtts", "plain")
    reason = refused(url, access(tls=trusting(secured)))
    assert reason.startswith(f"external broker {url}: TLS")
    assert reason.endswith("is the port a TLS one?")


@pytest.mark.integration
@pytest.mark.parametrize(("protocol", "user", "password", "named"), [
    ("3.1.1", USER, "wrong", "CONNACK return code 5 not authorized (user 'alice')"),
    ("5", USER, "wrong", "CONNACK reason code 0x87 Not authorized (user 'alice')"),
    ("3.1.1", None, None, "CONNACK return code 5 not authorized (anonymous: no "
                          "broker.auth)"),
    ("5", "mallory", PASSWORD, "CONNACK reason code 0x87 Not authorized (user 'mallory')"),
])
def test_a_refused_connect_names_the_connack_code_and_the_user(
        secured, protocol, user, password, named):
    # Mosquitto 2.0.11 answers a wrong password with "not authorized" (3.1.1 code 5, MQTT 5
    # 0x87), not with "bad user name or password" (4, 0x86): both are taken as they come
    url = secured.url("mqtts", "tls")
    reason = refused(url, access(protocol, trusting(secured), password, user))
    assert reason == f"external broker {url}: CONNECT refused with {named}"
    assert PASSWORD not in reason


@pytest.mark.integration
@pytest.mark.parametrize("status", [403, 404])
def test_a_refused_websocket_upgrade_names_the_http_status(status):
    with refusing_http_server(status) as port:
        url = f"ws://127.0.0.1:{port}/mqtt"
        reason = refused(url, access(password=None, user=None))
    phrase = {403: "Forbidden", 404: "Not Found"}[status]
    assert reason == (f"external broker {url}: the WebSocket upgrade was refused: "
                      f"HTTP/1.0 {status} {phrase}")


@pytest.mark.integration
def test_a_wss_client_at_a_tls_port_without_websocket_is_told_so(secured):
    url = secured.url("wss", "tls")
    reason = refused(url, access(tls=trusting(secured)))
    assert reason == (f"external broker {url}: the connection closed before an answer to "
                      "the upgrade (is the port a WebSocket listener?)")


@pytest.mark.integration
def test_unreadable_tls_files_are_named_by_their_path(secured, tmp_path):
    url = secured.url("mqtts", "tls")
    missing = tmp_path / "no-such-ca.pem"
    assert refused(url, access(tls=TlsSettings(ca_file=str(missing)))) == (
        f"external broker {url}: broker.tls.ca_file '{missing}' cannot be read: No such "
        "file or directory")
    assert refused(url, access(tls=TlsSettings(ca_file=str(tmp_path)))) == (
        f"external broker {url}: broker.tls.ca_file '{tmp_path}' cannot be read: not a "
        "regular file")
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("a CA? no\n")
    assert refused(url, access(tls=TlsSettings(ca_file=str(not_pem)))) == (
        f"external broker {url}: broker.tls.ca_file '{not_pem}' holds no PEM certificate "
        "(-----BEGIN CERTIFICATE-----)")
    key = tmp_path / "gone.key"
    reason = refused(url, access(tls=trusting(secured, cert_file=str(secured.dir / "client.crt"),
                                              key_file=str(key))))
    assert reason == (f"external broker {url}: broker.tls.key_file '{key}' cannot be read: "
                      "No such file or directory")


@pytest.mark.integration
def test_a_listener_the_url_does_not_have_is_refused_naming_both(secured):
    url = secured.url("mqtt", "plain")
    assert refused(url, access(tls=trusting(secured))) == (
        f"external broker {url}: broker.tls is given but the url's scheme has no TLS; "
        "write mqtts://")


def test_mqtt5_of_a_broker_declaring_3_1_1_only_is_refused_before_anything_runs():
    with pytest.raises(SpecError, match="workload.protocol '5': backend external declares "
                                        "MQTT 3.1.1 only"):
        parse_spec({"name": "x", "workload": {"protocol": "5"},
                    "broker": {"backend": "external", "url": "mqtts://broker.example",
                               "features": {"protocols": ["3.1.1"]}}})


@pytest.mark.parametrize(("broker", "shown"), [
    ({"url": "mqtts://alice:canary-pw-42@broker.example"},
     "broker.url: bad value 'mqtts://**********@broker.example': "),
    # not user-info to urlsplit (a "/" and a space in the password): masked all the same,
    # in the value and where the backend's message quotes it
    ({"url": "mqtt://alice:canary/pw 42@broker.example"},
     "broker.url: bad value 'mqtt://**********@broker.example': 'mqtt://**********@"),
    ({"url": "mqtt://broker.example", "extra": ["ws://bob:canary-pw-42@h"]},
     "broker.extra: unknown key (value ['ws://**********@h'])"),
])
def test_the_spec_s_errors_never_repeat_the_user_info_of_a_url(broker, shown):
    with pytest.raises(SpecError) as raised:
        parse_spec({"name": "x", "broker": {"backend": "external", **broker}})
    reason = str(raised.value)
    assert shown in reason
    assert "canary" not in reason and "alice" not in reason and "bob" not in reason


@pytest.mark.integration
def test_failed_deploys_leave_no_connection_and_no_sampler_behind(secured):
    for url, run_access in [(secured.url("mqtts", "tls"), access("5", trusting(secured),
                                                                 "wrong")),
                            (secured.url("mqtt", "tls"), access()),
                            (secured.url("wss", "wss"), access(tls=TlsSettings(
                                ca_file=str(secured.dir / "other-ca.crt"))))]:
        refused(url, run_access)
    assert eventually(lambda: not _established(secured.proc.pid), 3), \
        _established(secured.proc.pid)
    assert not [t for t in threading.enumerate() if t.name.startswith("sys-topics-")]
    assert secured.proc.poll() is None   # and the broker itself is as it was


def test_the_external_backend_configures_access():
    assert isinstance(ExternalBackend(), ConfiguresAccess)


@contextmanager
def refusing_http_server(status: int) -> Iterator[int]:
    """An HTTP server answering every request with ``status``: its port."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the handler's name is http.server's
            self.send_error(status)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(2)


# -- the WebSocket client, byte by byte -------------------------------------------------


def server_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """A frame as a server sends it: unmasked."""
    first = (0x80 if fin else 0) | opcode
    if len(payload) < 126:
        return bytes((first, len(payload))) + payload
    return struct.pack("!BBH", first, 126, len(payload)) + payload


def read_client_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One frame a client sent: its opcode and unmasked payload (short frames)."""
    first, second = sock.recv(2)
    assert second & 0x80, "a client frame must be masked (RFC 6455 section 5.1)"
    length = second & 0x7F
    if length == 126:
        length = struct.unpack("!H", sock.recv(2))[0]
    key = sock.recv(4)
    payload = b""
    while len(payload) < length:
        payload += sock.recv(length - len(payload))
    return first & 0x0F, mask(payload, key)


def test_websocket_stream_joins_fragments_answers_pings_and_ends_at_close():
    client, server = socket.socketpair()
    with client, server:
        stream = WebSocketStream(client, already_read=server_frame(OP_BINARY, b"\x20\x02",
                                                                   fin=False))
        server.sendall(server_frame(OP_CONTINUATION, b"\x00", fin=False)
                       + server_frame(OP_PING, b"hi")
                       + server_frame(OP_CONTINUATION, b"\x00" + b"x" * 300)
                       + server_frame(OP_CLOSE, struct.pack("!H", 1000)))
        received = b""
        while chunk := stream.recv(64):
            received += chunk
        assert received == b"\x20\x02\x00\x00" + b"x" * 300
        assert read_client_frame(server) == (OP_PONG, b"hi")
        assert read_client_frame(server) == (OP_CLOSE, struct.pack("!H", 1000))
        stream.sendall(b"\xe0\x00")
        assert read_client_frame(server) == (OP_BINARY, b"\xe0\x00")


@pytest.mark.parametrize(("frame", "reason"), [
    (bytes((0x82, 0x81)) + b"kkkk" + b"x", "masked frame"),
    (server_frame(0x1, b"text"), "text frame"),
    (bytes((0xC2, 0)), "reserved bits"),
    (server_frame(OP_PING, b"x" * 126), "longer than 125 bytes"),
    (struct.pack("!BBQ", 0x82, 127, 1 << 40), "exceeds the"),
    (server_frame(0x3, b""), "opcode 0x3 is reserved"),
])
def test_websocket_stream_refuses_what_rfc_6455_forbids(frame, reason):
    client, server = socket.socketpair()
    with client, server:
        server.sendall(frame)
        with pytest.raises(WebSocketError, match=reason):
            WebSocketStream(client).recv(10)
        assert read_client_frame(server) == (OP_CLOSE, struct.pack("!H", 1002))


WEBSOCKET_SEEDS = [server_frame(OP_BINARY, b"\x20\x02\x00\x00"),
                   server_frame(OP_BINARY, b"\x30", fin=False)
                   + server_frame(OP_PING, b"p") + server_frame(OP_CONTINUATION, b"x" * 200),
                   server_frame(OP_CLOSE, struct.pack("!H", 1000)),
                   struct.pack("!BBQ", 0x82, 127, 3) + b"abc"]


@FUZZ
@given(datagrams(WEBSOCKET_SEEDS))
def test_fuzzed_websocket_frames_give_bytes_or_a_named_refusal_never_a_hang(data):
    client, server = socket.socketpair()
    with client, server:
        client.settimeout(1)
        server.sendall(data)
        server.shutdown(socket.SHUT_WR)   # the end of the bytes: a read past it must end
        stream = WebSocketStream(client)
        try:
            while stream.recv(4096):
                pass
        except (WebSocketError, ConnectionResetError):
            pass


# -- the MQTT 5 codec of the probes -----------------------------------------------------


def test_mqtt5_connect_carries_version_5_user_and_password():
    packet = mqtt5_codec.encode_connect(Connect("probe", keepalive_s=0, username="u",
                                                password=b"p"))
    # 11 bytes of variable header (properties: none, one byte), 13 of payload
    assert packet == (b"\x10\x18\x00\x04MQTT\x05\xc2\x00\x00\x00"
                      b"\x00\x05probe\x00\x01u\x00\x01p")


def test_mqtt5_answers_decode_with_their_reason_codes_named():
    connack = mqtt5_codec.decode_body(0x20, b"\x00\x86\x05\x1f\x00\x02no")
    assert isinstance(connack, mqtt5_codec.ConnAck5) and not connack.accepted
    assert (connack.reason_code, connack.reason_string) == (0x86, "no")
    assert mqtt5_codec.describe_reason(0x86) == "0x86 Bad User Name or Password"
    assert mqtt5_codec.describe_reason(0x87) == "0x87 Not authorized"
    assert mqtt5_codec.describe_reason(0x7F) == "0x7f reserved, not an MQTT 5 reason code"
    publish = mqtt5_codec.decode_body(0x30, b"\x00\x03a/b\x02\x01\x01hello")
    assert publish == Publish("a/b", b"hello")
    assert mqtt5_codec.decode_body(0x90, b"\x00\x01\x00\x00\x80") == SubAck(1, (0, 0x80))
    disconnect = mqtt5_codec.decode_body(0xE0, b"\x8b\x00")
    assert disconnect == mqtt5_codec.Disconnect5(0x8B)
    with pytest.raises(MalformedPacket, match="property 0x7f is not an MQTT 5 property"):
        mqtt5_codec.decode_body(0x20, b"\x00\x00\x02\x7f\x00")
    with pytest.raises(MalformedPacket, match="a server does not send CONNECT"):
        mqtt5_codec.decode_body(0x10, b"")


MQTT5_SEEDS = [b"\x20\x03\x00\x00\x00", b"\x20\x08\x00\x86\x05\x1f\x00\x02no",
               b"\x30\x0e\x00\x03a/b\x02\x01\x01hello", b"\x90\x05\x00\x01\x00\x00\x80",
               b"\xe0\x02\x8b\x00", b"\x40\x04\x00\x01\x10\x00", b"\xd0\x00"]


@FUZZ
@given(datagrams(MQTT5_SEEDS))
def test_fuzzed_mqtt5_answers_decode_or_are_refused_as_malformed(data):
    if len(data) < 2:
        return
    try:
        packet = mqtt5_codec.decode_body(data[0], data[2:])
    except MalformedPacket:
        return
    assert isinstance(packet, typing.get_args(mqtt5_codec.Packet5))
