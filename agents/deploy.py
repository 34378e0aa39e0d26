"""Starting a run's agent processes: on this machine, or on lab machines (Pis) over SSH.

The controller says where (a :class:`Site` per agent: a Host and the command that starts
``mqttbed agent`` there); the pool starts them all, reports any that died with the last
line it logged, and stops every one of them after the run. A remote agent's output is
streamed into the same local log directory as a local one's.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mqttbed.core.host import Host, ProcessHandle, describe_exit

if TYPE_CHECKING:  # paramiko is the controller's, not an agent's
    from mqttbed.core.ssh import SshHost

# `python -m mqttbed.agents` with this interpreter: what the controller's own machine runs.
LOCAL_COMMAND = (sys.executable, "-m", "mqttbed.agents")


@dataclass(frozen=True)
class Site:
    """Where one agent runs: its host, the argv prefix that starts the agent there, and
    the controller's URL as seen from there when it differs from the pool's (a host in a
    network namespace reaches it through a relay)."""

    host: Host | SshHost  # an SSH host's directories are remote paths, not local ones
    command: tuple[str, ...] = field(default=LOCAL_COMMAND)
    controller_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # over the pool's, for this site


class Agents(Protocol):
    """A run's agents as the engine supervises them, however they run."""

    names: list[str]         # the name each agent registers with, one per site
    hosts: dict[str, str]    # name -> where it runs, as the run's record says

    def exited(self) -> list[str]:
        """Why each agent that has ended ended (the run fails with these reasons)."""
        ...

    def stop(self, grace_s: float = 2.0, timeout_s: float = 3.0) -> None:
        """Give the agents ``grace_s`` to end by themselves, then stop every one left."""
        ...


class StartAgents(Protocol):
    """How the engine starts a run's agents: :class:`AgentPool` (processes) unless a
    test hands the controller another way (:mod:`mqttbed.agents.in_process`)."""

    def __call__(self, sites: list[Site], controller_url: str, token: str, run_id: str,
                 log_dir: Path, *, gpio: str, gpio_chip: str,
                 env: dict[str, str] | None) -> Agents:
        ...


class AgentPool:
    """Starts one agent per site for one run and stops every one of them after it."""

    def __init__(self, sites: list[Site], controller_url: str, token: str, run_id: str,
                 log_dir: Path, gpio: str = "auto", gpio_chip: str = "/dev/gpiochip0",
                 env: dict[str, str] | None = None):
        self.names = [f"{run_id}-a{i}" for i in range(len(sites))]
        log_dir.mkdir(parents=True, exist_ok=True)
        self._logs = {name: log_dir / f"{name}.log" for name in self.names}
        self.processes: dict[str, ProcessHandle] = {}
        self.hosts = {name: site.host.name for name, site in zip(self.names, sites, strict=True)}
        try:
            for name, site in zip(self.names, sites, strict=True):
                argv = [*site.command, "--controller", site.controller_url or controller_url,
                        "--name", name,
                        "--gpio", gpio, "--gpio-chip", gpio_chip]
                # The token goes through the environment: argv is world-readable in ps.
                self.processes[name] = site.host.spawn(
                    argv, env={**(env or {}), **site.env, "MQTTBED_AGENT_TOKEN": token},
                    log_path=self._logs[name])
        except BaseException:
            self.stop(grace_s=0)  # the ones already started, before the failure goes up
            raise

    def exited(self) -> list[str]:
        """Reasons for every agent process that has ended, with the last line it logged."""
        reasons = []
        for name, proc in self.processes.items():
            if (code := proc.poll()) is None:
                continue
            lines = [line for line in self._logs[name].read_text(errors="replace").splitlines()
                     if line.strip()] if self._logs[name].exists() else []
            last = f": {lines[-1].strip()}" if lines else ""
            where = "" if self.hosts[name] == "local" else f" on {self.hosts[name]}"
            reasons.append(f"agent lost: {name}{where} (pid {proc.pid}) exited with code "
                           f"{describe_exit(code)}{last}")
        return reasons

    def stop(self, grace_s: float = 2.0, timeout_s: float = 3.0) -> None:
        """Give the agents ``grace_s`` to exit by themselves, then stop what is left.

        Stopping signals each agent's whole process group, so nothing it started survives.
        """
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None
                                                  for p in self.processes.values()):
            time.sleep(0.02)
        for proc in self.processes.values():
            proc.stop(timeout_s)
