"""An MQTT 3.1.1 client over UDP, one packet per datagram, as the FPGA broker speaks it.

Each client owns one UDP socket, and that socket's address and port are the client's
identity at the broker (the FPGA's Subscriber Table stores exactly that, 48 bits). There
is no connection, but CONNECT/CONNACK still happen because the broker expects them.

The client offers the part of paho's ``Client`` that :class:`MqttSession` drives
(``connect``, ``socket``, ``loop_read``, ``want_write``, ``loop_write``, ``loop_misc``,
``subscribe``, ``publish``, ``disconnect``), so one selector loop runs TCP and UDP
clients with the same code, and a PUBLISH goes out with a single ``send`` call.

UDP does not retransmit. Loopback loses a datagram only when a receive buffer overflows,
but a lost CONNECT or SUBSCRIBE would hang a run's set-up, so those (and UNSUBSCRIBE)
are sent again every ``resend_s`` until acknowledged; the broker treats a repeated
SUBSCRIBE from the same address as the same subscription. PUBLISH is QoS 0 only: a lost
message shows as ``lost`` in the statistics, as it would with the hardware.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from mqttbed.agents import rx_timestamps
from mqttbed.agents.rx_timestamps import RealtimeToMonotonic
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.mqtt_codec import (
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    PingReq,
    PingResp,
    Publish,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    decode,
    encode,
    encode_publish,
)

RESEND_S = 0.5
MAX_DATAGRAM = 65_535


class UdpMqttClient:
    """One MQTT 3.1.1 client on its own UDP socket, driven by the caller's selector loop."""

    # What a subclass speaking another dialect over the same socket handling replaces.
    codec_error: type[ValueError] = MalformedPacket
    ping_datagram = encode(PingReq())
    disconnect_datagram = encode(Disconnect())

    def __init__(self, client_id: str, *,
                 on_connack: Callable[[int], None],
                 on_suback: Callable[[tuple[int, ...]], None],
                 on_message: Callable[[Publish], None],
                 on_failure: Callable[[str], None],
                 on_unsuback: Callable[[int], None] | None = None,
                 resend_s: float = RESEND_S,
                 receive_buffer_bytes: int | None = None,
                 clock: RealtimeToMonotonic | None = None):
        self.client_id = client_id
        self._on_connack = on_connack
        self._on_suback = on_suback
        self._on_message = on_message
        self._on_failure = on_failure
        self._on_unsuback = on_unsuback
        self._resend_ns = int(resend_s * 1e9)
        self._receive_buffer_bytes = receive_buffer_bytes
        self._clock = clock
        self.kernel_stamps = False
        # the kernel's receive time of the datagram being handled (CLOCK_MONOTONIC), or None
        self.rx_kernel_ns: int | None = None
        self._sock: socket.socket | None = None
        self._keepalive_ns = 0
        self._last_sent_ns = 0
        self._next_packet_id = 0
        # Control packets awaiting their acknowledgement: key -> bytes to send again.
        self._pending: dict[str | int, bytes] = {}
        self._next_resend_ns = 0
        self.connack_code: int | None = None
        self.resent = 0
        self.malformed = 0
        self.send_errors = 0
        self.pings_answered = 0

    # -- the surface MqttSession drives -------------------------------------------------

    def connect(self, host: str, port: int, keepalive: int = 60) -> None:
        """Open the socket towards ``host:port`` and send CONNECT (resent until CONNACK)."""
        self._open(host, port, keepalive)
        self._send_control("connect", encode(Connect(self.client_id, keepalive, True)))

    def _open(self, host: str, port: int, keepalive: int) -> None:
        """Open the client's socket towards the broker (the part every UDP dialect shares)."""
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        sock = socket.socket(family, socket.SOCK_DGRAM)
        if self._receive_buffer_bytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._receive_buffer_bytes)
        # connect() fixes the peer: datagrams from anyone but the broker are not received,
        # and an ICMP port-unreachable surfaces as ConnectionRefusedError.
        sock.connect(address)
        if self._clock is not None:
            self.kernel_stamps = rx_timestamps.enable(sock)
        sock.setblocking(False)
        self._sock = sock
        self._keepalive_ns = keepalive * 1_000_000_000

    def socket(self) -> socket.socket | None:
        """Return the client's socket (None before connect or after close)."""
        return self._sock

    def subscribe(self, topic: str, qos: int = 0) -> tuple[int, int]:
        """Send SUBSCRIBE for one filter (resent until its SUBACK); return (0, packet id)."""
        packet_id = self._new_packet_id()
        self._send_control(packet_id, encode(Subscribe(packet_id, ((topic, qos),))))
        return 0, packet_id

    def unsubscribe(self, topic: str) -> tuple[int, int]:
        """Send UNSUBSCRIBE for one filter (resent until its UNSUBACK); return (0, packet id)."""
        packet_id = self._new_packet_id()
        self._send_control(packet_id, encode(Unsubscribe(packet_id, (topic,))))
        return 0, packet_id

    def publish(self, topic: str, payload: bytes, qos: int = 0) -> None:
        """Send one QoS 0 PUBLISH datagram."""
        if qos:
            raise ValueError(f"mqtt-udp carries QoS 0 only (the FPGA broker has no QoS 1/2); "
                             f"{self.client_id} asked for QoS {qos}")
        self._send(encode_publish(topic, payload))

    def loop_read(self) -> None:
        """Read every datagram waiting on the socket and act on each packet."""
        sock = self._sock
        if sock is None:
            return
        ancillary = rx_timestamps.ANCILLARY_BYTES if self.kernel_stamps else 0
        while True:
            try:
                datagram, anc, _flags, _addr = sock.recvmsg(MAX_DATAGRAM, ancillary)
            except BlockingIOError:
                return
            except ConnectionRefusedError:
                self._on_failure(f"broker {self._peer()} unreachable (ICMP port unreachable)")
                return
            stamp = rx_timestamps.realtime_ns(anc) if anc else None
            self.rx_kernel_ns = (None if stamp is None or self._clock is None
                                 else self._clock.monotonic(stamp))
            try:
                self._receive(datagram)
            except self.codec_error as exc:
                self.malformed += 1
                self._on_failure(f"malformed datagram from broker {self._peer()}: {exc}")

    def _receive(self, datagram: bytes) -> None:
        """Decode one datagram from the broker and act on it."""
        packet = decode(datagram)
        if type(packet) is Publish:
            self._on_message(packet)
        else:
            self._handle_control(packet)

    def want_write(self) -> bool:
        """Return True when an unacknowledged control packet is due to be sent again."""
        return bool(self._pending) and monotonic_ns() >= self._next_resend_ns

    def loop_write(self) -> int:
        """Send again every control packet still waiting for its acknowledgement."""
        if not self.want_write():
            return 0
        for packet in self._pending.values():
            self._send(packet)
            self.resent += 1
        self._next_resend_ns = monotonic_ns() + self._resend_ns
        return 0

    def loop_misc(self) -> int:
        """Send PINGREQ when nothing was sent for a keep-alive interval."""
        if self._sock is not None and self._keepalive_ns and (
                monotonic_ns() - self._last_sent_ns >= self._keepalive_ns):
            self._send(self.ping_datagram)
        return 0

    def disconnect(self) -> None:
        """Send DISCONNECT; the broker then forgets this address's subscriptions."""
        self._pending.clear()
        if self._sock is not None:
            self._send(self.disconnect_datagram)

    def close(self) -> None:
        """Close the socket; safe to call twice."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- internals ----------------------------------------------------------------------

    def _peer(self) -> str:
        try:
            host, port = self._sock.getpeername()[:2] if self._sock else ("?", 0)
        except OSError:
            return "?"
        return f"{host}:{port}"

    def _new_packet_id(self) -> int:
        self._next_packet_id = self._next_packet_id % 0xFFFF + 1
        return self._next_packet_id

    def _send_control(self, key: str | int, packet: bytes) -> None:
        self._pending[key] = packet
        self._next_resend_ns = monotonic_ns() + self._resend_ns
        self._send(packet)

    def _send(self, packet: bytes) -> None:
        if self._sock is None:
            raise ConnectionError(f"{self.client_id}: send before connect or after close")
        try:
            self._sock.send(packet)
        except ConnectionRefusedError:
            self._on_failure(f"broker {self._peer()} unreachable (ICMP port unreachable)")
        except (BlockingIOError, PermissionError):
            # The socket buffer is full, or a firewall rule dropped the datagram on its way
            # out (an impaired link's loss: iptables answers a local sender with EPERM):
            # the datagram is lost, as on a congested or lossy line.
            self.send_errors += 1
        self._last_sent_ns = monotonic_ns()

    def _handle_control(self, packet: object) -> None:
        if type(packet) is ConnAck:
            if self._pending.pop("connect", None) is not None:
                self.connack_code = packet.return_code
                self._on_connack(packet.return_code)
        elif type(packet) is SubAck:
            # A SUBACK for a SUBSCRIBE no longer pending answers a resent copy: ignore it.
            if self._pending.pop(packet.packet_id, None) is not None:
                self._on_suback(packet.return_codes)
        elif type(packet) is UnsubAck:
            if self._pending.pop(packet.packet_id, None) is not None and self._on_unsuback:
                self._on_unsuback(packet.packet_id)
        elif type(packet) is PingResp:
            self.pings_answered += 1
        else:
            self._on_failure(f"unexpected {type(packet).__name__} from broker {self._peer()}")
