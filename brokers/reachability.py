"""Whether an MQTT broker answers at an address: the probes a backend runs around a run.

- :func:`probe`: the broker answers its protocol as the run speaks it: over TCP (and TLS,
  and WebSocket, where the endpoint says so) a CONNECT in the run's MQTT version, with its
  user name and password, gets a CONNACK that accepts it; over UDP a PINGREQ gets its
  PINGRESP (MQTT or MQTT-SN).
- :class:`Liveness`: the cheap check a backend's ``health()`` makes while a run measures.

Failures raise :class:`Unreachable` whose ``reason`` names the OS error as the kernel
gave it ("connection refused (ECONNREFUSED)"), OpenSSL's reason ("TLS handshake failed:
certificate verify failed: certificate has expired"), the HTTP status of a refused
WebSocket upgrade, or :class:`ConnectRefused` naming the CONNACK code and its meaning
("return code 5 not authorized", "reason code 0x86 Bad User Name or Password"). The
caller puts the address in front: it knows how the user wrote it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import ssl
import time

from mqttbed.core import mqttsn
from mqttbed.core.broker_access import ClientCredentials, MqttProtocol
from mqttbed.core.client_tls import describe_tls_error
from mqttbed.core.mqtt5_codec import ConnAck5, describe_reason
from mqttbed.core.mqtt_codec import MalformedPacket, PingReq, PingResp
from mqttbed.core.mqtt_codec import decode as decode_mqtt
from mqttbed.core.mqtt_codec import encode as encode_mqtt
from mqttbed.core.mqtt_stream import (
    ByteStream,
    MqttSession,
    StreamClosed,
    connect,
    describe_connack,
    open_stream,
)
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.websocket import UpgradeRefused, WebSocketError

__all__ = ["ConnectRefused", "Liveness", "Unreachable", "describe_connack",
           "describe_os_error", "probe", "probe_mqtt_tcp", "probe_session",
           "probe_tcp_connect", "probe_udp_ping"]

_probe_ids = itertools.count(1)


class Unreachable(Exception):
    """The broker did not answer as an MQTT broker; ``reason`` says what happened."""

    def __init__(self, reason: str, timed_out: bool = False, lasting: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out  # nothing came back in time (as opposed to a refusal)
        # the broker is up but answers otherwise than the run asks (a certificate that
        # does not verify, an upgrade refused): a readiness poll stops at once on it
        self.lasting = lasting

    @classmethod
    def from_os_error(cls, exc: OSError) -> Unreachable:
        """The failure an OSError of a probe's socket means."""
        return cls(describe_os_error(exc), timed_out=isinstance(exc, TimeoutError))


class ConnectRefused(Unreachable):
    """The broker answered CONNECT with a CONNACK refusing the connection."""

    def __init__(self, code: int, protocol: MqttProtocol = "3.1.1", detail: str = ""):
        named = (f"reason code {describe_reason(code)}" if protocol == "5"
                 else f"return code {describe_connack(code)}")
        super().__init__(f"CONNECT refused with CONNACK {named}{detail}", lasting=True)
        self.code = code
        self.protocol = protocol


def describe_os_error(exc: OSError) -> str:
    """An OSError as the kernel named it: ``connection refused (ECONNREFUSED)``."""
    if isinstance(exc, socket.gaierror):
        return f"host name not resolved ({exc.strerror})"
    if isinstance(exc, TimeoutError) and exc.errno is None:
        return "no answer (timed out)"
    if exc.errno is not None and exc.errno in errno.errorcode:
        return f"{os.strerror(exc.errno).lower()} ({errno.errorcode[exc.errno]})"
    return str(exc)


def probe_tcp_connect(host: str, port: int, timeout_s: float) -> None:
    """A TCP connection to ``host:port`` opens (and is closed at once)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        raise Unreachable.from_os_error(exc) from None


def probe_mqtt_tcp(host: str, port: int, timeout_s: float) -> None:
    """A plain MQTT 3.1.1 CONNECT to ``host:port`` gets a CONNACK accepting it; then
    DISCONNECT."""
    probe_session(Endpoint(host=host, port=port), timeout_s)


def probe_session(endpoint: Endpoint, timeout_s: float,
                  credentials: ClientCredentials | None = None,
                  protocol: MqttProtocol = "3.1.1") -> None:
    """A CONNECT in ``protocol`` with ``credentials`` to ``endpoint`` (over its TLS and
    WebSocket layers) gets a CONNACK accepting it; then DISCONNECT."""
    client_id = f"mqttbed-probe-{os.getpid()}-{next(_probe_ids)}"
    try:
        session = connect(endpoint, client_id, timeout_s, credentials=credentials,
                          protocol=protocol)
    except StreamClosed:
        raise Unreachable(f"the connection closed before a CONNACK came"
                          f"{_plain_at_tls_hint(endpoint)}") from None
    except MalformedPacket as exc:
        raise Unreachable(f"the answer to CONNECT is not an MQTT {protocol} CONNACK: "
                          f"{exc}") from None
    except (OSError, ValueError) as exc:
        raise _opening_failed(endpoint, exc, credentials) from None
    with contextlib.closing(session):
        if not session.accepted:
            user = None if credentials is None else credentials.username
            raise _refused(session, f" (user {user!r})" if user is not None else
                           " (anonymous: no broker.auth)")
        session.disconnect()


def _refused(session: MqttSession, detail: str) -> ConnectRefused:
    connack = session.connack
    if isinstance(connack, ConnAck5):
        said = f" ({connack.reason_string})" if connack.reason_string else ""
        return ConnectRefused(connack.reason_code, "5", said + detail)
    return ConnectRefused(connack.return_code, "3.1.1", detail)


def _opening_failed(endpoint: Endpoint, exc: OSError | ValueError,
                    credentials: ClientCredentials | None = None) -> Unreachable:
    """Why a stream to ``endpoint`` did not open (or CONNECT got no answer): the OS
    error, OpenSSL's reason, the WebSocket upgrade's status."""
    if isinstance(exc, WebSocketError):
        return Unreachable(str(exc), lasting=isinstance(exc, UpgradeRefused))
    if isinstance(exc, ssl.SSLError):
        if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            # what a broker wanting a client certificate does too (Mosquitto's
            # require_certificate): it closes once the handshake is done
            wants = ("" if credentials is not None and credentials.cert_pem is not None
                     else "; or it requires a client certificate: give broker.tls.cert_file "
                          "and key_file")
            return Unreachable("TLS failed: the server closed the connection during or "
                               f"right after the handshake: is the port a TLS one{wants}?")
        return Unreachable(f"TLS handshake failed: {describe_tls_error(exc)}",
                           lasting=isinstance(exc, ssl.SSLCertVerificationError))
    if isinstance(exc, ValueError):
        return Unreachable(str(exc))
    failure = Unreachable.from_os_error(exc)
    if isinstance(exc, ConnectionResetError | TimeoutError) and endpoint.tls is None:
        failure = Unreachable(failure.reason + _plain_at_tls_hint(endpoint), failure.timed_out)
    elif isinstance(exc, ConnectionResetError) and endpoint.tls is not None:
        failure = Unreachable(f"TLS handshake failed: {failure.reason}: is the port a "
                              "TLS one?")
    return failure


def _plain_at_tls_hint(endpoint: Endpoint) -> str:
    """What a plain client at a TLS listener sees: the broker closes on the CONNECT's
    bytes (not a TLS record), or waits for a ClientHello that never comes."""
    if endpoint.tls is not None:
        return ""
    secure = "wss" if endpoint.websocket_path is not None else "mqtts"
    return (f" (the client spoke without TLS, as the url's scheme {endpoint.scheme} says; "
            f"if this port is a TLS listener, use {secure}://)")


def probe_udp_ping(endpoint: Endpoint, timeout_s: float) -> None:
    """A PINGREQ to ``endpoint`` (MQTT or MQTT-SN over UDP) gets its PINGRESP."""
    sn = endpoint.transport == Transport.MQTT_SN_UDP
    request = mqttsn.encode(mqttsn.Pingreq()) if sn else encode_mqtt(PingReq())
    family = socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        try:
            # connect(): an ICMP port unreachable then comes back as ECONNREFUSED
            sock.connect((endpoint.host, endpoint.port))
            sock.send(request)
            reply = sock.recv(512)
        except OSError as exc:
            raise Unreachable.from_os_error(exc) from None
    try:
        answer = mqttsn.decode(reply) if sn else decode_mqtt(reply)
    except (MalformedPacket, mqttsn.MqttSnError) as exc:
        raise Unreachable(f"the answer to PINGREQ is malformed: {exc}") from None
    if not isinstance(answer, mqttsn.Pingresp if sn else PingResp):
        raise Unreachable(f"PINGREQ was answered with {type(answer).__name__}, not PINGRESP")


def probe(endpoint: Endpoint, timeout_s: float, credentials: ClientCredentials | None = None,
          protocol: MqttProtocol = "3.1.1") -> None:
    """The broker at ``endpoint`` answers its transport's MQTT as the run speaks it (see
    the module docstring); ``credentials`` and ``protocol`` apply over TCP only."""
    if endpoint.transport == Transport.MQTT_TCP:
        probe_session(endpoint, timeout_s, credentials, protocol)
    else:
        probe_udp_ping(endpoint, timeout_s)


def probe_stream(endpoint: Endpoint, timeout_s: float,
                 credentials: ClientCredentials | None = None) -> None:
    """A stream to ``endpoint`` opens through its layers (TCP, TLS handshake, WebSocket
    upgrade) and is closed at once: no MQTT session."""
    stream: ByteStream | None = None
    try:
        stream = open_stream(endpoint, timeout_s, credentials)
    except (OSError, ValueError) as exc:
        raise _opening_failed(endpoint, exc, credentials) from None
    finally:
        if stream is not None:
            stream.close()


class Liveness:
    """The health check of a broker mqttbed does not own: cheap, and not fooled by load.

    Over TCP a connection opening through the endpoint's layers is enough (the TLS
    handshake, the WebSocket upgrade; no MQTT session: nothing the broker counts as a
    client); over UDP a PINGREQ. The engine asks every few tens of milliseconds, so
    the answer is kept for ``interval_s``. A refusal is final at once; a timeout (a busy
    broker's full backlog, a lost datagram) only after ``timeouts_allowed`` more in a row.
    """

    def __init__(self, endpoint: Endpoint, interval_s: float = 0.5, timeout_s: float = 1.0,
                 timeouts_allowed: int = 2, credentials: ClientCredentials | None = None):
        self.endpoint = endpoint
        self.credentials = credentials   # the client certificate a TLS listener may ask
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.timeouts_allowed = timeouts_allowed
        self._checked_at = float("-inf")
        self._reason: str | None = None
        self._timeouts = 0

    def check(self) -> str | None:
        """None while the broker answers, else why it does not (the OS error)."""
        now = time.monotonic()
        if self._reason is not None or now - self._checked_at < self.interval_s:
            return self._reason
        self._checked_at = now
        try:
            if self.endpoint.transport != Transport.MQTT_TCP:
                probe_udp_ping(self.endpoint, self.timeout_s)
            elif self.endpoint.tls is None and self.endpoint.websocket_path is None:
                probe_tcp_connect(self.endpoint.host, self.endpoint.port, self.timeout_s)
            else:
                probe_stream(self.endpoint, self.timeout_s, self.credentials)
        except Unreachable as exc:
            self._timeouts = self._timeouts + 1 if exc.timed_out else 0
            if not exc.timed_out or self._timeouts > self.timeouts_allowed:
                self._reason = exc.reason
            return self._reason
        self._timeouts = 0
        return None
