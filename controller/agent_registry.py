"""The agent registry: who is registered, who is alive, what each agent must do next.

Agents heartbeat; an agent silent for longer than the liveness timeout is reported lost.
Commands wait in a per-agent queue that the agent long-polls. Messages about a run
(ready, done, error) land in that run's inbox, where the run engine waits for them.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import (
    AgentFailure,
    Command,
    Connected,
    Done,
    Ready,
    Register,
    ResultChunk,
    Subscribed,
)


@dataclass
class AgentRecord:
    agent_id: str
    hello: Register
    last_seen_ns: int
    state: str = "idle"
    lost: bool = False


@dataclass
class RunInbox:
    """What the agents of one run have reported so far."""

    run_id: str
    campaign_id: str
    connected: dict[str, Connected] = field(default_factory=dict)
    subscribed: set[int] = field(default_factory=set)  # ranks holding their SUBACK
    ready: dict[str, Ready] = field(default_factory=dict)
    done: dict[str, Done] = field(default_factory=dict)
    errors: dict[str, AgentFailure] = field(default_factory=dict)
    chunks: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    # Told of every uploaded chunk that carries GPIO edges (the virtual scope's feed).
    edge_sink: Callable[[ResultChunk], None] | None = None


class AgentRegistry:
    """Thread-safe state shared by the agent API (HTTP) and the run engine."""

    def __init__(self, heartbeat_interval_s: float = 0.5,
                 on_agent_change: Callable[[AgentRecord], None] | None = None):
        self.heartbeat_interval_s = heartbeat_interval_s
        # Told of registrations and of agents lost or gone (not of every heartbeat).
        self._on_agent_change = on_agent_change or (lambda _record: None)
        self._agents: dict[str, AgentRecord] = {}
        self._commands: dict[str, list[Command]] = defaultdict(list)
        self._inboxes: dict[str, RunInbox] = {}
        self._ids = itertools.count(1)
        self._changed = threading.Condition()

    # -- agents -------------------------------------------------------------------------

    def register(self, hello: Register) -> str:
        with self._changed:
            agent_id = f"agent-{next(self._ids)}-{hello.name}"[:48]
            record = self._agents[agent_id] = AgentRecord(agent_id, hello, monotonic_ns())
            self._changed.notify_all()
        self._on_agent_change(record)
        return agent_id

    def heartbeat(self, agent_id: str, state: str) -> bool:
        """Record a heartbeat; False if the agent is unknown (it must register again)."""
        with self._changed:
            record = self._agents.get(agent_id)
            if record is None:
                return False
            record.last_seen_ns = monotonic_ns()
            record.state = state
            return True

    def agents(self) -> list[AgentRecord]:
        with self._changed:
            return list(self._agents.values())

    def agent(self, agent_id: str) -> AgentRecord | None:
        with self._changed:
            return self._agents.get(agent_id)

    def silent_agents(self, agent_ids: list[str], timeout_s: float) -> list[str]:
        """Return those of ``agent_ids`` not heard from within ``timeout_s``; mark them lost."""
        now = monotonic_ns()
        silent, newly_lost = [], []
        with self._changed:
            for agent_id in agent_ids:
                record = self._agents.get(agent_id)
                if record is None or now - record.last_seen_ns > timeout_s * 1e9:
                    silent.append(agent_id)
                    if record is not None and not record.lost:
                        record.lost = True
                        record.state = "lost"
                        newly_lost.append(record)
        for record in newly_lost:
            self._on_agent_change(record)
        return silent

    def forget(self, agent_id: str) -> None:
        """Drop an agent whose process is gone."""
        with self._changed:
            record = self._agents.pop(agent_id, None)
            self._commands.pop(agent_id, None)
            self._changed.notify_all()  # its long poll returns now, not after its wait
        if record is not None:
            record.state = "gone"
            self._on_agent_change(record)

    def wait_for_agents(self, names: set[str], timeout_s: float) -> dict[str, str]:
        """Wait until agents with every name in ``names`` registered; return name -> id."""
        deadline = monotonic_ns() + int(timeout_s * 1e9)
        with self._changed:
            while True:
                found = {r.hello.name: r.agent_id for r in self._agents.values()
                         if r.hello.name in names}
                remaining = (deadline - monotonic_ns()) / 1e9
                if len(found) == len(names) or remaining <= 0:
                    return found
                self._changed.wait(remaining)

    # -- commands -----------------------------------------------------------------------

    def send(self, agent_id: str, command: Command) -> None:
        with self._changed:
            self._commands[agent_id].append(command)
            self._changed.notify_all()

    def take_commands(self, agent_id: str, wait_s: float) -> list[Command]:
        """Long poll: return the agent's queued commands, waiting up to ``wait_s`` for one."""
        deadline = monotonic_ns() + int(wait_s * 1e9)
        with self._changed:
            while not self._commands.get(agent_id):
                remaining = (deadline - monotonic_ns()) / 1e9
                if remaining <= 0 or agent_id not in self._agents:
                    return []
                self._changed.wait(remaining)
            return self._commands.pop(agent_id)

    # -- run inboxes --------------------------------------------------------------------

    def open_inbox(self, run_id: str, campaign_id: str) -> RunInbox:
        with self._changed:
            inbox = self._inboxes[run_id] = RunInbox(run_id, campaign_id)
            return inbox

    def close_inbox(self, run_id: str) -> None:
        with self._changed:
            self._inboxes.pop(run_id, None)

    def deliver(self, message: Connected | Subscribed | Ready | Done | AgentFailure) -> bool:
        """File a run message in its inbox; False if no run with that id is open."""
        with self._changed:
            inbox = self._inboxes.get(message.run_id)
            if inbox is None:
                return False
            if isinstance(message, Subscribed):
                inbox.subscribed.add(message.rank)
            elif isinstance(message, Connected):
                inbox.connected[message.agent_id] = message
            elif isinstance(message, Ready):
                inbox.ready[message.agent_id] = message
            elif isinstance(message, Done):
                inbox.done[message.agent_id] = message
            else:
                inbox.errors[message.agent_id] = message
            self._changed.notify_all()
            return True

    def chunk_stored(self, chunk: ResultChunk) -> None:
        """Count a stored chunk for its run, and pass its GPIO edges to the run's edge sink."""
        with self._changed:
            inbox = self._inboxes.get(chunk.run_id)
            if inbox is not None:
                inbox.chunks[chunk.agent_id].add(chunk.seq)
                self._changed.notify_all()
        if inbox is not None and inbox.edge_sink is not None and chunk.edges:
            inbox.edge_sink(chunk)

    def wait(self, timeout_s: float) -> None:
        """Sleep until anything changes in the registry, or ``timeout_s``."""
        with self._changed:
            self._changed.wait(timeout_s)
