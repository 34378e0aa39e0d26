"""Turning a run's workload into per-agent assignments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mqttbed.campaigns.repetitions import most_repetitions
from mqttbed.campaigns.shapes import shared_filter, tree_messages_matching
from mqttbed.campaigns.spec import CampaignSpec, expand_points
from mqttbed.campaigns.wiring import plan_wiring
from mqttbed.core.backends import check_restarts
from mqttbed.core.broker_access import ClientCredentials
from mqttbed.core.events import publisher_client_id, subscriber_client_id
from mqttbed.core.protocol import (
    Assignment,
    ClientAssignment,
    Endpoint,
    PublishedTree,
    ReconnectPlan,
    RetainedPlan,
    Role,
    SessionPlan,
    StormPlan,
    SubscribedStream,
)


@dataclass(frozen=True)
class ClientPlacement:
    """Which agent plays each client, and where each agent reaches the broker.

    For runs whose clients do not all share one path to the broker (impaired groups):
    ``agent_of`` maps client id to agent index; ``endpoints[i]`` is agent i's way to the
    broker, None for the broker's own endpoint.
    """

    agent_of: dict[str, int]
    endpoints: list[Endpoint | None]


def run_window_ns(spec: CampaignSpec) -> int:
    """The run's measured window from the start time: sending time, or min_window_s."""
    w = spec.workload
    if w.connect is not None:  # a storm: its schedule, every connect's timeout, the hold
        storm = w.connect
        span_s = (storm.clients - 1) / storm.rate_hz if storm.rate_hz else 0.0
        return int((span_s + STORM_CONNECT_TIMEOUT_S + storm.hold_s) * 1e9)
    sending_ns = 0
    if w.retained is not None:  # the values set, then the wait before the subscribes
        return max(retained_sending_ns(spec) + int(w.retained.subscribe_after_s * 1e9),
                   int(w.min_window_s * 1e9))
    if w.pacing == "closed-loop":
        return int(w.min_window_s * 1e9)  # as fast as acknowledged, for this long
    for stream in (s for s in w.resolved_streams() if s.publishers):
        # The stream's last publisher starts up to one period late (staggered start).
        period_ns = stream.period_ns
        sending_ns = max(sending_ns, int(stream.offset_s * 1e9) + int(
            (stream.publishers - 1) * period_ns / stream.publishers) + int(
            stream.messages * period_ns))
    return max(sending_ns, int(w.min_window_s * 1e9))


def agents_needed(spec: CampaignSpec) -> int:
    """How many agent processes the run needs (none when it has no clients)."""
    clients = spec.workload.total_publishers() + spec.workload.subscribers
    if spec.workload.connect is not None:  # a storm's clients only
        clients = spec.workload.connect.clients
    return min(spec.agents.resolved_count(), clients)


def agent_roles(spec: CampaignSpec, agents: int) -> list[frozenset[str]]:
    """The client roles each of ``agents`` agents will play under :func:`plan_assignments`
    (for a backend that places agents by role before they exist)."""
    roles: list[set[str]] = [set() for _ in range(agents)]
    clients = _clients(spec)
    # the same dealing as plan_assignments: scope-probed clients to their wiring slots
    dealt = plan_wiring(spec).deal([c.client_id for c in clients], agents)
    for client, index in zip(clients, dealt, strict=True):
        roles[index].add(client.role.value)
    return [frozenset(r) for r in roles]


def client_ids(spec: CampaignSpec) -> list[str]:
    """Every client's id, publishers first (the order agents are dealt them in)."""
    return [client.client_id for client in _clients(spec)]


def _clients(spec: CampaignSpec) -> list[ClientAssignment]:
    """Every client of the run, publishers first (the order agents are dealt them in).

    Each stream's publishers are clients of their own, numbered on across the streams
    (pub-0 ... of the first stream, then the next's), staggered over the stream's period
    from its offset. Every subscriber subscribes to every stream's topic and expects every
    message of every stream: topics are names, never filters, so the count is exact.
    """
    w = spec.workload
    if w.mode == "connect":  # a storm's clients are dealt as StormPlans (storm_plans)
        return []
    streams = w.resolved_streams()
    clients: list[ClientAssignment] = []
    # per-publisher topics: publisher i on topic/i, subscriber j on topic/(j mod publishers)
    paired = w.topics == "per-publisher"
    for stream in streams:
        period_ns, offset_ns = stream.period_ns, int(stream.offset_s * 1e9)
        for k in range(stream.publishers):
            i = stream.first_publisher + k
            clients.append(ClientAssignment(
                client_id=publisher_client_id(i), role=Role.PUBLISHER,
                topic=f"{stream.topic}/{i}" if paired else stream.topic,
                qos=stream.qos, gpio_pin=0, publisher_index=i,
                payload_bytes=stream.payload_bytes, rate_hz=stream.rate_hz,
                messages=stream.messages, warmup_messages=stream.warmup_messages,
                start_offset_ns=offset_ns + int(k * period_ns / stream.publishers),
                closed_loop=w.pacing == "closed-loop"))
    subscribed = [SubscribedStream(topic=s.topic, qos=s.qos, first_publisher=s.first_publisher,
                                   publishers=s.publishers, warmup_messages=s.warmup_messages)
                  for s in streams] if w.streams else []
    for j in range(w.subscribers):
        clients.append(ClientAssignment(
            client_id=subscriber_client_id(j), role=Role.SUBSCRIBER,
            topic=f"{streams[0].topic}/{j % w.publishers}" if paired else streams[0].topic,
            qos=streams[0].qos, gpio_pin=0, warmup_messages=streams[0].warmup_messages,
            expected_messages=streams[0].messages if paired
            else sum(s.publishers * s.messages for s in streams),
            subscribe_rank=j, streams=subscribed))
    return _away(spec, _retained(spec, _shaped(spec, clients)))


# A connection storm's events per client, at most: its attempts, CONNACK, hold and leave.
STORM_EVENTS_PER_CLIENT = 10


def run_events_bound(spec: CampaignSpec) -> int:
    """At most how many events one run of ``spec`` records: every PUBLISH its publishers
    send (``messages``, the warm-up's among them) and a copy of each for every
    subscriber, or a connection storm's few per client. A bound known before the run, for
    choices made before it (how the analysis JVM compiles,
    :func:`mqttbed.analytics.spark.quick_jit_suits`)."""
    w = spec.workload
    if w.mode == "connect":
        assert w.connect is not None   # the spec's validation holds it
        return STORM_EVENTS_PER_CLIENT * w.connect.clients
    clients = _clients(spec)
    sent = sum(c.messages for c in clients if c.role == Role.PUBLISHER)
    subscribers = sum(1 for c in clients if c.role == Role.SUBSCRIBER)
    return sent * (1 + subscribers)


def campaign_events_bound(spec: CampaignSpec) -> int | None:
    """At most how many events the campaign's runs record (:func:`run_events_bound` over
    its points and most repetitions), or None for a search, whose probes are not known
    before it runs."""
    if spec.search is not None:
        return None
    return most_repetitions(spec.repetitions) * sum(
        run_events_bound(point.spec) for point in expand_points(spec))


def retained_topic_counts(topics: int, publishers: int) -> list[int]:
    """How many of ``topics`` retained topics each publisher sets: publisher n takes
    topics n, n + publishers, n + 2 * publishers, ..."""
    return [len(range(n, topics, publishers)) for n in range(publishers)]


def retained_sending_ns(spec: CampaignSpec) -> int:
    """How long a retained-state run's publishers take to set every value on their
    schedule (closed loop: min_window_s)."""
    w = spec.workload
    if w.retained is None:
        raise ValueError("retained_sending_ns: the workload has no workload.retained")
    if w.pacing == "closed-loop" or not w.publishers:
        return int(w.min_window_s * 1e9)
    period_ns = 1e9 / w.rate_hz
    most = max(retained_topic_counts(w.retained.topics, w.publishers)) * w.retained.updates
    # the last publisher starts up to one period late (staggered start)
    return int((w.publishers - 1) * period_ns / w.publishers) + int(most * period_ns)


def _retained(spec: CampaignSpec, clients: list[ClientAssignment]) -> list[ClientAssignment]:
    """The clients as a retained-state workload has them (``workload.retained``).

    Publisher n sets ``updates`` values on each of its topics n, n + P, ... of
    ``{topic}/{i}`` in turn (RETAIN flag; the last value of each topic is its state) and
    sends nothing else; every subscriber subscribes to ``{topic}/#`` once the window's
    sending time and ``subscribe_after_s`` have passed (and its agent's publishers are
    done), expecting each topic's one latest value. Warm-up does not apply: every value
    set is state."""
    w = spec.workload
    retained = w.retained
    if retained is None:
        return clients
    counts = retained_topic_counts(retained.topics, w.publishers)
    after_ns = int(retained.subscribe_after_s * 1e9)
    subscribe_ns = retained_sending_ns(spec) + after_ns
    shaped = []
    for client in clients:
        if client.role == Role.PUBLISHER:
            n = client.publisher_index
            shaped.append(client.model_copy(update={
                "messages": counts[n] * retained.updates, "warmup_messages": 0,
                "retained": RetainedPlan(topics=retained.topics, first=n, stride=w.publishers,
                                         count=counts[n])}))
        else:
            shaped.append(client.model_copy(update={
                "topic": f"{client.topic}/#", "expected_messages": retained.topics,
                "warmup_messages": 0,
                "retained": RetainedPlan(topics=retained.topics,
                                         subscribe_after_start_ns=subscribe_ns,
                                         subscribe_after_publishers_ns=after_ns)}))
    return shaped


def _shaped(spec: CampaignSpec, clients: list[ClientAssignment]) -> list[ClientAssignment]:
    """The clients as a shared-subscription or topic-tree workload has them.

    ``workload.shared``: subscriber j subscribes to ``$share/{group}-{j mod groups}/{topic}``
    and may receive any of the stream (a member's share is not known before the run: it
    waits out the drain, or timing.drain_idle_s). ``workload.topic_tree``: publisher i
    spreads its messages over the tree from topic ``i * topics // publishers``, and
    subscriber j holds ``{topic}/{filters[j mod len]}``, expecting exactly the messages
    its filter matches."""
    w = spec.workload
    if w.shared is not None:
        shared = w.shared
        return [client if client.role != Role.SUBSCRIBER else client.model_copy(update={
            "topic": shared_filter(shared, client.subscribe_rank, client.topic)})
            for client in clients]
    tree = w.topic_tree
    if tree is None:
        return clients
    publishers = [c for c in clients if c.role == Role.PUBLISHER]
    firsts = {c.client_id: n * tree.topics // len(publishers) for n, c in enumerate(publishers)}
    shaped = []
    for client in clients:
        if client.role == Role.PUBLISHER:
            shaped.append(client.model_copy(update={"topic_tree": PublishedTree(
                levels=tree.levels, fanout=tree.fanout, first=firsts[client.client_id])}))
            continue
        topic_filter = tree.filters[client.subscribe_rank % len(tree.filters)]
        shaped.append(client.model_copy(update={
            "topic": f"{client.topic}/{topic_filter}",
            "expected_messages": sum(
                tree_messages_matching(tree, topic_filter, firsts[p.client_id], p.messages)
                for p in publishers)}))
    return shaped


def plan_assignments(spec: CampaignSpec, run_id: str, campaign_id: str, endpoint: Endpoint,
                     agent_ids: list[str],
                     broker_of: Callable[[ClientAssignment], Endpoint] | None = None,
                     placement: ClientPlacement | None = None, *,
                     credentials: ClientCredentials | None = None) -> dict[str, Assignment]:
    """Spread the run's clients round-robin over the agents (publishers first; a scope's
    probed clients to their slots of :mod:`mqttbed.campaigns.wiring`), or as
    ``placement`` says.

    ``broker_of`` gives each client its own broker (a backend that deploys several);
    without it every client uses ``endpoint``, or its agent's in ``placement``. Every
    client speaks ``workload.protocol`` and proves itself with ``credentials``.
    """
    window_ns = run_window_ns(spec)
    storms = dict(zip(agent_ids, storm_plans(spec, len(agent_ids)), strict=False))
    per_agent: dict[str, list[ClientAssignment]] = {a: [] for a in agent_ids}
    broker = dict.fromkeys(agent_ids, endpoint)
    if placement is not None:
        broker.update({agent_ids[i]: e for i, e in enumerate(placement.endpoints) if e})
    clients = _clients(spec)
    # Scope-probed clients keep their agent and header line at every sweep point (the
    # wiring plan); the others are dealt round robin and share their host's other lines.
    wiring = plan_wiring(spec)
    dealt = (wiring.deal([c.client_id for c in clients], len(agent_ids)) if placement is None
             else [placement.agent_of[c.client_id] for c in clients])
    dealt_ids: list[list[str]] = [[] for _ in agent_ids]
    for client, index in zip(clients, dealt, strict=True):
        dealt_ids[index].append(client.client_id)
    pins = wiring.pins(dealt_ids)
    for client, index in zip(clients, dealt, strict=True):
        agent = agent_ids[index]
        update: dict[str, object] = {"gpio_pin": pins[client.client_id]}
        if broker_of is not None:
            update["broker"] = broker_of(client)
        per_agent[agent].append(client.model_copy(update=update))
    return {agent: Assignment(run_id=run_id, campaign_id=campaign_id, broker=broker[agent],
                              clients=mine, window_ns=window_ns, drain_s=spec.timing.drain_s,
                              drain_idle_s=spec.timing.drain_idle_s,
                              connect_timeout_s=spec.timing.setup_timeout_s,
                              force_clock_probe=spec.agents.force_clock_probe,
                              clock_probe_interval_s=spec.agents.clock_probe_interval_s,
                              # a virtual scope sees edges only once they are uploaded
                              chunk_interval_s=spec.timing.upload_interval_s or (
                                  0.2 if spec.measurement.scope else 1.0),
                              gpio_pulses=spec.measurement.scope is not None,
                              mqtt_client=spec.workload.client,
                              protocol=spec.workload.protocol, credentials=credentials,
                              storm=storms.get(agent))
            for agent, mine in per_agent.items() if mine or agent in storms}


# A storm client's connect not done this long after its connect() is a timeout.
STORM_CONNECT_TIMEOUT_S = 10.0


def storm_plans(spec: CampaignSpec, agents: int) -> list[StormPlan]:
    """A connection storm's clients dealt round-robin over ``agents`` (storm client k to
    agent k mod agents, intended at k / rate_hz over all of them); none without a storm."""
    storm = spec.workload.connect
    if storm is None:
        return []
    return [StormPlan(client_id_prefix="storm-", first=i, step=agents,
                      count=len(range(i, storm.clients, agents)), total=storm.clients,
                      rate_hz=storm.rate_hz, hold_s=storm.hold_s,
                      clean_session=storm.clean_session,
                      connect_timeout_s=STORM_CONNECT_TIMEOUT_S)
            for i in range(min(agents, storm.clients))]


def subscribe_turns(assignments: dict[str, Assignment]) -> list[tuple[str, list[int]]]:
    """The order in which agents subscribe: (agent, ranks) in rank order, consecutive ranks
    of one agent together (that agent chains them itself, SUBACK after SUBACK)."""
    owner = {c.subscribe_rank: agent for agent, a in assignments.items() for c in a.clients
             if c.role == Role.SUBSCRIBER}
    turns: list[tuple[str, list[int]]] = []
    for rank in sorted(owner):
        if turns and turns[-1][0] == owner[rank]:
            turns[-1][1].append(rank)
        else:
            turns.append((owner[rank], [rank]))
    return turns


def _away(spec: CampaignSpec, clients: list[ClientAssignment]) -> list[ClientAssignment]:
    """The clients as persistent sessions and reconnect storms have them.

    ``workload.sessions``: the first ``offline`` subscribers keep a persistent session and
    go away ``offline_at_s`` into the run for ``offline_for_s``. ``workload.reconnect``:
    every client connects again when the restart takes its connection, and with
    ``persistent`` every subscriber keeps a persistent session across it."""
    w = spec.workload
    if (sessions := w.sessions) is not None:
        plan = SessionPlan(session_expiry_s=sessions.session_expiry_s,
                           away_at_ns=int(sessions.offline_at_s * 1e9),
                           away_for_ns=int(sessions.offline_for_s * 1e9), leave=sessions.leave)
        return [c.model_copy(update={"session": plan})
                if c.role == Role.SUBSCRIBER and c.subscribe_rank < sessions.offline else c
                for c in clients]
    if (storm := w.reconnect) is not None:
        again = ReconnectPlan(backoff_initial_ns=int(storm.backoff_initial_s * 1e9),
                              backoff_max_ns=int(storm.backoff_max_s * 1e9))
        kept = SessionPlan() if storm.persistent else None
        return [c.model_copy(update={"reconnect": again, "session": kept
                                     if c.role == Role.SUBSCRIBER else None})
                for c in clients]
    return clients


def check_away_shapes(spec: CampaignSpec) -> None:
    """Raise ValueError when the run asks persistent sessions or a reconnect storm of what
    cannot give them: a backend that cannot restart its broker (naming it), or a Python
    client (only the native engine goes away and comes back)."""
    w = spec.workload
    shape = w.shape()
    if shape not in ("sessions", "reconnect"):
        return
    if shape == "reconnect":
        check_restarts(spec.broker.backend)
    if w.client != "native":
        raise ValueError(f"workload.{shape} needs the native engine (its clients go away and "
                         f"come back in C): workload.client {w.client!r} cannot; set "
                         "workload.client to 'native'")
