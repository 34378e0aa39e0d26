"""Typed, versioned messages between the controller and its agents (JSON over HTTP).

An agent registers, then heartbeats and long-polls for commands. Commands are an
assignment (which MQTT clients to run against which broker), a start time, an abort or a
shutdown. The agent answers with ready, result chunks (idempotent: the same chunk sent
twice is stored once), done or error.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mqttbed.core.broker_access import (
    DEFAULT_WEBSOCKET_PATH,
    ClientCredentials,
    ConnectPhases,
    EndpointTls,
    MqttProtocol,
)
from mqttbed.core.clock_discipline import ClockDiscipline
from mqttbed.core.events import EVENT_COLUMNS, OPTIONAL_EVENT_COLUMNS
from mqttbed.core.names import MAX_NAME_CHARS, PlainName

PROTOCOL_VERSION = 1


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    protocol_version: int = PROTOCOL_VERSION


class Transport(StrEnum):
    MQTT_TCP = "mqtt-tcp"
    MQTT_UDP = "mqtt-udp"
    MQTT_SN_UDP = "mqtt-sn-udp"


class Endpoint(BaseModel):
    """Where clients reach a deployed broker."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str
    port: int
    transport: Transport = Transport.MQTT_TCP
    # mqtt-tcp only: the stream is TLS (verified as these say), and/or MQTT rides in
    # WebSocket frames (RFC 6455, subprotocol "mqtt") at this path
    tls: EndpointTls | None = None
    websocket_path: str | None = None

    @model_validator(mode="after")
    def _layers_on_a_stream(self) -> Endpoint:
        if self.transport != Transport.MQTT_TCP and (self.tls or self.websocket_path):
            raise ValueError(f"{self.transport}: TLS and WebSocket ride on mqtt-tcp only")
        if self.websocket_path is not None and not self.websocket_path.startswith("/"):
            raise ValueError(f"websocket_path {self.websocket_path!r} must start with / "
                             f"(e.g. {DEFAULT_WEBSOCKET_PATH})")
        return self

    @property
    def scheme(self) -> str:
        """The URL scheme a user would write for it: mqtt, mqtts, ws, wss, mqtt-udp, ..."""
        if self.transport != Transport.MQTT_TCP:
            return str(self.transport)
        if self.websocket_path is not None:
            return "wss" if self.tls else "ws"
        return "mqtts" if self.tls else "mqtt"

    @property
    def url(self) -> str:
        """The endpoint as a user would write it: ``wss://127.0.0.1:8443/mqtt``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.websocket_path or ''}"


# Bounds of what the controller stores (its database columns and 32-bit integers):
# anything outside is a malformed message (422), not a server error.
_INT32 = 2**31 - 1
_COUNT = 2**62


class Register(Message):
    # The agent's id is made of it, and the id names the files of its event chunks.
    name: PlainName = Field(min_length=1, max_length=MAX_NAME_CHARS)
    hostname: str = Field(max_length=200)
    pid: int = Field(ge=0, le=_INT32)
    cores: int = Field(ge=1, le=1 << 16)
    gpio_backend: str = Field(max_length=64)
    clock: str = Field(max_length=64)
    clock_resolution_ns: int = Field(ge=0, le=10**12)
    boot_id: str | None = Field(default=None, max_length=64)


class Registered(Message):
    agent_id: PlainName
    heartbeat_interval_s: float
    # The agent exits once the controller has not answered for this long (it is gone).
    heartbeat_timeout_s: float = 3.0
    controller_boot_id: str | None = None  # same as the agent's: one clock, no offset


class ClockProbe(Message):
    """The controller's answer to an NTP-style probe: its clock on arrival and departure."""

    t_recv_ns: int
    t_send_ns: int
    # The controller's CLOCK_REALTIME - CLOCK_MONOTONIC and its clock discipline: with an
    # agent's own, they give the offset to within the two disciplines' bounds.
    realtime_minus_monotonic_ns: int | None = None
    discipline: ClockDiscipline | None = None


class ClockEstimate(BaseModel):
    """An agent's clock relative to the controller's: agent = controller + offset."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    offset_ns: int
    uncertainty_ns: int
    # "same-clock" (same kernel boot), "ntp" (min round-trip of HTTP probes), or "chrony" /
    # "ptp" (both machines disciplined: realtime - monotonic compared, bounds added)
    method: str
    discipline: str = "none"              # this agent's: chrony, ptp or none
    discipline_error_ns: int | None = None  # its bound, when synchronised
    probe_uncertainty_ns: int | None = None  # half the best probe's round trip


class Heartbeat(Message):
    agent_id: PlainName
    state: str = Field(max_length=16)
    t_agent_ns: int


class Role(StrEnum):
    PUBLISHER = "publisher"
    SUBSCRIBER = "subscriber"


class SubscribedStream(BaseModel):
    """A stream of a message mix as its subscribers see it: the topic to subscribe to, at
    which QoS, and whose messages are warm-up (publisher indexes first_publisher ...
    first_publisher + publishers - 1, sequence numbers below warmup_messages)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topic: str
    qos: int
    first_publisher: int
    publishers: int
    warmup_messages: int


class PublishedTree(BaseModel):
    """A publisher's messages spread over a tree of topics (``workload.topic_tree``):
    message k goes to the tree's topic ``(first + k) mod fanout ** levels`` under the
    client's topic (:func:`mqttbed.campaigns.shapes.tree_topic` names it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    levels: int = Field(ge=1, le=8)
    fanout: int = Field(ge=1)
    first: int = Field(0, ge=0, description="the tree topic of the publisher's message 0")


class RetainedPlan(BaseModel):
    """A client of a retained-state run (``workload.retained``): a publisher sets retained
    values, message k (RETAIN flag) on topic ``first + (k mod count) * stride`` of
    ``{topic}/{i}``, i < topics; a subscriber subscribes to its ``topic`` during the run,
    ``subscribe_after_start_ns`` after the start and no earlier than
    ``subscribe_after_publishers_ns`` after its agent's publishers are done."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topics: int = Field(ge=1)
    first: int = Field(0, ge=0)
    stride: int = Field(1, ge=1)
    count: int = Field(0, ge=0, description="a publisher's topics (0: a subscriber)")
    subscribe_after_start_ns: int = Field(0, ge=0)
    subscribe_after_publishers_ns: int = Field(0, ge=0)


class SessionPlan(BaseModel):
    """A client's persistent session (``workload.sessions``, ``workload.reconnect``):
    clean session 0 (3.1.1; MQTT 5: clean start 0 with ``session_expiry_s``), and for the
    subscribers that go away, when (``away_at_ns`` after the run's start), for how long,
    and how they leave (``disconnect``: DISCONNECT first; ``drop``: the socket closed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    persistent: bool = True
    session_expiry_s: int = Field(3600, ge=1, le=4_294_967_294)
    away_at_ns: int | None = Field(None, ge=0)
    away_for_ns: int | None = Field(None, gt=0)
    leave: Literal["disconnect", "drop"] = "drop"


class ReconnectPlan(BaseModel):
    """A client that connects again when its connection is lost during the run
    (``workload.reconnect``): after ``backoff_initial_ns``, the wait doubling after each
    failed attempt up to ``backoff_max_ns`` (no jitter)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backoff_initial_ns: int = Field(gt=0)
    backoff_max_ns: int = Field(gt=0)


class ClientAssignment(BaseModel):
    """One MQTT client an agent runs during a run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    client_id: str
    role: Role
    topic: str
    qos: int
    gpio_pin: int
    # publisher
    publisher_index: int = 0
    payload_bytes: int = 0
    rate_hz: float = 0.0
    messages: int = 0
    warmup_messages: int = 0
    start_offset_ns: int = 0  # staggers publishers over one period instead of a burst
    # subscriber: deliveries it expects (sum over the publishers of its topic(s))
    expected_messages: int = 0
    # subscriber of a message mix: every stream's topic, subscribed once per distinct
    # topic (at the highest QoS of its streams), one after the other in stream order; a
    # delivery's warm-up is its publisher's stream's. Empty: ``topic`` at ``qos``, with
    # ``warmup_messages``.
    streams: list[SubscribedStream] = []
    # subscription order: 0 subscribes first
    subscribe_rank: int = 0
    # the broker this client uses when a backend deploys several (else the assignment's)
    broker: Endpoint | None = None
    # publisher pacing: open loop on the schedule, or the next PUBLISH once the last one
    # is acknowledged (PUBACK / PUBCOMP), never faster than rate_hz
    closed_loop: bool = False
    # a publisher over a topic tree (workload.topic_tree): a topic per message; a
    # subscriber's ``topic`` is then its filter (and a shared subscriber's, $share/G/F)
    topic_tree: PublishedTree | None = None
    # workload.retained: a publisher's retained values, a subscriber's SUBSCRIBE in the run
    retained: RetainedPlan | None = None
    # workload.sessions / workload.reconnect: a persistent session and absences; connects
    # again after a lost connection (native engine only)
    session: SessionPlan | None = None
    reconnect: ReconnectPlan | None = None

    def subscriptions(self) -> list[tuple[str, int]]:
        """The (topic, QoS) a subscriber subscribes to, in order: its streams' distinct
        topics, each at the highest QoS of its streams; or its one topic."""
        if not self.streams:
            return [(self.topic, self.qos)]
        qos: dict[str, int] = {}
        for stream in self.streams:
            qos[stream.topic] = max(qos.get(stream.topic, 0), stream.qos)
        return list(qos.items())


class StormPlan(BaseModel):
    """One agent's share of a connection storm (``workload.mode: connect``): storm clients
    ``first``, ``first + step``, ... (``count`` of them, of ``total`` over every agent),
    client k named ``{client_id_prefix}{k}`` and intended at ``k / rate_hz`` s after the
    start (None: every client at the start); each held ``hold_s`` once all are made."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    client_id_prefix: str = Field(min_length=1, max_length=64)
    first: int = Field(ge=0)
    step: int = Field(ge=1)
    count: int = Field(ge=1)
    total: int = Field(ge=1)
    rate_hz: float | None = Field(None, gt=0)
    hold_s: float = Field(ge=0)
    clean_session: bool = True
    keepalive_s: int = Field(60, ge=1, le=65535)
    connect_timeout_s: float = Field(10.0, gt=0, description="a connect not done this long "
                                                             "after its connect() fails as "
                                                             "a timeout")

    def clients(self) -> range:
        """The storm indexes of this agent's clients."""
        return range(self.first, self.first + self.count * self.step, self.step)

    def offset_ns(self, k: int) -> int:
        """Client k's intended connect time after the start."""
        return 0 if self.rate_hz is None else round(k * 1e9 / self.rate_hz)


class Assignment(Message):
    type: Literal["assignment"] = "assignment"
    run_id: PlainName
    campaign_id: PlainName
    broker: Endpoint
    clients: list[ClientAssignment]
    chunk_events: int = 5000
    chunk_interval_s: float = 1.0
    force_clock_probe: bool = False  # estimate the offset even on the controller's machine
    clock_probe_interval_s: float = 5.0  # re-estimate the offset this often while running
    gpio_pulses: bool = False  # pulse the lines instead of toggling them (a scope is watching)
    window_ns: int = 0  # publishing window of the whole run, from the start time
    connect_timeout_s: float = 30.0
    drain_s: float = 1.0
    drain_idle_s: float | None = None  # the spec's timing.drain_idle_s
    # the MQTT client for mqtt-tcp: the native engine (C; the lean one where it cannot
    # run), mqttbed's lean Python one, or paho (TLS, comparison)
    mqtt_client: Literal["native", "lean", "paho"] = "native"
    heartbeat_timeout_s: float = 3.0  # the spec's timing.heartbeat_timeout_s, both ways
    protocol: MqttProtocol = "3.1.1"  # the spec's workload.protocol
    # what every client sends in CONNECT and presents in TLS (secrets: masked in every dump
    # but the commands' own, core.broker_access.reveal_secrets_context)
    credentials: ClientCredentials | None = None
    # workload.mode connect: this agent's share of the storm (``clients`` is empty then)
    storm: StormPlan | None = None


class Subscribe(Message):
    """Subscribe the subscribers of these ranks, in this order, each after the last SUBACK.

    The controller hands out the ranks in turn, the next only once the previous one's
    SUBACK was reported (``Subscribed``): every SUBSCRIBE leaves after the broker answered
    the one before, so the broker's subscription order is the rank order across agents.
    """

    type: Literal["subscribe"] = "subscribe"
    run_id: PlainName
    ranks: list[int]


class StartAt(Message):
    """Start publishing at ``t_start_ns`` on the controller's clock."""

    type: Literal["start"] = "start"
    run_id: PlainName
    t_start_ns: int


class Abort(Message):
    type: Literal["abort"] = "abort"
    run_id: PlainName
    reason: str


class Shutdown(Message):
    type: Literal["shutdown"] = "shutdown"


Command = Annotated[Assignment | Subscribe | StartAt | Abort | Shutdown,
                    Field(discriminator="type")]


class Commands(Message):
    commands: list[Command]


class Connected(Message):
    """Every client of the agent holds its CONNACK; the agent waits for its Subscribe."""

    run_id: PlainName
    agent_id: PlainName
    clients: list[str]
    clock: ClockEstimate


class Ready(Message):
    """Every subscriber of the agent holds its SUBACK; the agent waits for its StartAt."""

    run_id: PlainName
    agent_id: PlainName
    clients: list[str]
    clock: ClockEstimate
    gpio_backend: str
    gpio_toggle_ns: int | None = None
    gpio_driver: str = ""   # "native" (the C engine drives the lines) or "python"
    gpio_chip: str | None = None  # the chip the native engine drives


class Subscribed(Message):
    """The subscriber of ``rank`` holds its SUBACK (the controller hands out the next rank)."""

    run_id: PlainName
    agent_id: PlainName
    rank: int = Field(ge=0, le=_INT32)


class ResultChunk(Message):
    """Event rows in columns: ``columns`` vary per row, ``constants`` hold for every row.

    Columnar because the agent builds it on the machine it measures on: zipping tuples
    into columns and dumping lists is C work; building a dict per row is not.
    """

    run_id: PlainName
    agent_id: PlainName = Field(max_length=48)
    seq: int = Field(ge=0, le=_INT32)
    columns: dict[str, list[Any]]
    constants: dict[str, Any] = {}
    # GPIO edges recorded up to ``edges_until_ns`` (agent clock): columns pin, t_ns, level.
    # (A binary chunk's, decoded on the controller, are Arrow arrays, as its columns are.)
    edges: dict[str, list[int]] | None = None
    edges_until_ns: int | None = None

    @model_validator(mode="after")
    def _columns_cover_the_event_row(self) -> ResultChunk:
        lengths = {len(values) for values in self.columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns differ in length: {sorted(lengths)}")
        missing = (set(EVENT_COLUMNS) - set(self.columns) - set(self.constants)
                   - OPTIONAL_EVENT_COLUMNS)
        extra = (set(self.columns) | set(self.constants)) - set(EVENT_COLUMNS)
        if missing or extra:
            raise ValueError(f"event columns missing {sorted(missing)}, unknown {sorted(extra)}")
        return self

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values()), []))


class GeneratorReport(BaseModel):
    """How one agent's load generator kept its schedule, and which clock stamped its
    deliveries (sent with ``Done``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    open_loop_publishers: int = Field(0, ge=0)
    requested_msgs_per_s: float = Field(0.0, ge=0, description="sum of the open-loop rates")
    achieved_msgs_per_s: float = Field(
        0.0, ge=0, description="sum over open-loop publishers of messages sent over "
                               "(last send - first intended time + one period)")
    send_lag_max_ns: int = Field(0, ge=0)
    messages_unsent: int = Field(0, ge=0, description="scheduled but not sent by the deadline")
    publishers_behind: list[str] = Field(
        default_factory=list, description="open-loop publishers that did not keep their rate")
    rate_kept: bool = True
    mqtt_client: str = Field("", description="the client that ran: native, lean, paho")
    mqtt_client_reason: str = Field(
        "", description="why it is not the one the run asked for (e.g. the native engine "
                        "cannot be built here, or lacks the transport); empty when it is")
    kernel_deliveries: int = Field(0, ge=0)
    user_deliveries: int = Field(0, ge=0)
    realtime_offset_gap_ns: int | None = Field(
        None, description="how close the CLOCK_REALTIME/MONOTONIC pair was read: the kernel "
                          "stamps' mapping is right to within half of it")
    nofile_limit: int | None = Field(None, description="this agent's RLIMIT_NOFILE (soft)")
    send_kernel_stamps: int = Field(0, ge=0, description="publishes with a kernel TX stamp "
                                                         "(native engine)")
    send_to_kernel_p50_ns: int | None = Field(
        None, description="kernel TX stamp - user-space send time, median (native engine)")
    send_to_kernel_p99_ns: int | None = Field(None, description="... its 99th percentile")
    gpio_edge_lag_p99_ns: int | None = Field(
        None, description="GPIO edge - return of the send/receive call it marks, 99th "
                          "percentile (native engine)")
    gpio_edge_lag_max_ns: int | None = Field(None, description="... its maximum")
    gpio_chip: str | None = Field(
        None, description="the GPIO character device the native engine drove the lines on "
                          "(uAPI v2 SET_VALUES at each edge); None: virtual lines, or lines "
                          "toggled from Python")
    gpio_write_p99_ns: int | None = Field(
        None, description="how long the chip's SET_VALUES took after each edge's recorded "
                          "time (the line moved within it), 99th percentile (native engine "
                          "on a chip)")
    gpio_write_max_ns: int | None = Field(None, description="... its maximum")
    datagrams_dropped: int = Field(
        0, ge=0, description="mqtt-sn-udp on the native engine: datagrams from the gateway "
                             "dropped as malformed or unexpected, or on a topic id the client "
                             "never learnt (the run goes on)")


class Done(Message):
    run_id: PlainName
    agent_id: PlainName
    chunks: int = Field(ge=0, le=_INT32)
    published: int = Field(ge=0, le=_COUNT)
    received: int = Field(ge=0, le=_COUNT)
    upload_retries: int = Field(0, ge=0, le=_INT32, description="chunk posts sent again "
                                                                "after a failed attempt")
    generator: GeneratorReport | None = None
    # each client's connection, phase by phase (TCP, TLS, WebSocket, CONNECT -> CONNACK)
    connections: list[ConnectPhases] = Field(default_factory=list, max_length=1 << 20)
    # workload.mode connect: every storm client's connect (the controller keeps it as a
    # file of the run, connect_storm.json: 20,000 clients are ~1 MB, too big for a row)
    storm: StormOutcomes | None = None
    # workload.sessions / workload.reconnect: each such client's absences and returns
    reconnects: list[ClientReconnects] = Field(default_factory=list, max_length=1 << 20)


class Reconnect(BaseModel):
    """One absence of a client (left on schedule, or its connection lost) and its way back,
    on the agent's CLOCK_MONOTONIC (ns; None: not reached before the run ended)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    t_lost_ns: int = Field(description="it left, or its loss was seen")
    scheduled: bool = Field(description="a planned absence (workload.sessions)")
    reason: str = Field(max_length=256, description="how the connection went")
    attempts: int = Field(ge=0, description="connects tried until one was accepted")
    t_connect_ns: int | None = Field(None, description="the accepted attempt's connect()")
    tcp_ns: int | None = Field(None, description="its TCP connect")
    tls_ns: int | None = None
    websocket_ns: int | None = None
    connack_ns: int | None = Field(None, description="its CONNECT written to CONNACK read")
    t_connack_ns: int | None = Field(None, description="when it was back: CONNACK read")
    session_present: bool | None = Field(None, description="the CONNACK's flag")
    t_subscribed_ns: int | None = Field(None, description="the SUBACK of its subscribe "
                                                          "again (None: session kept)")
    publishes_skipped: int = Field(0, ge=0, description="own publishes due while away")
    publishes_abandoned: int = Field(0, ge=0, description="own QoS 1/2 publishes in "
                                                          "flight when it went")


class ClientReconnects(BaseModel):
    """A persistent or reconnecting client of a run: its first CONNACK's session present
    flag and each absence (:class:`Reconnect`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    client_id: str
    role: Role
    qos: int
    persistent: bool
    session_present: bool | None = Field(None, description="its first CONNACK's flag")
    reconnects: list[Reconnect] = Field(default_factory=list, max_length=1 << 16)


class StormOutcomes(BaseModel):
    """One agent's storm clients, column by column (one entry per client, in ``clients``
    order), on the agent's CLOCK_MONOTONIC: each instant in ns after the client's intended
    connect time (None: not reached), its outcome (``connected``, or why it failed:
    ``connack``, ``refused``, ``reset``, ``closed``, ``timeout``, ``tls``, ``websocket``,
    ``other``; ``pending``: never opened) and code (the CONNACK's return or reason code,
    or the errno)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    t_start_ns: int = Field(description="the storm's start: client k is intended at "
                                        "t_start_ns + k / rate_hz")
    t_all_done_ns: int | None = Field(None, description="every connect made or failed")
    t_left_ns: int | None = Field(None, description="the held connections ended "
                                                    "(DISCONNECT)")
    clients: list[int] = Field(max_length=1 << 20, description="storm indexes")
    intended_ns: list[int] = Field(max_length=1 << 20, description="after t_start_ns")
    connect_ns: list[int | None] = Field(max_length=1 << 20, description="connect() called")
    tcp_ns: list[int | None] = Field(max_length=1 << 20, description="TCP established")
    tls_ns: list[int | None] = Field(max_length=1 << 20, description="TLS handshake done")
    websocket_ns: list[int | None] = Field(max_length=1 << 20, description="101 read")
    mqtt_sent_ns: list[int | None] = Field(max_length=1 << 20, description="CONNECT written")
    connack_ns: list[int | None] = Field(max_length=1 << 20, description="CONNACK read")
    ended_ns: list[int | None] = Field(max_length=1 << 20, description="failed, or lost "
                                                                       "while held")
    outcome: list[str] = Field(max_length=1 << 20)
    code: list[int] = Field(max_length=1 << 20)
    details: dict[str, str] = Field(default_factory=dict, description="per outcome, the "
                                                                      "first failure's text")

    @model_validator(mode="after")
    def _columns_align(self) -> StormOutcomes:
        lengths = {name: len(getattr(self, name)) for name in STORM_COLUMNS}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"storm columns differ in length: {lengths}")
        return self


STORM_COLUMNS = ("clients", "intended_ns", "connect_ns", "tcp_ns", "tls_ns", "websocket_ns",
                 "mqtt_sent_ns", "connack_ns", "ended_ns", "outcome", "code")


class AgentFailure(Message):
    run_id: PlainName
    agent_id: PlainName
    reason: str
