"""The MQTT clients of one run on the native engine, with the Python session's surface.

:class:`~mqttbed.agents.mqtt_session.MqttSession` hands itself over to a
:class:`NativeSession` when the run's clients can run on the engine (mqtt-tcp, mqtt-udp
or mqtt-sn-udp; over mqtt-tcp also TLS and WebSocket, as the endpoint says; virtual GPIO
lines or a GPIO character device, the engine builds here);
:func:`unsupported_reason` says why they cannot otherwise, and that reason goes into the
generator report with the client that ran.

On a GPIO character device (the ``gpiod`` backend) the engine owns the run's lines: it
requests them on the chip (uAPI v2) and writes each edge with SET_VALUES right where it
records it, after the send call returns and after the receive. The Python backend releases
its own request for the run (the kernel gives a line to one request) and takes the levels
back when the session closes. ``rpi`` (RPi.GPIO, /dev/gpiomem on a Pi 1-4) stays in Python.

The engine runs the schedule, the sockets, the acknowledgement flows, the kernel stamps
and the GPIO edges in C; this class is the control plane: it connects, subscribes in rank
order, steps the run in slices of :data:`SLICE_NS` and, between slices, turns the engine's
event tables into the uploader's columns (whole columns at a time: no Python work per
event on the batch path) and its GPIO edges into the GPIO log (the engine's bytes).
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqttbed.agents.connect_times import ConnectTimes
from mqttbed.agents.gpio import GpiodLines, GpioLines, GpioUnavailable, VirtualGpio
from mqttbed.agents.native import engine as native
from mqttbed.agents.schedule_report import PublisherProgress, schedule_fields
from mqttbed.agents.subscribe_order import (
    check_handshakes,
    subscriber_ranks,
    subscribers_in_order,
)
from mqttbed.core.binary_chunk import BinaryBatch, Coded, Const, Null, Raw
from mqttbed.core.broker_access import ClientCredentials, ConnectPhases, MqttProtocol
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.events import ClockSource, EventKind, publisher_client_id
from mqttbed.core.protocol import (
    ClientAssignment,
    ClientReconnects,
    Endpoint,
    GeneratorReport,
    Reconnect,
    Role,
    Transport,
)

SLICE_NS = 50_000_000        # the run hands back this often: events drained, abort checked
KEEPALIVE_S = 30
RAW_COLUMNS = ("kind", "publisher", "seq", "receiver", "topic", "payload_bytes", "qos",
               "warmup", "t_intended_ns", "t_pub_ns", "t_recv_ns", "clock_source",
               "t_recv_user_ns")
_CLOCKS = (ClockSource.USER.value, ClockSource.KERNEL.value)
_MANY_PUBLISHERS = 1 << 20   # beyond: a foreign payload's index, named one at a time
MAX_CHIP_LINES = 64          # GPIO_V2_LINES_MAX: lines in one uAPI v2 line request

EventColumns = dict[str, list[Any]]
_NULL = Null()
_PUBLISH, _DELIVERY, _SUBSCRIBE = (Const(kind.value) for kind in EventKind)
_USER_CLOCK = Const(_CLOCKS[0])
_EDGE_COLUMNS = ("pin", "t", "level")       # of the engine's edge table, kept as bytes


def unsupported_reason(endpoint: Endpoint, clients: Sequence[ClientAssignment],
                       gpio: GpioLines) -> str | None:
    """Why these clients cannot run on the engine here, or None if they can."""
    for spec in clients:
        transport = (spec.broker or endpoint).transport
        if transport not in (Transport.MQTT_TCP, Transport.MQTT_UDP, Transport.MQTT_SN_UDP):
            return (f"transport {transport} (client {spec.client_id}): the native engine "
                    f"runs mqtt-tcp, mqtt-udp and mqtt-sn-udp only")
        if not 0 <= spec.gpio_pin < 65536:
            return f"gpio_pin {spec.gpio_pin} of {spec.client_id} is outside 0..65535"
    # one SSL_CTX per engine: every TLS client trusts the same CAs with the same checks
    trusts = {(tls.ca_pem, tls.verify) for spec in clients
              if (tls := (spec.broker or endpoint).tls) is not None}
    if len(trusts) > 1:
        return (f"{len(trusts)} different TLS settings (CA, verify) among one agent's brokers: "
                f"the native engine holds one per run")
    if not isinstance(gpio, (VirtualGpio, GpiodLines)):
        return (f"GPIO backend {gpio.backend!r}: the native engine drives virtual lines and "
                f"GPIO character devices (agents.gpio: gpiod) only; {gpio.backend!r} lines "
                f"(RPi.GPIO, /dev/gpiomem on a Pi 1-4) are toggled from Python by the lean "
                f"client. On a Pi, agents.gpio: gpiod drives them from C")
    if isinstance(gpio, GpiodLines):
        lines = {spec.gpio_pin for spec in clients}
        if len(lines) > MAX_CHIP_LINES:
            return (f"{len(lines)} GPIO lines: one line request on {gpio.chip} holds at most "
                    f"{MAX_CHIP_LINES} (linux/gpio.h GPIO_V2_LINES_MAX)")
    return native.unavailable_reason()


def _lookup(values: Sequence[Any], codes: list[int]) -> list[Any]:
    """``[values[c] for c in codes]`` as C work: one value repeated when the codes are."""
    if not codes:
        return []
    if codes.count(codes[0]) == len(codes):  # small ints compare by identity: cheap
        return [values[codes[0]]] * len(codes)
    return list(map(values.__getitem__, codes))


def _percentile(values: array, q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return int(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


@dataclass
class NativeClient:
    """One engine client as the session's callers see it (``MqttSession._clients``)."""

    spec: ClientAssignment
    index: int
    engine: native.Engine
    warmup_ranges: tuple[tuple[int, int, int], ...] = field(default=())

    @property
    def connected(self) -> bool:
        return bool(self.engine.client_counters(self.index).connected)

    @property
    def subscribed(self) -> bool:
        return bool(self.engine.client_counters(self.index).subscribed)

    @property
    def sent(self) -> int:
        return int(self.engine.client_counters(self.index).sent)

    @property
    def acked(self) -> int:
        return int(self.engine.client_counters(self.index).acked)

    @property
    def dropped(self) -> int:
        """mqtt-sn-udp: datagrams from the gateway dropped as malformed or unexpected."""
        return int(self.engine.client_counters(self.index).dropped)

    @property
    def failure(self) -> str | None:
        return self.engine.failure(self.index) or None

    @property
    def paho(self) -> NativeClient:
        """The client itself: its ``socket()`` is what callers of the historical name ask."""
        return self

    @property
    def conn(self) -> NativeClient:
        return self

    def socket(self) -> socket.socket | None:
        """A duplicate of the client's socket (for inspection: options, addresses)."""
        fd = self.engine.client_counters(self.index).fd
        return None if fd < 0 else socket.socket(fileno=os.dup(fd))


class NativeSession:
    """Connects, subscribes, publishes and receives for one agent during one run, in C."""

    def __init__(self, endpoint: Endpoint, clients: list[ClientAssignment], gpio: GpioLines,
                 record: Callable[[Any], None], gpio_pulses: bool = False,
                 record_columns: Callable[[EventColumns], None] | None = None,
                 kernel_timestamps: bool = True,
                 record_binary: Callable[[BinaryBatch], None] | None = None, *,
                 credentials: ClientCredentials | None = None,
                 protocol: MqttProtocol = "3.1.1"):
        self._endpoint = endpoint
        self._credentials = credentials
        self._protocol: MqttProtocol = protocol
        self._gpio = gpio
        self._record = record
        self._record_columns = record_columns
        self._record_binary = record_binary
        self._engine = native.Engine(kernel_stamps=kernel_timestamps, pulse_mode=gpio_pulses)
        self._configure_tls(clients)
        ordered = sorted(clients, key=lambda c: (c.role != Role.SUBSCRIBER, c.subscribe_rank))
        self._clients = [self._add(spec) for spec in ordered]
        self.gpio_chip: str | None = None  # the chip the engine drives, None: virtual lines
        pins = sorted({c.spec.gpio_pin for c in self._clients})
        if isinstance(gpio, GpiodLines):
            self._take_lines(gpio, pins)
        else:
            gpio.setup(pins)
        gpio.pulse_mode = gpio_pulses
        # Per-client values by client index: looked up for the list columns, and the
        # dictionaries of the binary batches' codes (tuples: a chunk lists each once).
        self._ids = tuple(c.spec.client_id for c in self._clients)
        self._receivers = (*self._ids, None)          # index -1: no receiver
        self._sizes = tuple(c.spec.payload_bytes for c in self._clients)
        self._qos = tuple(c.spec.qos for c in self._clients)
        # workload.retained: publishers' values carry the RETAIN flag; subscribers subscribe
        # during the run (their subscribe rows then say when the SUBSCRIBE was due, written)
        self._retains = tuple(c.spec.retained is not None and c.spec.role == Role.PUBLISHER
                              for c in self._clients)
        self._late = any(c.spec.retained is not None and c.spec.role == Role.SUBSCRIBER
                         for c in self._clients)
        self._publisher_names: tuple[str, ...] = ()   # by publisher index, grown on demand
        self._engine_topics: tuple[str, ...] = ()
        self._send_to_kernel_ns = array("q")          # per publish: kernel TX - user send
        self._edge_lags_ns = array("q")               # per edge: edge - syscall return
        self._edge_writes_ns = array("q")             # per chip edge: SET_VALUES done - edge
        self._kernel_deliveries = 0
        self._user_deliveries = 0
        self._closed = False

    def _configure_tls(self, clients: list[ClientAssignment]) -> None:
        """The engine's TLS settings: the endpoints' CA and verify (one for all, as
        :func:`unsupported_reason` checks) and the credentials' client certificate."""
        tls = next((t for spec in clients if (t := self._endpoint_of(spec).tls) is not None),
                   None)
        if tls is None:
            return
        credentials = self._credentials
        cert_pem = credentials.cert_pem if credentials else None
        key = credentials.key_pem if credentials else None
        try:
            self._engine.configure_tls(
                ca_pem=tls.ca_pem, verify=tls.verify, cert_pem=cert_pem,
                key_pem=None if key is None else key.get_secret_value())
        except ValueError:
            self._engine.close()
            self._closed = True
            raise

    def _take_lines(self, gpio: GpiodLines, pins: list[int]) -> None:
        """Request ``pins`` on the backend's chip from the engine, or fail the run here,
        before it starts, naming the chip and why (GpioUnavailable)."""
        gpio.hand_over(pins, self._engine.gpio_set)  # its own request goes first
        try:
            self._engine.open_gpio_chip(gpio.chip, pins)
        except OSError as exc:
            gpio.take_back({})
            self._engine.close()
            self._closed = True
            busy = (" (another request holds a line: `gpioinfo` names its consumer)"
                    if exc.errno == errno.EBUSY else "")
            # the engine's message names the chip, the step (open, request) and the errno
            raise GpioUnavailable(f"GPIO lines {pins} for the native engine: "
                                  f"{exc.strerror}{busy}") from exc
        self.gpio_chip = gpio.chip

    def _add(self, spec: ClientAssignment) -> NativeClient:
        endpoint = spec.broker or self._endpoint
        publisher = spec.role == Role.PUBLISHER
        index = self._engine.add_client(
            client_id=spec.client_id, host=endpoint.host, port=endpoint.port,
            publisher=publisher, topic=spec.topic, qos=spec.qos, gpio_pin=spec.gpio_pin,
            publisher_index=spec.publisher_index, payload_bytes=spec.payload_bytes,
            rate_hz=spec.rate_hz, messages=spec.messages if publisher else spec.expected_messages,
            warmup_messages=spec.warmup_messages, start_offset_ns=spec.start_offset_ns,
            closed_loop=spec.closed_loop)
        if endpoint.transport == Transport.MQTT_UDP:
            self._engine.set_udp(index)
        elif endpoint.transport == Transport.MQTT_SN_UDP:
            self._engine.set_mqttsn(index)
        if endpoint.tls is not None:
            self._engine.set_tls(index, endpoint.tls.server_name)
        if endpoint.websocket_path is not None:
            self._engine.set_websocket(index, endpoint.websocket_path)
        if spec.topic_tree is not None:  # after set_udp / set_mqttsn: MQTT-SN is refused
            tree = spec.topic_tree
            self._engine.set_topic_tree(index, tree.levels, tree.fanout, tree.first)
        if (plan := spec.retained) is not None and publisher and plan.count:
            self._engine.set_retained(index, topics=plan.topics, first=plan.first,
                                      stride=plan.stride, count=plan.count)
        credentials = self._credentials
        if self._protocol != "3.1.1" or (credentials is not None and (
                credentials.username is not None or credentials.password is not None)):
            self._engine.set_session(
                index, protocol_level=5 if self._protocol == "5" else 4,
                username=credentials.username if credentials else None,
                password=credentials.password_bytes() if credentials else None)
        if (session := spec.session) is not None and session.persistent:
            self._engine.set_persistent(index, session.session_expiry_s)
        if session is not None and session.away_at_ns is not None \
                and session.away_for_ns is not None:
            self._engine.set_absence(index, at_ns=session.away_at_ns,
                                     for_ns=session.away_for_ns, drop=session.leave == "drop")
        if (reconnect := spec.reconnect) is not None:
            self._engine.set_reconnect(index, backoff_initial_ns=reconnect.backoff_initial_ns,
                                       backoff_max_ns=reconnect.backoff_max_ns)
        for stream in spec.streams:
            self._engine.add_warmup_range(index, stream.first_publisher,
                                          stream.first_publisher + stream.publishers,
                                          stream.warmup_messages)
        return NativeClient(spec=spec, index=index, engine=self._engine)

    # -- set-up -----------------------------------------------------------------------

    def connect(self, timeout_s: float) -> None:
        """Connect every client, then subscribe every subscriber in rank order."""
        self.open(timeout_s)
        self.subscribe(timeout_s)

    def open(self, timeout_s: float) -> None:
        """Connect every client; returns once each holds its CONNACK, raises otherwise."""
        self._engine.connect_all(KEEPALIVE_S, timeout_s)
        deadline = monotonic_ns() + int(timeout_s * 1e9)
        while not all(c.connected for c in self._clients):
            try:
                check_handshakes(self._clients, deadline, "CONNACK", self._endpoint_of)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}{self._stuck_phases()}") from None
            self._poll(50_000_000)

    def _stuck_phases(self) -> str:
        """Where the first clients without a CONNACK stand (a TLS handshake, a WebSocket
        upgrade, the CONNECT), for a time-out's message; "" when all have failed."""
        stuck = []
        for client in self._clients:
            if client.connected or client.failure:
                continue
            endpoint = self._endpoint_of(client.spec)
            times = self._engine.connect_phases(client.index)
            if endpoint.tls is not None and times.t_tls_ns == native.NO_TIME:
                where = "its TLS handshake did not finish (does the port speak TLS?)"
            elif (endpoint.websocket_path is not None
                  and times.t_websocket_ns == native.NO_TIME):
                where = "no answer to its WebSocket upgrade"
            else:
                where = ("its CONNECT got no answer"
                         + ("" if endpoint.tls or endpoint.websocket_path else
                            " (a TLS or WebSocket port waits so on a plain MQTT client)"))
            stuck.append(f"{client.spec.client_id}: {where}")
        return f" ({'; '.join(stuck[:5])})" if stuck else ""

    def connect_phases(self) -> list[ConnectPhases]:
        """Each client's connection, phase by phase (for ``Done.connections``): TCP
        connect, TLS handshake, WebSocket upgrade, CONNECT to CONNACK; a phase that did
        not happen (or has not ended) is None. Clients that never called connect() are
        left out."""
        def seen(t: int) -> int | None:
            return None if t == native.NO_TIME else t

        phases = []
        for client in self._clients:
            t = self._engine.connect_phases(client.index)
            if t.t_connect_ns == native.NO_TIME:
                continue
            phases.append(ConnectTimes(
                t_start_ns=t.t_connect_ns, t_tcp_start_ns=t.t_connect_ns,
                t_tcp_done_ns=seen(t.t_tcp_ns), t_tls_done_ns=seen(t.t_tls_ns),
                t_websocket_done_ns=seen(t.t_websocket_ns),
                t_connect_sent_ns=seen(t.t_mqtt_sent_ns), t_connack_ns=seen(t.t_connack_ns),
            ).phases(client.spec.client_id))
        return phases

    def reconnects(self) -> list[ClientReconnects]:
        """Each persistent or reconnecting client's first CONNACK flag and absences, with
        the phases of each way back (for ``Done.reconnects``; src/reconnect.c)."""
        def seen(t: int) -> int | None:
            return None if t == native.NO_TIME else t

        def took(start: int, end: int) -> int | None:
            return None if native.NO_TIME in (start, end) else end - start

        found = []
        for client in self._clients:
            spec = client.spec
            if spec.session is None and spec.reconnect is None:
                continue
            records = []
            for r in self._engine.reconnects(client.index):
                tcp_start = r.t_connect_ns
                records.append(Reconnect(
                    t_lost_ns=r.t_lost_ns, scheduled=bool(r.scheduled),
                    reason=r.reason.decode(errors="replace"), attempts=r.attempts,
                    t_connect_ns=seen(tcp_start), tcp_ns=took(tcp_start, r.t_tcp_ns),
                    tls_ns=took(r.t_tcp_ns, r.t_tls_ns),
                    websocket_ns=took(r.t_tls_ns if r.t_tls_ns != native.NO_TIME
                                      else r.t_tcp_ns, r.t_websocket_ns),
                    connack_ns=took(r.t_mqtt_sent_ns, r.t_connack_ns),
                    t_connack_ns=seen(r.t_connack_ns),
                    session_present=None if r.session_present < 0
                    else bool(r.session_present),
                    t_subscribed_ns=seen(r.t_subscribed_ns), publishes_skipped=r.skipped,
                    publishes_abandoned=r.abandoned))
            present = self._engine.session_present(client.index)
            found.append(ClientReconnects(
                client_id=spec.client_id, role=spec.role, qos=spec.qos,
                persistent=spec.session is not None and spec.session.persistent,
                session_present=None if present < 0 else bool(present), reconnects=records))
        return found

    def tls_sessions(self) -> dict[str, str]:
        """Each TLS client's negotiated protocol and cipher ("TLSv1.3 TLS_AES_...")."""
        return {client.spec.client_id: tls for client in self._clients
                if (tls := self._engine.connect_phases(client.index).tls.decode())}

    def subscriber_ranks(self) -> list[int]:
        """The subscribe ranks of this session's subscribers, lowest first."""
        return subscriber_ranks(self._clients)

    def subscribe(self, timeout_s: float, ranks: list[int] | None = None) -> None:
        """Subscribe the subscribers of ``ranks`` (default: all), one at a time, in order,
        each SUBSCRIBE after the SUBACK before it."""
        deadline = monotonic_ns() + int(timeout_s * 1e9)
        for client in subscribers_in_order(self._clients, ranks):
            if (plan := client.spec.retained) is not None:  # subscribes during the run
                self._engine.subscribe_later(
                    client.index, client.spec.topic, client.spec.qos,
                    after_start_ns=plan.subscribe_after_start_ns,
                    after_publishers_ns=plan.subscribe_after_publishers_ns)
                continue
            for topic, qos in client.spec.subscriptions():
                self._engine.subscribe(client.index, topic, qos)
                while not client.subscribed:
                    check_handshakes(self._clients, deadline, "SUBACK", self._endpoint_of)
                    self._poll(50_000_000)

    def wake(self) -> None:
        """Make a wait or a run step blocked in another thread return now."""
        if not self._closed:
            self._engine.wake()

    def wait_for(self, event: threading.Event) -> None:
        """Keep every connection alive (reads, writes, PINGREQ when due) until ``event``."""
        while not event.is_set():
            self._poll(50_000_000)

    def _poll(self, timeout_ns: int) -> None:
        self._engine.poll(timeout_ns)
        self._drain()

    def _failures(self) -> str:
        return "; ".join(f"{c.spec.client_id}: {c.failure}" for c in self._clients
                         if c.failure)

    def _endpoint_of(self, spec: ClientAssignment) -> Endpoint:
        return spec.broker or self._endpoint

    # -- the run --------------------------------------------------------------------------

    def run(self, t_start_ns: int, t_deadline_ns: int, abort: Callable[[], bool],
            t_publish_end_ns: int | None = None,
            drain_idle: tuple[int, int] | None = None) -> None:
        """Publish on schedule from ``t_start_ns`` and receive until done or the deadline
        (the Python session's contract: :meth:`MqttSession.run`)."""
        publish_end = t_deadline_ns if t_publish_end_ns is None else t_publish_end_ns
        window_end, idle_ns = drain_idle if drain_idle is not None else (0, 0)
        self._engine.run_begin(t_start_ns, t_deadline_ns, publish_end, window_end, idle_ns)
        while not abort():
            status = self._engine.step(monotonic_ns() + SLICE_NS)
            self._drain()
            if status in (native.DONE, native.DEADLINE):
                break
            if status == native.FAILED:
                raise RuntimeError(self._failures())
        self._check_chip_writes()

    def _check_chip_writes(self) -> None:
        """RuntimeError when the chip refused line writes: the scope missed those edges."""
        if self.gpio_chip is None:
            return
        failures, error = self._engine.gpio_write_failures()
        if failures:
            raise RuntimeError(f"GPIO chip {self.gpio_chip}: {failures} line writes "
                               f"(SET_VALUES) failed, the last with {os.strerror(error)}")

    # -- events ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """Hand what the engine recorded to the uploader (columns) and the GPIO log."""
        engine = self._engine
        if self._record_binary is not None:
            self._drain_binary(self._record_binary)
        else:
            self._drain_lists()
        engine.take_column_into(native.T_TX, "lag", self._send_to_kernel_ns)
        if engine.rows(native.T_EDGE):
            self._edge_lags_ns.frombytes(engine.column_bytes(native.T_EDGE, "lag"))
            if self.gpio_chip is not None:
                self._edge_writes_ns.frombytes(engine.column_bytes(native.T_EDGE, "write"))
            # the edges stay the engine's bytes to the binary chunk (lists only on demand)
            _rows, edges = engine.take_bytes(native.T_EDGE, _EDGE_COLUMNS)
            if isinstance(self._gpio, (VirtualGpio, GpiodLines)):
                self._gpio.add_edge_buffers(edges["pin"], edges["t"], edges["level"])

    def _drain_lists(self) -> None:
        engine = self._engine
        self._emit_lists(self._publish_columns(engine.take(native.T_PUBLISH)))
        self._emit_lists(self._delivery_columns(engine.take(native.T_DELIVERY)))
        self._emit_lists(self._subscribe_columns(engine.take(native.T_SUBSCRIBE)))

    def _drain_binary(self, record: Callable[[BinaryBatch], None]) -> None:
        """The engine's tables as binary batches: each column one copy of the engine's
        buffer; strings and per-client values as codes over the session's tables."""
        engine = self._engine
        rows, table = engine.take_bytes(native.T_PUBLISH)
        if rows:
            record(self._publish_batch(rows, table))
        rows, table = engine.take_bytes(native.T_DELIVERY)
        if rows:
            batch = self._delivery_batch(rows, table)
            if batch is not None:
                record(batch)
            else:  # a foreign payload's publisher index: its names go the list way
                self._emit_lists(self._delivery_columns(
                    native.as_lists(native.T_DELIVERY, table)))
        rows, table = engine.take_bytes(native.T_SUBSCRIBE)
        if rows:
            record(self._subscribe_batch(rows, table))

    def _emit_lists(self, columns: EventColumns | None) -> None:
        if columns is not None:
            self._emit(columns)

    def _publish_batch(self, rows: int, table: dict[str, bytes]) -> BinaryBatch:
        client = table["client"]
        return BinaryBatch(rows, {
            "kind": _PUBLISH, "publisher": Coded(client, self._ids),
            "seq": Raw("int64", table["seq"]), "receiver": _NULL,
            # the topic each message went to (a tree publisher's changes per message)
            "topic": Coded(table["topic"], self._topics_snapshot()),
            "payload_bytes": Coded(client, self._sizes),
            "qos": Coded(client, self._qos), "warmup": Raw("bool", table["warmup"]),
            "t_intended_ns": Raw("int64", table["t_intended"]),
            "t_pub_ns": Raw("int64", table["t_pub"]), "t_recv_ns": _NULL,
            "clock_source": _USER_CLOCK, "t_recv_user_ns": _NULL,
            "retain": Coded(client, self._retains)})

    def _delivery_batch(self, rows: int, table: dict[str, bytes]) -> BinaryBatch | None:
        """None when a publisher index is foreign (>= _MANY_PUBLISHERS): no dictionary."""
        indexes = memoryview(table["publisher"]).cast("i")
        most = max(indexes)
        if most >= _MANY_PUBLISHERS or min(indexes) < 0:
            return None
        self._count_clocks(rows, table["kernel"].count(1))
        return BinaryBatch(rows, {
            "kind": _DELIVERY,
            "publisher": Coded(table["publisher"], self._publisher_names_through(most)),
            "seq": Raw("int64", table["seq"]),
            "receiver": Coded(table["client"], self._receivers),
            "topic": Coded(table["topic"], self._topics_snapshot()),
            "payload_bytes": Raw("int32", table["payload_bytes"]),
            "qos": Raw("uint8", table["qos"]), "warmup": Raw("bool", table["warmup"]),
            "t_intended_ns": Raw("int64", table["t_intended"]),
            "t_pub_ns": Raw("int64", table["t_pub"]), "t_recv_ns": Raw("int64", table["t_recv"]),
            "clock_source": Coded(table["kernel"], _CLOCKS, "uint8"),
            "t_recv_user_ns": Raw("int64", table["t_recv_user"]),
            "retain": Raw("bool", table["retain"])})

    def _subscribe_batch(self, rows: int, table: dict[str, bytes]) -> BinaryBatch:
        return BinaryBatch(rows, {
            "kind": _SUBSCRIBE, "publisher": _NULL, "seq": _NULL,
            "receiver": Coded(table["client"], self._receivers),
            "topic": Coded(table["topic"], self._topics_snapshot()),
            "payload_bytes": Const(0), "qos": Raw("uint8", table["qos"]),
            "warmup": Const(False),
            # a subscription made during the run: when its SUBSCRIBE was due, and written
            "t_intended_ns": Raw("int64", table["t_intended"]) if self._late else _NULL,
            "t_pub_ns": Raw("int64", table["t_sent"]) if self._late else _NULL,
            "t_recv_ns": Raw("int64", table["t_suback"]), "clock_source": _USER_CLOCK,
            "t_recv_user_ns": Raw("int64", table["t_suback"])})

    def _topics_snapshot(self) -> tuple[str, ...]:
        """The engine's interned topics as a tuple, a new one only when a topic came."""
        topics = self._engine.topics()
        if len(topics) != len(self._engine_topics):
            self._engine_topics = tuple(topics)
        return self._engine_topics

    def _emit(self, columns: EventColumns) -> None:
        if self._record_columns is not None:
            self._record_columns(columns)
            return
        for event in zip(*(columns[name] for name in RAW_COLUMNS), strict=True):
            self._record(event)

    def _publish_columns(self, table: dict[str, list[int]]) -> EventColumns | None:
        rows = len(table["client"])
        if not rows:
            return None
        client = table["client"]
        nothing: list[None] = [None] * rows
        return {"kind": [EventKind.PUBLISH.value] * rows,
                "publisher": _lookup(self._ids, client),
                "seq": table["seq"], "receiver": nothing,
                "topic": _lookup(self._engine.topics(), table["topic"]),
                "payload_bytes": _lookup(self._sizes, client),
                "qos": _lookup(self._qos, client), "warmup": table["warmup"],
                "t_intended_ns": table["t_intended"], "t_pub_ns": table["t_pub"],
                "t_recv_ns": nothing, "clock_source": [_CLOCKS[0]] * rows,
                "t_recv_user_ns": nothing, "retain": _lookup(self._retains, client)}

    def _publisher_names_of(self, indexes: list[int]) -> list[str]:
        """The publishers' client ids of a delivery column's publisher indexes."""
        most = max(indexes)
        if most >= _MANY_PUBLISHERS:  # a foreign payload's index: named one at a time
            return list(map(publisher_client_id, indexes))
        return _lookup(self._publisher_names_through(most), indexes)

    def _publisher_names_through(self, most: int) -> tuple[str, ...]:
        """The client ids of publisher indexes 0 to ``most`` (a new tuple only when the
        known ones grow: a binary chunk lists its dictionary once)."""
        known = len(self._publisher_names)
        if most >= known:
            self._publisher_names += tuple(map(publisher_client_id, range(known, most + 1)))
        return self._publisher_names

    def _count_clocks(self, rows: int, kernel: int) -> None:
        """Count ``rows`` deliveries, ``kernel`` of them kernel-stamped, by clock."""
        self._kernel_deliveries += kernel
        self._user_deliveries += rows - kernel

    def _delivery_columns(self, table: dict[str, list[int]]) -> EventColumns | None:
        rows = len(table["client"])
        if not rows:
            return None
        self._count_clocks(rows, sum(table["kernel"]))
        topics = self._engine.topics()
        return {"kind": [EventKind.DELIVERY.value] * rows,
                "publisher": self._publisher_names_of(table["publisher"]),
                "seq": table["seq"], "receiver": _lookup(self._receivers, table["client"]),
                "topic": _lookup(topics, table["topic"]),
                "payload_bytes": table["payload_bytes"], "qos": table["qos"],
                "warmup": table["warmup"],
                "t_intended_ns": table["t_intended"], "t_pub_ns": table["t_pub"],
                "t_recv_ns": table["t_recv"],
                "clock_source": _lookup(_CLOCKS, table["kernel"]),
                "t_recv_user_ns": table["t_recv_user"], "retain": table["retain"]}

    def _subscribe_columns(self, table: dict[str, list[int]]) -> EventColumns | None:
        rows = len(table["client"])
        if not rows:
            return None
        topics = self._engine.topics()
        nothing: list[None] = [None] * rows
        return {"kind": [EventKind.SUBSCRIBE.value] * rows, "publisher": nothing,
                "seq": nothing, "receiver": list(map(self._receivers.__getitem__,
                                                     table["client"])),
                "topic": list(map(topics.__getitem__, table["topic"])),
                "payload_bytes": [0] * rows, "qos": table["qos"], "warmup": [False] * rows,
                "t_intended_ns": table["t_intended"] if self._late else nothing,
                "t_pub_ns": table["t_sent"] if self._late else nothing,
                "t_recv_ns": table["t_suback"],
                "clock_source": [_CLOCKS[0]] * rows, "t_recv_user_ns": table["t_suback"],
                "retain": nothing}

    # -- reports --------------------------------------------------------------------------

    def generator_report(self, mqtt_client_reason: str = "") -> GeneratorReport:
        """How the open-loop publishers kept their schedule, which clock stamped the
        deliveries, and the engine's own figures (send stamps, GPIO edge lag)."""
        progress = []
        for client in self._clients:
            if client.spec.role == Role.PUBLISHER and not client.spec.closed_loop:
                counters = self._engine.client_counters(client.index)
                progress.append(PublisherProgress(
                    client.spec, counters.sent,
                    counters.first_intended_ns if counters.sent else None,
                    counters.last_pub_ns, counters.send_lag_max_ns))
        return GeneratorReport(
            **schedule_fields(progress), mqtt_client="native",
            mqtt_client_reason=mqtt_client_reason,
            kernel_deliveries=self._kernel_deliveries, user_deliveries=self._user_deliveries,
            realtime_offset_gap_ns=self._engine.realtime_gap_ns,
            send_kernel_stamps=len(self._send_to_kernel_ns),
            send_to_kernel_p50_ns=_percentile(self._send_to_kernel_ns, 0.5),
            send_to_kernel_p99_ns=_percentile(self._send_to_kernel_ns, 0.99),
            gpio_edge_lag_p99_ns=_percentile(self._edge_lags_ns, 0.99),
            gpio_edge_lag_max_ns=max(self._edge_lags_ns) if self._edge_lags_ns else None,
            gpio_chip=self.gpio_chip,
            gpio_write_p99_ns=_percentile(self._edge_writes_ns, 0.99),
            gpio_write_max_ns=max(self._edge_writes_ns) if self._edge_writes_ns else None,
            datagrams_dropped=sum(client.dropped for client in self._clients))

    def counts(self) -> tuple[int, int]:
        """Return (messages published, unique messages received) over all clients."""
        counters = [self._engine.client_counters(c.index) for c in self._clients]
        return sum(c.sent for c in counters), sum(c.received_unique for c in counters)

    def close(self) -> None:
        """Disconnect every client politely, then close the sockets and free the engine."""
        if self._closed:
            return
        self._drain()
        levels = {pin: self._engine.gpio_level(pin) for pin in
                  {c.spec.gpio_pin for c in self._clients}}
        if isinstance(self._gpio, VirtualGpio):
            self._gpio.set_levels(levels)
        elif isinstance(self._gpio, GpiodLines) and self.gpio_chip is not None:
            self._gpio.take_back(levels)  # the engine's request is closed with it below
        self._closed = True
        self._engine.close()
