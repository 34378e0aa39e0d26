"""MQTT over one blocking stream: open a session, read whole packets.

For the small clients around a run (a broker's readiness probe, the ``$SYS`` sampler),
not for the agents' hot path (:mod:`mqttbed.agents.mqtt_tcp`). :func:`open_session` is
plain MQTT 3.1.1 over TCP; :func:`connect` speaks an endpoint as a run does: over TLS
(:mod:`mqttbed.core.client_tls`) and/or WebSocket (:mod:`mqttbed.core.websocket`) where
the endpoint says so, MQTT 3.1.1 or 5, with the run's user name and password. Packets
are built and parsed by :mod:`mqttbed.core.mqtt_codec` (3.1.1) and
:mod:`mqttbed.core.mqtt5_codec` (5).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Protocol

from mqttbed.core import mqtt5_codec
from mqttbed.core.broker_access import ClientCredentials, MqttProtocol
from mqttbed.core.client_tls import ssl_context
from mqttbed.core.mqtt_codec import (
    ConnAck,
    ConnackCode,
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
    Subscribe,
    decode_body,
    decode_remaining_length,
    encode,
)
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.websocket import upgrade

# A probe or monitor has no use for a larger packet; bounding it bounds what a
# misbehaving peer can make this process allocate.
DEFAULT_MAX_PACKET_BYTES = 1 << 20


class ByteStream(Protocol):
    """What MQTT is read from and written to: a socket, a TLS socket, a WebSocket."""

    def sendall(self, data: bytes, /) -> None: ...

    def recv(self, count: int, /) -> bytes: ...

    def settimeout(self, timeout: float | None, /) -> None: ...

    def shutdown(self, how: int, /) -> None: ...

    def close(self) -> None: ...


class StreamClosed(ConnectionError):
    """The peer closed the connection (before a packet, or in the middle of one)."""


def read_exactly(sock: ByteStream, count: int) -> bytes:
    """``count`` bytes from ``sock``; StreamClosed if it ends first."""
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise StreamClosed(f"connection closed after {len(data)} of {count} bytes")
        data += chunk
    return bytes(data)


def read_packet(sock: ByteStream, max_bytes: int = DEFAULT_MAX_PACKET_BYTES) -> Packet:
    """Read one whole packet from ``sock`` (blocking, within the socket's timeout).

    Raises StreamClosed when the peer closes, MalformedPacket for bytes that are not a
    well-formed packet (or one over ``max_bytes``), TimeoutError on the socket's timeout.
    """
    return decode_body(*read_frame(sock, max_bytes))


def read_frame(sock: ByteStream, max_bytes: int = DEFAULT_MAX_PACKET_BYTES) -> tuple[int, bytes]:
    """One whole packet's first byte and the bytes after its remaining length, undecoded
    (the same framing in MQTT 3.1.1 and 5); raises as :func:`read_packet`."""
    header = bytearray(read_exactly(sock, 1))
    # The remaining length is one to four bytes, each but the last with its top bit set.
    while len(header) < 5:
        header += read_exactly(sock, 1)
        if not header[-1] & 0x80:
            break
    length, _ = decode_remaining_length(bytes(header))
    if length > max_bytes:
        raise MalformedPacket(f"packet of {length} bytes exceeds the {max_bytes}-byte limit")
    return header[0], read_exactly(sock, length)


def open_session(host: str, port: int, client_id: str, timeout_s: float,
                 keepalive_s: int = 0) -> tuple[socket.socket, ConnAck]:
    """Connect to ``host:port`` over TCP, send CONNECT, return the socket and the CONNACK.

    The socket has TCP_NODELAY set (a small packet is not held back) and ``timeout_s``
    as its timeout. The caller checks the CONNACK's return code and closes the socket.
    Raises OSError (refused, unreachable, timed out), StreamClosed, or MalformedPacket
    when the first packet back is not a CONNACK.
    """
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(encode(Connect(client_id, keepalive_s=keepalive_s, clean_session=True)))
        answer = read_packet(sock)
        if not isinstance(answer, ConnAck):
            raise MalformedPacket(f"the answer to CONNECT is {type(answer).__name__}, "
                                  "not CONNACK (section 3.2)")
        return sock, answer
    except BaseException:
        sock.close()
        raise


class MqttSession:
    """An MQTT session :func:`connect` opened: its stream, its version, its CONNACK."""

    def __init__(self, stream: ByteStream, protocol: MqttProtocol,
                 connack: ConnAck | mqtt5_codec.ConnAck5):
        self.stream = stream
        self.protocol = protocol
        self.connack = connack

    @property
    def accepted(self) -> bool:
        """Whether the CONNACK accepted the connection."""
        if isinstance(self.connack, mqtt5_codec.ConnAck5):
            return self.connack.accepted
        return self.connack.return_code == ConnackCode.ACCEPTED

    def refusal(self) -> str:
        """The CONNACK's refusal as the standard names it: ``CONNACK return code 5 not
        authorized`` (3.1.1), ``CONNACK reason code 0x87 Not authorized`` (5)."""
        connack = self.connack
        if isinstance(connack, mqtt5_codec.ConnAck5):
            said = f" ({connack.reason_string})" if connack.reason_string else ""
            return (f"CONNACK reason code {mqtt5_codec.describe_reason(connack.reason_code)}"
                    f"{said}")
        return f"CONNACK return code {describe_connack(connack.return_code)}"

    def read(self, max_bytes: int = DEFAULT_MAX_PACKET_BYTES) -> Packet | mqtt5_codec.Packet5:
        """The next whole packet, decoded in the session's version (see read_packet)."""
        first, body = read_frame(self.stream, max_bytes)
        if self.protocol == "5":
            return mqtt5_codec.decode_body(first, body)
        return decode_body(first, body)

    def subscribe(self, packet_id: int, filters: tuple[tuple[str, int], ...]) -> None:
        """Send a SUBSCRIBE of ``(filter, QoS)`` pairs."""
        if self.protocol == "5":
            self.stream.sendall(mqtt5_codec.encode_subscribe(packet_id, filters))
        else:
            self.stream.sendall(encode(Subscribe(packet_id, filters)))

    def disconnect(self) -> None:
        """Send DISCONNECT (normal disconnection); a stream already gone is no error."""
        data = (mqtt5_codec.encode_disconnect() if self.protocol == "5"
                else encode(Disconnect()))
        with contextlib.suppress(OSError):
            self.stream.sendall(data)

    def close(self) -> None:
        """Close the stream (without DISCONNECT: see :meth:`disconnect`)."""
        self.stream.close()


def describe_connack(code: int) -> str:
    """A 3.1.1 CONNACK return code with its meaning: ``5 not authorized`` (section
    3.2.2.3)."""
    try:
        meaning = ConnackCode(code).name.lower().replace("_", " ")
    except ValueError:
        meaning = "reserved, not a 3.1.1 return code"
    return f"{code} {meaning}"


def open_stream(endpoint: Endpoint, timeout_s: float,
                credentials: ClientCredentials | None = None) -> ByteStream:
    """A connected stream to ``endpoint`` as its layers say: TCP, then TLS (verified by
    ``endpoint.tls``, with the client certificate of ``credentials`` if any), then the
    WebSocket upgrade at ``endpoint.websocket_path``. TCP_NODELAY is set and
    ``timeout_s`` is the timeout of every step and of the stream.

    Raises OSError (refused, unreachable, timed out), ssl.SSLError (an OSError: the
    handshake failed, OpenSSL's reason in it), WebSocketError / UpgradeRefused (the
    upgrade), or ValueError (a PEM text OpenSSL refused).
    """
    if endpoint.transport != Transport.MQTT_TCP:
        raise ValueError(f"{endpoint.transport}: a stream is opened over mqtt-tcp only")
    context = None if endpoint.tls is None else ssl_context(endpoint.tls, credentials)
    sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
    stream: ByteStream = sock
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            # (the context sends and verifies broker.tls.server_name in the host's place)
            sock = context.wrap_socket(sock, server_hostname=endpoint.host)
            stream = sock
        if endpoint.websocket_path is not None:
            stream = upgrade(sock, endpoint.host, endpoint.port, endpoint.websocket_path)
        return stream
    except BaseException:
        sock.close()
        raise


def connect(endpoint: Endpoint, client_id: str, timeout_s: float, *,
            credentials: ClientCredentials | None = None, protocol: MqttProtocol = "3.1.1",
            keepalive_s: int = 0) -> MqttSession:
    """Open a stream to ``endpoint`` (:func:`open_stream`), send CONNECT in ``protocol``
    with the user name and password of ``credentials``, and return the session with its
    CONNACK; the caller checks :attr:`MqttSession.accepted` and closes it.

    Raises as :func:`open_stream`, and StreamClosed, or MalformedPacket when the first
    packet back is not a CONNACK of that version.
    """
    stream = open_stream(endpoint, timeout_s, credentials)
    try:
        hello = Connect(client_id, keepalive_s=keepalive_s, clean_session=True,
                        username=None if credentials is None else credentials.username,
                        password=None if credentials is None else credentials.password_bytes())
        stream.sendall(mqtt5_codec.encode_connect(hello) if protocol == "5" else encode(hello))
        first, body = read_frame(stream)
        answer = (mqtt5_codec.decode_body(first, body) if protocol == "5"
                  else decode_body(first, body))
        if not isinstance(answer, ConnAck | mqtt5_codec.ConnAck5):
            raise MalformedPacket(f"the answer to CONNECT is {type(answer).__name__}, "
                                  "not CONNACK")
        return MqttSession(stream, protocol, answer)
    except BaseException:
        stream.close()
        raise
