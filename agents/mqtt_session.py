"""The MQTT clients of one run, driven by one selector loop on one thread.

paho-mqtt runs without its own threads here: every client's socket sits in one selector,
so receive timestamps are taken by the same thread that reads the socket, and publishes
go out from that thread at their open-loop schedule. Every socket gets TCP_NODELAY before
CONNECT is sent (paho does not set it; without it loopback latency reads ~9 ms).
"""

from __future__ import annotations

import contextlib
import heapq
import selectors
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt

from mqttbed.agents.gpio import GpioLines
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.events import (
    EventKind,
    decode_payload,
    encode_payload,
    publisher_client_id,
)
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role

# (kind, publisher, seq, receiver, topic, payload_bytes, qos, warmup,
#  t_intended_ns, t_pub_ns, t_recv_ns): the tuple is cheap to build on the hot path;
# the uploader turns it into an event row.
RawEvent = tuple[str, str | None, int | None, str | None, str, int, int, bool,
                 int | None, int | None, int | None]

KEEPALIVE_S = 30


def _set_nodelay(_client: mqtt.Client, _userdata: object, sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass
class _Client:
    spec: ClientAssignment
    paho: mqtt.Client
    connected: bool = False
    subscribed: bool = False
    sent: int = 0
    acked: int = 0
    received: set[tuple[int, int]] = field(default_factory=set)
    failure: str | None = None


class MqttSession:
    """Connects, subscribes, publishes and receives for one agent during one run."""

    def __init__(self, endpoint: Endpoint, clients: list[ClientAssignment], gpio: GpioLines,
                 record: Callable[[RawEvent], None]):
        if endpoint.transport != "mqtt-tcp":
            raise ValueError(f"transport {endpoint.transport} is not supported by this agent yet")
        self._endpoint = endpoint
        self._gpio = gpio
        self._record = record
        self._selector = selectors.DefaultSelector()
        ordered = sorted(clients, key=lambda c: (c.role != Role.SUBSCRIBER, c.subscribe_rank))
        self._clients = [self._make_client(c) for c in ordered]
        gpio.setup([c.spec.gpio_pin for c in self._clients])

    # -- set-up -----------------------------------------------------------------------

    def _make_client(self, spec: ClientAssignment) -> _Client:
        paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=spec.client_id,
                           protocol=mqtt.MQTTv311, clean_session=True)
        client = _Client(spec=spec, paho=paho)
        paho.on_socket_open = _set_nodelay
        paho.on_connect = lambda _c, _u, _f, rc, _p: self._on_connect(client, rc)
        paho.on_disconnect = lambda _c, _u, _f, rc, _p: self._on_disconnect(client, rc)
        if spec.role == Role.SUBSCRIBER:
            paho.on_subscribe = lambda _c, _u, _mid, codes, _p: self._on_suback(client, codes)
            paho.on_message = lambda _c, _u, msg: self._on_message(client, msg)
        else:
            paho.on_publish = lambda _c, _u, _mid, _rc, _p: self._on_puback(client)
        return client

    def connect(self, timeout_s: float) -> None:
        """Connect every client and subscribe every subscriber, in subscribe-rank order.

        Returns once every subscriber holds its SUBACK; raises RuntimeError otherwise.
        """
        for client in self._clients:
            client.paho.connect(self._endpoint.host, self._endpoint.port, KEEPALIVE_S)
            self._selector.register(client.paho.socket(), selectors.EVENT_READ, client)
        deadline = monotonic_ns() + int(timeout_s * 1e9)
        while not all(c.connected for c in self._clients):
            self._check_deadline(deadline, "CONNACK")
            self.pump(0.05)
        # Subscribe one at a time so subscribe_rank is the broker's subscription order.
        for client in self._clients:
            if client.spec.role != Role.SUBSCRIBER:
                continue
            client.paho.subscribe(client.spec.topic, qos=client.spec.qos)
            while not client.subscribed:
                self._check_deadline(deadline, "SUBACK")
                self.pump(0.05)

    def _check_deadline(self, deadline_ns: int, waiting_for: str) -> None:
        failed = [f"{c.spec.client_id}: {c.failure}" for c in self._clients if c.failure]
        if failed:
            raise RuntimeError("; ".join(failed))
        if monotonic_ns() > deadline_ns:
            missing = [c.spec.client_id for c in self._clients
                       if not (c.connected if waiting_for == "CONNACK" else c.subscribed)]
            raise RuntimeError(f"no {waiting_for} for {', '.join(missing[:5])} "
                               f"from {self._endpoint.host}:{self._endpoint.port}")

    # -- callbacks (run on the loop thread) ---------------------------------------------

    def _on_connect(self, client: _Client, rc: mqtt.ReasonCode) -> None:
        if rc.is_failure:
            client.failure = f"CONNACK refused: {rc}"
        else:
            client.connected = True

    def _on_disconnect(self, client: _Client, rc: mqtt.ReasonCode) -> None:
        if client.connected and rc.is_failure:
            client.failure = f"connection lost: {rc}"
        client.connected = False

    def _on_suback(self, client: _Client, codes: list[mqtt.ReasonCode]) -> None:
        t_suback = monotonic_ns()
        if any(code.is_failure for code in codes):
            client.failure = f"SUBACK refused {client.spec.topic!r}: {codes}"
            return
        client.subscribed = True
        spec = client.spec
        self._record((EventKind.SUBSCRIBE, None, None, spec.client_id, spec.topic, 0, spec.qos,
                      False, None, None, t_suback))

    def _on_message(self, client: _Client, msg: mqtt.MQTTMessage) -> None:
        t_recv = monotonic_ns()
        self._gpio.toggle(client.spec.gpio_pin)
        try:
            seq, pub_index, t_pub, t_intended = decode_payload(msg.payload)
        except ValueError:
            return  # not one of ours (e.g. a stray retained message)
        client.received.add((pub_index, seq))
        spec = client.spec
        self._record((EventKind.DELIVERY, publisher_client_id(pub_index), seq, spec.client_id,
                      msg.topic, len(msg.payload), msg.qos, seq < spec.warmup_messages,
                      t_intended, t_pub, t_recv))

    def _on_puback(self, client: _Client) -> None:
        client.acked += 1

    # -- the loop -----------------------------------------------------------------------

    def pump(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for socket activity and let paho handle it."""
        for key, _ in self._selector.select(max(timeout_s, 0.0)):
            key.data.paho.loop_read()
        for client in self._clients:
            if client.paho.want_write():
                client.paho.loop_write()

    def run(self, t_start_ns: int, t_deadline_ns: int, abort: Callable[[], bool]) -> None:
        """Publish on schedule from ``t_start_ns`` and receive until done or the deadline.

        Publishers are open loop: message k is due at ``t_start + offset + k / rate``;
        a late send goes out at once and keeps its
        intended time, so coordinated omission stays visible in the data.
        """
        publishers = [c for c in self._clients if c.spec.role == Role.PUBLISHER]

        def due_ns(spec: ClientAssignment, k: int) -> int:
            return t_start_ns + spec.start_offset_ns + int(k * 1e9 / spec.rate_hz)

        due = [(due_ns(c.spec, 0), pos, 0) for pos, c in enumerate(publishers)]
        heapq.heapify(due)
        last_misc = monotonic_ns()
        while not abort():
            now = monotonic_ns()
            while due and due[0][0] <= now:
                t_intended, pos, k = heapq.heappop(due)
                client = publishers[pos]
                self._publish(client, k, t_intended)
                if k + 1 < client.spec.messages:
                    heapq.heappush(due, (due_ns(client.spec, k + 1), pos, k + 1))
                now = monotonic_ns()
            if self._finished(due) or now > t_deadline_ns:
                return
            wait_ns = (due[0][0] - now) if due else 50_000_000
            self.pump(min(wait_ns, 50_000_000) / 1e9)
            if now - last_misc > 1_000_000_000:
                for client in self._clients:
                    client.paho.loop_misc()
                last_misc = now
            failed = [f"{c.spec.client_id}: {c.failure}" for c in self._clients if c.failure]
            if failed:
                raise RuntimeError("; ".join(failed))

    def _publish(self, client: _Client, seq: int, t_intended_ns: int) -> None:
        spec = client.spec
        t_pub = monotonic_ns()
        payload = encode_payload(seq, spec.publisher_index, t_pub, t_intended_ns,
                                 spec.payload_bytes)
        client.paho.publish(spec.topic, payload, qos=spec.qos)
        # Like the seed's publisher: toggle the line after the PUBLISH is written.
        self._gpio.toggle(spec.gpio_pin)
        client.sent += 1
        self._record((EventKind.PUBLISH, spec.client_id, seq, None, spec.topic, spec.payload_bytes,
                      spec.qos, seq < spec.warmup_messages, t_intended_ns, t_pub, None))

    def _finished(self, due: list[tuple[int, int, int]]) -> bool:
        if due:
            return False
        for client in self._clients:
            spec = client.spec
            if spec.role == Role.PUBLISHER and spec.qos > 0 and client.acked < client.sent:
                return False
            if spec.role == Role.SUBSCRIBER and len(client.received) < spec.expected_messages:
                return False
        return True

    def counts(self) -> tuple[int, int]:
        """Return (messages published, unique messages received) over all clients."""
        return (sum(c.sent for c in self._clients),
                sum(len(c.received) for c in self._clients))

    def close(self) -> None:
        """Disconnect every client politely, then close the sockets."""
        for client in self._clients:
            try:
                if client.connected:
                    client.paho.disconnect()
                    client.paho.loop_write()
            except (OSError, ValueError):
                pass
            sock = client.paho.socket()
            if sock is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                sock.close()
        self._selector.close()
