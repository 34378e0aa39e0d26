"""One MQTT 5 connection of a node: framing, QoS 1/2 both ways, a window of messages in flight.

Both of a node's kinds of connection build on :class:`MqttConnection`: its client
connection to the local Mosquitto (:mod:`.local`) and its links to other nodes
(:mod:`.links`). Everything runs in callbacks of one asyncio loop with no awaits in
between, so a message is handled, acknowledged and forwarded in one go, in the order it
arrived. TCP_NODELAY is set on every socket: a PUBREC held back by Nagle's algorithm
would stall the QoS 2 handshake by a delayed-ACK period.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque

from mqttbed.brokers.mqttst import mqtt5
from mqttbed.brokers.mqttst.mqtt5 import Ack, FrameBuffer, Packet, Publish
from mqttbed.core.mqtt_codec import MalformedPacket, PacketType, encode_remaining_length

logger = logging.getLogger("mqttbed.mqtt-st")

_AWAITED_AFTER_PUBLISH = {1: PacketType.PUBACK, 2: PacketType.PUBREC}


def wire_size(body: bytes) -> int:
    """The bytes a packet with ``body`` takes on the wire (fixed header included)."""
    return 1 + len(encode_remaining_length(len(body))) + len(body)


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Disable Nagle's algorithm on the transport's TCP socket."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class MqttConnection(asyncio.Protocol):
    """An MQTT 5 byte stream with the QoS 1/2 bookkeeping of both directions.

    Subclasses get :meth:`on_ready` once the transport is up, :meth:`on_packet` for every
    packet but the acknowledgements of QoS flows (handled here), and :meth:`on_lost`
    once when the connection ends, for whatever reason.
    """

    def __init__(self, window: int, max_packet_bytes: int = mqtt5.MAX_PACKET_BYTES):
        self.transport: asyncio.Transport | None = None
        self.window = window
        self.frames = FrameBuffer(max_packet_bytes)
        self.last_heard = time.monotonic()
        self.closed = False
        self.close_reason: str | None = None
        self._in_flight: dict[int, PacketType] = {}   # packet id -> the ack awaited
        self._pending: deque[Publish] = deque()
        self._next_packet_id = 1
        self._received_qos2: set[int] = set()

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        set_nodelay(transport)
        self.transport = transport
        self.on_ready()

    def data_received(self, data: bytes) -> None:
        self.last_heard = time.monotonic()
        try:
            for first, body in self.frames.feed(data):
                if self.closed:
                    return
                self._dispatch(mqtt5.decode(first, body), wire_size(body))
        except MalformedPacket as exc:
            self.protocol_error(f"malformed packet: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.close_reason is None:
            self.close_reason = f"connection lost: {exc}" if exc else "closed by the peer"
        self.closed = True
        self.on_lost(self.close_reason)

    # -- hooks ----------------------------------------------------------------------------

    def on_ready(self) -> None:
        """The transport is up."""

    def on_packet(self, packet: Packet, size: int) -> None:
        """A packet other than PUBACK/PUBREC/PUBREL/PUBCOMP arrived (``size`` wire bytes)."""

    def on_lost(self, reason: str) -> None:
        """The connection ended (called once)."""

    def protocol_error(self, reason: str) -> None:
        """The peer broke the protocol: drop the connection (MQTT 5 section 4.13)."""
        self.abort(reason)

    # -- sending ------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def publish(self, message: Publish) -> None:
        """Send ``message`` at its QoS; beyond the window it waits for a free slot."""
        if message.qos == 0:
            self.send(mqtt5.encode_publish(message))
        elif len(self._in_flight) < self.window:
            self._send_in_window(message)
        else:
            self._pending.append(message)

    def in_flight(self) -> int:
        """QoS 1/2 messages sent and not yet acknowledged, plus those waiting for the window."""
        return len(self._in_flight) + len(self._pending)

    def _send_in_window(self, message: Publish) -> None:
        packet_id = self._next_packet_id
        while packet_id in self._in_flight:
            packet_id = packet_id % 0xFFFF + 1
        self._next_packet_id = packet_id % 0xFFFF + 1
        self._in_flight[packet_id] = _AWAITED_AFTER_PUBLISH[message.qos]
        self.send(mqtt5.encode_publish(message, packet_id))

    def _release(self, packet_id: int) -> None:
        del self._in_flight[packet_id]
        while self._pending and len(self._in_flight) < self.window:
            self._send_in_window(self._pending.popleft())

    # -- receiving ----------------------------------------------------------------------

    def accept_publish(self, message: Publish) -> bool:
        """Acknowledge an incoming PUBLISH; False if it repeats a QoS 2 one still held."""
        packet_id = message.packet_id  # never None at QoS 1 and 2 (decode makes sure)
        if message.qos == 1 and packet_id is not None:
            self.send(mqtt5.encode(Ack(PacketType.PUBACK, packet_id)))
        elif message.qos == 2 and packet_id is not None:
            self.send(mqtt5.encode(Ack(PacketType.PUBREC, packet_id)))
            if packet_id in self._received_qos2:
                return False
            self._received_qos2.add(packet_id)
        return True

    def _dispatch(self, packet: Packet, size: int) -> None:
        if not isinstance(packet, Ack):
            self.on_packet(packet, size)
            return
        kind, packet_id = packet.packet_type, packet.packet_id
        if kind == PacketType.PUBREL:
            self._received_qos2.discard(packet_id)
            self.send(mqtt5.encode(Ack(PacketType.PUBCOMP, packet_id)))
            return
        if self._in_flight.get(packet_id) != kind:
            logger.debug("%s for packet id %d, which awaits %s: ignored", kind.name, packet_id,
                         self._in_flight.get(packet_id))
            return
        if kind == PacketType.PUBREC and packet.reason_code < 0x80:
            self._in_flight[packet_id] = PacketType.PUBCOMP
            self.send(mqtt5.encode(Ack(PacketType.PUBREL, packet_id)))
        else:   # PUBACK, PUBCOMP, or a PUBREC refusing the message: the flow ends
            self._release(packet_id)

    # -- closing ------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Drop the connection at once, recording ``reason``."""
        if self.close_reason is None:
            self.close_reason = reason
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def close(self, reason: str, disconnect: bool = True) -> None:
        """Send DISCONNECT (unless told not to) and close after the buffered bytes."""
        if self.close_reason is None:
            self.close_reason = reason
        if self.transport is not None and not self.closed:
            if disconnect:
                self.send(mqtt5.encode(mqtt5.Disconnect()))
            self.transport.close()
