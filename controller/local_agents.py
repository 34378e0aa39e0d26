"""Agent processes the controller spawns on this machine, one set per run."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from mqttbed.core.host import Host, ProcessHandle, describe_exit


class LocalAgentPool:
    """Starts ``count`` agent processes for one run and stops every one of them after it."""

    def __init__(self, host: Host, controller_url: str, token: str, run_id: str, count: int,
                 log_dir: Path, gpio: str = "virtual", gpio_chip: str = "/dev/gpiochip0"):
        self.names = [f"{run_id}-a{i}" for i in range(count)]
        log_dir.mkdir(parents=True, exist_ok=True)
        self._logs = {name: log_dir / f"{name}.log" for name in self.names}
        self.processes: dict[str, ProcessHandle] = {}
        for name in self.names:
            argv = [sys.executable, "-m", "mqttbed.agents", "--controller", controller_url,
                    "--name", name, "--gpio", gpio, "--gpio-chip", gpio_chip]
            # The token goes through the environment: argv is world-readable in ps.
            self.processes[name] = host.spawn(argv, env={"MQTTBED_AGENT_TOKEN": token},
                                              log_path=self._logs[name])

    def exited(self) -> list[str]:
        """Reasons for every agent process that has ended, with the last line it logged."""
        reasons = []
        for name, proc in self.processes.items():
            if (code := proc.poll()) is None:
                continue
            lines = [line for line in self._logs[name].read_text(errors="replace").splitlines()
                     if line.strip()] if self._logs[name].exists() else []
            last = f": {lines[-1].strip()}" if lines else ""
            reasons.append(f"agent {name} (pid {proc.pid}) exited with code "
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
