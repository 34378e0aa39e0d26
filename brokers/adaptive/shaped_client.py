"""Subscribers that show the adaptive broker a chosen RTT: they answer its queries late.

The broker's RTT sample is the time from writing a query to its PUBACK, so a subscriber
that holds its PUBACK back by ``query_delay_s`` shows an RTT of about that much, on any
link: the knob that makes a link *look* congested, deterministically, for tests and the
memory bench. ``query_delay_s = None`` never answers a query (a silent subscriber);
``reading = False`` stops reading the socket (a subscriber whose link stalls: TCP's
window closes and the broker's writer backs off). Data PUBLISHes at QoS 1 are
acknowledged at once. Every subscriber of a group is served by one thread and one
selector; each delivery is recorded with its CLOCK_MONOTONIC receive time.
"""

from __future__ import annotations

import heapq
import itertools
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mqttbed.brokers.adaptive.rtt import QUERY_TOPIC
from mqttbed.brokers.mqttst.mqtt5 import FrameBuffer
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.mqtt_codec import (
    ConnAck,
    Connect,
    PacketIdAck,
    PacketType,
    Publish,
    SubAck,
    Subscribe,
    decode_body,
    encode,
)

_TICK_S = 0.05


@dataclass(frozen=True)
class Received:
    """One delivery: topic, payload size and first bytes, receive time (CLOCK_MONOTONIC)."""

    topic: str
    size: int
    head: bytes
    t_ns: int


@dataclass(eq=False)
class ShapedSubscriber:
    """One subscriber of a :class:`ShapedSubscribers` group (its knobs are live)."""

    client_id: str
    sock: socket.socket
    query_delay_s: float | None = 0.0
    reading: bool = True     # change it with ShapedSubscribers.set_reading
    received: list[Received] = field(default_factory=list)
    queries_seen: int = 0
    queries_answered: int = 0
    closed: bool = False
    frames: FrameBuffer = field(default_factory=lambda: FrameBuffer(1 << 28))
    pending: list[tuple[int, bytes]] = field(default_factory=list)

    def messages(self, topic_prefix: str = "") -> list[Received]:
        """Deliveries other than RTT queries (whose topic starts with ``topic_prefix``)."""
        return [r for r in self.received
                if r.topic != QUERY_TOPIC and r.topic.startswith(topic_prefix)]


class ShapedSubscribers:
    """A group of raw MQTT 3.1.1 subscribers served by one background thread."""

    def __init__(self, host: str, port: int):
        self.address = (host, port)
        self.subscribers: list[ShapedSubscriber] = []
        self._selector = selectors.DefaultSelector()
        self._due: list[tuple[int, int, ShapedSubscriber, int]] = []   # PUBACKs to send
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shaped-subscribers",
                                         daemon=True)
        self._thread.start()

    def connect(self, client_id: str, filters: list[tuple[str, int]],
                query_delay_s: float | None = 0.0, timeout_s: float = 5.0,
                receive_buffer_bytes: int | None = None) -> ShapedSubscriber:
        """Connect and subscribe (synchronously, before the thread takes the socket over).

        ``receive_buffer_bytes`` caps the TCP window it offers (so a pause in reading
        reaches the broker after that much, not after the kernel's autotuned megabytes).
        """
        sock = socket.socket(socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET)
        if receive_buffer_bytes is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        sock.settimeout(timeout_s)
        sock.connect(self.address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        subscriber = ShapedSubscriber(client_id, sock, query_delay_s)
        sock.sendall(encode(Connect(client_id, keepalive_s=60)))
        if not isinstance(self._read_one(subscriber), ConnAck):
            raise ConnectionError(f"{client_id}: no CONNACK")
        sock.sendall(encode(Subscribe(1, tuple(filters))))
        while not isinstance(packet := self._read_one(subscriber), SubAck):
            self._on_packet(subscriber, packet)   # a query may come before the SUBACK
        for first, body in subscriber.pending:
            self._on_packet(subscriber, decode_body(first, body))
        subscriber.pending.clear()
        sock.setblocking(False)
        with self._lock:
            self.subscribers.append(subscriber)
            self._selector.register(sock, selectors.EVENT_READ, subscriber)
        return subscriber

    def set_reading(self, subscriber: ShapedSubscriber, reading: bool) -> None:
        """Stop (or resume) reading ``subscriber``'s socket: its TCP window closes."""
        with self._lock:
            if reading != subscriber.reading and not subscriber.closed:
                if reading:
                    self._selector.register(subscriber.sock, selectors.EVENT_READ, subscriber)
                else:
                    self._selector.unregister(subscriber.sock)
            subscriber.reading = reading

    def wait_for(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``condition`` until true or ``timeout_s`` passed; return its last value."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        """Stop the thread and close every socket."""
        self._stop.set()
        self._thread.join(timeout=5)
        for subscriber in self.subscribers:
            subscriber.sock.close()
        self._selector.close()

    # -- the thread ------------------------------------------------------------------------

    @staticmethod
    def _read_one(subscriber: ShapedSubscriber) -> object:
        """The next packet, blocking (only while connecting)."""
        while not subscriber.pending:
            chunk = subscriber.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError(f"{subscriber.client_id}: closed by the broker")
            subscriber.pending.extend(subscriber.frames.feed(chunk))
        return decode_body(*subscriber.pending.pop(0))

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                registered = bool(self._selector.get_map())
                events = self._selector.select(self._timeout_s()) if registered else []
                for key, _mask in events:
                    self._drain(key.data)
                self._send_due()
            if not registered:
                time.sleep(_TICK_S)

    def _timeout_s(self) -> float:
        if not self._due:
            return _TICK_S
        return min(_TICK_S, max(0.0, (self._due[0][0] - monotonic_ns()) / 1e9))

    def _drain(self, subscriber: ShapedSubscriber) -> None:
        try:
            chunk = subscriber.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            subscriber.closed = True
            self._selector.unregister(subscriber.sock)
            return
        for first, body in subscriber.frames.feed(chunk):
            self._on_packet(subscriber, decode_body(first, body))

    def _on_packet(self, subscriber: ShapedSubscriber, packet: object) -> None:
        if not isinstance(packet, Publish):
            return
        now_ns = monotonic_ns()
        subscriber.received.append(Received(packet.topic, len(packet.payload),
                                            packet.payload[:16], now_ns))
        if packet.qos == 0 or packet.packet_id is None:  # QoS 1 and 2 always carry an id
            return
        if packet.topic != QUERY_TOPIC:
            self._send(subscriber, packet.packet_id)
            return
        subscriber.queries_seen += 1
        if subscriber.query_delay_s is not None:
            due_ns = now_ns + int(subscriber.query_delay_s * 1e9)
            heapq.heappush(self._due, (due_ns, next(self._order), subscriber,
                                       packet.packet_id))

    def _send_due(self) -> None:
        now_ns = monotonic_ns()
        while self._due and self._due[0][0] <= now_ns:
            _, _, subscriber, packet_id = heapq.heappop(self._due)
            self._send(subscriber, packet_id)
            subscriber.queries_answered += 1

    @staticmethod
    def _send(subscriber: ShapedSubscriber, packet_id: int) -> None:
        if subscriber.closed:
            return
        try:
            subscriber.sock.sendall(encode(PacketIdAck(PacketType.PUBACK, packet_id)))
        except OSError:
            subscriber.closed = True
