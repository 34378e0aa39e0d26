"""Any broker from a command template, started per run in a private directory.

Deploy picks a free port, renders the config template into the run's directory, starts
the command in a process group of its own (as ``user`` if asked) with its output in
``output.log`` there, and polls until the broker answers MQTT (a CONNECT gets its CONNACK;
over UDP a PINGREQ its PINGRESP): no fixed sleeps. A command that exits first fails the
deploy with its exit status and the end of its output; one that never answers fails after
``ready_timeout_s`` naming the address; either way nothing of it is left running. While
the run measures, its process tree is sampled (CPU, memory, I/O) and its ``$SYS`` topics
read; teardown sends SIGTERM to the process group, SIGKILL after ``stop_grace_s``.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shlex
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from mqttbed.brokers.command.options import Options
from mqttbed.brokers.command.ready import probe_ready
from mqttbed.brokers.command.templates import render, render_command
from mqttbed.brokers.processes import BrokerProcess, local_processes, processes_in_group
from mqttbed.brokers.reachability import ConnectRefused, Unreachable
from mqttbed.brokers.restarts import BrokerRestarts
from mqttbed.brokers.sys_monitor import SysMonitor, SysTopicsRecord
from mqttbed.core.backends import AccessRecord, DeploymentRecord, Fault
from mqttbed.core.broker_access import ClientCredentials, MqttProtocol
from mqttbed.core.errors import BackendError, MissingSystemDependency
from mqttbed.core.host import Host, ProcessHandle, describe_exit, sha256_file
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import BrokerResourceSample, SysSample
from mqttbed.core.sections import SectionRecords
from mqttbed.core.ssh import SshHost

CONFIG_NAME = "broker.conf"
LOG_NAME = "output.log"
VERSION_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.02
# A broker that lost the race for its port (another process bound it between our
# choice and its bind) says so and exits; it is started again on a new port.
PORT_ATTEMPTS = 3
PORT_TAKEN = ("address already in use", "eaddrinuse")


class CommandDeployment(DeploymentRecord):
    """What one command broker deploy was."""

    preset: str | None = None
    command: list[str] = Field(description="the rendered command line, one word per item")
    command_line: str = Field(description="the same, quoted as a shell would take it")
    env: dict[str, str] = Field(default_factory=dict, description="rendered, as given")
    user: str | None = None
    transport: Transport
    ready_after_s: float | None = Field(None, description="from start to its first answer")
    stop_grace_s: float | None = None
    sys_topics: SysTopicsRecord | None = None
    access: AccessRecord | None = Field(None, description="the listener a named broker was "
                                                          "configured for (no secret)")


class CommandBackend:
    """Deploys a broker from a command template (see the module docstring)."""

    name = "command"
    # a named preset's backend narrows this to its own options (brokers/command/named.py)
    options_model: ClassVar[type[Options]] = Options

    def __init__(self) -> None:
        self._options: Options | None = None
        self._proc: BrokerProcess | None = None
        self._argv: list[str] = []
        self._env: dict[str, str] = {}
        self._config: str | None = None
        self._binary: str | None = None
        self._binary_sha256: str | None = None
        self._version: str | None = None
        self._port: int | None = None
        self._ready_after_s: float | None = None
        self._sys = SysMonitor()
        self._torn_down = False
        self._restarts = BrokerRestarts(self.name)
        self._account: pwd.struct_passwd | None = None
        self._host: Host | None = None

    # -- restarts (workload.reconnect) ---------------------------------------------------

    def keep_sessions(self, persistent: bool) -> None:
        """Nothing to configure: whether the broker keeps sessions across its restart is
        its own (the results' session present flags say what it did)."""

    def restart_at(self, at_ns: int, down_s: float) -> None:
        """Stop the broker at ``at_ns`` (SIGTERM) and run its command again ``down_s``
        later, with the same arguments, environment, config and port."""
        proc, options, port, host = self._proc, self._options, self._port, self._host
        if proc is None or options is None or port is None or host is None \
                or self._torn_down:
            raise BackendError("restart_at comes after deploy, before teardown")
        argv = _as_user(self._argv, self._account)
        env = _env_for(self._env, self._account)
        self._restarts.arm(
            proc, lambda n: host.spawn(argv, env=env,
                                       log_path=proc.dir / f"restart-{n}-{LOG_NAME}"),
            host.address, port, at_ns, down_s, options.stats_interval_s)

    def started(self, t_start_ns: int) -> None:
        """Nothing to arm at the start: a restart is armed by :meth:`restart_at`."""

    def faults(self) -> list[Fault]:
        """The restarts done (when each stopped, and listened again)."""
        return self._restarts.faults()

    # -- deploy -------------------------------------------------------------------------

    def deploy(self, spec: Options | Mapping[str, Any], host: Host | SshHost) -> Endpoint:
        """Start the command on ``host``; return where clients connect once it answers."""
        if self._options is not None or self._torn_down:
            raise BackendError("this CommandBackend was already deployed; create a new one "
                               "per run (mqttbed.core.backends.create_backend)")
        if isinstance(host, SshHost):
            raise BackendError(f"backend command runs brokers on this machine only, not on "
                               f"lab host {host.name}")
        options = (spec if isinstance(spec, self.options_model)
                   else self.options_model.model_validate(spec))
        self._options = options
        account = self._account = _account(options.user)
        self._host = host
        self._proc = proc = BrokerProcess(self.name, host, "mqttbed-command-",
                                          log_names=(LOG_NAME,))
        try:
            if account is not None:
                os.chown(proc.dir, account.pw_uid, account.pw_gid)
            endpoint = self._start(options, host, proc, account)
            proc.watch(_handle(proc), options.stats_interval_s)
            if options.sys_topics and self._sys_topics_reachable():
                self._sys.start(endpoint)
        except BaseException:
            # A failed deploy leaves nothing behind: no process, no directory.
            self.teardown()
            raise
        return endpoint

    def _start(self, options: Options, host: Host, proc: BrokerProcess,
               account: pwd.struct_passwd | None) -> Endpoint:
        """Start the broker until it answers, on a new port after a lost port race."""
        assert options.command is not None  # the options' own check
        template, env = self._config_template(options), self._env_template(options)
        self._prepare(proc.dir, host.address, account)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = host.free_port()
            values = {"port": str(port), "config": str(proc.dir / CONFIG_NAME),
                      "dir": str(proc.dir)}
            self._argv = render_command(options.command, values)
            self._env = {name: render(value, values) for name, value in env.items()}
            if template is not None:
                self._config = render(template, values)
                config = proc.dir / CONFIG_NAME
                config.write_text(self._config)
                if account is not None:
                    os.chown(config, account.pw_uid, account.pw_gid)
            if attempt == 1:
                self._identify(options, host, proc, values, account)
            self._port = port
            endpoint = self._endpoint(host.address, port, options)
            started = time.monotonic()
            proc.handle = host.spawn(_as_user(self._argv, account), env=_env_for(self._env,
                                     account), log_path=proc.dir / LOG_NAME)
            exited = self._await_ready(options, endpoint, proc, started)
            if exited is None:
                self._ready_after_s = time.monotonic() - started
                return endpoint
            if attempt == PORT_ATTEMPTS or not any(
                    sign in proc.log_tail().lower() for sign in PORT_TAKEN):
                raise BackendError(exited)
            proc.handle = None
        raise AssertionError("unreachable: the last attempt raises")

    def _identify(self, options: Options, host: Host, proc: BrokerProcess,
                  values: dict[str, str], account: pwd.struct_passwd | None) -> None:
        """Resolve and hash the program, and ask it its version (before it starts)."""
        program = self._argv[0]
        found = shutil.which(program, path=self._env.get("PATH", os.environ.get("PATH")))
        if found is None:
            raise MissingSystemDependency(
                f"broker.command {options.command!r}: program {program!r} is not found "
                f"(not on PATH, or not an executable file); install it, or give its full "
                f"path")
        self._binary = os.path.realpath(found)
        self._binary_sha256 = sha256_file(Path(self._binary))
        if options.version_command is not None:
            argv = _as_user(render_command(options.version_command, values), account)
            self._version = _first_line(host, argv, _env_for(self._env, account),
                                        proc.dir / "version.txt")

    def _await_ready(self, options: Options, endpoint: Endpoint, proc: BrokerProcess,
                     started: float) -> str | None:
        """Poll the broker until it answers: None when it does, the reason when it exited.

        Raises BackendError when it refuses the CONNECT or stays silent past the timeout.
        """
        deadline = started + options.ready_timeout_s
        address = f"{endpoint.host}:{endpoint.port}"
        answer = "CONNACK" if endpoint.transport == Transport.MQTT_TCP else "PINGRESP"
        last = "not tried yet"
        handle = _handle(proc)
        while True:
            if (code := handle.poll()) is not None:
                hint = (" (a broker that puts itself in the background must be told to stay "
                        "in the foreground)" if code == 0 else "")
                return (f"broker command {shlex.join(self._argv)!r} exited with status "
                        f"{describe_exit(code)} before it answered on {address}, after "
                        f"{time.monotonic() - started:.1f} s{hint}; its output ends:\n"
                        f"{proc.log_tail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackendError(
                    f"broker command {shlex.join(self._argv)!r} never became ready: no "
                    f"{answer} from {address} within {options.ready_timeout_s:.1f} s (last "
                    f"try: {last}); its output ends:\n{proc.log_tail()}")
            try:
                self._probe(endpoint, min(PROBE_TIMEOUT_S, remaining))
                return None
            except ConnectRefused as exc:
                raise BackendError(f"broker {self.name} on {address}: {exc.reason}; "
                                   f"{self._clients_connect_as()}") from None
            except Unreachable as exc:
                last = exc.reason
            time.sleep(POLL_INTERVAL_S)

    # -- what a backend that configures its listener changes (named.py) ----------------

    def _config_template(self, options: Options) -> str | None:
        """The config template this deploy renders."""
        return options.config_template

    def _env_template(self, options: Options) -> dict[str, str]:
        """The environment (with placeholders) this deploy gives the broker."""
        return dict(options.env)

    def _prepare(self, directory: Path, address: str,
                 account: pwd.struct_passwd | None) -> None:
        """Write the listener's files into the run's directory before the broker starts."""

    def _endpoint(self, address: str, port: int, options: Options) -> Endpoint:
        """Where and how clients reach the broker on ``port``."""
        return Endpoint(host=address, port=port, transport=options.transport)

    def _probe(self, endpoint: Endpoint, timeout_s: float) -> None:
        """One readiness probe (raises Unreachable until the broker answers)."""
        probe_ready(self.name, endpoint, timeout_s, self._credentials(), self._protocol())

    def _credentials(self) -> ClientCredentials | None:
        """What the run's clients present (None: anonymous, no client certificate)."""
        return None

    def _protocol(self) -> MqttProtocol:
        """The MQTT version the run's clients speak."""
        return "3.1.1"

    def _clients_connect_as(self) -> str:
        """Who the run's clients are, for an error about a refused CONNECT."""
        return "the agents connect anonymously, without credentials"

    def _sys_topics_reachable(self) -> bool:
        """Whether mqttbed's $SYS sampler can connect (plain, anonymous MQTT)."""
        return True

    def _access_record(self) -> AccessRecord | None:
        """The listener this deploy configured, for the deployment record."""
        return None

    # -- while running ------------------------------------------------------------------

    def health(self) -> str | None:
        """None while the broker's process runs, else how it ended (with its output)."""
        if self._proc is None or self._proc.handle is None:
            return "broker command is not deployed"
        if self._torn_down:
            return f"broker command (pid {self._proc.pid}) was torn down"
        if self._restarts.error is not None:
            return self._restarts.error
        if self._restarts.restarting:
            return None  # stopped on purpose, and coming back (workload.reconnect)
        return self._proc.exit_reason()

    def resource_samples(self) -> list[BrokerResourceSample]:
        """The resource samples of the broker's process tree since deploy."""
        return [] if self._proc is None else self._proc.samples()

    def broker_processes(self) -> dict[str, list[int]]:
        """The broker's process tree on this machine (what ``broker.cpu_limit`` limits)."""
        return local_processes(self._proc)

    def sys_samples(self) -> list[SysSample]:
        """The numeric values the broker published on ``$SYS`` since deploy."""
        return self._sys.samples()

    def deployment(self) -> CommandDeployment:
        """What was deployed: command, config and its hash, program and its hash, version."""
        options, proc, config = self._options, self._proc, self._config
        return CommandDeployment(
            backend=self.name, version=self._version or self._sys.version(),
            binary=self._binary, binary_sha256=self._binary_sha256, config=config,
            config_sha256=None if config is None else hashlib.sha256(
                config.encode()).hexdigest(),
            port=self._port, pid=None if proc is None else proc.pid,
            exit_code=None if proc is None else proc.exit_code,
            log_tail=None if proc is None else proc.log_tail(),
            preset=None if options is None else options.preset, command=self._argv,
            command_line=shlex.join(self._argv), env=self._env,
            user=None if options is None else options.user,
            transport=Transport.MQTT_TCP if options is None else options.transport,
            ready_after_s=self._ready_after_s,
            stop_grace_s=None if options is None else options.stop_grace_s,
            sys_topics=self._sys.record(), access=self._access_record())

    def section_records(self) -> SectionRecords:
        """Nothing beyond the common figures."""
        return {}

    # -- teardown -----------------------------------------------------------------------

    def teardown(self) -> None:
        """Stop sampling, then the process group (SIGTERM, SIGKILL after the grace), keep
        the log tail, remove the directory; safe to call twice."""
        if self._torn_down:
            return
        self._torn_down = True
        self._restarts.cancel()
        self._sys.stop()
        proc = self._proc
        if proc is None:
            return
        grace = self._options.stop_grace_s if self._options is not None else 5.0
        proc.stop(timeout_s=grace)
        if proc.handle is not None:
            # The group leader gone, a child that ignored SIGTERM may still run.
            for straggler in processes_in_group(proc.handle.pid):
                straggler.kill()
        proc.remove()


def _handle(proc: BrokerProcess) -> ProcessHandle:
    assert proc.handle is not None
    return proc.handle


def _account(user: str | None) -> pwd.struct_passwd | None:
    """The account to run the broker as; None for mqttbed's own."""
    if user is None:
        return None
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise BackendError(f"broker.user {user!r}: no such user on this machine") from None
    if account.pw_uid == os.geteuid():
        return None
    if os.geteuid() != 0:
        raise BackendError(f"broker.user {user!r}: starting a broker as another user needs "
                           f"mqttbed to run as root (it runs as uid {os.geteuid()}); leave "
                           "user out to run it as mqttbed's own user")
    if shutil.which("setpriv") is None:
        raise MissingSystemDependency("broker.user needs setpriv (util-linux): "
                                      "apt-get install util-linux")
    return account


def _as_user(argv: list[str], account: pwd.struct_passwd | None) -> list[str]:
    """``argv`` run as ``account``: setpriv changes the ids and execs (the pid stays the
    broker's, so it is sampled and signalled as itself)."""
    if account is None:
        return argv
    return ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
            "--init-groups", "--", *argv]


def _env_for(env: dict[str, str], account: pwd.struct_passwd | None) -> dict[str, str]:
    """The broker's environment: the user's HOME and names (as a login would set), then
    the spec's variables."""
    if account is None:
        return env
    login = {"HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name}
    return {**login, **env}


def _first_line(host: Host, argv: list[str], env: dict[str, str], out: Path) -> str | None:
    """The first non-empty line a short command prints (its exit status is not looked at:
    some programs print their version and exit non-zero)."""
    handle = host.spawn(argv, env=env, log_path=out)
    deadline = time.monotonic() + VERSION_TIMEOUT_S
    while handle.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
    handle.stop(timeout_s=1.0)
    try:
        text = out.read_text(errors="replace")
    except OSError:
        return None
    return next((line.strip() for line in text.splitlines() if line.strip()), None)


def unavailable() -> str | None:
    """Nothing to install: each spec names its own program (checked when it deploys)."""
    return None
