"""What a broker backend is, what it may also do, and how mqttbed finds one.

A backend is one folder under ``brokers/`` (or an installed package) that declares
everything about itself in one :class:`BackendDeclaration`: its options model, whether it
can run here, its results section, the report figures it adds, the MQTT features its
broker has, and which optional capabilities its backend class implements. The engine,
CLI, lab, spec validation and report ask the declaration; none of them names a backend.

Optional capabilities are small runtime-checkable protocols, checked with ``isinstance``
on the backend (or ``issubclass`` on its class), never looked up with ``getattr``:

- :class:`MultiBroker`: deploys several brokers and says which one each client uses;
- :class:`ConfiguresAccess`: configures its listener (TLS, WebSocket) and users from
  the run's :class:`BrokerAccess`;
- :class:`FaultSchedule`: causes a fault at a time of the run, and reports it;
- :class:`OwnNetwork`: builds its own network and places the run's agents in it;
- :class:`RunsOnLabHost`: can deploy its broker on a lab host over SSH;
- :class:`LocalProcesses`: starts its brokers as processes on this machine and names
  them, so they can be put under a CPU budget (``broker.cpu_limit``);
- :class:`StandaloneServer`: runs by hand as ``mqttbed broker run NAME`` (the
  declaration's ``standalone``, so listing servers imports no backend class).

Backends are found in :data:`BUILTIN_BACKENDS` and in the ``mqttbed.backends`` entry-point
group (a name → ``module:ATTRIBUTE`` of a declaration), so a user adds a broker by
installing a package. Modules are imported only when a backend is asked for.
"""

from __future__ import annotations

import hashlib
import importlib
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from mqttbed.core.broker_access import (
    AuthSettings,
    ClientCredentials,
    ListenerTransport,
    MqttProtocol,
    TlsSettings,
    read_client_credentials,
)
from mqttbed.core.host import Host
from mqttbed.core.protocol import ClientAssignment, Endpoint
from mqttbed.core.report_figures import ReportFigures
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.sections import BackendSection, SectionRecords
from mqttbed.core.ssh import SshHost

ENTRY_POINT_GROUP = "mqttbed.backends"

# The backends mqttbed ships: name -> "module:ATTRIBUTE" of its declaration.
BUILTIN_BACKENDS: dict[str, str] = {
    "mosquitto": "mqttbed.brokers.mosquitto.declaration:DECLARATION",
    "fpga": "mqttbed.brokers.fpga.declaration:DECLARATION",
    "forkpipe": "mqttbed.brokers.forkpipe.declaration:DECLARATION",
    "mqtt-sn": "mqttbed.brokers.mqttsn.declaration:DECLARATION",
    "p4": "mqttbed.brokers.p4.declaration:DECLARATION",
    "mqtt-st": "mqttbed.brokers.mqttst.declaration:DECLARATION",
    "adaptive": "mqttbed.brokers.adaptive.declaration:DECLARATION",
    "external": "mqttbed.brokers.external.declaration:DECLARATION",
    "command": "mqttbed.brokers.command.declaration:DECLARATION",
    "rabbitmq": "mqttbed.brokers.command.named:RABBITMQ",
    "nats": "mqttbed.brokers.command.named:NATS",
    "amqtt": "mqttbed.brokers.command.named:AMQTT",
    "activemq": "mqttbed.brokers.command.named:ACTIVEMQ",
    "ejabberd": "mqttbed.brokers.command.named:EJABBERD",
}


# -- what a deploy recorded -------------------------------------------------------------

class DeploymentRecord(BaseModel):
    """What a backend deployed for one run; a backend subclasses it for its own details."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: str
    managed: bool = Field(True, description="started and stopped by mqttbed (False: a "
                                            "broker that was already running)")
    version: str | None = None
    binary: str | None = None
    binary_sha256: str | None = None
    config: str | None = Field(None, description="the config text, verbatim")
    config_sha256: str | None = None
    port: int | None = None
    pid: int | None = Field(None, description="the broker's (root) process, where known")
    exit_code: int | None = None
    log_tail: str | None = Field(None, description="the broker's last log lines")


class AccessRecord(BaseModel):
    """How clients reached a run's broker, as its backend configured the listener (no
    secret: the user's name, never its password; the CA's fingerprint, never a key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    transport: ListenerTransport
    protocol: str = Field(description="workload.protocol")
    certificate_names: list[str] = Field(default_factory=list,
                                         description="names in the server certificate")
    ca_sha256: str | None = Field(None, description="SHA-256 of the run's CA (DER)")
    client_certificates: bool = Field(False, description="the listener required one")
    username: str | None = Field(None, description="the one user configured")
    websocket_path: str | None = None
    plain_port: int | None = Field(None, description="a plain MQTT listener beside the "
                                                     "measured one (mqttbed's $SYS sampler's)")

    @classmethod
    def of(cls, access: BrokerAccess, *, ca_pem: str | None = None,
           certificate_names: Sequence[str] = (), websocket_path: str | None = None,
           client_certificates: bool = False, plain_port: int | None = None) -> AccessRecord:
        """The record of a listener configured for ``access``, whose server certificate
        (if any) the CA ``ca_pem`` signed for ``certificate_names``."""
        ca_sha256 = (None if ca_pem is None else
                     hashlib.sha256(ssl.PEM_cert_to_DER_cert(ca_pem)).hexdigest())
        return cls(transport=access.transport, protocol=access.protocol,
                   certificate_names=list(certificate_names), ca_sha256=ca_sha256,
                   client_certificates=client_certificates,
                   username=None if access.auth is None else access.auth.username,
                   websocket_path=websocket_path, plain_port=plain_port)


class Fault(BaseModel):
    """A fault a backend caused during a run, on purpose (e.g. a broker killed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    at_ns: int = Field(description="when, on CLOCK_MONOTONIC of the controller's machine")
    what: str = Field(description="e.g. 'killed broker 2 (the root)'")
    until_ns: int | None = Field(None, description="when it was over (a restarted broker "
                                                   "listening again), on the same clock; "
                                                   "None: it lasted")


@dataclass(frozen=True)
class AgentPlacement:
    """Where a backend wants the run's agents: a host per agent, and the controller's URL
    as those hosts reach it."""

    hosts: list[Host]
    controller_url: str


# -- the contract and its optional capabilities --------------------------------------

@runtime_checkable
class BrokerBackend(Protocol):
    """A broker deployed per run: deploy, check, sample, tear down."""

    name: str

    def deploy(self, spec: Any, host: Host) -> Endpoint:
        """Start the broker described by ``spec`` (the campaign's broker section) on ``host``."""
        ...

    def health(self) -> str | None:
        """Return None while healthy, else the reason the broker is unusable."""
        ...

    def resource_samples(self) -> list[BrokerResourceSample]:
        """Return the resource samples taken since deploy."""
        ...

    def deployment(self) -> DeploymentRecord:
        """Return what was deployed: version, config and its hash, binary hash, process."""
        ...

    def section_records(self) -> SectionRecords:
        """Return, after teardown, the run's raw values for ``results_section``'s figures."""
        ...

    def teardown(self) -> None:
        """Stop the broker and remove everything it left; safe to call twice."""
        ...


@runtime_checkable
class MultiBroker(Protocol):
    """Deploys several brokers; each client is told which one to use."""

    def prepare(self, workload: Any) -> None:
        """Called with the run's workload before deploy (it decides the clients' homes)."""
        ...

    def broker_of(self, client: ClientAssignment) -> Endpoint:
        """After deploy: the broker ``client`` connects to."""
        ...


@dataclass(frozen=True)
class BrokerAccess:
    """What a run asks of the broker's listener and clients: ``broker.transport``,
    ``broker.tls``, ``broker.auth`` (its password read when the run starts) and
    ``workload.protocol``."""

    transport: ListenerTransport = ListenerTransport.TCP
    protocol: MqttProtocol = "3.1.1"
    tls: TlsSettings | None = None
    auth: AuthSettings | None = None
    password: SecretStr | None = field(default=None, repr=False)

    @property
    def plain(self) -> bool:
        """Anonymous MQTT 3.1.1 over plain TCP: what every backend speaks."""
        return (self.transport == ListenerTransport.TCP and self.protocol == "3.1.1"
                and self.tls is None and self.auth is None)

    def client_credentials(self) -> ClientCredentials | None:
        """What every client of the run presents: the user name and password, and
        ``broker.tls``'s client certificate and key, read now (None: anonymous, no
        certificate); raises SecretUnavailable naming the file."""
        return read_client_credentials(self.auth, self.password, self.tls)

    def to_configure(self) -> list[str]:
        """What a broker must be configured for (its listener, its users), named as the
        spec names it; empty for a plain TCP listener open to anyone (the MQTT version
        needs no configuring)."""
        return [name for name, asked in (
            (f"broker.transport {self.transport.value!r}",
             self.transport != ListenerTransport.TCP),
            ("broker.tls", self.tls is not None),
            ("broker.auth", self.auth is not None)) if asked]


@runtime_checkable
class ConfiguresAccess(Protocol):
    """Configures the broker's listener (TLS, WebSocket) and users from the run's
    :class:`BrokerAccess`; its ``deploy`` then returns an endpoint that says how to reach
    it (``Endpoint.tls``, ``Endpoint.websocket_path``). The declaration's features say
    which transports and whether ``auth`` it takes."""

    def configure_access(self, access: BrokerAccess) -> None:
        """Called once before ``deploy``."""
        ...


@runtime_checkable
class FaultSchedule(Protocol):
    """Causes a fault at a time of the run (e.g. kills a broker) and says what it did."""

    def started(self, t_start_ns: int) -> None:
        """The run's common start time (CLOCK_MONOTONIC) was handed out: arm the faults."""
        ...

    def faults(self) -> list[Fault]:
        """After teardown: what was done, and when."""
        ...


@runtime_checkable
class RestartsBroker(Protocol):
    """Stops its broker mid-run and starts it again on the same listeners
    (``workload.reconnect``); each restart is one of its faults (:class:`FaultSchedule`:
    when it stopped, and ``until_ns``, when it listened again)."""

    def keep_sessions(self, persistent: bool) -> None:
        """Called once before ``deploy``: whether the broker keeps its clients' sessions
        across a restart (persistence), as persistent sessions need."""
        ...

    def restart_at(self, at_ns: int, down_s: float) -> None:
        """Stop the broker at ``at_ns`` (CLOCK_MONOTONIC) and start it again ``down_s``
        later; returns at once (the restart runs on its own thread)."""
        ...


@runtime_checkable
class OwnNetwork(Protocol):
    """Builds its own network, and says where the run's agents must run in it."""

    def agent_placement(self, roles: list[frozenset[str]], controller_url: str
                        ) -> AgentPlacement | None:
        """One host per agent (``roles[i]``: the client roles agent ``i`` plays), in that
        order, and the controller's URL there; None keeps the engine's default."""
        ...


@runtime_checkable
class RunsOnLabHost(Protocol):
    """Can deploy its broker on a lab host (``broker.host``) over SSH."""

    def deploy_on_lab_host(self, spec: Any, host: SshHost) -> Endpoint:
        """Start the broker on the lab host ``host``; sampled there."""
        ...


@runtime_checkable
class LocalProcesses(Protocol):
    """Starts its brokers as processes on this machine, and says which: the process trees
    its resource sampling covers, and what a CPU budget (``broker.cpu_limit``) limits."""

    def broker_processes(self) -> dict[str, list[int]]:
        """After deploy: each broker's name -> the root pids of its process trees here
        (children are found from them); empty when none runs on this machine."""
        ...


@runtime_checkable
class StandaloneServer(Protocol):
    """A broker that runs by hand in the foreground: ``mqttbed broker run NAME``."""

    def serve(self, argv: list[str]) -> int:
        """Run until Ctrl-C or SIGTERM with the command line's own options; exit status."""
        ...


# -- the declaration ---------------------------------------------------------------------

class BrokerFeatures(BaseModel):
    """What the broker can do over MQTT; a spec asking for more is refused before a run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    qos: frozenset[int] = Field(frozenset({0, 1, 2}), description="QoS levels it delivers")
    retained: bool = Field(True, description="keeps and delivers retained messages")
    wildcards: bool = Field(True, description="subscriptions with + and #")
    protocols: frozenset[MqttProtocol] = Field(
        frozenset({"3.1.1"}), description="MQTT versions it speaks (workload.protocol)")
    transports: frozenset[ListenerTransport] = Field(
        frozenset({ListenerTransport.TCP}),
        description="listeners the backend configures (broker.transport): tcp, tls, ws, wss")
    auth: bool = Field(False, description="the backend configures user names and passwords "
                                          "(broker.auth)")
    shared_subscriptions: frozenset[MqttProtocol] = Field(
        frozenset(), description="MQTT versions at which it shares $share/GROUP/FILTER "
                                 "subscriptions over their members (workload.shared)")
    persistent_sessions: bool = Field(True, description="keeps a session (subscriptions, "
                                                        "QoS 1/2 messages) across a client's "
                                                        "absence (clean session 0)")
    note: str = Field("", description="where these limits come from")


@runtime_checkable
class DeclaresFeatures(Protocol):
    """Options whose values decide the broker's features (e.g. a preset of a command)."""

    def broker_features(self) -> BrokerFeatures:
        """The features of the broker these options deploy."""
        ...


# what a class must have to be a BrokerBackend, read off the protocol: its attributes and
# methods (named in the error when a declared class misses some)
_CONTRACT = (*BrokerBackend.__annotations__,
             *(n for n, v in vars(BrokerBackend).items() if callable(v) and not n.startswith("_")))


@dataclass(frozen=True)
class BackendDeclaration:
    """Everything mqttbed knows about one backend, declared in the backend's folder."""

    name: str
    summary: str
    # The pydantic model of the campaign's ``broker:`` section for this backend.
    options: type[BaseModel]
    # "module:Class" of the backend, imported only when a run deploys it.
    backend: str
    # Why it cannot be deployed here with default options, or None.
    unavailable: Callable[[], str | None]
    results_section: type[BackendSection] | None = None
    features: BrokerFeatures = field(default_factory=BrokerFeatures)
    # ``workload.placement`` values it takes (a MultiBroker backend).
    placements: tuple[str, ...] = ()
    # Figures it adds to the campaign report, keyed by element id.
    report_figures: ReportFigures | None = None
    # ``mqttbed broker run NAME``: the foreground server, if it has one.
    standalone: StandaloneServer | None = None
    # Options for a short run on this machine, yielded by a context (which may start what
    # they point at, e.g. the broker an ``external`` backend measures); the conformance
    # suite and the docs' examples deploy with them. None: the options' defaults.
    example_options: Callable[[], AbstractContextManager[dict[str, Any]]] | None = None

    @contextmanager
    def example(self) -> Iterator[dict[str, Any]]:
        """The ``broker:`` section of a short run on this machine (``example_options``)."""
        if self.example_options is None:
            yield {"backend": self.name}
            return
        with self.example_options() as options:
            yield {"backend": self.name, **options}

    def backend_class(self) -> type[BrokerBackend]:
        """The backend class (imports its module)."""
        module_name, _, class_name = self.backend.partition(":")
        cls: type[BrokerBackend] = getattr(importlib.import_module(module_name), class_name)
        return cls

    def create(self) -> BrokerBackend:
        """A new, undeployed backend."""
        backend = self.backend_class()()
        if not isinstance(backend, BrokerBackend):
            # A declaration pointing at a class that misses part of the contract is a
            # programming error; catching it here beats an AttributeError mid-run.
            missing = [name for name in _CONTRACT if not hasattr(backend, name)]
            raise TypeError(f"{self.backend} does not implement BrokerBackend: it has no "
                            f"{', '.join(missing)}")
        return backend

    def supports(self, capability: type) -> bool:
        """Whether the backend class implements ``capability`` (one of the protocols)."""
        return issubclass(self.backend_class(), capability)

    def features_for(self, options: BaseModel) -> BrokerFeatures:
        """The broker's features with these options (options may decide them)."""
        if isinstance(options, DeclaresFeatures):
            return options.broker_features()
        return self.features


# -- the backend registry ----------------------------------------------------------------

@cache
def _targets() -> Mapping[str, str]:
    """name -> "module:ATTRIBUTE": the built-in table, then installed plug-ins."""
    found = dict(BUILTIN_BACKENDS)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name in found and found[point.name] != point.value:
            raise RuntimeError(f"two broker backends are named {point.name!r}: "
                               f"{found[point.name]} and {point.value} (entry point group "
                               f"{ENTRY_POINT_GROUP}); uninstall or rename one")
        found[point.name] = point.value
    return found


def refresh() -> None:
    """Look for installed plug-ins again (after a package was installed or removed)."""
    _targets.cache_clear()
    declaration.cache_clear()


def backend_names() -> list[str]:
    """The names of every backend, built-in and installed, sorted."""
    return sorted(_targets())


@cache
def declaration(name: str) -> BackendDeclaration:
    """The declaration of backend ``name``; a clear error for an unknown name."""
    try:
        target = _targets()[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown broker backend {name!r}; available: "
                         f"{', '.join(backend_names())}") from None
    module_name, _, attribute = target.partition(":")
    found = getattr(importlib.import_module(module_name), attribute or "DECLARATION")
    if not isinstance(found, BackendDeclaration):
        raise TypeError(f"{target} (backend {name!r}) is not a BackendDeclaration")
    if found.name != name:
        raise TypeError(f"{target} declares backend {found.name!r}, registered as {name!r}")
    return found


def create_backend(name: str) -> BrokerBackend:
    """A new, undeployed instance of backend ``name``."""
    return declaration(name).create()


def section_types() -> tuple[type[BackendSection], ...]:
    """The results sections every backend declares (imports each declaration)."""
    found = (declaration(name).results_section for name in backend_names())
    return tuple(section for section in found if section is not None)


def check_features(features: BrokerFeatures, backend: str, qos: Sequence[int]) -> None:
    """Raise ValueError naming ``workload.qos`` when the workload needs a QoS level the
    broker does not deliver (a traffic shape's needs: campaigns.shapes.check_shape_features)."""
    missing = sorted(set(qos) - features.qos)
    if missing:
        why = f" ({features.note})" if features.note else ""
        raise ValueError(f"workload.qos {missing[0]}: broker {backend} delivers QoS "
                         f"{', '.join(map(str, sorted(features.qos)))} only{why}")


# ``broker.cpu_limit`` (any backend that is LocalProcesses): cores as a CFS quota per period.
CPU_PERIOD_US = 100_000        # the kernel's default CFS period
MIN_CPU_QUOTA_US = 1_000       # the smallest quota the kernel takes (1 ms)
MIN_CPU_LIMIT = MIN_CPU_QUOTA_US / CPU_PERIOD_US


def check_cpu_limit(cores: float) -> float:
    """``cores`` if the kernel can enforce it as a CPU quota, else ValueError saying why."""
    if not cores >= MIN_CPU_LIMIT:   # also refuses NaN
        raise ValueError(f"cores must be at least {MIN_CPU_LIMIT} (the kernel's smallest "
                         f"quota, {MIN_CPU_QUOTA_US} µs per {CPU_PERIOD_US} µs period), e.g. "
                         "0.25 for a quarter of one core")
    return cores


@contextmanager
def fixed_options(**options: Any) -> Iterator[dict[str, Any]]:
    """``example_options`` for a backend whose example needs only fixed values."""
    yield dict(options)


def options_model(name: str) -> type[BaseModel]:
    """The pydantic model that validates backend ``name``'s ``broker:`` section."""
    return declaration(name).options


def unavailable_reason(name: str) -> str | None:
    """Why backend ``name`` cannot be deployed here with default options, or None."""
    return declaration(name).unavailable()


@dataclass(frozen=True)
class ServerCommand:
    """A :class:`StandaloneServer` that is a ``main(argv) -> int`` function, imported only
    when it runs ("module:function")."""

    target: str

    def serve(self, argv: list[str]) -> int:
        """Run the server's main with ``argv``."""
        module_name, _, function = self.target.partition(":")
        main: Callable[[list[str]], int] = getattr(importlib.import_module(module_name),
                                                   function)
        return main(argv)


def check_restarts(backend: str) -> None:
    """Raise ValueError naming ``workload.reconnect`` and the backend when its broker cannot
    be restarted mid-run (no :class:`RestartsBroker`)."""
    if not declaration(backend).supports(RestartsBroker):
        raise ValueError(f"workload.reconnect: backend {backend} cannot restart its broker "
                         "mid-run (no RestartsBroker capability); run the reconnect storm on "
                         "a backend that can, e.g. mosquitto")
