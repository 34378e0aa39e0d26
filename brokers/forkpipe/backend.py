"""The fork/pipe broker deployed as a private process tree per run (``backend: forkpipe``).

mqttbed-forkpipe is the C broker of the fork/pipe seed study, rebuilt faithfully: the
listener forks one process per client, each client forks one process per subscription,
and they meet through named pipes ``<base>/<client pid>/<encoded topic filter>``. A
PUBLISH is written by the publisher's process into every matching pipe; the subscription
process reads its pipe with ``select()`` and a timeout, forwards to its client, and stops
when its pipe is deleted (UNSUBSCRIBE deletes the pipe, DISCONNECT the client's directory).

Choices where the seed was silent or could not do something:

- Topics with ``/`` work: a filter is percent-encoded into one file name (``a/+/c`` is the
  pipe ``a%2F%2B%2Fc``). A filter whose name would exceed 255 bytes gets SUBACK 0x80.
- Wildcards ``+`` and ``#`` work, by MQTT 3.1.1 rules ($-topics are not matched by a
  leading wildcard). A PUBLISH scans every client directory and matches each pipe's
  decoded filter against its topic; a client whose filters overlap gets one copy per
  matching subscription.
- QoS: every subscription is granted QoS 0. A QoS 1 PUBLISH is acknowledged (PUBACK), a
  QoS 2 one completes its flow (PUBREC, PUBREL, PUBCOMP); subscribers get it at QoS 0.
- Retain and will: accepted and validated, never stored or published; subscribers get
  every message with retain 0. Clean session 0 keeps nothing after the connection.
- A full pipe makes the publisher wait (back-pressure) instead of dropping; a client that
  reads nothing for ``send_timeout_ms`` is disconnected, which releases its publishers.
- A malformed packet closes that client's connection only; it is logged.

Measurement: the sampler reads the broker's whole process tree, so every forked client
and subscription process counts in CPU %, RSS and I/O bytes (the sampler's module,
:mod:`mqttbed.instruments.resources`, explains why it keeps nothing of ended processes:
their parents hold their I/O once they reap them). The bytes in and out are socket bytes
only: every process adds what it reads from and writes to client sockets into counters
shared through a file mapping (``--counters-file``, src/counters.h), which the sampler
reads at each sample. The per-process syscall counters (rchar/wchar) would also count
the pipe traffic (each message written into a pipe and read out again before it reaches
a socket), which read as about twice Mosquitto's kB/s for the same messages: the pipes
cost CPU, which is measured, but they are not network traffic.

The binary is built from ``src/`` with make on first use (see :mod:`.build`); it is built
on the controller machine, so this backend deploys to the local host.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field

from mqttbed.brokers.forkpipe.build import (
    Variant,
    build_dir,
    compiler_version,
    ensure_built,
    is_stale,
    missing_build_tool,
)
from mqttbed.brokers.forkpipe.reports import LOG_NAME, BrokerReports
from mqttbed.brokers.processes import (
    BrokerProcess,
    capture_output,
    local_processes,
    processes_in_group,
    start_listening,
)
from mqttbed.core.backends import DeploymentRecord
from mqttbed.core.errors import BackendError, MissingSystemDependency
from mqttbed.core.host import Host, ProcessHandle, sha256_file
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.sections import SectionRecords

DEPLOY_ATTEMPTS = 3
STARTUP_TIMEOUT_S = 5.0
# The listener gives its clients 5 s to stop before it kills them; wait a little longer.
STOP_TIMEOUT_S = 8.0
# Clients that disconnected as the run ended are gone within a select timeout or two;
# teardown waits for them (see _wait_for_clients_to_leave), but not for clients that stay.
SETTLE_TIMEOUT_S = 10.0
SETTLE_STALL_S = 1.0
MQTT_MAX_PACKET = 5 + 268_435_455
# Socket bytes in and out summed over every process of the broker (--counters-file: two
# native-endian uint64 in a file every process maps shared; see src/counters.h).
COUNTERS_FILE = "socket-bytes"
SOCKET_BYTES = struct.Struct("=QQ")


class Options(BaseModel):
    """The broker section of a campaign spec for the ``forkpipe`` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: Literal["forkpipe"] = "forkpipe"
    binary: str | None = Field(
        default=None, description="a prebuilt mqttbed-forkpipe; default: built from src/")
    sanitizers: bool = Field(
        default=False, description="run the AddressSanitizer + UBSan build (for tests); "
        "with `binary`, say that it is such a build, so its reports are collected")
    select_timeout_ms: int = Field(
        default=100, ge=1, le=60_000,
        description="how often a subscription process checks that its pipe still exists")
    send_timeout_ms: int = Field(
        default=10_000, ge=1, le=3_600_000,
        description="a client that reads nothing this long is disconnected")
    connect_timeout_ms: int = Field(
        default=10_000, ge=1, le=3_600_000, description="time allowed to send CONNECT")
    max_packet_bytes: int = Field(
        default=MQTT_MAX_PACKET, ge=64, le=MQTT_MAX_PACKET,
        description="larger packets close the connection")
    verbose: bool = Field(default=False, description="log every connect and disconnect")
    stats_interval_s: float = Field(
        default=0.2, gt=0, description="seconds between resource samples of the broker")


class ForkPipeBuild(BaseModel):
    """Which build of the broker ran."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    variant: Variant
    compiler: str | None = Field(None, description="known only for a binary built here, "
                                                   "not a configured one")


class ForkPipeLeftovers(BaseModel):
    """What the broker left behind after teardown: both must be 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    processes: int = Field(description="processes of its group still alive (then killed)")
    pipes: int = Field(description="named pipes still in its state directory")


class ForkPipeDeployment(DeploymentRecord):
    """What one fork/pipe broker deploy was; ``config`` is its command line (its whole
    configuration)."""

    build: ForkPipeBuild
    options: Options
    stats_interval_s: float
    process_failure: str | None = Field(None, description="the first fork/pipe the broker "
                                                          "could not create, as it logged it")
    sanitizer_reports: list[str] = Field(default_factory=list)
    leftovers: ForkPipeLeftovers | None = Field(None, description="after teardown")
    settled_s: float | None = Field(
        None, description="how long teardown waited for the last client processes to end "
                          f"before the final sample; None: still there after "
                          f"{SETTLE_TIMEOUT_S:g} s")


class ForkPipeBackend:
    """Deploys one mqttbed-forkpipe process tree on a host and samples its resource use."""

    name = "forkpipe"

    def __init__(self) -> None:
        self._options: Options | None = None
        self._proc: BrokerProcess | None = None
        self._reports: BrokerReports | None = None
        self._binary: str | None = None
        self._binary_sha256: str | None = None
        self._version: str | None = None
        self._compiler: str | None = None
        self._argv: list[str] = []
        self._port: int | None = None
        # Read from the broker's directory at teardown, before it is removed.
        self._process_failure: str | None = None
        self._sanitizer_reports: list[str] = []
        self._leftovers: ForkPipeLeftovers | None = None
        self._settled_s: float | None = None
        self._torn_down = False

    @property
    def state_dir(self) -> Path | None:
        """The broker's ``--base-dir``: one directory per client, one pipe per subscription."""
        return None if self._proc is None else self._proc.dir / "state"

    # -- deploy -------------------------------------------------------------------------

    def deploy(self, spec: Options | Mapping[str, Any], host: Host) -> Endpoint:
        """Build if needed, start the broker on ``host``; return where clients connect."""
        if self._proc is not None or self._torn_down:
            raise BackendError("this ForkPipeBackend was already deployed; create a new one "
                               "per run (mqttbed.core.backends.create_backend)")
        options = spec if isinstance(spec, Options) else Options.model_validate(spec)
        self._options = options
        self._binary = str(_resolve_binary(options))
        self._compiler = compiler_version() if options.binary is None else None
        self._binary_sha256 = sha256_file(Path(self._binary))
        self._proc = BrokerProcess(self.name, host, "mqttbed-forkpipe-", log_names=(LOG_NAME,))
        self._reports = BrokerReports(self._proc.dir, options.sanitizers)
        try:
            self._version = _probe_version(self._binary, host, self._proc.dir)
            port, handle = self._start(options, host, self._proc, self._reports)
            self._port = port
            counters = self._proc.dir / COUNTERS_FILE
            self._proc.watch(handle, options.stats_interval_s,
                             io_counters=lambda: read_socket_bytes(counters))
        except BaseException:
            # A failed deploy must leave nothing behind: no process, no pipe, no directory.
            self.teardown()
            raise
        return Endpoint(host=host.address, port=port, transport=Transport.MQTT_TCP)

    def _start(self, options: Options, host: Host, proc: BrokerProcess,
               reports: BrokerReports) -> tuple[int, ProcessHandle]:
        """Start the broker on a free port."""
        assert self._binary is not None
        binary = self._binary

        def launch(port: int) -> ProcessHandle:
            self._argv = _command(binary, options, host.address, port, proc.dir)
            return host.spawn(self._argv, env=reports.sanitizer_env(),
                              log_path=reports.log_path)

        return start_listening(host, f"mqttbed-forkpipe ({binary})", launch,
                               attempts=DEPLOY_ATTEMPTS, startup_timeout_s=STARTUP_TIMEOUT_S,
                               stop_timeout_s=STOP_TIMEOUT_S, log_tail=proc.log_tail)

    # -- while running ------------------------------------------------------------------

    def health(self) -> str | None:
        """Return None while the broker serves, else why not (its exit, a refused fork ...)."""
        if self._proc is None or self._proc.handle is None:
            return "broker forkpipe is not deployed"
        if self._torn_down:
            return f"broker forkpipe (pid {self._proc.pid}) was torn down"
        assert self._reports is not None
        if (exited := self._proc.exit_reason()) is not None:
            return exited
        if (failure := self._reports.process_failure()) is not None:
            return f"broker forkpipe could not create a process: {failure}"
        if reports := self._reports.sanitizer_reports():
            return f"broker forkpipe: sanitizer report:\n{reports[0][:2000]}"
        return None

    def resource_samples(self) -> list[BrokerResourceSample]:
        """Return the resource samples of the broker's process tree taken since deploy."""
        return [] if self._proc is None else self._proc.samples()

    def broker_processes(self) -> dict[str, list[int]]:
        """The broker's process tree on this machine (what ``broker.cpu_limit`` limits)."""
        return local_processes(self._proc)

    def deployment(self) -> ForkPipeDeployment:
        """Return what was deployed: version, binary and its hash, command line, options."""
        options = self._options or Options()
        config = " ".join(self._argv)
        # While it runs, ask its log; after teardown, what teardown read from it.
        live = None if self._torn_down else self._reports
        proc = self._proc
        return ForkPipeDeployment(
            backend=self.name, version=self._version, binary=self._binary,
            binary_sha256=self._binary_sha256,
            build=ForkPipeBuild(variant=_variant(options), compiler=self._compiler),
            config=config,
            config_sha256=hashlib.sha256(config.encode()).hexdigest() if config else None,
            options=options, stats_interval_s=options.stats_interval_s, port=self._port,
            pid=None if proc is None else proc.pid,
            exit_code=None if proc is None else proc.exit_code,
            process_failure=self._process_failure if live is None
            else live.process_failure(),
            sanitizer_reports=list(self._sanitizer_reports) if live is None
            else live.sanitizer_reports(),
            leftovers=self._leftovers, settled_s=self._settled_s,
            log_tail=None if proc is None else proc.log_tail())

    # -- teardown -----------------------------------------------------------------------

    def section_records(self) -> SectionRecords:
        """Nothing beyond the common figures."""
        return {}

    def teardown(self) -> None:
        """Stop sampling and the broker, record what it left, remove its directory; idempotent."""
        if self._torn_down:
            return
        self._torn_down = True
        if self._proc is None:
            return
        if self._proc.handle is not None:
            self._settled_s = self._wait_for_clients_to_leave(self._proc.handle.pid)
        self._proc.stop(timeout_s=STOP_TIMEOUT_S)
        if self._proc.handle is not None:
            self._leftovers = self._collect_leftovers(self._proc.handle.pid)
        if self._reports is not None:
            self._process_failure = self._reports.process_failure()
            self._sanitizer_reports = self._reports.sanitizer_reports()
        self._proc.remove()

    def _wait_for_clients_to_leave(self, listener_pid: int) -> float | None:
        """Wait until the listener is alone; return how long that took, None if it never was.

        The final sample must read a tree at rest. Clients that disconnect as the run ends
        take their processes down one by one; a sample taken meanwhile reads some of
        them before and some after their parent reaped them (and so absorbed their I/O
        counters), and misses or repeats bytes. Once only the listener is left, its own
        counters hold every byte of every process that ever served a client. Clients
        still connected (a failed run) stop the wait once their number stops falling.
        """
        started = last_change = time.monotonic()
        last_count = -1
        while True:
            try:
                count = len(psutil.Process(listener_pid).children())
            except psutil.NoSuchProcess:
                return None
            now = time.monotonic()
            if count == 0:
                return now - started
            if count != last_count:
                last_count, last_change = count, now
            if now - last_change > SETTLE_STALL_S or now - started > SETTLE_TIMEOUT_S:
                return None
            time.sleep(0.02)

    def _collect_leftovers(self, group: int) -> ForkPipeLeftovers:
        """Count (and kill) processes of the broker's group and pipes still present."""
        stray = processes_in_group(group)
        for proc in stray:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        pipes = 0
        if self.state_dir is not None and self.state_dir.exists():
            pipes = sum(1 for path in self.state_dir.rglob("*")
                        if stat.S_ISFIFO(path.lstat().st_mode))
        return ForkPipeLeftovers(processes=len(stray), pipes=pipes)


def read_socket_bytes(path: Path) -> tuple[int, int]:
    """The broker's socket bytes (in, out) over all its processes; (0, 0) before it starts."""
    try:
        data = path.read_bytes()
    except OSError:
        return 0, 0
    if len(data) < SOCKET_BYTES.size:
        return 0, 0
    bytes_in, bytes_out = SOCKET_BYTES.unpack_from(data)
    return bytes_in, bytes_out


def unavailable() -> str | None:
    """Why the default (release) broker cannot be deployed here, or None if it can."""
    if not is_stale(build_dir() / Variant.RELEASE.binary_name):
        return None
    return missing_build_tool()


def _variant(options: Options) -> Variant:
    return Variant.SANITIZED if options.sanitizers else Variant.RELEASE


def _resolve_binary(options: Options) -> Path:
    """Return the broker executable: the configured one, or an up-to-date build."""
    if options.binary is None:
        return ensure_built(_variant(options))
    path = Path(options.binary)
    if path.is_file() and os.access(path, os.X_OK):
        return path
    raise MissingSystemDependency(
        f"broker option binary={options.binary!r} is not an executable file; point it at "
        "mqttbed-forkpipe, or leave it unset to build one with `make -C brokers/forkpipe`")


def _command(binary: str, options: Options, address: str, port: int, workdir: Path) -> list[str]:
    """Return the broker's command line for one deploy (recorded in the run's metadata)."""
    argv = [binary, "--port", str(port), "--bind", address,
            "--base-dir", str(workdir / "state"),
            "--select-timeout-ms", str(options.select_timeout_ms),
            "--send-timeout-ms", str(options.send_timeout_ms),
            "--connect-timeout-ms", str(options.connect_timeout_ms),
            "--max-packet-bytes", str(options.max_packet_bytes),
            "--counters-file", str(workdir / COUNTERS_FILE)]
    if options.verbose:
        argv.append("--verbose")
    return argv


def _probe_version(binary: str, host: Host, workdir: Path) -> str:
    """Return the version ``mqttbed-forkpipe --version`` prints ("0.1.0"), or "unknown"."""
    words = capture_output(host, [binary, "--version"], workdir / "version.txt",
                           STARTUP_TIMEOUT_S).split()
    return words[1] if len(words) > 1 and words[0] == "mqttbed-forkpipe" else "unknown"
