"""MQTT 3.1.1 over one blocking TCP socket: open a session, read whole packets.

For the small clients around a run (a broker's readiness probe, the ``$SYS`` sampler),
not for the agents' hot path (:mod:`mqttbed.agents.mqtt_tcp`). Packets are built and
parsed by :mod:`mqttbed.core.mqtt_codec`.
"""

from __future__ import annotations

import socket

from mqttbed.core.mqtt_codec import (
    ConnAck,
    Connect,
    MalformedPacket,
    Packet,
    decode_body,
    decode_remaining_length,
    encode,
)

# A probe or monitor has no use for a larger packet; bounding it bounds what a
# misbehaving peer can make this process allocate.
DEFAULT_MAX_PACKET_BYTES = 1 << 20


class StreamClosed(ConnectionError):
    """The peer closed the connection (before a packet, or in the middle of one)."""


def read_exactly(sock: socket.socket, count: int) -> bytes:
    """``count`` bytes from ``sock``; StreamClosed if it ends first."""
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise StreamClosed(f"connection closed after {len(data)} of {count} bytes")
        data += chunk
    return bytes(data)


def read_packet(sock: socket.socket, max_bytes: int = DEFAULT_MAX_PACKET_BYTES) -> Packet:
    """Read one whole packet from ``sock`` (blocking, within the socket's timeout).

    Raises StreamClosed when the peer closes, MalformedPacket for bytes that are not a
    well-formed packet (or one over ``max_bytes``), TimeoutError on the socket's timeout.
    """
    header = bytearray(read_exactly(sock, 1))
    # The remaining length is one to four bytes, each but the last with its top bit set.
    while len(header) < 5:
        header += read_exactly(sock, 1)
        if not header[-1] & 0x80:
            break
    length, _ = decode_remaining_length(bytes(header))
    if length > max_bytes:
        raise MalformedPacket(f"packet of {length} bytes exceeds the {max_bytes}-byte limit")
    return decode_body(header[0], read_exactly(sock, length))


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
