"""Mosquitto, the software reference broker, deployed as a private process per run.

Each deploy writes its own config into a fresh directory, so nothing from a system-wide
``/etc/mosquitto`` (or a previous run) leaks into a measurement. The run's access (TLS,
WebSocket, a password file, MQTT 5: :mod:`.access`) is configured in that directory too,
here or on a lab host, and removed with it. The queue limits are part of the measurement:
when a subscriber's queue is full Mosquitto silently drops QoS 0 messages to it, so the
limits in force are recorded in the run's metadata.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePath, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.brokers.mosquitto import access as listener
from mqttbed.brokers.mosquitto.access import AccessRecord, ListenerFiles
from mqttbed.brokers.mosquitto.persistence import persistence_lines
from mqttbed.brokers.processes import (
    BrokerProcess,
    capture_output,
    local_processes,
    start_listening,
)
from mqttbed.brokers.remote import RemoteBrokerProcess
from mqttbed.brokers.restarts import BrokerRestarts
from mqttbed.brokers.sys_monitor import SysMonitor, SysTopicsRecord
from mqttbed.core.backends import BrokerAccess, DeploymentRecord, Fault
from mqttbed.core.broker_access import ClientCredentials, SecretUnavailable
from mqttbed.core.errors import BackendError, MissingSystemDependency, system_deps_hint
from mqttbed.core.host import Host, ProcessHandle, raise_nofile_limit, sha256_file
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import BrokerResourceSample, SysSample
from mqttbed.core.sections import SectionRecords
from mqttbed.core.ssh import SshError, SshHost

FALLBACK_BINARIES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")
INSTALL_HINT = (f"install it with {system_deps_hint('demo', 'mosquitto')}, or set the "
                "broker option `binary`")
DEPLOY_ATTEMPTS = 3
STARTUP_TIMEOUT_S = 5.0


class Options(BaseModel):
    """The broker section of a campaign spec for the ``mosquitto`` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: Literal["mosquitto"] = "mosquitto"
    binary: str | None = Field(
        default=None, description="path to mosquitto; default: found on PATH or in sbin")
    max_queued_messages: int = Field(
        default=1000, ge=0,
        description="messages queued per client beyond those in flight; past it Mosquitto "
                    "drops what arrives for that client, QoS 1 and 2 too (counted in "
                    "$SYS/broker/publish/messages/dropped); 0 = no limit")
    max_inflight_messages: int = Field(
        default=20, ge=0, description="QoS 1/2 messages in flight per client; 0 = no limit")
    max_connections: int = Field(
        default=-1, ge=-1, description="clients the listener accepts; -1 = no limit (the "
                                       "open-file limit, raised per run, still applies)")
    set_tcp_nodelay: bool = Field(
        default=True, description="disable Nagle, so small messages are not held back")
    stats_interval_s: float = Field(
        default=0.2, gt=0, description="seconds between resource samples of the broker")
    sys_interval_s: int = Field(
        default=1, ge=0, le=3600, description="seconds between the broker's $SYS updates "
                                              "(Mosquitto's sys_interval; 0 = none)")
    sys_topics: bool = Field(
        default=True, description="subscribe to $SYS/# during the run and keep the numeric "
                                  "values as a time series (one more client on the broker)")


class MosquittoLimits(BaseModel):
    """The queue and connection limits a run's Mosquitto had.

    Mosquitto drops QoS 0 messages to a subscriber whose queue is full, without telling
    anyone: a delivery figure means nothing without these limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_queued_messages: int
    max_inflight_messages: int
    set_tcp_nodelay: bool
    max_connections: int
    nofile: int | None = Field(None, description="the open-file limit it inherited")


class MosquittoDeployment(DeploymentRecord):
    """What one Mosquitto deploy was."""

    limits: MosquittoLimits
    stats_interval_s: float
    sys_topics: SysTopicsRecord | None = None
    access: AccessRecord | None = Field(None, description="how clients reached it (TLS, "
                                                          "WebSocket, user; no secret)")
    persistence: bool = Field(False, description="sessions written to a file in the run's "
                                                 "directory and read back after a restart "
                                                 "(workload.reconnect.persistent)")


class MosquittoBackend:
    """Deploys one Mosquitto process on a host and samples its resource use."""

    name = "mosquitto"

    def __init__(self) -> None:
        self._options: Options | None = None
        self._proc: BrokerProcess | RemoteBrokerProcess | None = None
        self._binary: str | None = None
        self._binary_sha256: str | None = None
        self._version: str | None = None
        self._config: str | None = None
        self._port: int | None = None
        self._torn_down = False
        self._nofile: int | None = None
        self._sys = SysMonitor()
        self._access = BrokerAccess()
        self._access_record: AccessRecord | None = None
        self._plain_port: int | None = None
        self._credentials: ClientCredentials | None = None
        self._persistence = False
        self._restarts = BrokerRestarts(self.name)
        self._argv: list[str] = []
        self._host: Host | None = None

    def keep_sessions(self, persistent: bool) -> None:
        """Keep the clients' sessions across a restart: Mosquitto's persistence on, its
        file in the run's directory (before deploy)."""
        if self._proc is not None or self._torn_down:
            raise BackendError("keep_sessions comes before deploy")
        self._persistence = persistent

    def restart_at(self, at_ns: int, down_s: float) -> None:
        """Stop Mosquitto at ``at_ns`` (SIGTERM: it saves its sessions when persistent),
        start it again ``down_s`` later with the same config and port."""
        if not isinstance(self._proc, BrokerProcess) or self._host is None \
                or self._port is None:
            raise BackendError("mosquitto: a restart mid-run needs a broker deployed on this "
                               "machine (not on a lab host)")
        options, proc, host, argv = self._options or Options(), self._proc, self._host, self._argv
        self._restarts.arm(
            proc, lambda n: host.spawn(argv, log_path=proc.dir / f"stdout-restart-{n}.log"),
            host.address, self._port, at_ns, down_s, options.stats_interval_s)

    def started(self, t_start_ns: int) -> None:
        """Nothing to arm at the start: a restart is armed by :meth:`restart_at`."""

    def faults(self) -> list[Fault]:
        """The restarts done (when each stopped, and listened again)."""
        return self._restarts.faults()

    def configure_access(self, access: BrokerAccess) -> None:
        """Take the run's listener, MQTT version and user (checked at deploy)."""
        if self._proc is not None or self._torn_down:
            raise BackendError("configure_access comes before deploy")
        self._access = access

    # -- deploy -------------------------------------------------------------------------

    def deploy(self, spec: Options | Mapping[str, Any], host: Host | SshHost) -> Endpoint:
        """Start Mosquitto on ``host`` with ``spec``'s limits; return where clients connect."""
        if isinstance(host, SshHost):
            return self.deploy_on_lab_host(spec, host)
        options = self._first_deploy(spec)
        # what a local broker inherits (a lab host keeps its own limits)
        self._nofile = raise_nofile_limit() if host.name == "local" else None
        self._binary = find_binary(options.binary)
        self._binary_sha256 = sha256_file(Path(self._binary))
        proc = BrokerProcess(self.name, host, "mqttbed-mosquitto-",
                             log_names=("stdout.log", "mosquitto.log"))
        self._proc = proc
        try:
            binary = self._binary
            self._version = _probe_version(binary, host, proc.dir)
            listener.check_access(self._access, lambda: self._websockets_here(host, proc))
            self._credentials = self._own_credentials()
            files = self._write_files(proc.dir, host.address, proc.dir, None)

            def launch(port: int) -> ProcessHandle:
                conf_path = proc.dir / "mosquitto.conf"
                self._config = self._render(options, host, port, proc.dir, files)
                conf_path.write_text(self._config)
                self._argv, self._host = [binary, "-c", str(conf_path)], host
                return host.spawn(self._argv, log_path=proc.dir / "stdout.log")

            port, handle = start_listening(
                host, f"mosquitto ({binary})", launch, attempts=DEPLOY_ATTEMPTS,
                startup_timeout_s=STARTUP_TIMEOUT_S, stop_timeout_s=2.0,
                log_tail=proc.log_tail)
            return self._serve(options, host.address, port, handle, files)
        except BaseException:
            # A failed deploy must leave nothing behind: no process, no directory.
            self.teardown()
            raise

    def deploy_on_lab_host(self, spec: Options | Mapping[str, Any], host: SshHost) -> Endpoint:
        """Start Mosquitto on a lab host: config and access files copied there, sampled there."""
        options = self._first_deploy(spec)
        self._binary = options.binary or _find_remote_binary(host)
        self._binary_sha256 = host.run(["sha256sum", self._binary],
                                       "hash mosquitto").split()[0]
        self._version = _remote_version(host, self._binary)
        proc = RemoteBrokerProcess(self.name, host, "mqttbed-mosquitto-",
                                   log_names=("stdout.log", "mosquitto.log"))
        self._proc = proc
        try:
            binary = self._binary
            listener.check_access(self._access, lambda: self._websockets_there(host, proc))
            self._credentials = self._own_credentials()
            remote_dir = PurePosixPath(str(proc.remote_dir))
            files = self._write_files(proc.dir, host.address, remote_dir, host)

            def launch(port: int) -> ProcessHandle:
                self._config = self._render(options, host, port, remote_dir, files)
                conf = proc.put_text("mosquitto.conf", self._config)
                return host.spawn([binary, "-c", str(conf)], log_path=proc.dir / "stdout.log")

            port, handle = start_listening(
                host, f"mosquitto ({binary}) on {host.name}", launch,
                attempts=DEPLOY_ATTEMPTS, startup_timeout_s=STARTUP_TIMEOUT_S,
                stop_timeout_s=2.0, log_tail=proc.log_tail, check_listener=False)
            return self._serve(options, host.address, port, handle, files)
        except BaseException:
            self.teardown()
            raise

    def _first_deploy(self, spec: Options | Mapping[str, Any]) -> Options:
        """The validated options of this backend's one deploy."""
        if self._proc is not None or self._torn_down:
            raise BackendError("this MosquittoBackend was already deployed; create a new one "
                               "per run (mqttbed.core.backends.create_backend)")
        options = spec if isinstance(spec, Options) else Options.model_validate(spec)
        self._options = options
        return options

    def _own_credentials(self) -> ClientCredentials | None:
        """What mqttbed's own clients (deploy probe, ``$SYS`` sampler) present: what the
        agents present, the client certificate's files read now (before the broker starts:
        a missing key fails the deploy naming its path)."""
        try:
            return self._access.client_credentials()
        except SecretUnavailable as exc:
            raise BackendError(f"mosquitto: {exc}") from None

    def _write_files(self, local_dir: Path, address: str, broker_dir: PurePath,
                     remote: SshHost | None) -> ListenerFiles:
        """Write the listener's TLS files and password file (made for this deploy) into
        the broker's private directory: here, or here and then copied to ``remote``."""
        access = self._access
        written: dict[str, PurePath] = {}

        def private(name: str, text: str) -> None:
            listener.write_private(local_dir / name, text)
            if remote is not None:
                # (put keeps the 0600 mode; the directory there is 0700 too)
                remote.put(local_dir / name, str(broker_dir / name))
            written[name] = broker_dir / name

        ca_pem = None
        if access.transport.tls:
            tls = listener.tls_material(access, address)
            ca_pem = tls.ca_pem
            private("ca.crt", tls.trusted_pem)
            private("server.crt", tls.cert_pem)
            private("server.key", tls.key_pem.get_secret_value())
        if access.auth is not None and access.password is not None:
            private("passwords", listener.password_line(access.auth.username,
                                                        access.password) + "\n")
        return ListenerFiles(
            ca_file=written.get("ca.crt"), cert_file=written.get("server.crt"),
            key_file=written.get("server.key"), password_file=written.get("passwords"),
            ca_pem=ca_pem,
            require_certificate=access.tls is not None and access.tls.cert_file is not None)

    def _render(self, options: Options, host: Host | SshHost, port: int, broker_dir: PurePath,
                files: ListenerFiles) -> str:
        """The config of one start attempt (a WebSocket listener gets a plain one beside)."""
        self._plain_port = None
        if self._access.transport.websocket:
            self._plain_port = host.free_port()
            while self._plain_port == port:
                self._plain_port = host.free_port()
        return render_config(options, host.address, port, Path(str(broker_dir)),
                             access=self._access, files=files, plain_port=self._plain_port,
                             persistence=self._persistence)

    def _serve(self, options: Options, address: str, port: int, handle: ProcessHandle,
               files: ListenerFiles) -> Endpoint:
        """The broker listens: sample it, check it answers as the run asks, start $SYS."""
        assert self._proc is not None
        self._port = port
        self._proc.watch(handle, options.stats_interval_s)
        access = self._access
        self._access_record = listener.record(access, address, files, self._plain_port)
        endpoint = Endpoint(host=address, port=port, transport=Transport.MQTT_TCP,
                            tls=listener.endpoint_tls(access, files),
                            websocket_path=listener.websocket_path(access))
        listener.probe(endpoint, access.protocol, self._credentials)
        if options.sys_topics and options.sys_interval_s > 0:
            # the sampler reaches a WebSocket broker at its plain listener (no TLS there;
            # the password file is the broker's, so it logs in there too)
            own = (endpoint if self._plain_port is None
                   else Endpoint(host=address, port=self._plain_port))
            self._sys.start(own, credentials=self._credentials, protocol=access.protocol)
        return endpoint

    def _websockets_here(self, host: Host, proc: BrokerProcess) -> str | None:
        """Why the local binary cannot serve WebSocket, or None (it parses a probe config)."""
        assert self._binary is not None
        conf = proc.dir / "websockets-probe.conf"
        conf.write_text(listener.WEBSOCKETS_PROBE_CONFIG)
        printed = capture_output(host, [self._binary, "-c", str(conf)],
                                 proc.dir / "websockets-probe.txt", STARTUP_TIMEOUT_S)
        return listener.websockets_verdict(printed, self._binary, self._version or "unknown")

    def _websockets_there(self, host: SshHost, proc: RemoteBrokerProcess) -> str | None:
        """Why the lab host's binary cannot serve WebSocket, or None."""
        assert self._binary is not None
        conf = proc.put_text("websockets-probe.conf", listener.WEBSOCKETS_PROBE_CONFIG)
        printed = host.run(["sh", "-c", '"$0" -c "$1" 2>&1; true', self._binary, str(conf)],
                           "probe mosquitto for WebSocket support")
        return listener.websockets_verdict(printed, f"{self._binary} on {host.name}",
                                           self._version or "unknown")

    # -- while running ------------------------------------------------------------------

    def health(self) -> str | None:
        """Return None while Mosquitto runs, else why it is unusable (with its last log lines)."""
        if self._proc is None or self._proc.handle is None:
            return "broker mosquitto is not deployed"
        if self._torn_down:
            return f"broker mosquitto (pid {self._proc.pid}) was torn down"
        if self._restarts.error is not None:
            return self._restarts.error
        if self._restarts.restarting:
            return None  # stopped on purpose, and coming back (workload.reconnect)
        return self._proc.exit_reason()

    def resource_samples(self) -> list[BrokerResourceSample]:
        """Return the resource samples of the broker's process tree taken since deploy."""
        return [] if self._proc is None else self._proc.samples()

    def broker_processes(self) -> dict[str, list[int]]:
        """The broker's process tree on this machine (what ``broker.cpu_limit`` limits)."""
        return local_processes(self._proc)

    def deployment(self) -> MosquittoDeployment:
        """Return what was deployed: version, binary and config with hashes, queue limits."""
        options = self._options or Options()
        config = self._config or ""
        proc = self._proc
        return MosquittoDeployment(
            backend=self.name, version=self._version, binary=self._binary,
            binary_sha256=self._binary_sha256, config=config,
            config_sha256=hashlib.sha256(config.encode()).hexdigest() if config else None,
            limits=MosquittoLimits(
                max_queued_messages=options.max_queued_messages,
                max_inflight_messages=options.max_inflight_messages,
                set_tcp_nodelay=options.set_tcp_nodelay,
                max_connections=options.max_connections, nofile=self._nofile),
            stats_interval_s=options.stats_interval_s, port=self._port,
            pid=None if proc is None else proc.pid,
            exit_code=None if proc is None else proc.exit_code,
            log_tail=None if proc is None else proc.log_tail(),
            sys_topics=self._sys.record(), access=self._access_record,
            persistence=self._persistence)

    def sys_samples(self) -> list[SysSample]:
        """The numeric ``$SYS`` values Mosquitto published since deploy."""
        return self._sys.samples()

    # -- teardown -----------------------------------------------------------------------

    def section_records(self) -> SectionRecords:
        """Nothing beyond the common figures."""
        return {}

    def teardown(self) -> None:
        """Stop sampling and the broker, keep its log tail, remove its directory; idempotent."""
        if self._torn_down:
            return
        self._torn_down = True
        self._restarts.cancel()
        self._sys.stop()   # before the broker goes: its last values, not a lost connection
        if self._proc is not None:
            self._proc.stop(timeout_s=5.0)
            self._proc.remove()


def unavailable() -> str | None:
    """Why Mosquitto cannot be deployed here with default options, or None if it can."""
    try:
        find_binary(None)
    except MissingSystemDependency as exc:
        return str(exc)
    return None


def find_binary(configured: str | None) -> str:
    """Return the mosquitto executable to run, or say how to install one."""
    if configured is not None:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured
        raise MissingSystemDependency(
            f"broker option binary={configured!r} is not an executable file; "
            f"point it at mosquitto, or {INSTALL_HINT}")
    for candidate in (shutil.which("mosquitto"), *FALLBACK_BINARIES):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise MissingSystemDependency(
        f"mosquitto not found on PATH nor in {', '.join(FALLBACK_BINARIES)}; {INSTALL_HINT}")


def _find_remote_binary(host: SshHost) -> str:
    """mosquitto on a lab host: on its PATH or in sbin."""
    for candidate in ("mosquitto", *FALLBACK_BINARIES):
        try:
            return host.run(["sh", "-c", 'command -v "$0"', candidate], "find mosquitto")
        except SshError:
            continue
    raise MissingSystemDependency(f"mosquitto not found on {host.name} (PATH, "
                                  f"{', '.join(FALLBACK_BINARIES)}): {INSTALL_HINT} there")


def _remote_version(host: SshHost, binary: str) -> str:
    """``mosquitto -h``'s version on a lab host (it exits with 3: only the text counts)."""
    printed = host.run(["sh", "-c", '"$0" -h 2>&1; true', binary], "read mosquitto's version")
    match = re.search(r"mosquitto version (\S+)", printed)
    return match.group(1) if match else "unknown"


def _probe_version(binary: str, host: Host, workdir: Path) -> str:
    """Return the version ``mosquitto -h`` prints ("2.0.11"), or "unknown"."""
    printed = capture_output(host, [binary, "-h"], workdir / "version.txt", STARTUP_TIMEOUT_S)
    match = re.search(r"mosquitto version (\S+)", next(iter(printed.splitlines()), ""))
    return match.group(1) if match else "unknown"


def render_config(options: Options, address: str, port: int, workdir: Path, *,
                  access: BrokerAccess | None = None, files: ListenerFiles | None = None,
                  plain_port: int | None = None, persistence: bool = False) -> str:
    """Return the full config text for one deploy (recorded verbatim in the metadata).

    ``access`` and ``files`` configure the listener (TLS, WebSocket, password file: see
    :mod:`.access`); it holds paths, never a secret. ``persistence`` keeps the sessions in
    a file of ``workdir`` across a restart (:mod:`.restart`)."""
    access, files = access or BrokerAccess(), files or ListenerFiles()
    lines = [
        "# generated by mqttbed for one run; recorded in the run's metadata",
        *listener.listener_lines(access, port, address, files, options.max_connections),
        *listener.security_lines(files),
        *persistence_lines(workdir if persistence else None),
        f"max_queued_messages {options.max_queued_messages}",
        f"max_inflight_messages {options.max_inflight_messages}",
        f"set_tcp_nodelay {'true' if options.set_tcp_nodelay else 'false'}",
        f"log_dest file {workdir / 'mosquitto.log'}",
        "log_type error",
        "log_type warning",
        "log_type notice",
        f"sys_interval {options.sys_interval_s}",
        *listener.plain_listener_lines(plain_port, address),
    ]
    if os.geteuid() == 0:
        # Started as root, Mosquitto drops to user `mosquitto`, which cannot write the
        # log into our private (0700, root-owned) directory; staying root keeps the log.
        lines.insert(1, "user root")
    return "\n".join(lines) + "\n"
