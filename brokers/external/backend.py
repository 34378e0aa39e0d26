"""A broker that is already running, at a URL: mqttbed measures it, never starts or stops it.

Deploy checks, before the run starts, that the broker answers its protocol (a CONNECT
gets an accepting CONNACK over TCP, a PINGREQ its PINGRESP over UDP) and fails within
seconds naming the address and the OS error, or the CONNACK's refusal. While the run
measures, ``health()`` relies on the ``$SYS`` sampler's session while it is up, else
checks that a TCP connection still opens (a PINGREQ over UDP).
Optionally the broker's process tree is sampled for CPU, memory and I/O: on this machine
(:meth:`ExternalBackend.deploy`), or on the lab host ``broker.host`` names
(:meth:`ExternalBackend.deploy_on_lab_host`: looked up and sampled there over SSH, the
reachability check still from this machine, where the agents' traffic comes from). Its
``$SYS`` topics are read. Teardown stops mqttbed's own samplers only.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from mqttbed.brokers.external.options import Options, ProcessToSample
from mqttbed.brokers.external.process import (
    SampledProcess,
    describe_process,
    describe_remote_process,
    find_process,
    find_remote_process,
    gone,
)
from mqttbed.brokers.reachability import Liveness, Unreachable, probe
from mqttbed.brokers.remote_sampling import RemoteSampler
from mqttbed.brokers.sys_monitor import SysMonitor, SysTopicsRecord
from mqttbed.core.backends import DeploymentRecord
from mqttbed.core.errors import BackendError
from mqttbed.core.host import Host, describe_exit
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import BrokerResourceSample, SysSample
from mqttbed.core.sections import SectionRecords
from mqttbed.core.ssh import SshError, SshHost
from mqttbed.instruments.resources import ProcessTreeSampler


class ExternalDeployment(DeploymentRecord):
    """What a run measured against a broker it did not start."""

    url: str
    transport: Transport
    sampled_process: SampledProcess | None = None
    sys_topics: SysTopicsRecord | None = None


class ExternalBackend:
    """A running broker at a URL (see the module docstring)."""

    name = "external"

    def __init__(self) -> None:
        self._options: Options | None = None
        self._endpoint: Endpoint | None = None
        self._liveness: Liveness | None = None
        self._process: psutil.Process | None = None
        self._sampled: SampledProcess | None = None
        self._sampler: ProcessTreeSampler | None = None
        self._remote: RemoteSampler | None = None   # sampling on a lab host instead
        self._remote_dir: Path | None = None        # here: what the remote sampler streams
        self._samples: list[BrokerResourceSample] | None = None   # kept once stopped
        self._sys = SysMonitor()
        self._torn_down = False

    def deploy(self, spec: Options | Mapping[str, Any], host: Host) -> Endpoint:
        """Check the broker at ``spec.url`` answers; start the asked-for samplers.

        ``host`` is not used: the broker runs wherever its URL says.
        """
        return self._deploy(spec, self._watch)

    def deploy_on_lab_host(self, spec: Options | Mapping[str, Any], host: SshHost) -> Endpoint:
        """Check the broker at ``spec.url`` answers from here; sample its process on ``host``.

        ``spec.sample`` names the process on the lab host (a pid there, or a program
        name); it is only read there, over SSH. The broker is still reached at its URL.
        """
        return self._deploy(spec, lambda sample: self._watch_on(host, sample))

    def _deploy(self, spec: Options | Mapping[str, Any],
                watch: Callable[[ProcessToSample], None]) -> Endpoint:
        """The one deploy of this backend: probe the URL, then ``watch`` the process."""
        if self._options is not None or self._torn_down:
            raise BackendError("this ExternalBackend was already deployed; create a new one "
                               "per run (mqttbed.core.backends.create_backend)")
        options = spec if isinstance(spec, Options) else Options.model_validate(spec)
        self._options = options
        endpoint = options.broker_url().endpoint()
        try:
            probe(endpoint, options.connect_timeout_s)
        except Unreachable as exc:
            raise BackendError(f"external broker {options.url}: {exc.reason}") from None
        self._endpoint = endpoint
        self._liveness = Liveness(endpoint)
        try:
            if options.sample is not None:
                watch(options.sample)
            if options.sys_topics:
                self._sys.start(endpoint)
        except BaseException:
            self.teardown()
            raise
        return endpoint

    def _watch(self, sample: ProcessToSample) -> None:
        """Sample the broker's process tree here (read from /proc; it is never signalled)."""
        process = find_process(sample.pid, sample.process_name)
        self._process = process
        self._sampled = describe_process(process, sample.interval_s)
        sampler = ProcessTreeSampler(process.pid, sample.interval_s)
        try:
            sampler.start()
        except psutil.Error as exc:
            raise BackendError(f"cannot sample the external broker's process "
                               f"{process.pid}: {exc}") from None
        self._sampler = sampler

    def _watch_on(self, host: SshHost, sample: ProcessToSample) -> None:
        """Sample the broker's process tree on lab host ``host`` (read from /proc there)."""
        process = find_remote_process(host, sample.pid, sample.process_name)
        self._sampled = describe_remote_process(host, process, sample.interval_s)
        self._remote_dir = Path(tempfile.mkdtemp(prefix="mqttbed-external-"))
        self._remote = RemoteSampler(host, self._remote_dir / "samples.jsonl")
        try:
            self._remote.start_tree(process, sample.interval_s)
        except SshError as exc:
            raise BackendError(f"cannot sample the external broker's process {process.pid} "
                               f"on lab host {host.name}: {exc}") from None

    # -- while running ------------------------------------------------------------------

    def health(self) -> str | None:
        """None while the broker still accepts a connection, else why it does not."""
        if self._options is None or self._liveness is None:
            return "broker external is not deployed"
        if self._torn_down:
            return f"external broker {self._options.url}: its run was torn down"
        if self._process is not None and gone(self._process):
            return (f"external broker {self._options.url}: its process "
                    f"{self._process.pid} ({self._sampled.name if self._sampled else '?'}) "
                    "has ended")
        if self._remote is not None and (code := self._remote.exit_code()) is not None:
            return self._remote_ended(code)
        if self._sys.connected():
            # The $SYS session is a live connection already: no new one to open (each
            # would be a line or two in the broker's log, twice a second).
            return None
        if (reason := self._liveness.check()) is not None:
            return f"external broker {self._options.url}: {reason}"
        return None

    def _remote_ended(self, code: int) -> str:
        """Why the run cannot go on, once the sampler on the lab host ended by itself."""
        assert self._options is not None and self._sampled is not None
        where = (f"external broker {self._options.url}: its process {self._sampled.pid} "
                 f"({self._sampled.name}) on {self._sampled.host}")
        if code == 0:   # the sampler ends by itself only once its process ended
            return f"{where} has ended"
        tail = self._remote.output_tail() if self._remote is not None else ""
        return f"{where}: its sampler there exited with {describe_exit(code)}: {tail}"

    def resource_samples(self) -> list[BrokerResourceSample]:
        """The resource samples of the broker's process tree; none unless ``sample`` was set."""
        if self._samples is not None:
            return list(self._samples)
        if self._remote is not None:
            return self._remote.samples()
        return [] if self._sampler is None else self._sampler.samples

    def sys_samples(self) -> list[SysSample]:
        """The numeric values the broker published on ``$SYS`` since deploy."""
        return self._sys.samples()

    def deployment(self) -> ExternalDeployment:
        """What was measured: the URL, the sampled process and its binary, ``$SYS``."""
        options = self._options
        sampled = self._sampled
        return ExternalDeployment(
            backend=self.name, managed=False, version=self._sys.version(),
            binary=None if sampled is None else sampled.exe,
            binary_sha256=None if sampled is None else sampled.exe_sha256,
            port=None if self._endpoint is None else self._endpoint.port,
            pid=None if sampled is None else sampled.pid,
            url="" if options is None else options.url,
            transport=(Transport.MQTT_TCP if self._endpoint is None
                       else self._endpoint.transport),
            sampled_process=sampled, sys_topics=self._sys.record())

    def section_records(self) -> SectionRecords:
        """Nothing beyond the common figures."""
        return {}

    def teardown(self) -> None:
        """Stop mqttbed's samplers; the broker itself is left exactly as it was."""
        if self._torn_down:
            return
        self._torn_down = True
        self._sys.stop()
        if self._sampler is not None:
            self._samples = self._sampler.stop()
        if self._remote is not None:
            # only the sampler's own process group there is signalled, never the broker
            self._samples = self._remote.stop()
        if self._remote_dir is not None:
            shutil.rmtree(self._remote_dir, ignore_errors=True)


def unavailable() -> str | None:
    """Nothing to install: the broker is somebody else's."""
    return None
