"""The agent program: ``mqttbed agent --controller URL --token T``.

It registers with the controller over HTTP, heartbeats on its own thread, long-polls for
commands and runs each assignment it is given. The same program runs as a local process
spawned by the controller and on a Raspberry Pi in the lab.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable

import httpx
from pydantic import ValidationError

from mqttbed.agents.gpio import GpioUnavailable, open_gpio
from mqttbed.agents.native import engine as native_engine
from mqttbed.agents.options import build_parser
from mqttbed.agents.runner import AssignmentRunner
from mqttbed.core.clock import CLOCK_NAME, boot_id, monotonic_ns, resolution_ns, seconds_until
from mqttbed.core.host import raise_nofile_limit
from mqttbed.core.protocol import (
    Abort,
    Assignment,
    Commands,
    Heartbeat,
    Register,
    Registered,
    Shutdown,
    StartAt,
    Subscribe,
)
from mqttbed.core.tls import CA_FILE_HINT, TlsSetupError, client_verify, is_untrusted_certificate

log = logging.getLogger("mqttbed.agent")

EXIT_CONTROLLER_LOST = 5  # the controller stopped answering for the heartbeat timeout
EARLIER_RUN_JOIN_S = 5.0  # how long a new assignment waits for the last run's runner to end


class CommandsUnreadable(RuntimeError):
    """The controller's commands do not parse as this agent's protocol (a version skew)."""


def parse_commands(content: bytes) -> Commands:
    """The commands of one poll; raises CommandsUnreadable naming each bad field but never
    a value: an assignment carries the run's password and client key."""
    try:
        return Commands.model_validate_json(content)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, error['loc'])) or 'commands'}: {error['msg']}"
                             for error in exc.errors(include_url=False, include_input=False,
                                                     include_context=False))
        raise CommandsUnreadable(f"the controller's commands do not parse ({exc.error_count()} "
                                 f"error(s)): {problems}") from None


class Agent:
    """One agent's life: register, heartbeat, obey commands."""

    def __init__(self, controller_url: str, token: str, name: str, gpio_backend: str = "auto",
                 gpio_chip: str = "/dev/gpiochip0", ca_file: str | None = None, *,
                 on_controller_lost: Callable[[], object] | None = None):
        """``on_controller_lost`` is called once the controller is lost and the runs are
        aborted; None (the agent program) exits the process with EXIT_CONTROLLER_LOST. An
        agent on a thread of a test (:mod:`mqttbed.agents.in_process`) must not."""
        # httpx writes headers and body separately: without TCP_NODELAY every request
        # waits out a delayed ACK (~40 ms on Linux).
        transport = httpx.HTTPTransport(
            verify=client_verify(ca_file),
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self._http = httpx.Client(base_url=controller_url.rstrip("/"), timeout=30.0,
                                  transport=transport,
                                  headers={"authorization": f"Bearer {token}"})
        self._name = name
        self._gpio = open_gpio(gpio_backend, gpio_chip)  # fails here, before registering
        # build (or load) the native engine now, not while a run waits for its CONNACKs;
        # where it cannot be, each run says why and runs the lean client (paho where the
        # run needs TLS, WebSocket or MQTT 5, which the lean client does not speak)
        if (reason := native_engine.unavailable_reason()) is not None:
            log.warning("%s; runs use the lean Python client (paho for TLS, WebSocket or "
                        "MQTT 5)", reason)
        self._controller_boot_id: str | None = None
        self._stop = threading.Event()
        self._on_controller_lost = on_controller_lost
        self._heartbeat: threading.Thread | None = None
        self._runners: dict[str, AssignmentRunner] = {}
        self.agent_id = ""
        self._heartbeat_s = 0.5
        self._controller_timeout_s = 3.0
        self._last_answer_ns = monotonic_ns()  # the controller's last 2xx answer

    def register(self) -> None:
        hello = Register(name=self._name, hostname=socket.gethostname(), pid=os.getpid(),
                         cores=os.cpu_count() or 1, gpio_backend=self._gpio.backend,
                         clock=CLOCK_NAME, clock_resolution_ns=resolution_ns(),
                         boot_id=boot_id())
        response = self._http.post("/agent/v1/register", content=hello.model_dump_json(),
                                   headers={"content-type": "application/json"})
        response.raise_for_status()
        registered = Registered.model_validate_json(response.content)
        self.agent_id = registered.agent_id
        self._heartbeat_s = registered.heartbeat_interval_s
        self._controller_timeout_s = registered.heartbeat_timeout_s
        self._last_answer_ns = monotonic_ns()
        self._controller_boot_id = registered.controller_boot_id

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            state = "busy" if self._runners else "idle"
            beat = Heartbeat(agent_id=self.agent_id, state=state, t_agent_ns=monotonic_ns())
            try:
                self._http.post(f"/agent/v1/agents/{self.agent_id}/heartbeat",
                                content=beat.model_dump_json(),
                                headers={"content-type": "application/json"},
                                timeout=min(5.0, self._controller_timeout_s)
                                ).raise_for_status()
                self._last_answer_ns = monotonic_ns()
            except httpx.HTTPError as exc:
                log.warning("heartbeat failed: %s", exc)
            silent_s = (monotonic_ns() - self._last_answer_ns) / 1e9
            if silent_s > self._controller_timeout_s:
                self._controller_lost(silent_s)

    def _controller_lost(self, silent_s: float) -> None:
        """The controller is gone (killed, or a new one that does not know this agent):
        abort the runs and exit, rather than run on as an orphan nobody will stop."""
        log.error("controller %s silent for %.1f s (timeout %.1f s): exiting",
                  self._http.base_url, silent_s, self._controller_timeout_s)
        self._stop.set()
        for runner in list(self._runners.values()):
            runner.abort("controller lost")
            runner.join(2.0)
        if self._on_controller_lost is not None:
            self._on_controller_lost()
            return
        # The main thread may sit in a long poll to an unreachable address: do not wait.
        os._exit(EXIT_CONTROLLER_LOST)

    def serve(self) -> None:
        """Register, then obey commands until told to shut down."""
        self.register()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop,
                                           name=f"heartbeat-{self._name}", daemon=True)
        self._heartbeat.start()
        while not self._stop.is_set():
            try:
                response = self._http.get(f"/agent/v1/agents/{self.agent_id}/commands",
                                          params={"wait_s": 5.0}, timeout=15.0)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                log.warning("command poll failed: %s", exc)
                self._stop.wait(0.5)
                continue
            self._last_answer_ns = monotonic_ns()
            for command in parse_commands(response.content).commands:
                self._obey(command)
        for runner in list(self._runners.values()):
            runner.abort("agent shutting down")
            runner.join(5.0)

    def _obey(self, command: Assignment | Subscribe | StartAt | Abort | Shutdown) -> None:
        if isinstance(command, Assignment):
            if command.run_id in self._runners:
                return  # a repeated assignment: the run is already under way
            # A kept agent's last run may still be closing its clients (it said done
            # first): let it end, so nothing of it overlaps this run (kept_agents).
            for earlier in list(self._runners.values()):
                earlier.join(EARLIER_RUN_JOIN_S)
            self._controller_timeout_s = command.heartbeat_timeout_s
            started = AssignmentRunner(self._http, self.agent_id, command, self._gpio,
                                       on_finished=lambda: self._runners.pop(command.run_id, None),
                                       controller_boot_id=self._controller_boot_id)
            self._runners[command.run_id] = started
            started.launch()
        elif isinstance(command, Subscribe):
            if (runner := self._runners.get(command.run_id)) is not None:
                runner.subscribe(command)
        elif isinstance(command, StartAt):
            if (runner := self._runners.get(command.run_id)) is not None:
                runner.start_at(command.t_start_ns)
        elif isinstance(command, Abort):
            if (runner := self._runners.get(command.run_id)) is not None:
                runner.abort(command.reason)
        elif isinstance(command, Shutdown):
            self._stop.set()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float) -> list[str]:
        """Wait up to ``timeout_s`` for the threads of a stopped agent (its heartbeat, its
        runs) to end; return the names of those still running. A process need not: its
        threads end with it."""
        deadline = monotonic_ns() + int(timeout_s * 1e9)
        threads = [self._heartbeat] if self._heartbeat is not None else []
        for thread in threads:
            thread.join(seconds_until(deadline))
        for runner in list(self._runners.values()):
            runner.join(seconds_until(deadline))
        return ([t.name for t in threads if t.is_alive()]
                + [f"run-{run_id}" for run_id in list(self._runners)])

    def close(self) -> None:
        """Close the agent's HTTP client (a process's goes with it)."""
        self._http.close()


def run(args: argparse.Namespace) -> int:
    """Run the agent until the controller shuts it down or SIGTERM arrives."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s agent %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if not args.token:
        raise SystemExit("mqttbed agent: --token (or MQTTBED_AGENT_TOKEN) is required")
    # The MQTT loop thread timestamps receipts; when another thread (upload, heartbeat)
    # holds the GIL, the loop waits up to the switch interval (5 ms by default) before it
    # can take a timestamp. Half a millisecond bounds that wait at a small cost.
    sys.setswitchinterval(0.0005)
    raise_nofile_limit()  # one socket per client; reported with each run's Done
    try:
        agent = Agent(args.controller, args.token, args.name, args.gpio, args.gpio_chip,
                      args.ca_file)
    except (GpioUnavailable, TlsSetupError) as exc:
        print(f"mqttbed agent: {exc}", file=sys.stderr)
        return 3
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    try:
        agent.serve()
    except httpx.ConnectError as exc:
        if not is_untrusted_certificate(exc):
            raise
        print(f"mqttbed agent: the certificate of {args.controller} is not trusted ({exc}); "
              f"{CA_FILE_HINT}", file=sys.stderr)
        return 4
    return 0


def main() -> int:
    return run(build_parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
