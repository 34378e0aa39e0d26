"""A lean MQTT 3.1.1 client over TCP for the agents' hot path, on mqttbed's own codec.

One non-blocking socket per client, driven by the session's selector loop (no threads).
Received bytes land in one ``bytearray`` per client and are framed in place: a PUBLISH is
handed to the session as (topic, buffer, start, end) without copying its payload; the
topic string is the subscription's own object when the bytes match it (no decode). Sent
packets are appended to one output ``bytearray`` and written with one ``send`` per socket
per loop turn (:meth:`flush`), however many the turn produced (a publisher's burst, the
acknowledgements a read needs). Control packets, rare, go through
:mod:`mqttbed.core.mqtt_codec`.

QoS 0, 1 and 2 both ways: PUBACK for a QoS 1 delivery; PUBREC, then PUBCOMP on PUBREL for
QoS 2 (delivered once, at the PUBLISH; a DUP of a packet id still awaiting its PUBREL is
not delivered again); PUBACK, or PUBREC -> PUBREL -> PUBCOMP, for its own publishes, each
completed flow reported through ``on_acked``. Keep-alive: PINGREQ when nothing was sent
for half the interval, and a failure when its PINGRESP does not come within the interval.
Kernel receive timestamps (SO_TIMESTAMPNS) when a clock map is given: see
:mod:`mqttbed.agents.rx_timestamps` for how a read's stamp is given to its packets.

A user name and password go in CONNECT when the run has them (3.1.1 section 3.1.3.4).
Plain MQTT 3.1.1 over TCP only: no TLS, no WebSocket, no MQTT 5, no reconnect; a run that
needs them runs the native engine or paho (``workload.client``), and the session refuses
this client for it, naming what the run needs. The connection's phases (TCP connect,
CONNECT written to CONNACK read) are timed on the monotonic clock (:attr:`times`).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Callable

from mqttbed.agents import rx_timestamps
from mqttbed.agents.connect_times import ConnectTimes
from mqttbed.agents.rx_timestamps import RealtimeToMonotonic
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.mqtt_codec import (
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    PacketIdAck,
    PacketType,
    PingReq,
    PingResp,
    SubAck,
    Subscribe,
    decode_body,
    encode,
    encode_remaining_length,
    encode_string,
)

CONNECT_TIMEOUT_S = 10.0
RECEIVE_BUFFER_BYTES = 1 << 16
COMPACT_BELOW_BYTES = 4096       # move a partial packet to the front when less room is left
PINGREQ = encode(PingReq())
DISCONNECT = encode(Disconnect())
_PUBLISH = PacketType.PUBLISH
_PUBACK, _PUBREC, _PUBREL, _PUBCOMP = (int(PacketType.PUBACK), int(PacketType.PUBREC),
                                       int(PacketType.PUBREL), int(PacketType.PUBCOMP))
_U16 = struct.Struct("!H")

# MQTT 3.1.1 Table 3.1: what a refusing CONNACK's return code means
CONNACK_REFUSALS = {1: "unacceptable protocol version", 2: "identifier rejected",
                    3: "server unavailable", 4: "bad user name or password",
                    5: "not authorized"}


def connack_refusal(code: int) -> str:
    """A refusing MQTT 3.1.1 CONNACK return code with its meaning, e.g. ``return code 4
    (bad user name or password)``."""
    return f"return code {code} ({CONNACK_REFUSALS.get(code, 'reserved')})"


# on_publish(topic, buffer, payload start, payload end, qos, t_user_ns, t_kernel_ns)
OnPublish = Callable[[str, bytearray, int, int, int, int, "int | None"], None]


class TcpMqttClient:
    """One MQTT 3.1.1 client on one non-blocking TCP socket, driven by the caller's loop."""

    def __init__(self, client_id: str, *,
                 on_connack: Callable[[int], None],
                 on_suback: Callable[[tuple[int, ...]], None],
                 on_publish: OnPublish,
                 on_acked: Callable[[], None],
                 on_failure: Callable[[str], None],
                 on_backlog: Callable[[], None] | None = None,
                 clock: RealtimeToMonotonic | None = None,
                 receive_buffer_bytes: int = RECEIVE_BUFFER_BYTES,
                 username: str | None = None, password: bytes | None = None):
        if password is not None and username is None:
            raise ValueError(f"{client_id}: a password without a user name cannot go in an "
                             "MQTT 3.1.1 CONNECT (section 3.1.2.9): give the user name")
        self.client_id = client_id
        self._username = username
        self._password = password  # never printed: only encoded into CONNECT
        self.times = ConnectTimes()
        self._on_connack = on_connack
        self._on_suback = on_suback
        self._on_publish = on_publish
        self._on_acked = on_acked
        self._on_failure = on_failure
        self._on_backlog = on_backlog
        self._clock = clock
        self._sock: socket.socket | None = None
        self._in = bytearray(receive_buffer_bytes)
        self._start = 0          # first unframed byte of _in
        self._end = 0            # end of the bytes received into _in
        self._out = bytearray()
        self._keepalive_ns = 0
        self._last_sent_ns = 0
        self._ping_sent_ns: int | None = None
        self._next_packet_id = 0
        self._inflight: dict[int, int] = {}        # own QoS 1/2 publishes: packet id -> ack awaited
        self._awaiting_pubrel: set[int] = set()    # QoS 2 deliveries: packet ids before PUBREL
        self._topics: list[tuple[bytes, str]] = []  # subscribed filters without wildcards
        self._prefixes: dict[tuple[str, int, int], bytes] = {}
        self._closing = False
        self.kernel_stamps = False
        self.dead = False        # the connection failed or the broker closed it
        self.pings_answered = 0
        self.reads = 0

    # -- the surface MqttSession drives -------------------------------------------------

    def connect(self, host: str, port: int, keepalive: int = 60) -> None:
        """Open the TCP connection (TCP_NODELAY, kernel stamps) and send CONNECT."""
        times = self.times
        times.t_start_ns = times.t_tcp_start_ns = monotonic_ns()
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        times.t_tcp_done_ns = monotonic_ns()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._clock is not None:
            self.kernel_stamps = rx_timestamps.enable(sock)
        sock.setblocking(False)
        self._sock = sock
        self._keepalive_ns = keepalive * 1_000_000_000
        self._out += encode(Connect(self.client_id, keepalive, True,
                                    username=self._username, password=self._password))
        self.flush()
        times.t_connect_sent_ns = self._last_sent_ns

    def socket(self) -> socket.socket | None:
        """Return the client's socket (None before connect or after close)."""
        return self._sock

    def subscribe(self, topic: str, qos: int = 0) -> tuple[int, int]:
        """Send SUBSCRIBE for one filter; return (0, packet id) like paho."""
        packet_id = self._new_packet_id()
        if "+" not in topic and "#" not in topic:
            self._topics.append((topic.encode(), topic))
        self._out += encode(Subscribe(packet_id, ((topic, qos),)))
        self.flush()
        return 0, packet_id

    def publish(self, topic: str, payload: bytes, qos: int = 0) -> None:
        """Queue one PUBLISH; it leaves at the next :meth:`flush` (the session's turn end)."""
        prefix = self._prefixes.get((topic, qos, len(payload)))
        if prefix is None:
            prefix = self._prefix(topic, qos, len(payload))
        out = self._out
        out += prefix
        if qos:
            packet_id = self._new_packet_id()
            self._inflight[packet_id] = _PUBACK if qos == 1 else _PUBREC
            out += _U16.pack(packet_id)
        out += payload

    def _prefix(self, topic: str, qos: int, size: int) -> bytes:
        """Fixed header and topic of a PUBLISH of ``size`` payload bytes (cached: a
        publisher sends one size to one topic)."""
        if qos not in (0, 1, 2):
            raise ValueError(f"QoS {qos} is not 0, 1 or 2")
        field = encode_string(topic)
        remaining = len(field) + (2 if qos else 0) + size
        prefix = bytes(((_PUBLISH << 4) | (qos << 1),)) + encode_remaining_length(remaining) + field
        if len(self._prefixes) < 64:
            self._prefixes[(topic, qos, size)] = prefix
        return prefix

    def want_write(self) -> bool:
        """True while queued bytes wait to be written."""
        return bool(self._out)

    def loop_write(self) -> int:
        """Write what is queued (as :meth:`flush`); paho's name."""
        self.flush()
        return 0

    def flush(self) -> None:
        """Write every queued packet with one ``send``; what the socket does not take
        stays queued (and ``on_backlog`` is told)."""
        out = self._out
        if not out or self._sock is None or self.dead:
            return
        try:
            sent = self._sock.send(out)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._fail(f"send failed: {exc}")
            return
        self._last_sent_ns = monotonic_ns()
        if sent == len(out):
            out.clear()
            return
        del out[:sent]
        if self._on_backlog is not None:
            self._on_backlog()

    def loop_read(self) -> None:
        """Read what the socket holds, frame and handle every whole packet, then write the
        acknowledgements it produced."""
        sock = self._sock
        if sock is None or self.dead:
            if sock is not None:  # drain what a dead connection still delivers
                with contextlib.suppress(OSError):
                    sock.recv(1 << 16)
            return
        ancillary = rx_timestamps.ANCILLARY_BYTES if self.kernel_stamps else 0
        while True:
            if len(self._in) - self._end < COMPACT_BELOW_BYTES:
                self._make_room()
            try:
                count, anc, _flags, _addr = sock.recvmsg_into(
                    [memoryview(self._in)[self._end:]], ancillary)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._fail(f"connection lost: {exc}")
                return
            t_user = monotonic_ns()
            if count == 0:
                self._fail("broker closed the connection")
                return
            self.reads += 1
            t_kernel = None
            if anc:
                stamp = rx_timestamps.realtime_ns(anc)
                if stamp is not None and self._clock is not None:
                    t_kernel = self._clock.monotonic(stamp)
            room = len(self._in) - self._end
            self._end += count
            try:
                self._frame(t_user, t_kernel)
            except MalformedPacket as exc:
                self._fail(f"malformed packet from the broker: {exc}")
                return
            if self.dead or count < room:
                break  # the socket is drained (or the client failed)
        self.flush()

    def loop_misc(self) -> int:
        """Send PINGREQ when nothing was sent for half the keep-alive; fail when the last
        one's PINGRESP is overdue by a whole interval."""
        if self._sock is None or self.dead or not self._keepalive_ns:
            return 0
        now = monotonic_ns()
        if self._ping_sent_ns is not None and now - self._ping_sent_ns > self._keepalive_ns:
            self._fail("no PINGRESP within the keep-alive interval")
            return 0
        if self._ping_sent_ns is None and now - self._last_sent_ns >= self._keepalive_ns // 2:
            self._out += PINGREQ
            self._ping_sent_ns = now
            self.flush()
        return 0

    def disconnect(self) -> None:
        """Queue DISCONNECT (the session writes it, then closes the socket)."""
        self._closing = True
        if self._sock is not None:
            self._out += DISCONNECT

    def close(self) -> None:
        """Close the socket; safe to call twice."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- framing --------------------------------------------------------------------------

    def _make_room(self) -> None:
        """Move a partial packet to the front, or grow the buffer for one larger than it."""
        buf, start, end = self._in, self._start, self._end
        if start:
            buf[:end - start] = buf[start:end]
            self._start, self._end = 0, end - start
        if len(buf) - self._end < COMPACT_BELOW_BYTES:
            buf.extend(bytes(len(buf)))  # doubles; a large payload's packet must fit whole

    def _frame(self, t_user: int, t_kernel: int | None) -> None:
        """Handle every whole packet in the buffer; keep a partial one for the next read."""
        buf, pos, end = self._in, self._start, self._end
        while end - pos >= 2:
            length, multiplier, at = 0, 1, pos + 1
            while True:
                if at >= end:
                    self._start = pos
                    return
                byte = buf[at]
                at += 1
                length += (byte & 0x7F) * multiplier
                if byte < 0x80:
                    break
                multiplier <<= 7
                if at - pos > 4:
                    raise MalformedPacket("remaining length runs past four bytes "
                                          "(section 2.2.3)")
            packet_end = at + length
            if packet_end > end:
                break
            first = buf[pos]
            if first >> 4 == _PUBLISH:
                self._publish_received(first, at, packet_end, t_user, t_kernel)
            else:
                self._control(first, at, packet_end)
            pos = packet_end
            if self.dead:
                return
        if pos == end:
            self._start = self._end = 0
        else:
            self._start = pos

    def _publish_received(self, first: int, at: int, end: int, t_user: int,
                          t_kernel: int | None) -> None:
        buf = self._in
        qos = (first >> 1) & 0x03
        if qos == 3:
            raise MalformedPacket("PUBLISH QoS 3 is not allowed (section 3.3.1.2)")
        topic_length = (buf[at] << 8) | buf[at + 1]
        topic_start = at + 2
        payload_start = topic_start + topic_length
        topic = None
        for raw, text in self._topics:
            if len(raw) == topic_length and buf.startswith(raw, topic_start):
                topic = text
                break
        if topic is None:  # a wildcard subscription: decode the name
            try:
                topic = buf[topic_start:payload_start].decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedPacket("PUBLISH topic name is not valid UTF-8") from None
        if qos:
            packet_id = (buf[payload_start] << 8) | buf[payload_start + 1]
            payload_start += 2
            if qos == 1:
                self._out += bytes((_PUBACK << 4, 2, packet_id >> 8, packet_id & 0xFF))
            else:
                self._out += bytes((_PUBREC << 4, 2, packet_id >> 8, packet_id & 0xFF))
                if packet_id in self._awaiting_pubrel:
                    return  # a DUP of a message already delivered
                self._awaiting_pubrel.add(packet_id)
        if payload_start > end:
            raise MalformedPacket("PUBLISH shorter than its topic name")
        self._on_publish(topic, buf, payload_start, end, qos, t_user, t_kernel)

    def _control(self, first: int, at: int, end: int) -> None:
        kind = first >> 4
        if kind in (_PUBACK, _PUBREC, _PUBREL, _PUBCOMP) and end - at == 2:
            packet_id = (self._in[at] << 8) | self._in[at + 1]
            self._ack(kind, packet_id)
            return
        packet = decode_body(first, bytes(self._in[at:end]))
        if type(packet) is ConnAck:
            self.times.t_connack_ns = monotonic_ns()
            self._on_connack(packet.return_code)
        elif type(packet) is SubAck:
            self._on_suback(packet.return_codes)
        elif type(packet) is PingResp:
            self._ping_sent_ns = None
            self.pings_answered += 1
        elif type(packet) is PacketIdAck:
            self._ack(int(packet.packet_type), packet.packet_id)
        else:
            raise MalformedPacket(f"unexpected {type(packet).__name__} from the broker")

    def _ack(self, kind: int, packet_id: int) -> None:
        """One step of a QoS 1/2 flow, ours (PUBACK, PUBREC, PUBCOMP) or the broker's
        (PUBREL)."""
        if kind == _PUBREL:
            self._awaiting_pubrel.discard(packet_id)
            self._out += bytes((_PUBCOMP << 4, 2, packet_id >> 8, packet_id & 0xFF))
            return
        awaited = self._inflight.get(packet_id)
        if awaited != kind:
            raise MalformedPacket(f"{PacketType(kind).name} for packet id {packet_id}, which "
                                  f"awaits {PacketType(awaited).name if awaited else 'nothing'}")
        if kind == _PUBREC:
            self._inflight[packet_id] = _PUBCOMP
            self._out += bytes(((_PUBREL << 4) | 0x02, 2, packet_id >> 8, packet_id & 0xFF))
            return
        del self._inflight[packet_id]
        self._on_acked()

    # -- internals ----------------------------------------------------------------------

    def _new_packet_id(self) -> int:
        for _ in range(0xFFFF):
            self._next_packet_id = self._next_packet_id % 0xFFFF + 1
            if self._next_packet_id not in self._inflight:
                return self._next_packet_id
        raise RuntimeError(f"{self.client_id}: 65535 publishes await acknowledgement")

    def _fail(self, reason: str) -> None:
        """Stop using the connection and report ``reason`` (unless this client was
        disconnecting). The socket stays open, registered in the session's selector, until
        the session closes it."""
        if self.dead:
            return
        self.dead = True
        self._out.clear()
        if not self._closing:
            self._on_failure(reason)
