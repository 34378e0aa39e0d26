"""The campaign spec: what to measure, against which broker, swept over what.

A spec is loaded from YAML or JSON, validated by pydantic, and expanded into one
resolved spec per sweep point. Every error names the field and the bad value.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from mqttbed.campaigns.repetitions import (
    RepetitionsUntil,
    first_repetitions,
    most_repetitions,
)
from mqttbed.campaigns.search import SearchSpec
from mqttbed.campaigns.shapes import (
    SHAPES,
    ConnectStorm,
    PersistentSessions,
    ReconnectStorm,
    Retained,
    SharedSubscription,
    TopicTree,
    check_shape_features,
)
from mqttbed.campaigns.wiring import check_header_lines, plan_wiring
from mqttbed.core.bounded_yaml import MAX_BYTES as MAX_SPEC_BYTES
from mqttbed.core.bounded_yaml import YamlBoundsError, load_bounded_yaml
from mqttbed.core.broker_access import (
    MASK,
    MQTT_PROTOCOLS,
    AuthSettings,
    ListenerTransport,
    MqttProtocol,
    TlsSettings,
)
from mqttbed.core.errors import SpecError
from mqttbed.core.events import PAYLOAD_MIN_BYTES
from mqttbed.core.ssh import SshTarget

if typing.TYPE_CHECKING:
    from mqttbed.core.backends import BrokerFeatures

MQTT_MAX_PAYLOAD = 268_435_455 - 1024
# Scenarios x the sweep's cross product x repetitions; past it a spec is refused before
# anything is expanded (ten keys of ten values would be 10**10 points to validate).
MAX_RUNS = 10_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BrokerSection(BaseModel):
    """The broker backend and its backend-specific options (validated by the backend).

    ``host`` and ``cpu_limit`` are common to every backend: they say where and how the
    broker runs, and are not passed to the backend's options.
    """

    model_config = ConfigDict(extra="allow")
    backend: str = Field("mosquitto", description="which backend deploys the broker; the rest "
                                                  "of the section is its options")
    host: str | None = Field(None, min_length=1, max_length=64,
                             description="a lab host (mqttbed lab provision) to run the broker "
                                         "on, over SSH; default: the controller's machine")
    cpu_limit: float | None = Field(
        None, description="cores each broker of the run may use (e.g. 0.25), enforced by a "
                          "cgroup CPU quota on the broker's processes, as on a small host "
                          "of its own; default: no limit")
    transport: ListenerTransport | None = Field(
        None, description="what the broker's listener speaks under MQTT: tcp, tls, ws or "
                          "wss (a managed broker gets that listener); default: tcp, or, "
                          "for a backend reached one way only (external: its url's "
                          "scheme), that way")
    tls: TlsSettings | None = Field(
        None, description="how the clients verify the broker (ca_file, server_name, "
                          "verify) and prove who they are (cert_file, key_file), with "
                          "transport tls or wss; files are read on the controller when "
                          "each run starts")
    auth: AuthSettings | None = Field(
        None, description="the user name every client sends in CONNECT and where its "
                          "password is read when each run starts (password_file or "
                          "password_env, on the controller); the spec never holds it")

    @field_validator("cpu_limit")
    @classmethod
    def _cpu_limit_enforceable(cls, cores: float | None) -> float | None:
        from mqttbed.core.backends import check_cpu_limit

        return None if cores is None else check_cpu_limit(cores)

    @model_validator(mode="after")
    def _options_fit_backend(self) -> BrokerSection:
        from mqttbed.core.backends import options_model

        try:
            model = options_model(self.backend)
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        model.model_validate(self.model_dump(exclude=set(COMMON_BROKER_FIELDS)))
        return self

    @model_validator(mode="after")
    def _cpu_limit_has_processes(self) -> BrokerSection:
        """A CPU budget needs broker processes mqttbed starts on this machine."""
        from mqttbed.core.backends import LocalProcesses, declaration

        if self.cpu_limit is None:
            return self
        if self.host is not None:
            raise ValueError(f"broker.cpu_limit {self.cpu_limit}: the broker runs on lab host "
                             f"{self.host!r} (broker.host), and a CPU budget limits processes "
                             "on the controller's machine; leave one of them out")
        if not declaration(self.backend).supports(LocalProcesses):
            raise ValueError(f"broker.cpu_limit {self.cpu_limit}: backend {self.backend} "
                             "starts no broker process on this machine (mqttbed neither "
                             "starts nor stops its broker), so there is nothing to put under "
                             "a CPU budget; leave broker.cpu_limit out")
        return self

    def options(self) -> BaseModel:
        """Return the backend's own options model for this section."""
        from mqttbed.core.backends import options_model

        return options_model(self.backend).model_validate(
            self.model_dump(exclude=set(COMMON_BROKER_FIELDS)))

    def features(self) -> BrokerFeatures:
        """What the backend's broker does with these options (its declared features)."""
        from mqttbed.core.backends import declaration

        return declaration(self.backend).features_for(self.options())

    def resolved_transport(self) -> ListenerTransport:
        """``transport``; else the one way the backend declares for these options (an
        ``external`` url's scheme); else tcp."""
        if self.transport is not None:
            return self.transport
        transports = self.features().transports
        if len(transports) == 1:
            return next(iter(transports))
        return ListenerTransport.TCP


# Fields of the broker section that every backend has (not the backend's options).
COMMON_BROKER_FIELDS = frozenset(name for name in BrokerSection.model_fields
                                 if name != "backend")


def _publishable(topic: str) -> str:
    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
        raise ValueError("a publish topic must be non-empty without wildcards (+, #) or NUL")
    return topic


PublishTopic = Annotated[str, AfterValidator(_publishable)]


class Stream(_Strict):
    """One stream of a message mix: its own publishers, topic, payload size and rate.

    ``rate_hz`` and ``period_s`` are two spellings of one thing: give exactly one.
    ``messages`` and ``warmup_messages`` default to the workload's.
    """

    name: str | None = Field(None, min_length=1, max_length=200,
                             description="how the results name the stream; default: its topic")
    topic: PublishTopic = Field(description="the stream's topic (a name, no wildcards)")
    payload_bytes: int = Field(ge=PAYLOAD_MIN_BYTES, le=MQTT_MAX_PAYLOAD,
                               description="at least the timestamp header")
    rate_hz: float | None = Field(None, gt=0, le=100_000, description="per publisher, open loop")
    period_s: float | None = Field(None, gt=0, le=86_400, description="1 / rate_hz")
    publishers: int = Field(1, ge=1, le=10_000, description="publisher clients of its own")
    qos: Literal[0, 1, 2] = Field(0, description="QoS of the stream's publications")
    messages: int | None = Field(None, ge=1, le=10_000_000,
                                 description="per publisher, incl. warm-up; default: "
                                             "workload.messages")
    warmup_messages: int | None = Field(None, ge=0,
                                        description="default: workload.warmup_messages")
    offset_s: float = Field(0.0, ge=0, le=86_400,
                            description="its first message this long after the run's start "
                                        "(default: every stream starts at once)")

    @model_validator(mode="after")
    def _one_spelling_of_the_rate(self) -> Stream:
        if (self.rate_hz is None) == (self.period_s is None):
            given = (f"both rate_hz ({self.rate_hz}) and period_s ({self.period_s})"
                     if self.rate_hz is not None else "neither rate_hz nor period_s")
            raise ValueError(f"{given}: give exactly one (period_s = 1 / rate_hz)")
        return self

    @property
    def resolved_rate_hz(self) -> float:
        """The rate per publisher, whichever of its two spellings was given."""
        if self.rate_hz is not None:
            return self.rate_hz
        assert self.period_s is not None  # _one_spelling_of_the_rate saw exactly one
        return 1 / self.period_s


@dataclass(frozen=True)
class ResolvedStream:
    """A stream with every default filled in, and the publisher indexes it owns."""

    name: str
    topic: str
    payload_bytes: int
    rate_hz: float
    publishers: int
    qos: int
    messages: int
    warmup_messages: int
    offset_s: float
    first_publisher: int  # its publishers are first_publisher ... + publishers - 1

    @property
    def period_ns(self) -> float:
        return 1e9 / self.rate_hz


# What ``workload.streams`` replaces: giving both is an error.
STREAM_REPLACES = ("publishers", "topic", "payload_bytes", "rate_hz", "qos")
STREAMS_PATH = "workload.streams."
RATE_SPELLINGS = ("rate_hz", "period_s")


class Workload(_Strict):
    """Who publishes what, how fast, to how many subscribers.

    One stream by default (``publishers`` ... ``qos``); ``streams`` makes it a message mix
    instead: each stream has publishers of its own, and every subscriber subscribes to
    every stream's topic.
    """

    # time-sync: the publisher is a time server (seed 000, section 4.2, MQTT-TS): each
    # PUBLISH carries its clock, each subscriber sets its clock from it on receipt, and the
    # stats report every subscriber's error against the reference clock.
    # connect: a connection storm (workload.connect): clients connect, hold and leave, and
    # no message is published.
    mode: Literal["pubsub", "time-sync", "connect"] = Field(
        "pubsub", description="time-sync: the publisher is a time server (MQTT-TS) and the "
                              "stats give each subscriber's clock error; connect: a "
                              "connection storm (workload.connect), no messages")
    publishers: int = Field(1, ge=0, le=10_000, description="publisher clients")
    subscribers: int = Field(1, ge=0, le=10_000, description="subscriber clients")
    topic: PublishTopic = Field("bench/sync", description="the topic published to (a name, "
                                                       "no wildcards)")
    payload_bytes: int = Field(64, ge=PAYLOAD_MIN_BYTES, le=MQTT_MAX_PAYLOAD,
                               description="at least the timestamp header")
    rate_hz: float = Field(100.0, gt=0, le=100_000, description="per publisher, open loop")
    messages: int = Field(500, ge=1, le=10_000_000, description="per publisher, incl. warm-up")
    qos: Literal[0, 1, 2] = Field(0, description="QoS of publications and subscriptions")
    warmup_messages: int = Field(20, ge=0, description="per publisher: sent, but left out of "
                                                      "the statistics")
    min_window_s: float = Field(0.0, ge=0, le=86_400,
                                description="measure at least this long (e.g. an idle broker); "
                                            "closed loop: the time publishers are given")
    pacing: Literal["open-loop", "closed-loop"] = Field(
        "open-loop", description="open-loop: on the rate_hz schedule, late sends keep their "
                                 "intended time; closed-loop: the next PUBLISH once the last "
                                 "is acknowledged (PUBACK/PUBCOMP), at most rate_hz, for "
                                 "publication throughput")
    topics: Literal["shared", "per-publisher"] = Field(
        "shared", description="shared: every publisher publishes on topic and every "
                              "subscriber receives all (fan-out); per-publisher: publisher i "
                              "publishes on topic/i and subscriber j subscribes to "
                              "topic/(j mod publishers), to hold many clients without "
                              "publishers x subscribers deliveries")
    client: Literal["native", "lean", "paho"] = Field(
        "native", description="the agents' MQTT client on mqtt-tcp: native = mqttbed's C "
                              "engine (kernel send and receive timestamps; the lean client "
                              "runs where it cannot, and the run says why); lean = "
                              "mqttbed's Python client (non-blocking, batched writes, kernel "
                              "receive timestamps); paho = paho-mqtt (for comparison; "
                              "user-space timestamps)")
    protocol: MqttProtocol = Field(
        "3.1.1", description="the MQTT version every client speaks: \"3.1.1\" or \"5\" "
                             "(a backend declaring 3.1.1 only refuses 5 before the run)")
    placement: Literal["benchmark", "distributed", "locality"] | None = Field(
        None, description="how clients are spread over the brokers of a backend that "
                          "deploys several (mqtt-st): benchmark = one plain broker, "
                          "distributed = evenly over all, locality = all on one; "
                          "None = the backend's default")

    streams: list[Stream] | None = Field(
        None, min_length=1,
        description="a message mix: replaces publishers, topic, payload_bytes, rate_hz and "
                    "qos; every subscriber subscribes to every stream's topic")

    # traffic shapes (campaigns.shapes): at most one on a pub/sub workload
    connect: ConnectStorm | None = Field(
        None, description="mode connect: how many clients connect, how fast, for how long")
    shared: SharedSubscription | None = Field(
        None, description="subscribers share the stream in $share groups (MQTT 5, or "
                          "Mosquitto's 3.1.1 form)")
    topic_tree: TopicTree | None = Field(
        None, description="publishers spread over a tree of topics, subscribers hold "
                          "wildcard filters")
    retained: Retained | None = Field(
        None, description="retained values set first; subscribers arrive afterwards")
    sessions: PersistentSessions | None = Field(
        None, description="subscribers with persistent sessions go away mid-run and return")
    reconnect: ReconnectStorm | None = Field(
        None, description="the broker is restarted mid-run; clients reconnect with backoff")

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol_as_text(cls, value: Any) -> Any:
        # YAML reads `protocol: 5` as a number; the version is a name ("5", "3.1.1")
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and str(value) in MQTT_PROTOCOLS:
            return str(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _streams_or_one_stream(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("streams"):
            given = [key for key in STREAM_REPLACES if key in data]
            if given:
                raise ValueError(f"streams replaces {', '.join(given)} (each stream has its "
                                 f"own); drop {', '.join(given)} or drop streams")
        return data

    @model_serializer(mode="wrap")
    def _without_replaced_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A dumped mix must load again: it leaves out the single-stream fields it replaces.
        data = handler(self)
        if self.streams:
            for key in STREAM_REPLACES:
                data.pop(key, None)
        return data

    @model_validator(mode="after")
    def _warmup_leaves_messages(self) -> Workload:
        if self.warmup_messages >= self.messages and not self.streams:
            raise ValueError(f"warmup_messages ({self.warmup_messages}) must be less than "
                             f"messages ({self.messages}), or nothing is measured")
        for n, stream in enumerate(self.streams or ()):
            warmup = self.warmup_messages if stream.warmup_messages is None \
                else stream.warmup_messages
            messages = self.messages if stream.messages is None else stream.messages
            if warmup >= messages:
                raise ValueError(
                    f"streams.{n}.warmup_messages ({warmup}) must be less than its messages "
                    f"({messages}), or nothing of it is measured (a stream without either "
                    f"takes workload.warmup_messages / workload.messages)")
        return self

    @model_validator(mode="after")
    def _streams_are_told_apart(self) -> Workload:
        names = [stream.name or stream.topic for stream in self.streams or ()]
        if repeated := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"streams share the name {', '.join(map(repr, repeated))} (a "
                             f"stream is named by its topic unless it has a name): give "
                             f"each stream a distinct name")
        return self

    @model_validator(mode="after")
    def _per_publisher_topics_need_one_stream(self) -> Workload:
        if self.topics == "per-publisher" and self.streams:
            raise ValueError("topics 'per-publisher' gives each publisher of the one stream its "
                             "own topic; with streams, leave topics out (shared)")
        if self.topics == "per-publisher" and self.subscribers and not self.publishers:
            raise ValueError("topics 'per-publisher' pairs subscribers with publishers: set "
                             "publishers to at least 1")
        return self

    @model_validator(mode="after")
    def _closed_loop_needs_acks(self) -> Workload:
        at_qos0 = [s.name for s in self.resolved_streams() if s.qos == 0]
        if self.pacing == "closed-loop" and at_qos0:
            where = f" (streams {', '.join(at_qos0)})" if self.streams else ""
            raise ValueError(f"pacing 'closed-loop' waits for each PUBLISH's acknowledgement: "
                             f"QoS 0 has none{where}; set qos to 1 or 2")
        if self.pacing == "closed-loop" and self.min_window_s <= 0:
            raise ValueError("pacing 'closed-loop' needs min_window_s > 0: the time the "
                             "publishers are given (they stop then, or when all is sent)")
        return self

    @model_validator(mode="after")
    def _one_shape(self) -> Workload:
        given = [name for name in SHAPES if getattr(self, name) is not None]
        if self.mode == "connect":
            if self.connect is None:
                raise ValueError("mode 'connect' needs workload.connect (clients, rate_hz, "
                                 "hold_s)")
            # (a sweep point's workload is its dump validated again: every field is set
            # there, the defaults among them, so a field counts only if it is not its default)
            extra = [name for name in ("publishers", "subscribers", "streams", *given)
                     if name in self.model_fields_set
                     and getattr(self, name) != type(self).model_fields[name].get_default(
                         call_default_factory=True)]
            if extra:
                raise ValueError(f"mode 'connect' opens connections only: leave "
                                 f"{', '.join(extra)} out")
            return self
        if self.connect is not None:
            raise ValueError(f"workload.connect is for mode 'connect', not {self.mode!r}: "
                             "set mode: connect")
        if len(given) > 1:
            raise ValueError(f"workload.{given[0]} and workload.{given[1]} together: one "
                             "traffic shape per workload")
        if given and (self.mode != "pubsub" or self.streams):
            raise ValueError(f"workload.{given[0]} shapes one pub/sub stream: leave "
                             f"{'streams' if self.streams else 'mode'} out")
        if given and self.topics == "per-publisher":
            raise ValueError(f"workload.{given[0]} sets the topics itself: leave topics out")
        if self.topic_tree is not None and self.client != "native":
            raise ValueError(f"workload.topic_tree sends a topic per message, which only the "
                             f"native engine does; workload.client {self.client!r} publishes "
                             "one topic: leave workload.client out (native)")
        if self.retained is not None and self.client != "native":
            raise ValueError(f"workload.retained sets values with the RETAIN flag and "
                             f"subscribes during the run, which only the native engine does; "
                             f"workload.client {self.client!r} does neither: leave "
                             "workload.client out (native)")
        if self.shared is not None and self.subscribers < self.shared.groups:
            raise ValueError(f"workload.shared.groups ({self.shared.groups}) is more than "
                             f"subscribers ({self.subscribers}): each group needs a member")
        if self.sessions is not None and self.sessions.offline > self.subscribers:
            raise ValueError(f"workload.sessions.offline ({self.sessions.offline}) is more "
                             f"than subscribers ({self.subscribers})")
        return self

    def shape(self) -> str | None:
        """The traffic shape on this workload's stream (a name of campaigns.shapes.SHAPES),
        "connect" for a connection storm, or None for a plain stream."""
        if self.mode == "connect":
            return "connect"
        return next((name for name in SHAPES if getattr(self, name) is not None), None)

    def resolved_streams(self) -> list[ResolvedStream]:
        """Every stream with its defaults filled in: ``streams``, or the single stream of
        ``publishers`` ... ``qos``. Publisher indexes run on across streams."""
        if not self.streams:
            return [ResolvedStream(
                name=self.topic, topic=self.topic, payload_bytes=self.payload_bytes,
                rate_hz=self.rate_hz, publishers=self.publishers, qos=self.qos,
                messages=self.messages, warmup_messages=self.warmup_messages, offset_s=0.0,
                first_publisher=0)]
        resolved, first = [], 0
        for stream in self.streams:
            resolved.append(ResolvedStream(
                name=stream.name or stream.topic, topic=stream.topic,
                payload_bytes=stream.payload_bytes,
                rate_hz=stream.resolved_rate_hz,
                publishers=stream.publishers, qos=stream.qos,
                messages=self.messages if stream.messages is None else stream.messages,
                warmup_messages=(self.warmup_messages if stream.warmup_messages is None
                                 else stream.warmup_messages),
                offset_s=stream.offset_s, first_publisher=first))
            first += stream.publishers
        return resolved

    def total_publishers(self) -> int:
        """Publisher clients over every stream."""
        return sum(stream.publishers for stream in self.resolved_streams())


class AgentHost(SshTarget):
    """A lab machine (a Pi) that runs agents, started over SSH for each run.

    Either ``host`` (how to reach it) or ``name``: a host provisioned with ``mqttbed lab
    provision``, filled in from the controller's database when the campaign is created.
    """

    host: str = Field("", description="SSH destination, user@host (fabric syntax, :port "
                                      "allowed); or leave it out and give name")
    name: str | None = Field(None, min_length=1, max_length=64,
                             description="a lab host provisioned with mqttbed lab provision")
    count: int = Field(1, ge=1, le=64, description="agent processes on this machine")
    command: str = Field("mqttbed", description="the mqttbed executable there (its venv's)")
    ca_file: str | None = Field(None, description="there: the CA or certificate its agents "
                                                  "trust for an https controller (default: "
                                                  "that machine's CAs)")
    gpio_pins: list[int] | None = Field(
        None, min_length=1, description="BCM lines (0-27) of its 40-pin header the agents "
                                        "may drive, in the order they are handed out: scope "
                                        "probes take the first (campaigns.wiring); default "
                                        "BCM 2-27")

    @field_validator("gpio_pins")
    @classmethod
    def _header_lines(cls, pins: list[int] | None) -> list[int] | None:
        if pins is not None:
            check_header_lines(pins)
        return pins


class Agents(_Strict):
    """How the clients are spread over agent processes."""

    count: int | None = Field(None, ge=1, le=256,
                              description="default: one per core, or the hosts' counts")
    hosts: list[AgentHost] = Field(
        default_factory=list, description="lab machines over SSH; default: this machine")
    gpio: Literal["auto", "virtual", "rpi", "gpiod"] = Field(
        "auto", description="auto: rpi on a Raspberry Pi, virtual anywhere else")
    gpio_chip: str = Field("/dev/gpiochip0", description="the GPIO chip of the gpiod backend")
    force_clock_probe: bool = Field(
        False, description="estimate clock offsets NTP-style even on the controller's machine")
    clock_probe_interval_s: float = Field(
        5.0, ge=0, le=3600, description="an agent on another machine re-estimates its clock "
                                        "offset this often during a run (drift); 0: once")

    @model_validator(mode="after")
    def _count_matches_hosts(self) -> Agents:
        for i, entry in enumerate(self.hosts):
            if not entry.host and not entry.name:
                raise ValueError(f"hosts[{i}]: give host (user@address) or the name of a "
                                 "lab host (mqttbed lab status lists them)")
        on_hosts = sum(h.count for h in self.hosts)
        if self.hosts and self.count is not None and self.count != on_hosts:
            raise ValueError(f"count {self.count} differs from the {on_hosts} agents the hosts "
                             f"run (sum of hosts[].count); leave count out with hosts")
        return self

    def resolved_count(self) -> int:
        if self.hosts:
            return sum(h.count for h in self.hosts)
        return self.count or os.cpu_count() or 1


class Timing(_Strict):
    """Margins around the measured window."""

    start_lead_s: float = Field(0.5, gt=0, le=60, description="start time handed out ahead")
    drain_s: float = Field(1.0, ge=0, le=600, description="wait for late deliveries")
    drain_idle_s: float | None = Field(
        None, gt=0, le=600,
        description="end a subscriber's drain once no delivery reached it for this long "
                    "(drain_s stays the bound); default: wait all of drain_s unless every "
                    "expected message arrived (a closed-loop subscriber cannot know how "
                    "many to expect, so it always waits drain_s)")
    setup_timeout_s: float = Field(30.0, gt=0, le=3600, description="how long agents may take to "
                                   "connect and subscribe before the run fails")
    heartbeat_timeout_s: float = Field(3.0, gt=0, le=600, description="an agent silent this long "
                                       "is lost (its run fails); an agent whose controller is "
                                       "silent this long aborts its run")
    upload_interval_s: float | None = Field(
        None, gt=0, le=3600, description="how often agents upload their events during the "
                                         "run; default 1 s, 0.2 s with a scope")

    @model_validator(mode="after")
    def _idle_within_drain(self) -> Timing:
        if self.drain_idle_s is not None and self.drain_idle_s > self.drain_s:
            raise ValueError(f"drain_idle_s {self.drain_idle_s} is longer than drain_s "
                             f"{self.drain_s}, which bounds the drain: raise drain_s")
        return self


class ScopeChannels(_Strict):
    """Which GPIO line each scope channel watches."""

    publisher: int = Field(1, ge=1, le=4, description="the channel on the publisher's line")
    # A list watches subscribers 0, 1, 2 ... in subscription order; a mapping may name
    # them by rank or as "first" / "last" (subscribed first / last).
    subscribers: list[int] | dict[str, int] = Field(
        default_factory=lambda: [2], description="channels on subscribers' lines: a list in "
        "subscription order, or rank / 'first' / 'last' -> channel")

    @model_validator(mode="after")
    def _distinct_channels(self) -> ScopeChannels:
        channels = [self.publisher, *self.subscriber_channels().values()]
        if len(set(channels)) != len(channels):
            raise ValueError(f"a scope channel watches one line only; got {channels}")
        if any(not 1 <= c <= 4 for c in channels):
            raise ValueError(f"both scope dialects have 4 analog channels (1..4); "
                             f"got {channels}")
        for key in self.subscriber_channels():
            if key not in ("first", "last") and not key.isdigit():
                raise ValueError(f"subscriber {key!r}: use a rank (0, 1, ...), first or last")
        return self

    def subscriber_channels(self) -> dict[str, int]:
        """Subscriber selector ("0", "first", "last", ...) -> channel."""
        if isinstance(self.subscribers, list):
            return {str(rank): channel for rank, channel in enumerate(self.subscribers)}
        return dict(self.subscribers)


class Scope(_Strict):
    """An oscilloscope on the GPIO lines: the timing ground truth (seed 000, section 6.1)."""

    resource: str = Field(description="'virtual', or a VISA address such as "
                                      "TCPIP0::192.168.1.50::INSTR")
    dialect: Literal["rigol-ds1000z", "keysight-x"] = Field(
        "rigol-ds1000z", description="the scope's SCPI command set")
    channels: ScopeChannels = Field(default_factory=ScopeChannels,
                                    description="which GPIO line each channel watches")
    acquisitions: int = Field(20, ge=1, le=100_000, description="single acquisitions per run")
    timebase_s_per_div: float = Field(5e-4, gt=0, le=50, description="horizontal scale")
    trigger_level_v: float = Field(1.65, description="3.3 V logic: half way")
    acquisition_timeout_s: float = Field(2.0, gt=0, le=600, description="how long one single "
                                         "acquisition may wait for its trigger")
    measure_timeout_s: float = Field(
        10.0, ge=0, le=3600, description="how long the measure phase may go on past the "
                                         "run's window for acquisitions still missing; a "
                                         "shortfall is flagged in the results and report")


class Measurement(_Strict):
    """What measures the timing besides the software timestamps, and how much to trust it."""

    scope: Scope | None = Field(None, description="an oscilloscope on the GPIO lines; none: "
                                                  "software timestamps only")
    # A run whose clock-offset uncertainty exceeds this fraction of the sync spread it
    # measures (p50) is flagged: its spread could be an artefact of the clocks.
    max_clock_uncertainty_fraction: float = Field(
        0.1, gt=0, le=100, description="flag a run whose clock-offset uncertainty exceeds this "
                                        "fraction of its sync spread p50")
    receive_clock: Literal["kernel", "user"] = Field(
        "kernel", description="which receive time the figures use: kernel = the socket's "
                              "receive stamp where the client recorded one (clock_source "
                              "kernel), else the user-space time; user = always the "
                              "user-space time")


class ReferencePoint(_Strict):
    """A published figure a report shows beside the measured ones (e.g. from a seed paper)."""

    plot: Literal["sync_spread", "latency"] = Field(description="the plot it is drawn in")
    label: str = Field(min_length=1, description="legend entry, e.g. 'paper: FPGA broker'")
    x: float | str = Field(description="value of the swept parameter it belongs to")
    y_us: float = Field(description="the published figure, in µs")
    std_us: float | None = Field(None, description="its standard deviation, drawn as an "
                                                   "error bar")


class ReportOptions(_Strict):
    """How the report presents the campaign."""

    reference: list[ReferencePoint] = Field(default_factory=list, description="published "
                                            "figures drawn beside the measured ones")
    source: str = Field("", description="where the reference figures come from")


CLIENT_GROUPS = ("publishers", "subscribers")
CLIENT_NAME = re.compile(r"(pub|sub)-(0|[1-9][0-9]*)")
IMPAIRMENT_PATH = "network.impairments."


class Impairment(_Strict):
    """What the link of a group of clients does to its packets, in each direction on its own.

    Delay is one way: 50 ms adds 50 ms upstream and 50 ms downstream (a round trip gains
    100 ms), as on a link with that delay; loss drops that share of the packets each way.
    """

    group: str = Field(description="publishers, subscribers, or one client by name "
                                   "(pub-0, sub-3); a named client leaves its role's group")
    delay_ms: float = Field(0.0, ge=0, le=60_000, description="one way, in each direction")
    jitter_ms: float = Field(0.0, ge=0, le=60_000,
                             description="each packet's delay drawn in delay ± jitter (≥ 0)")
    loss_percent: float = Field(0.0, ge=0, le=100, description="of the packets, each direction")
    rate_kbit: int | None = Field(None, gt=0, le=100_000_000,
                                  description="rate cap in kbit/s, each direction; none: no cap")

    @field_validator("group")
    @classmethod
    def _known_group(cls, group: str) -> str:
        if group not in CLIENT_GROUPS and not CLIENT_NAME.fullmatch(group):
            raise ValueError("a group is publishers, subscribers, or a client name such as "
                             "pub-0 or sub-3")
        return group


class Network(_Strict):
    """The network between the clients and the broker (default: none in the way)."""

    impairments: list[Impairment] = Field(
        default_factory=list, description="impaired links, one per group of clients")
    mechanism: Literal["auto", "user-space", "netem"] = Field(
        "auto", description="auto: netem where the kernel has it, else a user-space delay "
                            "proxy with htb and iptables drops")

    @field_validator("impairments")
    @classmethod
    def _one_impairment_per_group(cls, impairments: list[Impairment]) -> list[Impairment]:
        groups = [i.group for i in impairments]
        if repeated := sorted({g for g in groups if groups.count(g) > 1}):
            raise ValueError(f"group {', '.join(repeated)} is impaired twice; merge the entries")
        return impairments


def _repetitions_form(value: Any) -> str:
    return "function-until" if isinstance(value, dict | RepetitionsUntil) else "function-count"


# ``repetitions: 3`` or ``repetitions: {min, max, until}``; an error names the form given
# only (the tags begin "function-", which error locations leave out).
Repetitions = Annotated[
    Annotated[Annotated[int, Field(ge=1, le=10_000)], Tag("function-count")]
    | Annotated[RepetitionsUntil, Tag("function-until")],
    Discriminator(_repetitions_form)]


class CampaignSpec(_Strict):
    """A whole campaign: base settings, the sweep over them, and repetitions."""

    name: str = Field(min_length=1, max_length=200, description="the campaign's name")
    description: str = Field("", description="free text kept with the campaign")
    broker: BrokerSection = Field(default_factory=BrokerSection,
                                  description="the broker backend and its options")
    workload: Workload = Field(default_factory=Workload, description="who publishes what, "
                                                                     "how fast, to whom")
    agents: Agents = Field(default_factory=Agents, description="where the clients run")
    timing: Timing = Field(default_factory=Timing, description="margins around the window")
    measurement: Measurement = Field(default_factory=Measurement,
                                     description="what measures timing, how far to trust it")
    network: Network = Field(default_factory=Network, description="link impairments")
    sweep: dict[str, list[Any]] = Field(default_factory=dict, description="dotted path -> "
                                        "values; the cross product is run")
    repetitions: Repetitions = Field(
        1, description="runs of every sweep point (1 to 10,000), interleaved: every point "
                       "once, then again; or {min, max, until: {FIGURE: WIDTH}}: runs until "
                       "the point's interval is narrow enough (docs: how-to/repetitions-until)")
    retries: int = Field(
        1, ge=0, le=10,
        description="how many times a run interrupted by its controller stopping or dying "
                    "is run again (a new attempt of the same run); failed runs are not")
    report: ReportOptions = Field(default_factory=ReportOptions,
                                  description="how the report presents the campaign")
    search: SearchSpec | None = Field(
        None, description="a capacity search instead of a sweep: the highest value of one "
                          "parameter at which every SLO term holds, probe after probe "
                          "(docs: how-to/capacity-search)")

    scenarios: list[dict[str, Any]] = Field(
        default_factory=list,
        description="named sets of overrides; each is crossed with the sweep")

    @model_validator(mode="after")
    def _workload_fits_backend(self) -> CampaignSpec:
        """A placement the backend does not take, or a QoS its broker does not deliver, is
        refused here, before anything runs."""
        from mqttbed.core.backends import check_features, declaration

        declared = declaration(self.broker.backend)
        placement = self.workload.placement
        if placement is not None and placement not in declared.placements:
            raise ValueError(f"workload.placement {placement!r}: backend "
                             f"{self.broker.backend} deploys one broker; placements are for "
                             f"backends that deploy several (mqtt-st)")
        qos = [stream.qos for stream in self.workload.streams or ()] or [self.workload.qos]
        features = declared.features_for(self.broker.options())
        if self.workload.mode != "connect":
            check_features(features, self.broker.backend, qos)
        shape = self.workload.shape()
        if shape == "reconnect" and self.workload.reconnect is not None \
                and self.workload.reconnect.persistent:
            shape = "sessions"   # its need: sessions kept across the restart
        check_shape_features(features, self.broker.backend, shape, self.workload.protocol)
        return self

    @model_validator(mode="after")
    def _access_fits_backend(self) -> CampaignSpec:
        """A listener, MQTT version, TLS or users the backend does not declare is refused
        here, before anything runs (the files they name are checked on the controller:
        :func:`check_access_files`)."""
        check_access(self.broker, self.workload.protocol)
        return self

    @model_validator(mode="after")
    def _probes_fit_headers(self) -> CampaignSpec:
        """A scope needing more GPIO lines on a host than its header gives is refused here
        (each sweep point is checked as it is resolved)."""
        try:
            plan_wiring(self)
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _search_alone(self) -> CampaignSpec:
        """A search chooses its own runs: no sweep, scenarios or repetitions beside it."""
        if self.search is None:
            return self
        parameter = self.search.parameter
        if self.sweep or self.scenarios or self.repetitions != 1:
            raise ValueError(f"search over {parameter!r} chooses its own runs (and repeats "
                             "at the boundary itself): leave sweep, scenarios and "
                             "repetitions out")
        _check_override_path(parameter, "search.parameter")
        value = _value_at(self.model_dump(), parameter)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"search.parameter {parameter!r} is {value!r} in this spec, not "
                             "a number: a search needs a numeric parameter (e.g. "
                             "workload.rate_hz; a broker option needs a value in the spec)")
        return self

    @model_validator(mode="after")
    def _runs_within_bound(self) -> CampaignSpec:
        factors = [len(self.scenarios) or 1, *(len(v) for v in self.sweep.values()),
                   most_repetitions(self.repetitions) if self.search is None
                   else self.search.max_probes]
        runs = math.prod(factors)
        if runs > MAX_RUNS:
            shown = " x ".join(f"{f:,}" for f in factors)
            raise ValueError(
                f"scenarios x sweep values x repetitions = {shown} = {runs:,} runs, more "
                f"than the {MAX_RUNS:,} one campaign may have (MAX_RUNS); sweep fewer values, "
                "or split it into several campaigns")
        return self

    @field_validator("sweep")
    @classmethod
    def _sweep_paths_exist(cls, sweep: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for path, values in sweep.items():
            _check_override_path(path, "sweep key")
            if not values:
                raise ValueError(f"sweep key {path!r} has no values")
        return sweep

    @field_validator("scenarios")
    @classmethod
    def _scenarios_are_named_overrides(cls, scenarios: list[dict[str, Any]]
                                       ) -> list[dict[str, Any]]:
        names = []
        for n, scenario in enumerate(scenarios):
            name = scenario.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError(f"scenario {n} needs a 'name'")
            names.append(name)
            for path in scenario:
                if path != "name":
                    _check_override_path(path, f"scenario {name!r} key")
        if len(set(names)) != len(names):
            raise ValueError(f"scenario names repeat: {names}")
        return scenarios

    @model_validator(mode="after")
    def _impaired_clients_exist(self) -> CampaignSpec:
        for n, impairment in enumerate(self.network.impairments):
            if match := CLIENT_NAME.fullmatch(impairment.group):
                role, index = match[1], int(match[2])
                count = (self.workload.total_publishers() if role == "pub"
                         else self.workload.subscribers)
                if index >= count:
                    raise ValueError(f"network.impairments.{n}.group: no client "
                                     f"{impairment.group!r}: the workload has {count} "
                                     f"{'publishers' if role == 'pub' else 'subscribers'}")
        return self


def check_access(broker: BrokerSection, protocol: MqttProtocol) -> None:
    """Raise ValueError naming the field and its value when ``broker.transport``,
    ``broker.tls``, ``broker.auth`` or ``workload.protocol`` asks what the backend's
    declared features (for these options) lack, or what nothing would use."""
    from mqttbed.core.backends import (
        BrokerAccess,
        ConfiguresAccess,
        LocalProcesses,
        declaration,
    )

    declared = declaration(broker.backend)
    features = broker.features()
    # Options that decide the features (an external url's scheme, a command's preset)
    # are the reason; the features' note is about QoS and the like, not said here.
    decided = (" with these options (they decide: e.g. a url's scheme, a preset)"
               if features != declared.features else "")
    if protocol not in features.protocols:
        raise ValueError(f"workload.protocol {protocol!r}: backend {broker.backend} declares "
                         f"MQTT {', '.join(sorted(features.protocols))} only{decided}")
    transport = broker.resolved_transport()
    if transport not in features.transports:
        raise ValueError(f"broker.transport {transport.value!r}: backend {broker.backend} "
                         f"declares {', '.join(sorted(features.transports))} only{decided}")
    if broker.auth is not None and not features.auth:
        raise ValueError(f"broker.auth (username {broker.auth.username!r}): backend "
                         f"{broker.backend} declares no user names or passwords{decided}; "
                         "leave broker.auth out")
    if broker.auth is not None and broker.auth.generate_password and not declared.supports(
            LocalProcesses):
        raise ValueError(f"broker.auth.generate_password: backend {broker.backend} starts no "
                         "broker, so nothing would configure the generated password on it; "
                         "give password_file or password_env")
    if broker.tls is not None and not transport.tls:
        source = ("broker.transport" if broker.transport is not None
                  else f"the default of backend {broker.backend}{decided}")
        raise ValueError(f"broker.tls: the clients reach the broker over {transport.value!r} "
                         f"({source}), which is not TLS, so nothing would use broker.tls; "
                         "set broker.transport to tls or wss (or give a url that says so), "
                         "or leave broker.tls out")
    # What only a backend that configures access can serve: checked last, as it imports
    # the backend's class.
    asked = BrokerAccess(transport=transport, tls=broker.tls, auth=broker.auth).to_configure()
    if asked and not declared.supports(ConfiguresAccess):
        raise ValueError(f"{', '.join(asked)}: backend {broker.backend} declares it but does "
                         "not configure its broker's access (no configure_access); leave "
                         f"{', '.join(asked)} out")


def check_access_files(spec: CampaignSpec) -> None:
    """Raise SpecError naming the field and the path (or variable) when a file of
    ``broker.tls`` or ``broker.auth`` cannot be read here, or ``password_env`` is unset.

    What the controller checks when it takes a campaign; each run reads them again when
    it starts (a file may vanish in between). Nothing read is kept."""
    from mqttbed.core.broker_access import (
        SecretUnavailable,
        read_public_file,
        read_secret_file,
    )

    for broker in _access_sections(spec):
        try:
            if (tls := broker.tls) is not None:
                for field, path in (("ca_file", tls.ca_file), ("cert_file", tls.cert_file)):
                    if path is not None:
                        read_public_file(path, f"broker.tls.{field}")
                if tls.key_file is not None:
                    read_secret_file(tls.key_file, "broker.tls.key_file")
            if broker.auth is not None:
                broker.auth.read_password()
        except SecretUnavailable as exc:
            raise SpecError(str(exc)) from None


# A spec sent over REST may name only secrets here: files inside the controller's
# secrets_dir, environment variables with this prefix.
REMOTE_SECRET_ENV_PREFIX = "MQTTBED_SECRET_"


def check_remote_access_sources(spec: CampaignSpec, secrets_dir: Path) -> None:
    """Raise SpecError unless every file ``broker.tls`` and ``broker.auth`` name lies inside
    ``secrets_dir`` and every ``password_env`` starts with MQTTBED_SECRET_.

    For a spec that came over REST: the controller reads these when each run starts and
    sends a password to the broker the spec names, so a caller who could name any file
    (or any variable) would read the controller's own secrets out through a broker of
    their choice. A spec run from the command line reads what its user can read anyway."""
    root = secrets_dir.expanduser().resolve()
    for broker in _access_sections(spec):
        tls, auth = broker.tls, broker.auth
        files = [] if tls is None else [(f"broker.tls.{field}", getattr(tls, field))
                                        for field in ("ca_file", "cert_file", "key_file")]
        if auth is not None:
            files.append(("broker.auth.password_file", auth.password_file))
        for field, path in files:
            if path is not None and not Path(path).expanduser().resolve().is_relative_to(root):
                raise SpecError(f"{field} {path!r}: a spec sent to the controller over REST "
                                f"may name files inside its secrets directory {str(root)!r} "
                                "only (setting secrets_dir, MQTTBED_SECRETS_DIR); put the "
                                "file there, or run the campaign with `mqttbed run`")
        if (auth is not None and auth.password_env is not None
                and not auth.password_env.startswith(REMOTE_SECRET_ENV_PREFIX)):
            raise SpecError(f"broker.auth.password_env {auth.password_env!r}: a spec sent to "
                            "the controller over REST may name environment variables "
                            f"starting with {REMOTE_SECRET_ENV_PREFIX} only")


def _access_sections(spec: CampaignSpec) -> list[BrokerSection]:
    """Each distinct (broker.tls, broker.auth) of the spec's points, as its broker section."""
    sections = ([spec.broker] if spec.search is not None
                else [point.spec.broker for point in expand_points(spec)])
    seen: set[tuple[TlsSettings | None, AuthSettings | None]] = set()
    distinct = []
    for broker in sections:
        if (broker.tls, broker.auth) not in seen:
            seen.add((broker.tls, broker.auth))
            distinct.append(broker)
    return distinct


def _check_override_path(path: str, what: str) -> None:
    """Raise ValueError unless ``path`` is a 'section.field' the spec has,
    'network.impairments.GROUP.FIELD' (one field of one group's impairment) or
    'workload.streams.N.FIELD' (one field of stream N, counted from 0)."""
    if path.startswith(IMPAIRMENT_PATH):
        _impairment_target(path, what)
        return
    if path.startswith(STREAMS_PATH):
        _stream_target(path, what)
        return
    section, _, field = path.partition(".")
    if section in ("sweep", "scenarios", "repetitions", "name", "description", "report"):
        raise ValueError(f"{what} {path!r}: {section} cannot be overridden")
    model = CampaignSpec.model_fields.get(section)
    if model is None or not field or "." in field:
        raise ValueError(f"{what} {path!r} is not a 'section.field' path "
                         f"(e.g. workload.subscribers)")
    section_type = model.annotation
    fields = (section_type.model_fields if isinstance(section_type, type)
              and issubclass(section_type, BaseModel) else {})
    if section != "broker" and field not in fields:
        raise ValueError(f"{what} {path!r}: {section} has no field {field!r} "
                         f"(fields: {', '.join(fields)})")


def _value_at(data: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of a dumped spec (None where the path leads nowhere)."""
    value: Any = data
    for part in path.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def _impairment_target(path: str, what: str) -> tuple[str, str]:
    """The (group, field) of an override path 'network.impairments.GROUP.FIELD'."""
    group, _, field = path.removeprefix(IMPAIRMENT_PATH).partition(".")
    fields = [name for name in Impairment.model_fields if name != "group"]
    if field not in fields or (group not in CLIENT_GROUPS and not CLIENT_NAME.fullmatch(group)):
        raise ValueError(f"{what} {path!r}: use {IMPAIRMENT_PATH}GROUP.FIELD with GROUP "
                         f"publishers, subscribers or a client (sub-0) and FIELD one of "
                         f"{', '.join(fields)}")
    return group, field


def _apply_override(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` to ``value`` in a spec's dict; an impairment path adds its group."""
    if path.startswith(IMPAIRMENT_PATH):
        group, field = _impairment_target(path, "override")
        impairments = data["network"]["impairments"]
        entry = next((i for i in impairments if i["group"] == group), None)
        if entry is None:
            entry = {"group": group}
            impairments.append(entry)
        entry[field] = value
        return
    if path.startswith(STREAMS_PATH):
        index, field = _stream_target(path, "override")
        streams = data["workload"].get("streams") or []
        if index >= len(streams):
            raise SpecError(f"{path}: the workload has {len(streams)} streams (indexes from "
                            f"0); a stream's field is overridden as "
                            f"{STREAMS_PATH}N.FIELD")
        streams[index][field] = value
        if field in RATE_SPELLINGS:  # the new rate replaces the stream's other spelling
            streams[index][next(f for f in RATE_SPELLINGS if f != field)] = None
        return
    section, _, field = path.partition(".")
    if (section, field) == ("workload", "streams") and value:
        # a whole mix replaces the single stream the spec had
        for key in STREAM_REPLACES:
            data[section].pop(key, None)
    data[section][field] = value


def _stream_target(path: str, what: str) -> tuple[int, str]:
    """The (index, field) of an override path 'workload.streams.N.FIELD'."""
    index, _, field = path.removeprefix(STREAMS_PATH).partition(".")
    if not index.isdigit() or field not in Stream.model_fields:
        raise ValueError(f"{what} {path!r}: use {STREAMS_PATH}N.FIELD with N a stream's "
                         f"index (0 is the first) and FIELD one of "
                         f"{', '.join(Stream.model_fields)}; or override the whole list "
                         f"as workload.streams")
    return int(index), field


class SweepPoint(BaseModel):
    """One combination of swept values, with the spec it resolves to."""

    model_config = ConfigDict(frozen=True)
    index: int
    params: dict[str, Any]
    spec: CampaignSpec


class PlannedRun(BaseModel):
    """One run: a sweep point and a repetition number."""

    model_config = ConfigDict(frozen=True)
    point: SweepPoint
    repetition: int


def _names_a_section(loc: tuple[Any, ...]) -> bool:
    """Whether an error's location is a whole section of the spec (a model, e.g.
    ``workload`` or ``workload.streams.0``), not one field's value (which may be a dict)."""
    model: Any = CampaignSpec
    for part in loc:
        if isinstance(part, int) or str(part).startswith("function-"):
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return False
        model = _unoptional_model(fields[part].annotation)
    return isinstance(model, type) and issubclass(model, BaseModel)


def _unoptional_model(annotation: Any) -> Any:
    """The model inside ``X | None`` or ``list[X]``, else the annotation itself."""
    for arg in typing.get_args(annotation) or (annotation,):
        inner = typing.get_args(arg)[0] if typing.get_origin(arg) is list else arg
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return annotation


# A URL's scheme; what follows up to an "@" is its user-info (user:password, RFC 3986
# section 3.2.1), which an error never repeats: the spec is stored, and so are its errors.
_URL_START = r"[A-Za-z][A-Za-z0-9+.-]*://"
# in a value: through the last "@" (a password may hold "/", "#" or a space)
_VALUE_USERINFO = re.compile(f"({_URL_START}).*@", re.DOTALL)
# in a message, which quotes the values it names: through the last "@" inside the quotes
_MESSAGE_USERINFO = re.compile(f"({_URL_START})[^'\"]*@")


def _without_userinfo(value: Any) -> Any:
    """``value`` (as a spec gave it) with the user-info of every URL in it masked."""
    if isinstance(value, str):
        return _VALUE_USERINFO.sub(lambda m: f"{m[1]}{MASK}@", value)
    if isinstance(value, dict):
        return {key: _without_userinfo(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_userinfo(item) for item in value]
    return value


def _format_errors(exc: ValidationError, prefix: str = "") -> str:
    """Each error as ``field: what is wrong``, echoing the bad value, never a URL's
    user-info (``mqtt://user:password@host`` is shown as ``mqtt://**********@host``)."""
    lines = []
    for err in exc.errors():
        loc = prefix + ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = _MESSAGE_USERINFO.sub(lambda m: f"{m[1]}{MASK}@",
                                    err["msg"].removeprefix("Value error, "))
        if not loc:  # a check across sections names its fields in its message
            lines.append(msg)
        elif err["type"] == "value_error" and _names_a_section(err["loc"]):
            # a check across a section's fields names them (and their values) itself
            lines.append(f"{loc}: {msg}")
        elif err["type"] == "extra_forbidden":
            lines.append(f"{loc}: unknown key (value {_without_userinfo(err['input'])!r})")
        elif err["type"] == "missing":
            lines.append(f"{loc}: required field is missing")
        else:
            lines.append(f"{loc}: bad value {_without_userinfo(err['input'])!r}: {msg}")
    return "; ".join(lines)


def parse_spec(data: Any) -> CampaignSpec:
    """Validate a spec already parsed from YAML/JSON; raise SpecError naming each bad field."""
    if not isinstance(data, dict):
        raise SpecError(f"a campaign spec is a mapping, got {type(data).__name__}")
    try:
        spec = CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc)) from None
    expand_points(spec)  # every swept value must validate too
    if spec.search is not None:  # so must both ends of a search
        for end in ("low", "high"):
            try:
                probe_point(spec, getattr(spec.search, end), 0)
            except SpecError as exc:
                raise SpecError(f"search.{end} ({getattr(spec.search, end):g}): "
                                f"{exc}") from None
    return spec


def spec_from_text(text: str) -> CampaignSpec:
    """Parse and validate a spec from YAML or JSON text (JSON is a subset of YAML), within
    the bounds of :mod:`mqttbed.core.bounded_yaml` (size, nesting, alias expansion)."""
    try:
        data = load_bounded_yaml(text)
    except YamlBoundsError as exc:
        raise SpecError(f"campaign spec refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"campaign spec is not valid YAML/JSON: {exc}") from None
    return parse_spec(data)


def spec_from_bytes(data: bytes, source: str = "campaign spec") -> CampaignSpec:
    """Like :func:`spec_from_text`, from bytes that must be UTF-8 (a file, a request body)."""
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"{source} refused: {len(data):,} bytes, more than the "
                        f"{MAX_SPEC_BYTES:,} a document may have (MAX_BYTES)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{source} is not UTF-8: byte {exc.start} is "
                        f"0x{data[exc.start]:02x}; save it as UTF-8") from None
    return spec_from_text(text)


def load_spec(path: str | Path) -> CampaignSpec:
    """Load and validate a spec from a YAML or JSON file."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"campaign spec file {str(path)!r} does not exist")
    if path.stat().st_size > MAX_SPEC_BYTES:  # never read a huge file to refuse it
        raise SpecError(f"campaign spec file {str(path)!r} refused: {path.stat().st_size:,} "
                        f"bytes, more than the {MAX_SPEC_BYTES:,} a document may have "
                        "(MAX_BYTES)")
    return spec_from_bytes(path.read_bytes(), f"campaign spec file {str(path)!r}")


def expand_points(spec: CampaignSpec) -> list[SweepPoint]:
    """Return scenarios x the sweep's cross product, each resolved into a full spec.

    A point's ``params`` hold its scenario's name (under ``scenario``) and its swept values.
    """
    base = spec.model_dump(exclude={"sweep", "scenarios", "search"})
    keys = list(spec.sweep)
    backend_varies = "broker.backend" in spec.sweep or any(
        "broker.backend" in sc for sc in spec.scenarios)
    points = []
    scenarios: list[dict[str, Any] | None] = list(spec.scenarios) or [None]
    combos = itertools.product(scenarios,
                               itertools.product(*(spec.sweep[k] for k in keys)))
    for index, (scenario, combo) in enumerate(combos):
        params = {"scenario": scenario["name"]} if scenario else {}
        params.update(zip(keys, combo, strict=True))
        overrides = {k: v for k, v in (scenario or {}).items() if k != "name"}
        overrides.update(zip(keys, combo, strict=True))
        data = copy.deepcopy(base)
        for key, value in overrides.items():
            _apply_override(data, key, value)
        if backend_varies:
            # options of one backend do not carry over to another
            data["broker"] = {k: v for k, v in data["broker"].items()
                              if k == "backend" or k in spec.broker.model_fields_set
                              or f"broker.{k}" in overrides}
        try:
            resolved = CampaignSpec.model_validate(data)
        except ValidationError as exc:
            where = ", ".join(f"{k}={v!r}" for k, v in params.items())
            raise SpecError(f"sweep point ({where}): {_format_errors(exc)}") from None
        points.append(SweepPoint(index=index, params=params, spec=resolved))
    return points


def plan_runs(spec: CampaignSpec) -> list[PlannedRun]:
    """Expand sweep x repetitions into runs.

    Repetitions are interleaved (every point once, then every point again) so a slow
    drift of the machine spreads over all points instead of biasing the last one.
    """
    if spec.search is not None:   # the first probe; the search adds the others
        return [PlannedRun(point=probe_point(spec, search_start(spec), 0), repetition=0)]
    points = expand_points(spec)
    return [PlannedRun(point=p, repetition=r)
            for r in range(first_repetitions(spec.repetitions)) for p in points]


def search_is_integer(spec: CampaignSpec) -> bool:
    """Whether a search's parameter takes whole numbers (an int in the spec's model)."""
    assert spec.search is not None
    point = probe_point(spec, spec.search.low, 0)
    value = _value_at(point.spec.model_dump(), spec.search.parameter)
    return isinstance(value, int) and not isinstance(value, bool)


def search_start(spec: CampaignSpec) -> float:
    """The value of a search's first probe."""
    from mqttbed.campaigns.search import decide

    assert spec.search is not None
    first = decide(spec.search, [], integer=search_is_integer(spec)).next_value
    assert first is not None
    return first


def probe_point(spec: CampaignSpec, value: float, index: int) -> SweepPoint:
    """The resolved spec of one probe of a search: the base spec with the searched
    parameter at ``value`` (an int for an integer parameter); raise SpecError if it does
    not validate."""
    assert spec.search is not None
    parameter = spec.search.parameter
    data = spec.model_dump(exclude={"sweep", "scenarios", "search"})
    run_value: float | int = value
    try:
        _apply_override(data, parameter, value)
        resolved = CampaignSpec.model_validate(data)
        current = _value_at(resolved.model_dump(), parameter)
        if isinstance(current, int) and not isinstance(current, bool) and value == int(value):
            run_value = int(value)
            _apply_override(data, parameter, run_value)
            resolved = CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"search probe ({parameter}={value!r}): "
                        f"{_format_errors(exc)}") from None
    return SweepPoint(index=index, params={parameter: run_value}, spec=resolved)


def builtin_spec_path(name: str) -> Path:
    """Return the path of a campaign of the built-in library, e.g. ``quickstart``."""
    path = Path(__file__).with_name(f"{name}.yaml")
    if not path.exists():
        available = sorted(p.stem for p in Path(__file__).parent.glob("*.yaml"))
        raise SpecError(f"no built-in campaign {name!r}; available: {', '.join(available)}")
    return path
