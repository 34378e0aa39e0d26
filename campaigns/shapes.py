"""Traffic shapes beyond one steady pub/sub stream: the spec sections that ask for them.

A workload is pub/sub (``workload.mode``) unless it is a connection storm (``mode:
connect``). A pub/sub workload may take one shape on top of its stream:

- ``shared``: subscribers are members of shared-subscription groups (``$share/G/F``);
  each group, not each member, receives every message once;
- ``topic_tree``: the publishers spread their messages over a tree of topics under
  ``workload.topic``, and subscribers hold ``+``/``#`` filters over it;
- ``retained``: the publishers set retained values on topics, and the subscribers arrive
  afterwards: the time until each holds every topic's latest value;
- ``sessions``: some subscribers keep a persistent session, go away mid-run and come back:
  what was published while they were away is delivered late, or lost;
- ``reconnect``: the broker is restarted mid-run and every client reconnects with backoff.

Each needs a broker feature (:class:`~mqttbed.core.backends.BrokerFeatures`) or a backend
capability; :func:`check_shape_features` refuses a shape the broker lacks, naming both.
"""

from __future__ import annotations

import math
import typing
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from mqttbed.core.broker_access import MqttProtocol

if typing.TYPE_CHECKING:
    from mqttbed.core.backends import BrokerFeatures

MAX_TREE_TOPICS = 100_000
MAX_STORM_CLIENTS = 100_000
SHAPES = ("shared", "topic_tree", "retained", "sessions", "reconnect")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _name_level(name: str) -> str:
    if not name or any(c in name for c in "/+#\x00"):
        raise ValueError(f"{name!r} is not one topic level (non-empty, no /, +, # or NUL)")
    return name


def _relative_filter(topic_filter: str) -> str:
    """A filter below the tree's root: levels of names, ``+``, and a final ``#``."""
    levels = topic_filter.split("/")
    for n, level in enumerate(levels):
        wild = level in ("+", "#")
        if (not wild and ("+" in level or "#" in level)) or "\x00" in level \
                or (level == "#" and n != len(levels) - 1):
            raise ValueError(f"{topic_filter!r} is not a topic filter: + and # are whole "
                             "levels, and # is the last")
    return topic_filter


LevelName = Annotated[str, AfterValidator(_name_level)]
RelativeFilter = Annotated[str, AfterValidator(_relative_filter)]


class ConnectStorm(_Strict):
    """``workload.mode: connect``: clients connect on a schedule, hold, and leave.

    Every client's connect is timed phase by phase (TCP, TLS, WebSocket, CONNECT→CONNACK)
    from its intended connect time, so a storm that falls behind its schedule shows it.
    """

    clients: int = Field(1000, ge=1, le=MAX_STORM_CLIENTS,
                         description="connections opened, over all agents")
    rate_hz: float | None = Field(
        None, gt=0, le=1_000_000,
        description="connects per second, open loop over all agents (client k intended at "
                    "k / rate_hz); None: all at once")
    hold_s: float = Field(1.0, ge=0, le=3600,
                          description="how long every connection is held once all are made")
    clean_session: bool = Field(True, description="the CONNECTs' clean session (MQTT 5: "
                                                  "clean start) flag")


class SharedSubscription(_Strict):
    """``workload.shared``: subscribers join shared-subscription groups.

    Subscriber j is a member of group ``j mod groups`` and subscribes to
    ``$share/{group}-{g}/{topic}`` (MQTT 5, and Mosquitto's 3.1.1 form alike). At QoS ≥ 1
    every message reaches exactly one member of each group.
    """

    group: LevelName = Field("mqttbed", description="the groups' name prefix")
    groups: int = Field(1, ge=1, le=1000, description="groups; the subscribers are dealt "
                                                      "over them round-robin")


class TopicTree(_Strict):
    """``workload.topic_tree``: publishers spread over ``fanout ** levels`` topics.

    The tree's topics are ``{topic}/{a}/{b}/...`` (levels of ``0 .. fanout-1``); each
    publisher sends its messages to the tree's topics in turn, starting at its own
    offset. Subscriber j holds ``filters[j mod len(filters)]`` under ``{topic}/``.
    """

    levels: int = Field(2, ge=1, le=8, description="levels below workload.topic")
    fanout: int = Field(10, ge=1, le=MAX_TREE_TOPICS, description="topics under each level")
    filters: list[RelativeFilter] = Field(
        default_factory=lambda: ["#"], min_length=1, max_length=64,
        description="subscriber filters below workload.topic (e.g. \"+/3\", \"1/#\"); "
                    "subscriber j takes filters[j mod len]")

    @property
    def topics(self) -> int:
        """How many topics the tree has."""
        return int(self.fanout ** self.levels)

    @model_validator(mode="after")
    def _bounded(self) -> TopicTree:
        if self.fanout ** self.levels > MAX_TREE_TOPICS:
            raise ValueError(f"fanout ** levels = {self.fanout} ** {self.levels} = "
                             f"{self.fanout ** self.levels:,} topics, more than "
                             f"{MAX_TREE_TOPICS:,}; lower fanout or levels")
        return self


class Retained(_Strict):
    """``workload.retained``: retained state a late subscriber needs at once.

    The publishers set ``updates`` retained values on each of ``topics`` topics under
    ``workload.topic`` (the last is the topic's value), then, ``subscribe_after_s`` later,
    the subscribers subscribe to ``{topic}/#``: the time until each holds every topic's
    latest value, and exact counts (nothing stale, nothing missing).
    """

    topics: int = Field(100, ge=1, le=MAX_TREE_TOPICS, description="retained topics")
    updates: int = Field(1, ge=1, le=100, description="values set per topic; the last stays")
    subscribe_after_s: float = Field(0.5, ge=0, le=3600,
                                     description="from the last value set to the subscribes")


class PersistentSessions(_Strict):
    """``workload.sessions``: subscribers that keep their session while away.

    The first ``offline`` subscribers connect with a persistent session (3.1.1: clean
    session 0; 5: clean start 0 and ``session_expiry_s``), go away ``offline_at_s`` into
    the publishing window for ``offline_for_s``, and come back with the same client id.
    """

    offline: int = Field(1, ge=1, le=10_000, description="subscribers that go away")
    offline_at_s: float = Field(1.0, ge=0, le=86_400,
                                description="when they go, from the run's start")
    offline_for_s: float = Field(1.0, gt=0, le=86_400, description="how long they stay away")
    session_expiry_s: int = Field(3600, ge=1, le=4_294_967_294,
                                  description="MQTT 5's session expiry interval")
    leave: Literal["disconnect", "drop"] = Field(
        "drop", description="disconnect: a DISCONNECT first; drop: the socket closed "
                            "(the broker sees the connection lost)")


class ReconnectStorm(_Strict):
    """``workload.reconnect``: the broker is restarted mid-run; every client reconnects.

    The backend stops its broker ``restart_at_s`` into the window and starts it again
    ``down_s`` later (its listeners unchanged); clients reconnect with exponential backoff
    from ``backoff_initial_s`` to ``backoff_max_s``.
    """

    restart_at_s: float = Field(1.0, gt=0, le=86_400, description="from the run's start")
    down_s: float = Field(0.5, ge=0, le=3600, description="how long the broker stays down")
    backoff_initial_s: float = Field(0.05, gt=0, le=60,
                                     description="a client's first wait before reconnecting")
    backoff_max_s: float = Field(2.0, gt=0, le=600,
                                 description="the wait doubles after each failed attempt, "
                                             "up to this")
    persistent: bool = Field(False, description="subscribers keep persistent sessions "
                                                "(clean session 0)")

    @model_validator(mode="after")
    def _backoff_grows(self) -> ReconnectStorm:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"backoff_max_s ({self.backoff_max_s}) is less than "
                             f"backoff_initial_s ({self.backoff_initial_s})")
        return self


def shared_filter(shared: SharedSubscription, subscriber: int, topic: str) -> str:
    """The shared-subscription filter of subscriber ``subscriber``."""
    return f"$share/{shared.group}-{subscriber % shared.groups}/{topic}"


def tree_topic(tree: TopicTree, root: str, index: int) -> str:
    """The ``index``-th topic of the tree under ``root`` (0-based, the last level fastest)."""
    levels = []
    for _ in range(tree.levels):
        index, digit = divmod(index, tree.fanout)
        levels.append(str(digit))
    return "/".join([root, *reversed(levels)])


def check_shape_features(features: BrokerFeatures, backend: str, shape: str | None,
                         protocol: MqttProtocol) -> None:
    """Raise ValueError naming ``workload.{shape}``, the feature and the broker when the
    broker lacks what the shape needs (at ``protocol``, for shared subscriptions). A
    reconnect storm's own need, a backend that restarts its broker, is the backend's
    capability, checked where the backend is known."""
    why = f" ({features.note})" if features.note else ""
    if shape == "shared" and protocol not in features.shared_subscriptions:
        versions = ", ".join(sorted(features.shared_subscriptions)) or "no MQTT version"
        raise ValueError(f"workload.shared: broker {backend} has shared subscriptions "
                         f"($share/GROUP/FILTER) at {versions}, not at MQTT {protocol}{why}")
    if shape in ("topic_tree", "retained") and not features.wildcards:
        raise ValueError(f"workload.{shape}: broker {backend} has no wildcard subscriptions "
                         f"(+, #), which the shape subscribes with{why}")
    if shape == "retained" and not features.retained:
        raise ValueError(f"workload.retained: broker {backend} keeps no retained "
                         f"messages{why}")
    if shape == "sessions" and not features.persistent_sessions:
        raise ValueError(f"workload.sessions: broker {backend} keeps no persistent sessions "
                         f"(clean session 0){why}")


def tree_filter_levels(tree: TopicTree, topic_filter: str) -> list[int | None] | None:
    """What a relative filter asks of each of the tree's levels: a digit, or None for any;
    None when it matches none of the tree's topics (too few or too many levels, or a name
    that is no level of the tree: levels are ``0 .. fanout-1`` in decimal)."""
    levels = topic_filter.split("/")
    multi = levels[-1] == "#"
    if multi:
        levels = levels[:-1]
    if len(levels) > tree.levels or (not multi and len(levels) != tree.levels):
        return None
    wanted: list[int | None] = []
    for level in levels:
        if level == "+":
            wanted.append(None)
        elif level.isdigit() and level == str(int(level)) and int(level) < tree.fanout:
            wanted.append(int(level))
        else:
            return None
    return wanted + [None] * (tree.levels - len(wanted))


def tree_messages_matching(tree: TopicTree, topic_filter: str, first: int,
                           messages: int) -> int:
    """How many of a publisher's ``messages`` (message k to tree topic ``(first + k) mod
    topics``) match ``topic_filter`` (relative to the tree's root): a subscriber's exact
    expectation, counted digit by digit (no walk over the topics)."""
    wanted = tree_filter_levels(tree, topic_filter)
    if wanted is None or messages <= 0:
        return 0
    options = [tree.fanout if digit is None else 1 for digit in wanted]

    def below(n: int) -> int:
        """Matching topic indexes in [0, n) (the first level most significant)."""
        if n >= tree.topics:
            return math.prod(options)
        digits = []
        for _ in wanted:
            n, digit = divmod(n, tree.fanout)
            digits.append(digit)
        count = 0
        for position, (digit, want) in enumerate(zip(reversed(digits), wanted, strict=True)):
            smaller = digit if want is None else int(want < digit)
            count += smaller * math.prod(options[position + 1:])
            if want is not None and want != digit:
                break
        return count

    total = tree.topics
    cycles, left = divmod(messages, total)
    start = first % total
    matched = cycles * below(total)
    if start + left <= total:
        return matched + below(start + left) - below(start)
    return matched + below(total) - below(start) + below(start + left - total)
