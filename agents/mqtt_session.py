"""The MQTT clients of one run, driven by one selector loop on one thread.

paho-mqtt runs without its own threads here: every client's socket sits in one selector,
so receive timestamps are taken by the same thread that reads the socket, and publishes
go out from that thread at their open-loop schedule. Every socket gets TCP_NODELAY before
CONNECT is sent (paho does not set it; without it loopback latency reads ~9 ms).

The native engine (``mqtt_client`` "native", the default) runs every client in C when it
can (:mod:`mqttbed.agents.native_session`: mqtt-tcp, mqtt-udp or mqtt-sn-udp, virtual GPIO
lines, a library that builds here); the session then hands every call over to it.
Otherwise, and the generator report says why, the endpoint's transport picks the client:
for ``mqtt-tcp`` mqttbed's lean client (:class:`~mqttbed.agents.mqtt_tcp.TcpMqttClient`:
plain MQTT 3.1.1 over TCP, with a user name and password if the run has them) or paho
(``mqtt_client`` "paho", the cross-check: TLS, WebSocket, MQTT 5, credentials; built by
:mod:`mqttbed.agents.paho_client`); where the engine cannot run and the run needs what
the lean client does not speak, paho runs in its place, and a run that asks for the lean
client by name is refused, naming what it needs. For the UDP transports,
:class:`~mqttbed.agents.mqtt_udp.UdpMqttClient` (one socket per client, one packet per
datagram) for ``mqtt-udp``, the FPGA broker's transport, or
:class:`~mqttbed.agents.mqtt_sn.MqttSnClient` for ``mqtt-sn-udp`` (MQTT-SN 1.2). All
offer the same driving surface (:class:`ClientConnection`), so the loop, the schedule
and the recorded events are the same code for every transport. The lean TCP client and
the UDP ones stamp deliveries with the kernel's receive time where the socket gives one
(``clock_source`` ``kernel``), and every delivery keeps the user-space time beside it.

Clients connect one at a time, each after the one before holds its CONNACK, so every
client's connection phases (:meth:`MqttSession.connect_phases`) are timed alone, not
behind the next client's blocking TCP connect or TLS handshake.

The lean client's publishes of one loop turn are written together after the turn's due
messages were built (one ``send`` per socket), then their GPIO lines toggle.
"""

from __future__ import annotations

import contextlib
import heapq
import selectors
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import paho.mqtt.client as mqtt

from mqttbed.agents import paho_client
from mqttbed.agents.connect_times import ConnectTimes
from mqttbed.agents.gpio import GpioLines
from mqttbed.agents.mqtt_sn import MqttSnClient, SnMessage
from mqttbed.agents.mqtt_tcp import TcpMqttClient, connack_refusal
from mqttbed.agents.mqtt_udp import UdpMqttClient
from mqttbed.agents.native_session import EventColumns, NativeSession, unsupported_reason
from mqttbed.agents.rx_timestamps import RealtimeToMonotonic
from mqttbed.agents.schedule_report import PublisherProgress, schedule_fields
from mqttbed.agents.subscribe_order import (
    check_handshakes,
    subscriber_ranks,
    subscribers_in_order,
)
from mqttbed.core.binary_chunk import BinaryBatch
from mqttbed.core.broker_access import (
    ClientCredentials,
    ConnectPhases,
    EndpointTls,
    MqttProtocol,
)
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.events import (
    ClockSource,
    EventKind,
    decode_payload_at,
    encode_payload,
    publisher_client_id,
)
from mqttbed.core.mqtt_codec import Publish, encode_publish
from mqttbed.core.mqttsn import Publish as SnPublish
from mqttbed.core.mqttsn import encode as encode_sn
from mqttbed.core.protocol import (
    ClientAssignment,
    ClientReconnects,
    Endpoint,
    GeneratorReport,
    Role,
    Transport,
)

# (kind, publisher, seq, receiver, topic, payload_bytes, qos, warmup,
#  t_intended_ns, t_pub_ns, t_recv_ns, clock_source, t_recv_user_ns): the tuple is cheap
# to build on the hot path; the uploader turns it into an event row.
RawEvent = tuple[str, str | None, int | None, str | None, str, int, int, bool,
                 int | None, int | None, int | None, str, int | None]
MQTT_CLIENTS = ("native", "lean", "paho")
MAX_BATCH = 64  # publishes per loop turn before the turn's writes and reads
_USER = ClockSource.USER.value
_KERNEL = ClockSource.KERNEL.value

KEEPALIVE_S = 30
UDP_MAX_PAYLOAD = 65_507  # IPv4: 65,535 - 20 (IP header) - 8 (UDP header)
SN_RECEIVE_BUFFER_BYTES = 1 << 20
# reads of one TLS client's decrypted backlog per pump before select() is asked again
MAX_PENDING_READS = 10_000


def lean_lacks(endpoints: list[Endpoint], protocol: MqttProtocol,
               credentials: ClientCredentials | None) -> list[str]:
    """What a run needs that the lean client (plain MQTT 3.1.1 over TCP) does not speak."""
    lacks = []
    for endpoint in dict.fromkeys(endpoints):  # each broker once, in order
        if endpoint.transport != Transport.MQTT_TCP:
            continue
        address = f"{endpoint.scheme}://{endpoint.host}:{endpoint.port}"
        if endpoint.tls is not None:
            lacks.append(f"TLS ({address})")
        if endpoint.websocket_path is not None:
            lacks.append(f"WebSocket ({address}{endpoint.websocket_path})")
    if protocol != "3.1.1":
        lacks.append(f"MQTT {protocol} (workload.protocol)")
    if credentials is not None and credentials.cert_pem is not None:
        lacks.append("a TLS client certificate (broker.tls.cert_file)")
    return lacks


class ClientConnection(Protocol):
    """What the session drives of one MQTT client: paho's Client, or UdpMqttClient."""

    def connect(self, host: str, port: int, keepalive: int) -> Any: ...
    def socket(self) -> Any: ...
    def loop_read(self) -> Any: ...
    def want_write(self) -> bool: ...
    def loop_write(self) -> Any: ...
    def loop_misc(self) -> Any: ...
    def subscribe(self, topic: str, qos: int = 0) -> Any: ...
    def publish(self, topic: str, payload: bytes, qos: int = 0) -> Any: ...
    def disconnect(self) -> Any: ...


@dataclass
class _Client:
    spec: ClientAssignment
    conn: ClientConnection
    connected: bool = False
    subscribed: bool = False
    sent: int = 0
    acked: int = 0
    received: set[tuple[int, int]] = field(default_factory=set)
    failure: str | None = None
    times: ConnectTimes = field(default_factory=ConnectTimes)
    paho_error: paho_client.LastError | None = None  # what paho last logged as an error
    tls: bool = False  # a paho client over TLS: decrypted bytes may wait unseen by select()
    lean: bool = False  # a TcpMqttClient: writes when the session flushes it
    first_intended_ns: int | None = None
    last_pub_ns: int = 0
    send_lag_max_ns: int = 0
    subscribing: str = ""  # the topic whose SUBACK a subscriber waits for
    last_delivery_ns: int = 0  # user-space time of its latest delivery (0: none yet)
    # (first publisher index, end, warm-up messages) per stream of a message mix
    warmup_ranges: tuple[tuple[int, int, int], ...] = ()

    def warmup_of(self, publisher_index: int) -> int:
        """How many of a publisher's first messages are warm-up for this subscriber."""
        for first, end, warmup in self.warmup_ranges:
            if first <= publisher_index < end:
                return warmup
        return self.spec.warmup_messages

    @property
    def paho(self) -> ClientConnection:
        """The client's connection (paho's Client on mqtt-tcp), by its historical name."""
        return self.conn


def _datagram_overhead(transport: Transport, topic: str, qos: int) -> int:
    """Bytes a PUBLISH datagram adds to a large payload (beyond 16 KiB) on a UDP transport."""
    probe = bytes(20_000)
    if transport == Transport.MQTT_UDP:
        return len(encode_publish(topic, probe)) - len(probe)
    return len(encode_sn(SnPublish(1, 1 if qos else 0, probe, qos))) - len(probe)


def _check_transport(spec: ClientAssignment, endpoint: Endpoint) -> None:
    """Refuse a QoS or a payload the client's transport cannot carry, naming the client
    and the fix."""
    if spec.role == Role.PUBLISHER and endpoint.transport != Transport.MQTT_TCP:
        # One PUBLISH per datagram, and a datagram ends at UDP's limit.
        most = UDP_MAX_PAYLOAD - _datagram_overhead(endpoint.transport, spec.topic, spec.qos)
        if spec.payload_bytes > most:
            raise ValueError(f"transport {endpoint.transport} carries one PUBLISH per UDP "
                             f"datagram (at most {UDP_MAX_PAYLOAD} bytes); {spec.client_id} "
                             f"publishes {spec.payload_bytes}-byte payloads on "
                             f"{spec.topic!r}: set its payload_bytes to at most {most}")
    if endpoint.transport == Transport.MQTT_SN_UDP and spec.qos not in (0, 1):
        raise ValueError(f"transport mqtt-sn-udp carries QoS 0 and 1 here (the gateway has "
                         f"no QoS 2); {spec.client_id} asks for QoS {spec.qos}: set "
                         f"workload.qos to 0 or 1")
    if endpoint.transport == Transport.MQTT_UDP and spec.qos != 0:
        raise ValueError(f"transport mqtt-udp carries QoS 0 only (the FPGA broker has no "
                         f"QoS 1/2); {spec.client_id} asks for QoS {spec.qos}: set "
                         f"workload.qos to 0")


def _warmup_ranges(spec: ClientAssignment) -> tuple[tuple[int, int, int], ...]:
    return tuple((s.first_publisher, s.first_publisher + s.publishers, s.warmup_messages)
                 for s in spec.streams)


class MqttSession:
    """Connects, subscribes, publishes and receives for one agent during one run.

    Each client talks to its own broker when the assignment names one
    (``ClientAssignment.broker``, a backend that deploys several), else to ``endpoint``;
    every client speaks ``protocol`` and proves itself with ``credentials`` (the
    assignment's: secrets never leave this object in a message or a log).
    """

    def __init__(self, endpoint: Endpoint, clients: list[ClientAssignment], gpio: GpioLines,
                 record: Callable[[RawEvent], None], gpio_pulses: bool = False,
                 mqtt_client: str = "native", kernel_timestamps: bool = True,
                 record_columns: Callable[[EventColumns], None] | None = None,
                 record_binary: Callable[[BinaryBatch], None] | None = None, *,
                 credentials: ClientCredentials | None = None,
                 protocol: MqttProtocol = "3.1.1"):
        if mqtt_client not in MQTT_CLIENTS:
            raise ValueError(f"mqtt_client {mqtt_client!r} is not one of "
                             f"{', '.join(MQTT_CLIENTS)}")
        for spec in clients:
            _check_transport(spec, spec.broker or endpoint)
        self._native: NativeSession | None = None
        self._client_reason = ""  # why the client that runs is not the one asked for
        lacks = lean_lacks([spec.broker or endpoint for spec in clients] or [endpoint],
                           protocol, credentials)
        if mqtt_client == "native":
            reason = unsupported_reason(endpoint, clients, gpio)
            if reason is None:
                self._native = NativeSession(endpoint, clients, gpio, record,
                                             gpio_pulses=gpio_pulses,
                                             record_columns=record_columns,
                                             kernel_timestamps=kernel_timestamps,
                                             record_binary=record_binary,
                                             credentials=credentials, protocol=protocol)
                self._clients: list[Any] = list(self._native._clients)
                return
            if lacks:
                # the cross-check client speaks every layer the engine does
                reason += (f"; the lean client speaks plain MQTT 3.1.1 over TCP and this "
                           f"run needs {', '.join(lacks)}: paho runs")
            self._client_reason, mqtt_client = reason, "paho" if lacks else "lean"
        elif mqtt_client == "lean" and lacks:
            raise ValueError(f"workload.client 'lean' speaks plain MQTT 3.1.1 over TCP; this "
                             f"run needs {', '.join(lacks)}: set workload.client to 'native' "
                             "or 'paho'")
        trees = [spec.client_id for spec in clients if spec.topic_tree is not None]
        if trees:  # the Python clients publish each client's one topic
            raise ValueError(f"workload.topic_tree: publisher {trees[0]} sends a topic per "
                             f"message, which only the native engine does, and the "
                             f"{mqtt_client} client runs here"
                             f"{f' ({self._client_reason})' if self._client_reason else ''}: "
                             "set workload.client to 'native' where the engine builds")
        retained = [spec.client_id for spec in clients if spec.retained is not None]
        if retained:  # the RETAIN flag and a SUBSCRIBE during the run are the engine's
            raise ValueError(f"workload.retained: client {retained[0]} sets or subscribes to "
                             f"retained state during the run, which only the native engine "
                             f"does, and the {mqtt_client} client runs here"
                             f"{f' ({self._client_reason})' if self._client_reason else ''}: "
                             "set workload.client to 'native' where the engine builds")
        away = [spec.client_id for spec in clients
                if spec.session is not None or spec.reconnect is not None]
        if away:  # absences and reconnects are the engine's (src/reconnect.c)
            raise ValueError(f"workload.sessions / workload.reconnect: client {away[0]} goes "
                             f"away and comes back, which only the native engine does, and "
                             f"the {mqtt_client} client runs here"
                             f"{f' ({self._client_reason})' if self._client_reason else ''}: "
                             "set workload.client to 'native' where the engine builds")
        self._endpoint = endpoint
        self._mqtt_client = mqtt_client
        self._protocol: MqttProtocol = protocol
        self._credentials = credentials
        self._tls_contexts: dict[EndpointTls, ssl.SSLContext] = {}
        # kernel receive stamps go onto CLOCK_MONOTONIC through this measured offset
        self._clock_map = RealtimeToMonotonic() if kernel_timestamps else None
        self._kernel_deliveries = 0
        self._user_deliveries = 0
        self._backlogged: set[int] = set()  # lean clients whose last flush left bytes
        self._gpio = gpio
        self._record = record
        self._selector = selectors.DefaultSelector()
        # Another thread wakes the loop out of select() through this pair (see wake()).
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        ordered = sorted(clients, key=lambda c: (c.role != Role.SUBSCRIBER, c.subscribe_rank))
        self._clients = [self._make_client(c) for c in ordered]
        # the clients whose writes pump() must drive (paho, UDP resends); lean ones flush
        self._polled = [c for c in self._clients if not c.lean]
        gpio.setup([c.spec.gpio_pin for c in self._clients])
        gpio.pulse_mode = gpio_pulses
        # the publishing schedule while run() runs (closed-loop acks add to it)
        self._publishers: list[_Client] = []
        self._position: dict[str, int] = {}
        self._due: list[tuple[int, int, int]] | None = None
        self._t_start_ns = 0

    # -- set-up -----------------------------------------------------------------------

    def _endpoint_of(self, spec: ClientAssignment) -> Endpoint:
        return spec.broker or self._endpoint

    def _make_client(self, spec: ClientAssignment) -> _Client:
        if self._endpoint_of(spec).transport in (Transport.MQTT_UDP, Transport.MQTT_SN_UDP):
            return self._make_udp_client(spec)
        if self._mqtt_client == "lean":
            return self._make_lean_client(spec)
        return self._make_paho_client(spec)

    def _tls_context(self, tls: EndpointTls) -> ssl.SSLContext:
        """One context per TLS configuration (a CA loaded once for all its clients)."""
        context = self._tls_contexts.get(tls)
        if context is None:
            context = self._tls_contexts[tls] = paho_client.tls_context(tls, self._credentials)
        return context

    def _make_paho_client(self, spec: ClientAssignment) -> _Client:
        endpoint = self._endpoint_of(spec)
        context = None if endpoint.tls is None else self._tls_context(endpoint.tls)
        times = ConnectTimes()
        paho = paho_client.make_client(spec.client_id, endpoint, self._protocol,
                                       self._credentials, context, times)
        client = _Client(spec=spec, conn=paho, warmup_ranges=_warmup_ranges(spec),
                         times=times, tls=context is not None,
                         paho_error=paho_client.keep_last_error(paho, spec.client_id))
        broker = f"{endpoint.host}:{endpoint.port}"
        protocol = self._protocol
        paho.on_connect = lambda _c, _u, _f, rc, _p: self._on_connect(
            client, f"CONNACK refused by {broker}: {paho_client.refusal(rc, protocol)}"
            if rc.is_failure else None)
        paho.on_disconnect = lambda _c, _u, _f, rc, _p: self._on_disconnect(
            client, f"connection to {broker} lost: {self._paho_cause(client, rc)}"
            if rc.is_failure else None)
        if spec.role == Role.SUBSCRIBER:
            paho.on_subscribe = lambda _c, _u, _mid, codes, _p: self._on_suback(
                client, [paho_client.reason_name(code) for code in codes if code.is_failure])
            paho.on_message = lambda _c, _u, msg: self._on_message(client, msg)
        else:
            paho.on_publish = lambda _c, _u, _mid, rc, _p: self._on_puback(
                client, f"{broker} refused a publish: reason code {paho_client.reason_name(rc)}"
                if rc.is_failure else None)
        return client

    @staticmethod
    def _paho_cause(client: _Client, code: object) -> str:
        """Why paho dropped a connection: the error it logged, else its code."""
        text = mqtt.error_string(code) if isinstance(code, mqtt.MQTTErrorCode) else str(code)
        logged = None if client.paho_error is None else client.paho_error.message
        return f"{text} ({logged})" if logged else text

    def _make_lean_client(self, spec: ClientAssignment) -> _Client:
        client: _Client

        def on_failure(reason: str) -> None:
            # before CONNACK too: a refused or closed connection fails the wait at once
            client.failure = reason
            client.connected = False

        def on_publish(topic: str, data: bytearray, start: int, end: int, qos: int,
                       t_user: int, t_kernel: int | None) -> None:
            self._on_delivery(client, topic, data, start, end, qos, t_user, t_kernel)

        credentials = self._credentials
        endpoint = self._endpoint_of(spec)
        broker = f"{endpoint.host}:{endpoint.port}"
        conn = TcpMqttClient(
            spec.client_id,
            username=None if credentials is None else credentials.username,
            password=None if credentials is None else credentials.password_bytes(),
            on_connack=lambda code: self._on_connect(
                client, f"CONNACK refused by {broker}: {connack_refusal(code)}"
                if code else None),
            on_suback=lambda codes: self._on_suback(
                client, [f"return code {code:#04x}" for code in codes if code == 0x80]),
            on_publish=on_publish,
            on_acked=lambda: self._on_puback(client),
            on_failure=on_failure,
            on_backlog=lambda: self._backlogged.add(id(client)),
            clock=self._clock_map)
        client = _Client(spec=spec, conn=conn, lean=True, warmup_ranges=_warmup_ranges(spec),
                         times=conn.times)
        return client

    def _make_udp_client(self, spec: ClientAssignment) -> _Client:
        client: _Client

        def on_failure(reason: str) -> None:
            client.failure = reason

        transport = self._endpoint_of(spec).transport
        if self._protocol != "3.1.1":
            raise ValueError(f"transport {transport} speaks MQTT 3.1.1 framing (MQTT-SN 1.2 "
                             f"on mqtt-sn-udp) here; {spec.client_id} is asked for MQTT "
                             f"{self._protocol}: set workload.protocol to 3.1.1")
        if self._credentials is not None and (self._credentials.username is not None
                                              or self._credentials.password is not None):
            raise ValueError(f"transport {transport} carries no user name or password here; "
                             f"{spec.client_id} is given them: drop broker.auth")
        sn = transport == Transport.MQTT_SN_UDP
        sn_options: dict[str, Any] = {} if not sn else {
            "publish_topic": spec.topic if spec.role == Role.PUBLISHER else None,
            "on_puback": lambda: self._on_puback(client),
            # ~1 s of a 1 kHz subscriber's datagrams (kernel size ~1 KiB each): an agent
            # starved by a busy machine reads late instead of losing messages.
            "receive_buffer_bytes": SN_RECEIVE_BUFFER_BYTES}
        udp = (MqttSnClient if sn else UdpMqttClient)(
            spec.client_id,
            **sn_options,
            clock=self._clock_map,
            on_connack=lambda code: self._on_connect(
                client, f"CONNACK refused: return code {code}" if code else None),
            on_suback=lambda codes: self._on_suback(
                client, [f"return code {code:#04x}" for code in codes if code == 0x80]),
            on_message=lambda msg: self._on_message(client, msg, udp.rx_kernel_ns),
            on_failure=on_failure)
        client = _Client(spec=spec, conn=udp, warmup_ranges=_warmup_ranges(spec))
        return client

    @property
    def native(self) -> bool:
        """Whether the native engine runs this session's clients."""
        return self._native is not None

    @property
    def gpio_chip(self) -> str | None:
        """The GPIO character device the native engine drives the lines on (None: virtual
        lines, or lines toggled from Python)."""
        return self._native.gpio_chip if self._native is not None else None

    def connect(self, timeout_s: float) -> None:
        """Connect every client, then subscribe every subscriber in rank order."""
        self.open(timeout_s)
        self.subscribe(timeout_s)

    def open(self, timeout_s: float) -> None:
        """Connect every client, each once the one before holds its CONNACK; returns once
        all do, raises otherwise (naming the client, the broker's address and why)."""
        if self._native is not None:
            return self._native.open(timeout_s)
        deadline = monotonic_ns() + int(timeout_s * 1e9)
        for done, client in enumerate(self._clients, start=1):
            self._connect(client, deadline)
            while not client.connected:
                check_handshakes(self._clients[:done], deadline, "CONNACK", self._endpoint_of)
                self.pump(0.05)

    def _connect(self, client: _Client, deadline_ns: int) -> None:
        """Open one client's connection (TCP, TLS, WebSocket as its endpoint says) and send
        CONNECT; a failure raises RuntimeError naming the address and the cause."""
        endpoint = self._endpoint_of(client.spec)
        host, port = endpoint.host, endpoint.port
        conn = client.conn
        timeout_s = max(deadline_ns - monotonic_ns(), 1_000_000) / 1e9
        options = {}
        if isinstance(conn, mqtt.Client):
            conn.connect_timeout = timeout_s  # paho's TCP connect, TLS and upgrade block
            options = paho_client.connect_kwargs(self._protocol)
        client.times.t_start_ns = monotonic_ns()
        where = f"{client.spec.client_id}: cannot connect"
        try:
            code = conn.connect(host, port, KEEPALIVE_S, **options)
        except (OSError, ValueError) as exc:  # ssl.SSLError and paho's WebSocket error too
            context = (self._tls_context(endpoint.tls) if endpoint.tls is not None
                       and isinstance(conn, mqtt.Client) else None)
            reason = paho_client.connect_failure(exc, endpoint, host, port, context, timeout_s,
                                                 client.times)
            raise RuntimeError(f"{where}: {reason}") from None
        if conn.socket() is None:
            # paho closed it writing CONNECT (e.g. a TLS 1.3 server's alert after the
            # handshake: a client certificate it refused) and returned a code only
            raise RuntimeError(f"{where}: {endpoint.scheme}://{host}:{port}: the connection "
                               f"closed as CONNECT was written: "
                               f"{self._paho_cause(client, code)}")
        if client.times.t_connect_sent_ns is None:  # UDP: CONNECT left within connect()
            client.times.t_connect_sent_ns = monotonic_ns()
        self._selector.register(conn.socket(), selectors.EVENT_READ, client)

    def subscriber_ranks(self) -> list[int]:
        """The subscribe ranks of this session's subscribers, lowest first."""
        if self._native is not None:
            return self._native.subscriber_ranks()
        return subscriber_ranks(self._clients)

    def subscribe(self, timeout_s: float, ranks: list[int] | None = None) -> None:
        """Subscribe the subscribers of ``ranks`` (default: all), one at a time, in order.

        Each SUBSCRIBE leaves only once the one before holds its SUBACK, so the broker
        sees them in this order; a subscriber of several topics (a message mix) sends one
        SUBSCRIBE per topic the same way. Raises RuntimeError when a SUBACK does not come.
        """
        if self._native is not None:
            return self._native.subscribe(timeout_s, ranks)
        deadline = monotonic_ns() + int(timeout_s * 1e9)
        for client in subscribers_in_order(self._clients, ranks):
            for topic, qos in client.spec.subscriptions():
                client.subscribed, client.subscribing = False, topic
                client.conn.subscribe(topic, qos=qos)
                while not client.subscribed:
                    check_handshakes(self._clients, deadline, "SUBACK", self._endpoint_of)
                    self.pump(0.05)

    def wake(self) -> None:
        """Make a pump() blocked in another thread return now (after setting an event)."""
        if self._native is not None:
            return self._native.wake()
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"\0")

    def wait_for(self, event: threading.Event) -> None:
        """Keep every connection alive (reads, writes, PINGREQ when due) until ``event``.

        Between the barriers of a run an agent may wait on slower agents for longer than
        the broker's keep-alive grace; the clients must not be dropped meanwhile. Whoever
        sets ``event`` calls wake(), so the wait ends at once, not at the next timeout.
        """
        if self._native is not None:
            return self._native.wait_for(event)
        last_misc = monotonic_ns()
        while not event.is_set():
            self.pump(0.05)
            if monotonic_ns() - last_misc > 1_000_000_000:
                for client in self._clients:
                    client.conn.loop_misc()
                last_misc = monotonic_ns()

    # -- callbacks (run on the loop thread) ---------------------------------------------

    def _on_connect(self, client: _Client, refusal: str | None) -> None:
        if client.times.t_connack_ns is None:
            client.times.t_connack_ns = monotonic_ns()
        if refusal is not None:
            client.failure = refusal
        else:
            client.connected = True

    def _on_disconnect(self, client: _Client, failure: str | None) -> None:
        # before its CONNACK too: a broker that drops the connection (a TLS alert after the
        # handshake) fails the wait at once; a refusing CONNACK's reason is kept first
        if failure is not None and client.failure is None:
            client.failure = failure
        client.connected = False

    def _on_suback(self, client: _Client, refused: list[str]) -> None:
        t_suback = monotonic_ns()
        topic = client.subscribing or client.spec.topic
        if refused:
            client.failure = f"SUBACK refused {topic!r}: {', '.join(refused)}"
            return
        client.subscribed = True
        spec = client.spec
        qos = dict(spec.subscriptions()).get(topic, spec.qos)
        self._record((EventKind.SUBSCRIBE, None, None, spec.client_id, topic, 0, qos,
                      False, None, None, t_suback, _USER, t_suback))

    def _on_message(self, client: _Client, msg: mqtt.MQTTMessage | Publish | SnMessage,
                    t_kernel: int | None = None) -> None:
        t_recv = monotonic_ns()
        payload = msg.payload
        self._on_delivery(client, msg.topic, payload, 0, len(payload), msg.qos, t_recv,
                          t_kernel)

    def _on_delivery(self, client: _Client, topic: str, data: bytes | bytearray, start: int,
                     end: int, qos: int, t_user: int, t_kernel: int | None) -> None:
        """Record one delivery of ``data[start:end]`` (read in place, not copied)."""
        self._gpio.toggle(client.spec.gpio_pin)
        try:
            seq, pub_index, t_pub, t_intended = decode_payload_at(data, start, end)
        except ValueError:
            return  # not one of ours (e.g. a stray retained message)
        client.received.add((pub_index, seq))
        client.last_delivery_ns = t_user
        spec = client.spec
        if t_kernel is None:
            self._user_deliveries += 1
            t_recv, source = t_user, _USER
        else:
            self._kernel_deliveries += 1
            t_recv, source = t_kernel, _KERNEL
        self._record((EventKind.DELIVERY, publisher_client_id(pub_index), seq, spec.client_id,
                      topic, end - start, qos, seq < client.warmup_of(pub_index),
                      t_intended, t_pub, t_recv, source, t_user))

    def _on_puback(self, client: _Client, refusal: str | None = None) -> None:
        if refusal is not None:  # an MQTT 5 PUBACK/PUBREC reason code >= 0x80
            client.failure = refusal
            return
        client.acked += 1
        spec = client.spec
        if spec.closed_loop and self._due is not None and client.sent < spec.messages:
            # the next message is due now, or at its place in the schedule if that is later
            heapq.heappush(self._due, (max(monotonic_ns(), self._due_ns(spec, client.sent)),
                                       self._position[client.spec.client_id], client.sent))

    # -- the loop -----------------------------------------------------------------------

    def pump(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for socket activity and let each client handle it."""
        for key, _ in self._selector.select(max(timeout_s, 0.0)):
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_reader.recv(4096):
                        pass
                continue
            client = key.data
            client.conn.loop_read()
            if client.tls:
                self._read_pending(client)
            if client.lean and client.conn.dead:
                # a closed connection stays readable (EOF): stop watching it
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(key.fileobj)
        self._gpio.settle()  # pulses end once what arrived together is handled
        for client in self._polled:
            if client.conn.want_write():
                client.conn.loop_write()
        if self._backlogged:
            self._flush_backlog()

    def _read_pending(self, client: _Client) -> None:
        """Read what TLS has decrypted but paho has not taken: a record may carry several
        packets, and select() no longer sees bytes the TLS layer holds."""
        for _ in range(MAX_PENDING_READS):
            sock = client.conn.socket()
            if sock is None or not sock.pending():
                return
            client.conn.loop_read()

    def _flush_backlog(self) -> None:
        """Write again what lean clients' sockets did not take at their last flush."""
        backlogged, self._backlogged = self._backlogged, set()
        for client in self._clients:
            if id(client) in backlogged and isinstance(client.conn, TcpMqttClient):
                client.conn.flush()

    def run(self, t_start_ns: int, t_deadline_ns: int, abort: Callable[[], bool],
            t_publish_end_ns: int | None = None,
            drain_idle: tuple[int, int] | None = None) -> None:
        """Publish on schedule from ``t_start_ns`` and receive until done or the deadline;
        nothing is published after ``t_publish_end_ns`` (default: the deadline). With
        ``drain_idle`` (the window's end, an idle time; ``timing.drain_idle_s``), a
        subscriber is done once no delivery reached it for the idle time after the window.

        Open-loop publishers: message k is due at ``t_start + offset + k / rate``; a late
        send goes out at once and keeps its intended time, so coordinated omission stays
        visible in the data. Closed-loop publishers (``ClientAssignment.closed_loop``, the
        QoS 2 publication throughput of the MQTT-ST paper): message k + 1 is due when
        message k is acknowledged, or at its schedule if that is later; its intended time
        is that moment.
        """
        if self._native is not None:
            return self._native.run(t_start_ns, t_deadline_ns, abort, t_publish_end_ns,
                                    drain_idle)
        self._t_start_ns = t_start_ns
        publish_end = t_deadline_ns if t_publish_end_ns is None else t_publish_end_ns
        self._publishers = [c for c in self._clients if c.spec.role == Role.PUBLISHER]
        self._position = {c.spec.client_id: pos for pos, c in enumerate(self._publishers)}
        due = self._due = [(self._due_ns(c.spec, 0), pos, 0)
                           for pos, c in enumerate(self._publishers)]
        heapq.heapify(due)
        last_misc = monotonic_ns()
        try:
            while not abort():
                now = monotonic_ns()
                batch: list[_Client] = []  # lean publishers with packets queued this turn
                # A generator behind schedule sends in turns of MAX_BATCH, reading between
                # them: its output stays bounded and acknowledgements keep flowing.
                while (due and due[0][0] <= now and now <= publish_end
                       and len(batch) < MAX_BATCH):
                    t_intended, pos, k = heapq.heappop(due)
                    client = self._publishers[pos]
                    self._publish(client, k, t_intended)
                    if client.lean:
                        batch.append(client)
                    else:
                        self._gpio.toggle(client.spec.gpio_pin)
                        self._gpio.settle()
                    if not client.spec.closed_loop and k + 1 < client.spec.messages:
                        heapq.heappush(due, (self._due_ns(client.spec, k + 1), pos, k + 1))
                    now = monotonic_ns()
                if batch:
                    self._write_batch(batch)
                    now = monotonic_ns()
                if now > publish_end:
                    due.clear()  # the publishing window is over: acks and drain only
                idle_since = (now - drain_idle[1] if drain_idle is not None
                              and now - drain_idle[0] >= drain_idle[1] else None)
                if self._finished(due, now > publish_end, idle_since) or now > t_deadline_ns:
                    return
                wait_ns = (due[0][0] - now) if due else 50_000_000
                self.pump(min(wait_ns, 50_000_000) / 1e9)
                if now - last_misc > 1_000_000_000:
                    for client in self._clients:
                        client.conn.loop_misc()
                    last_misc = now
                failed = [f"{c.spec.client_id}: {c.failure}" for c in self._clients
                          if c.failure]
                if failed:
                    raise RuntimeError("; ".join(failed))
        finally:
            self._due = None

    def _due_ns(self, spec: ClientAssignment, k: int) -> int:
        """When message ``k`` of a publisher is due on its open-loop schedule."""
        return self._t_start_ns + spec.start_offset_ns + int(k * 1e9 / spec.rate_hz)

    def _write_batch(self, batch: list[_Client]) -> None:
        """Write the lean publishers' queued PUBLISHes (one send each), then toggle their
        lines: like the seed's publisher, the line moves once the PUBLISH is written."""
        flushed: set[int] = set()
        for client in batch:
            if id(client) not in flushed and isinstance(client.conn, TcpMqttClient):
                flushed.add(id(client))
                client.conn.flush()
        for client in batch:
            self._gpio.toggle(client.spec.gpio_pin)
        self._gpio.settle()

    def _publish(self, client: _Client, seq: int, t_intended_ns: int) -> None:
        """Build and send (paho, UDP) or queue (lean) message ``seq``; the caller toggles
        the line once it is written."""
        spec = client.spec
        t_pub = monotonic_ns()
        payload = encode_payload(seq, spec.publisher_index, t_pub, t_intended_ns,
                                 spec.payload_bytes)
        client.conn.publish(spec.topic, payload, qos=spec.qos)
        client.sent += 1
        if client.first_intended_ns is None:
            client.first_intended_ns = t_intended_ns
        client.last_pub_ns = t_pub
        if t_pub - t_intended_ns > client.send_lag_max_ns:
            client.send_lag_max_ns = t_pub - t_intended_ns
        self._record((EventKind.PUBLISH, spec.client_id, seq, None, spec.topic, spec.payload_bytes,
                      spec.qos, seq < spec.warmup_messages, t_intended_ns, t_pub, None, _USER,
                      None))

    def _finished(self, due: list[tuple[int, int, int]], window_over: bool = False,
                  idle_since_ns: int | None = None) -> bool:
        """Whether every client is done; a subscriber whose latest delivery (or the
        window's end) is before ``idle_since_ns`` is done draining."""
        if due:
            return False
        for client in self._clients:
            spec = client.spec
            if spec.role == Role.PUBLISHER and client.sent < spec.messages and not window_over:
                return False  # a closed-loop publisher waits for its acknowledgements
            if spec.role == Role.PUBLISHER and spec.qos > 0 and client.acked < client.sent:
                return False
            if (spec.role == Role.SUBSCRIBER and len(client.received) < spec.expected_messages
                    and (idle_since_ns is None or client.last_delivery_ns >= idle_since_ns)):
                return False
        return True

    def connect_phases(self) -> list[ConnectPhases]:
        """Each client's connection, phase by phase, as far as its client could see it
        (for ``Done.connections``)."""
        if self._native is not None:
            return self._native.connect_phases()
        return [c.times.phases(c.spec.client_id) for c in self._clients
                if c.times.t_start_ns]

    def reconnects(self) -> list[ClientReconnects]:
        """Each persistent or reconnecting client's absences and returns (for
        ``Done.reconnects``; only the native engine has such clients)."""
        return self._native.reconnects() if self._native is not None else []

    def generator_report(self) -> GeneratorReport:
        """How the open-loop publishers kept their schedule, and which clock stamped the
        deliveries (for ``Done``)."""
        if self._native is not None:
            return self._native.generator_report()
        open_loop = [PublisherProgress(c.spec, c.sent, c.first_intended_ns, c.last_pub_ns,
                                       c.send_lag_max_ns) for c in self._clients
                     if c.spec.role == Role.PUBLISHER and not c.spec.closed_loop]
        return GeneratorReport(
            **schedule_fields(open_loop),
            mqtt_client=self._mqtt_client, mqtt_client_reason=self._client_reason,
            kernel_deliveries=self._kernel_deliveries,
            user_deliveries=self._user_deliveries,
            realtime_offset_gap_ns=None if self._clock_map is None else self._clock_map.gap_ns)

    def counts(self) -> tuple[int, int]:
        """Return (messages published, unique messages received) over all clients."""
        if self._native is not None:
            return self._native.counts()
        return (sum(c.sent for c in self._clients),
                sum(len(c.received) for c in self._clients))

    def close(self) -> None:
        """Disconnect every client politely, then close the sockets."""
        if self._native is not None:
            return self._native.close()
        for client in self._clients:
            try:
                if client.connected:
                    client.conn.disconnect()
                    client.conn.loop_write()
            except (OSError, ValueError):
                pass
            sock = client.conn.socket()
            if sock is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                sock.close()
            if isinstance(client.conn, TcpMqttClient):
                client.conn.close()
        self._selector.close()
        self._wake_reader.close()
        self._wake_writer.close()
