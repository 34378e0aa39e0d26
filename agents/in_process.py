"""A run's agents on threads of the calling process: the agent program without its process.

The engine starts each agent of a run as a process (:class:`~mqttbed.agents.deploy.AgentPool`):
an interpreter start, the agent's imports and a native-engine load per agent, per run.
Where the process adds nothing to what a test checks (the engine's lifecycle, a broker's
failure, chunk collection), :class:`InProcessAgents` runs the same
:class:`~mqttbed.agents.main.Agent` main loop on a thread instead: the same registration,
token and HTTP routes, the same heartbeats, commands, assignment runner and uploads.

What a process gives and a thread does not: a process that can be killed or stopped
(agent loss), its own resource usage and CPU share, its own GIL (a thread shares the
test's), another host or network namespace. Those tests keep processes. Only a site on
this machine, started with this interpreter, can become a thread; :func:`start_agents`
starts any other run's agents as processes.

The engine's supervision is kept: an agent thread that ends (its constructor or its
main loop raised, or it returned) or that lost the controller is in :meth:`exited`, and
:meth:`stop` stops every thread or raises :class:`AgentThreadsStuck` naming the ones that
did not stop. Not for production: a controller takes it only through its
``start_agents`` argument, which the test fixtures set.
"""

from __future__ import annotations

import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from mqttbed.agents.deploy import LOCAL_COMMAND, AgentPool, Agents, Site
from mqttbed.agents.main import EXIT_CONTROLLER_LOST, Agent
from mqttbed.core.clock import monotonic_ns, seconds_until
from mqttbed.core.host import LocalHost, raise_nofile_limit

HOST = "in-process"   # where the run's record says these agents ran
KILL_WAIT_S = 5.0     # what a process pool waits after SIGKILL: a thread gets it too


class AgentThreadsStuck(RuntimeError):
    """Agent threads that did not end when stopped (a thread cannot be killed)."""


@dataclass
class _AgentThread:
    """One agent on its thread, and how it ended."""

    name: str
    thread: threading.Thread | None = None
    agent: Agent | None = None
    error: str | None = None                # what its constructor or main loop raised
    lost_controller: bool = False
    stop: threading.Event = field(default_factory=threading.Event)

    def running(self) -> list[str]:
        """Its threads still running: the agent's own, or once that ended, its heartbeat
        and runs that outlived it."""
        if self.thread is not None and self.thread.is_alive():
            return [self.thread.name]
        return self.agent.join(0) if self.agent is not None else []


def is_local(site: Site) -> bool:
    """True for a site a thread of this process can stand in for: this machine, this
    interpreter, the pool's controller URL."""
    return (type(site.host) is LocalHost and site.command == LOCAL_COMMAND
            and site.controller_url is None)


class InProcessAgents:
    """One agent per site, each on its own thread, for one run; the engine's pool."""

    def __init__(self, sites: list[Site], controller_url: str, token: str, run_id: str,
                 log_dir: Path, *, gpio: str = "auto", gpio_chip: str = "/dev/gpiochip0",
                 env: dict[str, str] | None = None, kill_wait_s: float = KILL_WAIT_S):
        """``kill_wait_s``: how much longer than a stop's ``timeout_s`` a thread is waited
        for before it is called stuck (a process pool's wait after SIGKILL)."""
        for i, site in enumerate(sites):
            if not is_local(site):
                raise ValueError(f"site {i} ({site.host.name}, {' '.join(site.command)}) is "
                                 "not this machine's agent program: it needs a process")
        self.names = [f"{run_id}-a{i}" for i in range(len(sites))]
        self.hosts = dict.fromkeys(self.names, HOST)
        self._log_dir = log_dir
        self._kill_wait_s = kill_wait_s
        log_dir.mkdir(parents=True, exist_ok=True)
        raise_nofile_limit()   # one socket per client, as a spawned agent raises its own
        self._agents: dict[str, _AgentThread] = {}
        for name, site in zip(self.names, sites, strict=True):
            ca_file = {**(env or {}), **site.env}.get("MQTTBED_CA_FILE") or None
            entry = self._agents[name] = _AgentThread(name)
            entry.thread = threading.Thread(
                target=self._serve, args=(entry, controller_url, token, gpio, gpio_chip, ca_file),
                name=f"mqttbed-agent-{name}", daemon=True)   # never holds up an exit
            entry.thread.start()

    def _serve(self, entry: _AgentThread, controller_url: str, token: str, gpio: str,
               gpio_chip: str, ca_file: str | None) -> None:
        """The agent program's life on this thread: what ``mqttbed agent`` runs."""
        agent = None
        try:
            agent = Agent(controller_url, token, entry.name, gpio, gpio_chip, ca_file,
                          on_controller_lost=lambda: setattr(entry, "lost_controller", True))
            entry.agent = agent
            if not entry.stop.is_set():   # stopped before it was up: never registers
                agent.serve()
        except Exception as exc:  # noqa: BLE001 - the thread's end is its reason, as an exit is
            entry.error = f"{type(exc).__name__}: {exc}"
            (self._log_dir / f"{entry.name}.log").write_text(traceback.format_exc())
        finally:
            if agent is not None:
                agent.stop()
                if not agent.join(self._kill_wait_s):   # else running() names them
                    agent.close()

    def exited(self) -> list[str]:
        """Reasons for every agent thread that has ended or lost the controller."""
        reasons = []
        for name, entry in self._agents.items():
            where = f"{name} (in-process thread)"
            if entry.lost_controller:
                reasons.append(f"agent lost: {where} lost the controller (the process "
                               f"would have exited with code {EXIT_CONTROLLER_LOST})")
            elif entry.thread is not None and not entry.thread.is_alive():
                how = f"raised {entry.error}" if entry.error else "returned"
                reasons.append(f"agent lost: {where} ended: {how}")
        return reasons

    def running(self) -> list[str]:
        """The threads of this pool's agents still running (none once stopped)."""
        return [thread for entry in self._agents.values() for thread in entry.running()]

    def stop(self, grace_s: float = 2.0, timeout_s: float = 3.0) -> None:
        """Give the agents ``grace_s`` to end by themselves (the engine sent them Shutdown),
        then stop the rest; raise AgentThreadsStuck naming any thread still running
        ``timeout_s`` + ``kill_wait_s`` later (what a process pool waits, SIGKILL
        included)."""
        deadline = monotonic_ns() + int(grace_s * 1e9)
        for entry in self._agents.values():
            if entry.thread is not None:
                entry.thread.join(seconds_until(deadline))
        for entry in self._agents.values():
            entry.stop.set()
            if entry.agent is not None:
                entry.agent.stop()
        waited_s = timeout_s + self._kill_wait_s
        deadline = monotonic_ns() + int(waited_s * 1e9)
        for entry in self._agents.values():
            if entry.thread is not None:
                entry.thread.join(seconds_until(deadline))
        if stuck := self.running():
            frames = sys._current_frames()
            where = {t.name: _innermost(frames.get(t.ident or 0))
                     for t in threading.enumerate() if t.name in stuck}
            raise AgentThreadsStuck(
                f"{len(stuck)} agent thread(s) still running {waited_s:.1f} s "
                "after they were stopped: " + ", ".join(
                    f"{name} (at {where.get(name, 'unknown')})" for name in stuck))


def _innermost(frame: FrameType | None) -> str:
    """file:line of a thread's innermost frame: where a stuck thread sits."""
    if frame is None:
        return "unknown"
    summary = traceback.extract_stack(frame)[-1]
    return f"{Path(summary.filename).name}:{summary.lineno} in {summary.name}"


def start_agents(sites: list[Site], controller_url: str, token: str, run_id: str,
                 log_dir: Path, *, gpio: str, gpio_chip: str,
                 env: dict[str, str] | None) -> Agents:
    """A run's agents on threads when every site is this machine's agent program, else
    as processes (lab hosts, network namespaces, a backend's own network): the
    ``start_agents`` a test gives a controller."""
    if sites and all(is_local(site) for site in sites):
        return InProcessAgents(sites, controller_url, token, run_id, log_dir, gpio=gpio,
                               gpio_chip=gpio_chip, env=env)
    return AgentPool(sites, controller_url, token, run_id, log_dir, gpio=gpio,
                     gpio_chip=gpio_chip, env=env)
