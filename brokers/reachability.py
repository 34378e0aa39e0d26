"""Whether an MQTT broker answers at an address: the probes a backend runs around a run.

- :func:`probe`: the broker answers its protocol: over TCP a CONNECT gets a CONNACK that
  accepts it (MQTT 3.1.1); over UDP a PINGREQ gets its PINGRESP (MQTT or MQTT-SN).
- :class:`Liveness`: the cheap check a backend's ``health()`` makes while a run measures.

Failures raise :class:`Unreachable` whose ``reason`` names the OS error as the kernel
gave it ("connection refused (ECONNREFUSED)"), or :class:`ConnectRefused` naming the
CONNACK return code and its meaning ("5 not authorized"). The caller puts the address in
front: it knows how the user wrote it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import time

from mqttbed.core import mqttsn
from mqttbed.core.mqtt_codec import ConnackCode, Disconnect, MalformedPacket, PingReq, PingResp
from mqttbed.core.mqtt_codec import decode as decode_mqtt
from mqttbed.core.mqtt_codec import encode as encode_mqtt
from mqttbed.core.mqtt_stream import StreamClosed, open_session
from mqttbed.core.protocol import Endpoint, Transport

_probe_ids = itertools.count(1)


class Unreachable(Exception):
    """The broker did not answer as an MQTT broker; ``reason`` says what happened."""

    def __init__(self, reason: str, timed_out: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out  # nothing came back in time (as opposed to a refusal)

    @classmethod
    def from_os_error(cls, exc: OSError) -> Unreachable:
        """The failure an OSError of a probe's socket means."""
        return cls(describe_os_error(exc), timed_out=isinstance(exc, TimeoutError))


class ConnectRefused(Unreachable):
    """The broker answered CONNECT with a CONNACK refusing the connection."""

    def __init__(self, code: int):
        super().__init__(f"CONNECT refused with CONNACK return code {describe_connack(code)}")
        self.code = code


def describe_connack(code: int) -> str:
    """A CONNACK return code with its meaning: ``5 not authorized`` (3.1.1 section 3.2.2.3)."""
    try:
        meaning = ConnackCode(code).name.lower().replace("_", " ")
    except ValueError:
        meaning = "reserved, not a 3.1.1 return code"
    return f"{code} {meaning}"


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
    """A CONNECT to ``host:port`` gets a CONNACK accepting it; then DISCONNECT."""
    client_id = f"mqttbed-probe-{os.getpid()}-{next(_probe_ids)}"
    try:
        sock, connack = open_session(host, port, client_id, timeout_s)
    except StreamClosed:
        raise Unreachable("the connection closed before a CONNACK came") from None
    except MalformedPacket as exc:
        raise Unreachable(f"the answer to CONNECT is not an MQTT 3.1.1 CONNACK: {exc}") from None
    except OSError as exc:
        raise Unreachable.from_os_error(exc) from None
    with sock:
        if connack.return_code != ConnackCode.ACCEPTED:
            raise ConnectRefused(connack.return_code)
        with contextlib.suppress(OSError):
            sock.sendall(encode_mqtt(Disconnect()))


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


def probe(endpoint: Endpoint, timeout_s: float) -> None:
    """The broker at ``endpoint`` answers its transport's MQTT (see the module docstring)."""
    if endpoint.transport == Transport.MQTT_TCP:
        probe_mqtt_tcp(endpoint.host, endpoint.port, timeout_s)
    else:
        probe_udp_ping(endpoint, timeout_s)


class Liveness:
    """The health check of a broker mqttbed does not own: cheap, and not fooled by load.

    Over TCP a connection opening is enough (no MQTT session: nothing the broker counts
    as a client); over UDP a PINGREQ. The engine asks every few tens of milliseconds, so
    the answer is kept for ``interval_s``. A refusal is final at once; a timeout (a busy
    broker's full backlog, a lost datagram) only after ``timeouts_allowed`` more in a row.
    """

    def __init__(self, endpoint: Endpoint, interval_s: float = 0.5, timeout_s: float = 1.0,
                 timeouts_allowed: int = 2):
        self.endpoint = endpoint
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
            if self.endpoint.transport == Transport.MQTT_TCP:
                probe_tcp_connect(self.endpoint.host, self.endpoint.port, self.timeout_s)
            else:
                probe_udp_ping(self.endpoint, self.timeout_s)
        except Unreachable as exc:
            self._timeouts = self._timeouts + 1 if exc.timed_out else 0
            if not exc.timed_out or self._timeouts > self.timeouts_allowed:
                self._reason = exc.reason
            return self._reason
        self._timeouts = 0
        return None
