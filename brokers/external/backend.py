"""A broker that is already running, at a URL: mqttbed measures it, never starts or stops it.

Deploy checks, before the run starts, that the broker answers its protocol as the run
speaks it (a CONNECT in the run's MQTT version, with its user name and password, over the
URL's TLS and WebSocket, gets an accepting CONNACK; a PINGREQ its PINGRESP over UDP) and
fails within seconds naming the address and the OS error, OpenSSL's reason, the HTTP
status of a refused upgrade, or the CONNACK's refusal. The run's ``broker.tls`` and
``broker.auth`` come through :meth:`ExternalBackend.configure_access`; ``broker.tls``'s CA
file is read then, and its text travels in the endpoint to the agents. While the run
measures, ``health()`` relies on the ``$SYS`` sampler's session while it is up, else
checks that a connection still opens through the URL's layers (a PINGREQ over UDP).
Optionally the broker's process tree is sampled for CPU, memory and I/O: on this machine
(:meth:`ExternalBackend.deploy`), or on the lab host ``broker.host`` names
(:meth:`ExternalBackend.deploy_on_lab_host`: looked up and sampled there over SSH, the
reachability check still from this machine, where the agents' traffic comes from). Its
``$SYS`` topics are read. Teardown stops mqttbed's own samplers only.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil
from pydantic import Field

from mqttbed.brokers.external.options import BrokerUrl, Options, ProcessToSample
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
from mqttbed.core.backends import BrokerAccess, DeploymentRecord
from mqttbed.core.broker_access import (
    EndpointTls,
    ListenerTransport,
    SecretUnavailable,
    read_public_file,
)
from mqttbed.core.errors import BackendError
from mqttbed.core.host import Host, describe_exit
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import BrokerResourceSample, SysSample
from mqttbed.core.sections import SectionRecords
from mqttbed.core.ssh import SshError, SshHost
from mqttbed.instruments.resources import ProcessTreeSampler

REMOTE_EXIT_MARGIN_S = 1.0   # the ssh round trip and the sampler's exit, with room


class ExternalDeployment(DeploymentRecord):
    """What a run measured against a broker it did not start."""

    url: str
    transport: Transport
    tls_verified: bool | None = Field(
        None, description="whether the broker's certificate was verified (None: no TLS)")
    username: str | None = Field(None, description="the user name the clients sent")
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
        self._access = BrokerAccess()
        self._torn_down = False

    def configure_access(self, access: BrokerAccess) -> None:
        """Take the run's ``broker.tls``, ``broker.auth`` and ``workload.protocol``: how
        the probe, the ``$SYS`` sampler and the agents reach the broker at its URL."""
        self._access = access

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
        url = options.broker_url()
        access = self._access
        check_listener(access, url, options.url)
        try:
            endpoint = url.endpoint(endpoint_tls(access, options.url))
            credentials = access.client_credentials()
        except SecretUnavailable as exc:
            raise BackendError(f"external broker {options.url}: {exc}") from None
        try:
            probe(endpoint, options.connect_timeout_s, credentials, access.protocol)
        except Unreachable as exc:
            raise BackendError(f"external broker {options.url}: {exc.reason}") from None
        self._endpoint = endpoint
        self._liveness = Liveness(endpoint, credentials=credentials)
        try:
            if options.sample is not None:
                watch(options.sample)
            if options.sys_topics:
                self._sys.start(endpoint, credentials, access.protocol)
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
            if self._remote is not None and (code := self._remote_exit()) is not None:
                # the broker's port closed because its process ended: the sampler on the
                # lab host says so a moment later (its interval plus the ssh round trip)
                return self._remote_ended(code)
            return f"external broker {self._options.url}: {reason}"
        return None

    def _remote_exit(self) -> int | None:
        """The lab host's sampler's exit code, waited for up to two of its intervals and
        an ssh round trip's margin (None: it still samples a live process)."""
        assert self._remote is not None and self._sampled is not None
        deadline = time.monotonic() + 2 * self._sampled.interval_s + REMOTE_EXIT_MARGIN_S
        while (code := self._remote.exit_code()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return code

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
            tls_verified=(None if self._endpoint is None or self._endpoint.tls is None
                          else self._endpoint.tls.verify),
            username=None if self._access.auth is None else self._access.auth.username,
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


def endpoint_tls(access: BrokerAccess, url: str) -> EndpointTls | None:
    """How the clients verify the broker, from ``broker.tls`` (its CA file read now);
    None: the system's CAs, the URL's host. Raises SecretUnavailable naming the file."""
    tls = access.tls
    if tls is None:
        return None
    ca_pem = None if tls.ca_file is None else read_public_file(tls.ca_file, "broker.tls.ca_file")
    if ca_pem is not None and "-----BEGIN CERTIFICATE-----" not in ca_pem:
        raise SecretUnavailable(f"broker.tls.ca_file {tls.ca_file!r} holds no PEM "
                                "certificate (-----BEGIN CERTIFICATE-----)")
    return EndpointTls(ca_pem=ca_pem, server_name=tls.server_name, verify=tls.verify)


def check_listener(access: BrokerAccess, url: BrokerUrl, written: str) -> None:
    """The URL decides the listener: a run asking for another (``broker.transport``), or
    TLS settings for a listener without TLS, is an error naming both."""
    listener = url.listener
    if listener is None:
        asked = access.to_configure() + ([f"workload.protocol {access.protocol!r}"]
                                         if access.protocol != "3.1.1" else [])
        if asked:
            raise BackendError(f"external broker {written}: {', '.join(asked)} cannot apply "
                               f"to {url.transport} (UDP: MQTT 3.1.1, anonymous, no TLS)")
        return
    if access.transport not in (listener, ListenerTransport.TCP):
        raise BackendError(f"external broker {written}: broker.transport "
                           f"{access.transport.value!r} does not match the url's scheme "
                           f"({listener.value}); the url says how the broker is reached")
    if access.tls is not None and not listener.tls:
        secure = "wss" if listener.websocket else "mqtts"
        raise BackendError(f"external broker {written}: broker.tls is given but the url's "
                           f"scheme has no TLS; write {secure}://")


def unavailable() -> str | None:
    """Nothing to install: the broker is somebody else's."""
    return None
