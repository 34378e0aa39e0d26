"""A minimal blocking WebSocket client (RFC 6455) carrying MQTT: the upgrade and frames.

For mqttbed's own small clients of a broker on a ``ws``/``wss`` listener (the deploy and
readiness probes, the ``$SYS`` sampler; the paho client asks it the HTTP status of an
upgrade paho saw refused), not for the agents' hot path. :func:`upgrade` runs the
client handshake on a connected socket (plain or TLS): a GET asking for the subprotocol
``mqtt``, a ``101`` whose ``Sec-WebSocket-Accept`` matches the key sent and which chose
``mqtt``. The :class:`WebSocketStream` it returns looks like a socket to the MQTT code
(``sendall``, ``recv``, ``settimeout``, ``shutdown``, ``close``): each ``sendall`` is one
masked binary frame; ``recv`` returns the bytes of binary and continuation frames
(MQTT packets may be cut across frames anywhere, section 6 of MQTT 5), answers a ping
with a pong, and returns ``b""`` once the server closed (as a socket does).

Section numbers refer to RFC 6455.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import struct
from typing import NoReturn

ACCEPT_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"   # section 1.3
SUBPROTOCOL = "mqtt"
MAX_RESPONSE_HEAD_BYTES = 16 * 1024
# A probe or monitor has no use for a larger frame; bounding it bounds what a
# misbehaving server can make this process allocate.
MAX_FRAME_BYTES = (1 << 20) + 1024

OP_CONTINUATION, OP_TEXT, OP_BINARY = 0x0, 0x1, 0x2
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA
CLOSE_NORMAL, CLOSE_PROTOCOL_ERROR = 1000, 1002


class WebSocketError(ConnectionError):
    """The server did not speak WebSocket as RFC 6455 asks; the message says how."""


class UpgradeRefused(WebSocketError):
    """The server answered the upgrade with another HTTP status than 101."""

    def __init__(self, status_line: str):
        self.status_line = status_line
        parts = status_line.split(maxsplit=2)
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        super().__init__(f"the WebSocket upgrade was refused: {status_line or 'no status'}")


def accept_value(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` a server must answer ``key`` with (section 4.2.2)."""
    digest = hashlib.sha1((key + ACCEPT_GUID).encode("ascii")).digest()
    return base64.b64encode(digest).decode("ascii")


def upgrade(sock: socket.socket, host: str, port: int, path: str) -> WebSocketStream:
    """Upgrade the connected ``sock`` to a WebSocket carrying ``mqtt`` at ``path``.

    Raises UpgradeRefused (the HTTP status named), WebSocketError (no HTTP answer, or a
    101 that is not a valid one), or OSError (the socket's own: a timeout, a reset).
    """
    key = base64.b64encode(os.urandom(16)).decode("ascii")
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    request = (f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n")
    sock.sendall(request.encode("ascii"))
    head, rest = _read_head(sock)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    if status_line.split()[1:2] != ["101"]:
        raise UpgradeRefused(status_line.strip())
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("upgrade", "").lower() != "websocket":
        raise WebSocketError(f"the 101 answer's Upgrade header is "
                             f"{headers.get('upgrade')!r}, not websocket (section 4.1)")
    if headers.get("sec-websocket-accept") != accept_value(key):
        raise WebSocketError("the 101 answer's Sec-WebSocket-Accept does not match the key "
                             "sent (section 4.1): not a WebSocket server")
    chosen = headers.get("sec-websocket-protocol")
    if chosen != SUBPROTOCOL:
        raise WebSocketError(f"the server upgraded with subprotocol {chosen!r}, not "
                             f"{SUBPROTOCOL!r}: MQTT over WebSocket needs it (MQTT 5 "
                             "section 6)")
    return WebSocketStream(sock, rest)


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The HTTP response head (without its blank line) and what came after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_RESPONSE_HEAD_BYTES:
            raise WebSocketError(f"the answer to the upgrade has no end of headers within "
                                 f"{MAX_RESPONSE_HEAD_BYTES} bytes: not HTTP")
        chunk = sock.recv(4096)
        if not chunk:
            first = data.split(b"\r\n", 1)[0].decode("latin-1").strip()
            if first.startswith("HTTP/"):
                raise UpgradeRefused(first)
            raise WebSocketError("the connection closed before an answer to the upgrade "
                                 "(is the port a WebSocket listener?)"
                                 + (f" (it sent {len(data)} bytes that are not HTTP)"
                                    if data else ""))
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def mask(payload: bytes, key: bytes) -> bytes:
    """``payload`` XORed with the 4-byte ``key`` repeated (section 5.3); its own inverse."""
    if not payload:
        return b""
    repeated = (key * (len(payload) // 4 + 1))[:len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(
        len(payload), "big")


def encode_frame(opcode: int, payload: bytes, mask_key: bytes | None = None) -> bytes:
    """One final frame as a client sends it: masked with ``mask_key`` (random if None)."""
    key = os.urandom(4) if mask_key is None else mask_key
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    return header + key + mask(payload, key)


class WebSocketStream:
    """A WebSocket connection as a byte stream (see the module docstring)."""

    def __init__(self, sock: socket.socket, already_read: bytes = b""):
        self.sock = sock
        self._raw = bytearray(already_read)     # read from the socket, not yet parsed
        self._data = bytearray()                # payload bytes not yet returned
        self._closed = False                    # the server's close frame came

    # -- the socket-like surface ----------------------------------------------------------

    def sendall(self, data: bytes) -> None:
        """Send ``data`` as one masked binary frame."""
        self.sock.sendall(encode_frame(OP_BINARY, bytes(data)))

    def recv(self, count: int) -> bytes:
        """Up to ``count`` payload bytes; ``b""`` once the server closed the WebSocket."""
        while not self._data and not self._closed:
            self._read_frame()
        chunk = bytes(self._data[:count])
        del self._data[:count]
        return chunk

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        """Send a close frame (best effort) and close the socket."""
        if not self._closed:
            with contextlib.suppress(OSError):
                self.sock.sendall(encode_frame(OP_CLOSE, struct.pack("!H", CLOSE_NORMAL)))
        self.sock.close()

    def __enter__(self) -> WebSocketStream:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- frames ---------------------------------------------------------------------------

    def _read_frame(self) -> None:
        """Read one frame; keep a data frame's payload, answer the control frames."""
        first, second = self._take(2)
        fin_rsv, opcode = first & 0xF0, first & 0x0F
        if fin_rsv & 0x70:
            self._fail(f"a frame has reserved bits {fin_rsv & 0x70:#x} set, no extension "
                       "was agreed (section 5.2)")
        if second & 0x80:
            self._fail("the server sent a masked frame (section 5.1)")
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", self._take(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", self._take(8))[0]
        if opcode >= OP_CLOSE and (length > 125 or not first & 0x80):
            self._fail("a control frame is fragmented or longer than 125 bytes (section 5.5)")
        if length > MAX_FRAME_BYTES:
            self._fail(f"a frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
        payload = self._take(length)
        if opcode in (OP_BINARY, OP_CONTINUATION):
            self._data += payload
        elif opcode == OP_PING:
            self.sock.sendall(encode_frame(OP_PONG, payload))
        elif opcode == OP_CLOSE:
            self._closed = True
            # echo the close (section 5.5.1); the server may have gone already
            with contextlib.suppress(OSError):
                self.sock.sendall(encode_frame(OP_CLOSE, payload[:2]))
        elif opcode == OP_TEXT:
            self._fail("the server sent a text frame: MQTT travels in binary frames "
                       "(MQTT 5 section 6)")
        elif opcode != OP_PONG:
            self._fail(f"opcode {opcode:#x} is reserved (section 5.2)")

    def _take(self, count: int) -> bytes:
        """``count`` raw bytes of the connection; ConnectionError if it ends first."""
        while len(self._raw) < count:
            chunk = self.sock.recv(max(4096, count - len(self._raw)))
            if not chunk:
                raise ConnectionResetError(f"the WebSocket connection closed without a close "
                                           f"frame, {len(self._raw)} of {count} bytes into "
                                           "a frame")
            self._raw += chunk
        taken = bytes(self._raw[:count])
        del self._raw[:count]
        return taken

    def _fail(self, reason: str) -> NoReturn:
        with contextlib.suppress(OSError):
            self.sock.sendall(encode_frame(OP_CLOSE, struct.pack("!H", CLOSE_PROTOCOL_ERROR)))
        raise WebSocketError(reason)
