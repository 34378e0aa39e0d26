"""Turning a run's workload into per-agent assignments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mqttbed.campaigns.spec import CampaignSpec
from mqttbed.core.broker_access import ClientCredentials
from mqttbed.core.events import publisher_client_id, subscriber_client_id
from mqttbed.core.protocol import (
    Assignment,
    ClientAssignment,
    Endpoint,
    Role,
    SubscribedStream,
)

FIRST_GPIO_PIN = 2  # BCM 2 is the first general-purpose line on a Raspberry Pi header


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
    sending_ns = 0
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
    return min(spec.agents.resolved_count(), clients)


def agent_roles(spec: CampaignSpec, agents: int) -> list[frozenset[str]]:
    """The client roles each of ``agents`` agents will play under :func:`plan_assignments`
    (for a backend that places agents by role before they exist)."""
    roles: list[set[str]] = [set() for _ in range(agents)]
    for n, client in enumerate(_clients(spec)):
        roles[n % agents].add(client.role.value)
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
    return clients


def plan_assignments(spec: CampaignSpec, run_id: str, campaign_id: str, endpoint: Endpoint,
                     agent_ids: list[str],
                     broker_of: Callable[[ClientAssignment], Endpoint] | None = None,
                     placement: ClientPlacement | None = None, *,
                     credentials: ClientCredentials | None = None) -> dict[str, Assignment]:
    """Spread the run's clients round-robin over the agents (publishers first), or as
    ``placement`` says.

    ``broker_of`` gives each client its own broker (a backend that deploys several);
    without it every client uses ``endpoint``, or its agent's in ``placement``. Every
    client speaks ``workload.protocol`` and proves itself with ``credentials``.
    """
    window_ns = run_window_ns(spec)
    per_agent: dict[str, list[ClientAssignment]] = {a: [] for a in agent_ids}
    broker = dict.fromkeys(agent_ids, endpoint)
    if placement is not None:
        broker.update({agent_ids[i]: e for i, e in enumerate(placement.endpoints) if e})
    for n, client in enumerate(_clients(spec)):
        index = n % len(agent_ids) if placement is None else placement.agent_of[client.client_id]
        agent = agent_ids[index]
        update: dict[str, object] = {"gpio_pin": FIRST_GPIO_PIN + len(per_agent[agent])}
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
                              protocol=spec.workload.protocol, credentials=credentials)
            for agent, mine in per_agent.items() if mine}


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
