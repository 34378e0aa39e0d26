"""Whether a broker answers MQTT the way a run reaches it: TLS, WebSocket, a user.

The command backend's readiness probe for a listener that is not plain anonymous TCP:
TCP connect, the TLS handshake verified against the endpoint's CA (and name), the
WebSocket upgrade to subprotocol ``mqtt`` (RFC 6455, the CONNECT in a masked binary
frame), then a CONNECT with the run's user name and password, answered by a CONNACK.

Raises :class:`~mqttbed.brokers.reachability.Unreachable` while the broker is not up yet
(polled again), :class:`~mqttbed.brokers.reachability.ConnectRefused` for a CONNACK that
refuses, and :class:`ListenerMismatch` for what waiting cannot fix: a certificate that
does not verify, a WebSocket upgrade answered with another HTTP status.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import struct

from mqttbed.brokers.reachability import ConnectRefused, Unreachable
from mqttbed.core.broker_access import ClientCredentials, EndpointTls
from mqttbed.core.mqtt_codec import (
    ConnAck,
    ConnackCode,
    Connect,
    Disconnect,
    MalformedPacket,
    decode,
    encode,
)
from mqttbed.core.protocol import Endpoint

MAX_ANSWER_BYTES = 1 << 16
WS_BINARY, WS_CLOSE = 0x2, 0x8


class ListenerMismatch(Exception):
    """The listener answers, but not as the run asks; waiting will not change it."""


def tls_context(tls: EndpointTls) -> ssl.SSLContext:
    """A client context that trusts the endpoint's CA alone (or the system's)."""
    context = ssl.create_default_context(cadata=tls.ca_pem)
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def probe_listener(endpoint: Endpoint, credentials: ClientCredentials | None,
                   timeout_s: float, client_id: str | None = None) -> None:
    """One CONNECT as the run's clients make it; returns once a CONNACK accepts it."""
    username = None if credentials is None else credentials.username
    password = None if credentials is None else credentials.password_bytes()
    connect = encode(Connect(client_id or f"mqttbed-ready-{os.getpid()}", keepalive_s=0,
                             username=username, password=password))
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
    except OSError as exc:
        raise Unreachable.from_os_error(exc) from None
    try:
        if endpoint.tls is not None:
            sock = _handshake(sock, endpoint, endpoint.tls)
        if endpoint.websocket_path is not None:
            _upgrade(sock, endpoint)
            sock.sendall(_ws_frame(connect))
            answer = _ws_read(sock)
        else:
            sock.sendall(connect)
            answer = _read_connack(sock)
        try:
            packet = decode(answer)
        except MalformedPacket as exc:
            raise Unreachable(f"an answer to CONNECT that is not MQTT: {exc}") from None
        if not isinstance(packet, ConnAck):
            raise Unreachable(f"CONNECT answered with {type(packet).__name__}, not CONNACK")
        if packet.return_code != ConnackCode.ACCEPTED:
            raise ConnectRefused(packet.return_code)
        disconnect = encode(Disconnect())
        sock.sendall(_ws_frame(disconnect) if endpoint.websocket_path else disconnect)
    except OSError as exc:
        raise Unreachable.from_os_error(exc) from None
    finally:
        sock.close()


def _handshake(sock: socket.socket, endpoint: Endpoint, tls: EndpointTls) -> socket.socket:
    name = tls.server_name or endpoint.host
    try:
        return tls_context(tls).wrap_socket(sock, server_hostname=name)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise ListenerMismatch(f"TLS: certificate verify failed: {exc.verify_message} "
                               f"(server name {name!r})") from None
    except ssl.SSLError as exc:
        # e.g. the broker still starting its TLS listener: tried again
        sock.close()
        raise Unreachable(f"TLS handshake failed: {exc.reason or exc}") from None


def _upgrade(sock: socket.socket, endpoint: Endpoint) -> None:
    """The client's opening handshake (RFC 6455 section 4.1); raises on any answer but 101."""
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET {endpoint.websocket_path} HTTP/1.1\r\n"
                  f"Host: {endpoint.host}:{endpoint.port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise Unreachable("the connection closed during the WebSocket upgrade")
        head += chunk
        if len(head) > MAX_ANSWER_BYTES:
            raise ListenerMismatch("the WebSocket upgrade's answer has no end of headers")
    status_line, _, headers = head.partition(b"\r\n\r\n")[0].decode("latin-1").partition("\r\n")
    if status_line.split()[1:2] != ["101"]:
        raise ListenerMismatch(f"the WebSocket upgrade to {endpoint.websocket_path} was "
                               f"refused: {status_line.strip()!r}")
    if "sec-websocket-protocol: mqtt" not in headers.lower():
        raise ListenerMismatch("the WebSocket upgrade was accepted without subprotocol mqtt")


def _ws_frame(payload: bytes) -> bytes:
    """One final, masked binary frame (a client's frames are masked: RFC 6455 5.3)."""
    mask = os.urandom(4)
    length = len(payload)
    if length < 126:
        head = struct.pack("!BB", 0x80 | WS_BINARY, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", 0x80 | WS_BINARY, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", 0x80 | WS_BINARY, 0x80 | 127, length)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise Unreachable("the broker closed the connection after CONNECT, without a "
                              "CONNACK")
        data += chunk
    return data


def _ws_read(sock: socket.socket) -> bytes:
    """The MQTT bytes of the broker's binary frames, up to one whole packet."""
    data = b""
    while True:
        first, second = _recv_exactly(sock, 2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", _recv_exactly(sock, 2))[0]
        elif length == 127:
            length = struct.unpack("!Q", _recv_exactly(sock, 8))[0]
        if length > MAX_ANSWER_BYTES:
            raise ListenerMismatch(f"a WebSocket frame of {length} bytes answered CONNECT")
        mask = _recv_exactly(sock, 4) if second & 0x80 else b""
        payload = _recv_exactly(sock, length)
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        if first & 0x0F == WS_CLOSE:
            code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
            raise Unreachable(f"the broker closed the WebSocket (close code {code}) after "
                              "CONNECT, without a CONNACK")
        data += payload
        if len(data) >= 2 and len(data) >= 2 + data[1]:   # a CONNACK's length is one byte
            return data


def _read_connack(sock: socket.socket) -> bytes:
    head = _recv_exactly(sock, 2)
    return head + _recv_exactly(sock, head[1] & 0x7F)
