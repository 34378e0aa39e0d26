"""One client connection of the adaptive broker: MQTT 3.1.1 framing, QoS 0/1/2 in, writer out.

Everything runs in callbacks of one asyncio loop with no awaits in between, so a PUBLISH
is acknowledged, classified and queued to every subscriber in one go, in arrival order.

**Writer.** Each subscriber's :class:`~.outbox.Outbox` is drained into the socket only
while the transport's write buffer is under its high-water mark (``write_buffer_bytes``;
asyncio's ``pause_writing``/``resume_writing``). So a large message handed to a slow
socket stops the writer, and what arrives meanwhile waits in the outbox, where a small
message still overtakes every large one not yet written.

**What a client gets.** SUBSCRIBE grants at most QoS 1 (a QoS 2 PUBLISH is accepted with
its full flow, PUBREC/PUBREL/PUBCOMP, and delivered at most at QoS 1); a delivery goes
out at the lower of the publication's QoS and the best granted QoS of the client's
matching filters, once, however many of its filters match. Sessions are clean: a CONNECT
with clean session 0 is accepted with session present 0, nothing is kept after a
disconnect, and QoS 1 deliveries are not resent (3.1.1 resends only on reconnect).
Retained messages are not stored; the retain flag is never set on delivery. A will is
published when the connection ends without DISCONNECT.

**Bad input.** A malformed packet, a first packet other than CONNECT, a second CONNECT,
or a packet a client never sends (CONNACK, SUBACK, ...) closes that connection (3.1.1
section 4.8); it is counted and never touches another session. A client silent for 1.5
keep-alive periods is disconnected (3.1.1 section 3.1.2.10).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from mqttbed.brokers.adaptive.outbox import Outbox
from mqttbed.brokers.adaptive.rtt import RttProbe
from mqttbed.brokers.adaptive.tally import ClientTally
from mqttbed.brokers.mqttst.mqtt5 import FrameBuffer
from mqttbed.brokers.mqttst.session import set_nodelay
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.mqtt_codec import (
    PROTOCOL_LEVEL,
    PROTOCOL_NAME,
    SUBACK_FAILURE,
    ConnAck,
    ConnackCode,
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
    PacketIdAck,
    PacketType,
    PingReq,
    PingResp,
    Publish,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
    decode_body,
    encode,
)

if TYPE_CHECKING:
    from mqttbed.brokers.adaptive.broker import AdaptiveBroker

logger = logging.getLogger("mqttbed.adaptive")

MAX_GRANTED_QOS = 1
_MAX_PACKET_ID = 0xFFFF


class ClientSession(asyncio.Protocol):
    """One TCP connection: a client before CONNECT, then a session of the broker."""

    def __init__(self, broker: AdaptiveBroker):
        config = broker.config
        self.broker = broker
        self.transport: asyncio.Transport | None = None
        self.frames = FrameBuffer(config.max_packet_bytes)
        self.client_id: str | None = None
        self.keepalive_s = 0
        self.will: Will | None = None
        self.subscriptions: dict[str, int] = {}     # topic filter -> granted QoS
        self.tally = ClientTally(RttProbe(int(config.rtt_query_timeout_s * 1e9)))
        self.outbox = Outbox(broker.ledger, self.tally.counts, config.threshold_bytes,
                             config.max_queued_messages)
        self.probe = self.tally.probe
        self.queried = False
        self.connected_ns = self.last_heard_ns = monotonic_ns()
        self.closing = False    # abort() or close() called
        self.closed = False     # connection_lost() called
        self._paused = False
        self._deliveries_in_flight: dict[int, None] = {}   # QoS 1 packet ids awaiting PUBACK
        self._received_qos2: set[int] = set()
        self._next_packet_id = 1
        self._starvation_timer: asyncio.TimerHandle | None = None
        self._starvation_due_ns: int | None = None

    def __repr__(self) -> str:
        return f"<session {self.client_id!r}>"

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        set_nodelay(transport)
        high = self.broker.config.write_buffer_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)
        self.transport = transport
        self.broker.connection_made(self)

    def data_received(self, data: bytes) -> None:
        self.last_heard_ns = monotonic_ns()
        self.broker.protocol.bytes_in += len(data)
        try:
            for first, body in self.frames.feed(data):
                if self.closing:
                    return
                level = _connect_level(first, body) if self.client_id is None else None
                if level is not None and level != PROTOCOL_LEVEL:
                    # an MQTT 5 CONNECT does not decode as 3.1.1: answer before decoding
                    self._refuse_version(f"protocol level {level}")
                    return
                self._handle(decode_body(first, body))
        except MalformedPacket as exc:
            self.broker.protocol.refuse("malformed packet", self, str(exc))
            self.abort()
        except Exception:   # a bug ends this connection, never the broker
            self.broker.protocol.internal_errors += 1
            logger.exception("internal error on a packet from %r", self)
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if self._starvation_timer is not None:
            self._starvation_timer.cancel()
        self.broker.detach(self, publish_will=True)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self.pump()

    def adopt(self, tally: ClientTally) -> None:
        """Count from now on into ``tally``, the figures of an earlier connection of this
        client id (called on CONNECT, before anything is queued)."""
        tally.probe.new_connection()
        self.tally, self.probe, self.outbox.counts = tally, tally.probe, tally.counts

    # -- packets in ------------------------------------------------------------------------

    def _handle(self, packet: Packet) -> None:
        if self.client_id is None:
            if not isinstance(packet, Connect):
                self._refuse("first packet is not CONNECT", type(packet).__name__)
            else:
                self._on_connect(packet)
            return
        if isinstance(packet, Connect):
            self._refuse("second CONNECT", packet.client_id)
            return
        match packet:
            case Publish():
                self._on_publish(packet)
            case PacketIdAck(packet_type=PacketType.PUBACK):
                self._on_puback(packet.packet_id)
            case PacketIdAck(packet_type=PacketType.PUBREL):
                self._received_qos2.discard(packet.packet_id)
                self.send(encode(PacketIdAck(PacketType.PUBCOMP, packet.packet_id)))
            case Subscribe():
                self._on_subscribe(packet)
            case Unsubscribe():
                for topic_filter in packet.filters:
                    self.subscriptions.pop(topic_filter, None)
                self.broker.subscriptions_changed(self)
                self.send(encode(UnsubAck(packet.packet_id)))
            case PingReq():
                self.send(encode(PingResp()))
            case Disconnect():
                self.will = None
                self.close()
            case _:
                self._refuse("a packet a client never sends", type(packet).__name__)

    def _on_connect(self, connect: Connect) -> None:
        if connect.protocol_name != PROTOCOL_NAME:
            self._refuse_version(f"protocol name {connect.protocol_name!r}")
            return
        if not connect.client_id and not connect.clean_session:
            self.send(encode(ConnAck(ConnackCode.IDENTIFIER_REJECTED)))
            self._refuse("empty client id without clean session", "", flush=True)
            return
        self.client_id = connect.client_id or self.broker.new_client_id()
        self.keepalive_s = connect.keepalive_s
        self.will = connect.will
        self.broker.attach(self)
        self.send(encode(ConnAck()))

    def _on_publish(self, publish: Publish) -> None:
        now_ns = monotonic_ns()
        fresh = True
        packet_id = publish.packet_id  # never None at QoS 1 and 2 (decode makes sure)
        if publish.qos == 1 and packet_id is not None:
            self.send(encode(PacketIdAck(PacketType.PUBACK, packet_id)))
        elif publish.qos == 2 and packet_id is not None:
            self.send(encode(PacketIdAck(PacketType.PUBREC, packet_id)))
            fresh = packet_id not in self._received_qos2
            self._received_qos2.add(packet_id)
        if fresh:
            self.broker.route(publish, now_ns)

    def _on_puback(self, packet_id: int) -> None:
        rtt_s = self.probe.answer(packet_id, monotonic_ns())
        if rtt_s is not None:
            self.broker.rtt_sample(self, rtt_s)
        else:
            self._deliveries_in_flight.pop(packet_id, None)

    def _on_subscribe(self, subscribe: Subscribe) -> None:
        codes = []
        for topic_filter, qos in subscribe.filters:
            if (why := filter_refusal(topic_filter)) is not None:
                self.broker.protocol.refuse("topic filter refused", self, why)
                codes.append(SUBACK_FAILURE)
                continue
            granted = min(qos, MAX_GRANTED_QOS)
            self.subscriptions[topic_filter] = granted
            codes.append(granted)
        self.broker.subscriptions_changed(self)
        self.send(encode(SubAck(subscribe.packet_id, tuple(codes))))

    def _refuse_version(self, detail: str) -> None:
        self.send(encode(ConnAck(ConnackCode.UNACCEPTABLE_PROTOCOL_VERSION)))
        self._refuse("protocol other than MQTT 3.1.1", detail, flush=True)

    def _refuse(self, reason: str, detail: str, flush: bool = False) -> None:
        """Count and log ``reason``, then drop the connection (after the CONNACK if ``flush``)."""
        self.broker.protocol.refuse(reason, self, detail)
        if flush:
            self.close()
        else:
            self.abort()

    # -- out -------------------------------------------------------------------------------

    def send(self, data: bytes | bytearray) -> None:
        if not self.closing and self.transport is not None:
            self.broker.protocol.bytes_out += len(data)
            self.transport.write(data)

    def pump(self) -> None:
        """Write queued deliveries while the socket takes them (express first)."""
        while not self._paused and not self.closing:
            delivery = self.outbox.pop()
            if delivery is None:
                break
            packet_id = self._packet_id() if delivery.qos else None
            packet = delivery.packet(packet_id)
            if delivery.query and packet_id is not None:  # a query goes at QoS 1: it has one
                self.probe.written(packet_id, monotonic_ns())
            elif packet_id is not None:
                self._deliveries_in_flight[packet_id] = None
            self.send(packet)
        self.schedule_starvation()

    def _packet_id(self) -> int:
        in_use = self._deliveries_in_flight
        if len(in_use) + len(self.probe.outstanding) >= _MAX_PACKET_ID:
            del in_use[next(iter(in_use))]   # a client that never acks: forget the oldest
        packet_id = self._next_packet_id
        while packet_id in in_use or packet_id in self.probe.outstanding:
            packet_id = packet_id % _MAX_PACKET_ID + 1
        self._next_packet_id = packet_id % _MAX_PACKET_ID + 1
        return packet_id

    def schedule_starvation(self) -> None:
        """Arm the timer for the oldest withheld message's starvation deadline, if any."""
        due_ns = self.outbox.next_deadline_ns()
        if due_ns == self._starvation_due_ns or self.closing:
            return
        if self._starvation_timer is not None:
            self._starvation_timer.cancel()
            self._starvation_timer = None
        self._starvation_due_ns = due_ns
        if due_ns is not None:
            loop = asyncio.get_running_loop()
            # the loop's clock is CLOCK_MONOTONIC too (time.monotonic)
            self._starvation_timer = loop.call_at(due_ns / 1e9, self._starvation_due)

    def _starvation_due(self) -> None:
        self._starvation_timer = None
        self._starvation_due_ns = None
        self.outbox.release_starved(monotonic_ns())
        self.pump()

    # -- closing ---------------------------------------------------------------------------

    def abort(self) -> None:
        """Drop the connection now; what is queued is lost."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close after the bytes already handed to the socket."""
        self.closing = True
        if self.transport is not None:
            self.transport.close()


def _connect_level(first: int, body: bytes) -> int | None:
    """The protocol level a CONNECT names (read before decoding); None if not a CONNECT."""
    if first >> 4 != PacketType.CONNECT or len(body) < 2:
        return None
    at = 2 + int.from_bytes(body[:2], "big")   # after the protocol name
    return body[at] if len(body) > at else None


def filter_refusal(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a valid MQTT 3.1.1 filter (section 4.7.1), or None."""
    if not topic_filter:
        return "empty topic filter"
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if ("+" in level or "#" in level) and len(level) > 1:
            return f"{topic_filter!r}: a wildcard must fill its level"
        if level == "#" and index != len(levels) - 1:
            return f"{topic_filter!r}: '#' must be the last level"
    return None
