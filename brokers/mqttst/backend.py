"""The ``mqtt-st`` broker backend: K brokers that build a spanning tree (seed 001).

Per run it deploys a :class:`~mqttbed.brokers.mqttst.cluster.Cluster` (K Mosquittos, each
with its tree node) on consecutive free ports, waits until the tree has converged, and
spreads the clients over the brokers as ``workload.placement`` says:

- ``benchmark``: one plain Mosquitto, no tree (the paper's centralised broker);
- ``distributed`` (the default): publisher i on broker i mod K, subscriber j on broker
  j mod K;
- ``locality``: every client on broker ``locality_broker``.

``fail: {broker: root | <index>, at_s}`` kills that broker (its Mosquitto and its node,
SIGKILL) at ``at_s`` after the run's start; its clients would lose their broker with it,
so clients are placed on the other brokers only (``distributed`` over K - 1). The run
then reports the fault (analytics measures when delivery resumed at every subscriber)
and, from the nodes' state files, how long the tree took to re-converge.

``regions`` (one per broker), ``wan_delay_ms``, ``publisher_region``,
``subscriber_region``, ``locality_percent`` and ``cloud_region`` make the run the paper's
networked environment (III-B, Fig. 6, :mod:`.wan`): each client sits in a region and
uses the nearest broker its placement allows (``distributed``: one in its own region;
``benchmark``: the one broker, in ``cloud_region``; ``locality``: ``locality_broker``),
through a delay proxy when that broker is in another region; tree links between
regions go through delay proxies too.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, MosquittoDeployment
from mqttbed.brokers.mosquitto.backend import Options as MosquittoOptions
from mqttbed.brokers.mosquitto.backend import unavailable as mosquitto_unavailable
from mqttbed.brokers.mqttst.cluster import (
    Cluster,
    ClusterDeployment,
    TreeOptions,
    free_port_range,
    topology_edges,
)
from mqttbed.brokers.mqttst.wan import (
    DelayProxies,
    DelayProxyRecord,
    Geography,
    check_geography,
    wan_delays,
)
from mqttbed.core.backends import DeploymentRecord, Fault
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.errors import BackendError
from mqttbed.core.host import Host, LocalHost
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role, Transport
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.sections import SectionRecords
from mqttbed.instruments.resources import ProcessTreeSampler

DEPLOY_ATTEMPTS = 3


class Failure(BaseModel):
    """Kill one broker of the tree during the run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    broker: Literal["root"] | int = Field(description="'root' (as elected) or an index")
    at_s: float = Field(gt=0, le=3600, description="seconds after the run's start")


# The workload.placement values this backend takes.
PLACEMENTS = ("benchmark", "distributed", "locality")


class Options(BaseModel):
    """The broker section of a campaign spec for the ``mqtt-st`` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: Literal["mqtt-st"] = "mqtt-st"
    brokers: int = Field(3, ge=2, le=32, description="K, the brokers of the tree")
    topology: str | list[tuple[int, int]] = Field(
        "full-mesh", description="full-mesh, ring, chain, or edges such as '0-1,1-2'")
    keepalive_s: float = Field(10.0, gt=0, le=3600,
                               description="BPDU interval (the paper: 10 s)")
    alpha: float | None = Field(None, description="C = alpha L + beta M; default: the nodes'")
    beta: float | None = Field(None, description="see alpha; default: the nodes'")
    capabilities: dict[int, float] = Field(
        default_factory=dict, description="C per broker index, overriding alpha L + beta M; "
                                          "indexes >= brokers are left unused (one map "
                                          "serves a sweep over brokers)")
    locality_broker: int = Field(0, ge=0, description="where placement 'locality' puts "
                                                      "every client")
    fail: Failure | None = Field(None, description="SIGKILL one broker (root or an index) at_s "
                                                   "after the run's start")
    regions: list[str] | None = Field(
        None, description="region of each broker index (the networked environment, e.g. "
                          "['us-west', 'us-east', 'eu']); entries >= brokers are unused")
    wan_delay_ms: dict[str, float] = Field(
        default_factory=dict, description="one-way delay per direction between two regions, "
                                          "keyed 'REGION/REGION'; same region: none")
    publisher_region: str | None = Field(None, description="the publishers' home region")
    subscriber_region: str | None = Field(None, description="the subscribers' region at 0 % "
                                                            "locality")
    locality_percent: int = Field(0, description="0: publishers home, subscribers away; 50: "
                                                 "half of each in either; 100: all home")
    cloud_region: str | None = Field(None, description="where placement 'benchmark' runs its "
                                                       "one broker (default: regions[0])")
    converge_timeout_s: float = Field(30.0, gt=0, le=600,
                                      description="how long the tree may take to form")
    max_queued_messages: int = Field(1000, ge=0, description="per Mosquitto, as mosquitto's: "
                                     "past it messages for a slow client are dropped, QoS 2 "
                                     "too; 0 = no limit")
    max_inflight_messages: int = Field(20, ge=0, description="per Mosquitto, as mosquitto's")
    stats_interval_s: float = Field(0.2, gt=0, description="seconds between resource samples")

    @model_validator(mode="after")
    def _indexes_in_range(self) -> Options:
        topology_edges(self.topology, self.brokers)
        bad = sorted(i for i, c in self.capabilities.items()
                     if i < 0 or not math.isfinite(c) or c < 0)
        if bad:
            raise ValueError(f"capabilities[{bad[0]}] = {self.capabilities[bad[0]]!r}: an "
                             f"index >= 0 and a finite capability >= 0")
        if self.locality_broker >= self.brokers:
            raise ValueError(f"locality_broker {self.locality_broker} is not one of the "
                             f"brokers 0..{self.brokers - 1}")
        if self.fail is not None and isinstance(self.fail.broker, int) and not (
                0 <= self.fail.broker < self.brokers):
            raise ValueError(f"fail.broker {self.fail.broker} is not one of the brokers "
                             f"0..{self.brokers - 1}")
        self._check_geography()
        return self

    def _check_geography(self) -> None:
        check_geography(self.brokers, self.regions, self.wan_delay_ms, self.locality_percent,
                        publisher_region=self.publisher_region,
                        subscriber_region=self.subscriber_region, cloud_region=self.cloud_region)

    def geography(self) -> Geography | None:
        """The regions and delays of the networked environment, or None (all local)."""
        if self.regions is None:
            return None
        assert self.publisher_region is not None and self.subscriber_region is not None
        return Geography(tuple(self.regions[:self.brokers]), wan_delays(self.wan_delay_ms),
                         self.publisher_region, self.subscriber_region, self.locality_percent)

    def tree_options(self) -> TreeOptions:
        extra = {k: v for k, v in (("alpha", self.alpha), ("beta", self.beta)) if v is not None}
        used = {i: c for i, c in self.capabilities.items() if i < self.brokers}
        return TreeOptions(keepalive_s=self.keepalive_s, capabilities=used or None, **extra)


class MqttStLimits(BaseModel):
    """The queue limits every Mosquitto of the run had (as mosquitto's options)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_queued_messages: int
    max_inflight_messages: int


class ClientPath(BaseModel):
    """Where one client sat and which broker it used, under a geography."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    region: str
    broker: str = Field(description="the broker's index, or 'cloud' (placement benchmark)")
    broker_region: str
    delay_ms: float = Field(description="one way, client to broker (0: same region)")


class MqttStGeography(BaseModel):
    """The networked environment of a run: regions, delays, each client's path, proxies."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    broker_regions: list[str] = Field(description="per endpoint")
    wan_delay_ms: dict[str, float]
    locality_percent: int
    clients: dict[str, ClientPath] = Field(description="client id -> its path")
    proxy_prefix: str = Field(description="the delay proxies' prefix (reaped by it)")
    proxy_prefix_journalled: bool
    proxies: list[DelayProxyRecord]


class MqttStDeployment(DeploymentRecord):
    """What one mqtt-st deploy was: a tree of K brokers, or (placement benchmark) one
    plain Mosquitto. ``config`` is the options as sorted JSON.

    The tree's fields are empty for the benchmark, ``benchmark_broker`` None for a tree."""

    placement: str = Field(description="the workload's placement (see PLACEMENTS)")
    options: Options
    serving_brokers: list[int] = Field(description="the broker indexes clients are placed on")
    limits: MqttStLimits
    tree_node_sources_sha256: str
    geography: MqttStGeography | None = None
    benchmark_broker: MosquittoDeployment | None = None
    # the tree
    endpoints: list[Endpoint] = Field(default_factory=list)
    edges: list[tuple[int, int]] = Field(default_factory=list)
    root: int | None = Field(None, description="the elected root's index")
    convergence_s: float | None = Field(None, description="start to the first converged tree")
    faults: list[Fault] = Field(default_factory=list)
    root_at_end: int | None = None
    cluster: ClusterDeployment | None = None
    # Each node's stats file (a subprocess's, read by link_counts and
    # node_counter_records): open-ended, so kept as they came; None for a node down.
    states_at_convergence: list[dict[str, Any] | None] = Field(default_factory=list)
    states_at_end: list[dict[str, Any] | None] = Field(default_factory=list)


class MqttStBackend:
    """K Mosquittos with tree nodes, clients spread over them, a broker killed on demand."""

    name = "mqtt-st"

    def __init__(self) -> None:
        self._placement = "distributed"
        self._options: Options | None = None
        self._cluster: Cluster | None = None
        self._single: MosquittoBackend | None = None
        self._endpoints: list[Endpoint] = []
        self._serving: list[int] = []         # broker indexes clients are placed on
        self._geography: Geography | None = None
        self._endpoint_regions: list[str] = []   # per endpoint, under a geography
        self._proxies: DelayProxies | None = None
        self._proxy_dir: Path | None = None
        self._client_paths: dict[str, ClientPath] = {}
        self._placing = threading.Lock()
        self._samplers: dict[str, ProcessTreeSampler] = {}
        self._started_ns = 0
        self._converged_ns: int | None = None
        self._root: int | None = None
        self._first_states: list[dict[str, Any] | None] = []
        self._serving_pid: int | None = None
        self._final_states: list[dict[str, Any] | None] = []
        self._final_root: int | None = None
        self._final_converged_ns: int | None = None
        self._faults: list[Fault] = []
        self._kill_index: int | None = None
        self._fault_timer: threading.Thread | None = None
        self._stop_timer = threading.Event()
        self._fault_error: str | None = None
        self._torn_down = False

    # -- deploy -------------------------------------------------------------------------

    def prepare(self, workload: Any) -> None:
        """Take the run's placement (None: distributed)."""
        self._placement = workload.placement or "distributed"

    def deploy(self, spec: Options | Mapping[str, Any], host: Host) -> Endpoint:
        if self._cluster is not None or self._single is not None or self._torn_down:
            raise BackendError("this MqttStBackend was already deployed; create a new one "
                               "per run (mqttbed.core.backends.create_backend)")
        if not isinstance(host, LocalHost):
            raise BackendError("the mqtt-st backend deploys its brokers on this machine only")
        options = spec if isinstance(spec, Options) else Options.model_validate(spec)
        self._options = options
        try:
            if (geography := options.geography()) is not None:
                self._geography = geography
                self._proxy_dir = host.make_dir("mqttbed-mqtt-st-wan-")
                self._proxies = DelayProxies(self._proxy_dir, host.address)
            if self._placement == "benchmark":
                self._single = MosquittoBackend()
                endpoint = self._single.deploy(self._mosquitto_options(options), host)
                self._endpoints, self._serving = [endpoint], [0]
                if geography is not None:
                    self._endpoint_regions = [options.cloud_region or geography.broker_regions[0]]
                return endpoint
            self._start_cluster(options, host)
        except BaseException:
            self.teardown()
            raise
        return self._endpoints[self._serving[0]]

    @staticmethod
    def _mosquitto_options(options: Options) -> MosquittoOptions:
        return MosquittoOptions(max_queued_messages=options.max_queued_messages,
                                max_inflight_messages=options.max_inflight_messages,
                                stats_interval_s=options.stats_interval_s)

    def _start_cluster(self, options: Options, host: Host) -> None:
        conf = (f"max_queued_messages {options.max_queued_messages}\n"
                f"max_inflight_messages {options.max_inflight_messages}\n")
        last: Exception | None = None
        for _ in range(DEPLOY_ATTEMPTS):
            cluster = Cluster(brokers=options.brokers,
                              port=free_port_range(options.brokers, host.address),
                              topology=options.topology, options=options.tree_options(),
                              address=host.address, mosquitto_conf_extra=conf, host=host,
                              link_via=self._wan_link if self._geography is not None else None)
            self._started_ns = monotonic_ns()
            try:
                cluster.start()
            except (OSError, BackendError) as exc:  # e.g. a port taken since it was probed
                cluster.stop()
                last = exc
                continue
            self._cluster = cluster
            break
        else:
            raise BackendError(f"mqtt-st: could not start {options.brokers} brokers in "
                               f"{DEPLOY_ATTEMPTS} attempts: {last}")
        self._root = self._cluster.wait_converged(options.converge_timeout_s)
        self._converged_ns = self._cluster.converged_at_ns() or monotonic_ns()
        self._first_states = self._cluster.states()
        self._endpoints = [Endpoint(host=h, port=p, transport=Transport.MQTT_TCP)
                           for h, p in self._cluster.endpoints()]
        if self._geography is not None:
            self._endpoint_regions = list(self._geography.broker_regions)
        if options.fail is not None:
            self._kill_index = self._root if options.fail.broker == "root" else options.fail.broker
        if self._placement == "locality":
            if options.locality_broker == self._kill_index:
                raise BackendError(f"fail.broker {self._kill_index} is the locality broker: "
                                   "its clients would lose their broker with it; kill another")
            self._serving = [options.locality_broker]
        else:
            self._serving = [i for i in range(options.brokers) if i != self._kill_index]
        # the record's one process: the Mosquitto of the first broker clients use
        self._serving_pid = self._cluster.processes().get(f"mosquitto-{self._serving[0]}")
        for name, pid in self._cluster.processes().items():
            sampler = ProcessTreeSampler(pid, options.stats_interval_s)
            sampler.start()
            self._samplers[name] = sampler

    def _wan_link(self, dialer: int, peer: int, link: tuple[str, int]) -> tuple[str, int]:
        """Where node ``dialer`` dials ``peer``: a delay proxy between two regions."""
        assert self._geography is not None and self._proxies is not None
        a, b = self._geography.broker_regions[dialer], self._geography.broker_regions[peer]
        return self._proxies.route(link, self._geography.delay_ms(a, b),
                                   f"link {dialer} ({a}) -> {peer} ({b})")

    def broker_of(self, client: ClientAssignment) -> Endpoint:
        """The broker ``client`` uses under the run's placement (under a geography: the
        nearest the placement allows, through a delay proxy if in another region)."""
        index = client.publisher_index if client.role == Role.PUBLISHER else client.subscribe_rank
        geography = self._geography
        if geography is None or self._proxies is None:
            return self._endpoints[self._serving[index % len(self._serving)]]
        region = geography.client_region(client.role, index)
        nearest = geography.nearest_of(region, {i: self._endpoint_regions[i]
                                                for i in self._serving})
        chosen = nearest[index % len(nearest)]
        broker_region = self._endpoint_regions[chosen]
        endpoint = self._endpoints[chosen]
        delay_ms = geography.delay_ms(region, broker_region)
        label = "cloud" if self._single is not None else str(chosen)
        with self._placing:
            host, port = self._proxies.route((endpoint.host, endpoint.port), delay_ms,
                                             f"client {region} -> broker {label} "
                                             f"({broker_region})")
            self._client_paths[client.client_id] = ClientPath(
                region=region, broker=label, broker_region=broker_region, delay_ms=delay_ms)
        return endpoint.model_copy(update={"host": host, "port": port})

    # -- the run ------------------------------------------------------------------------

    def started(self, t_start_ns: int) -> None:
        """Arm the failure, if the spec has one, at its time after ``t_start_ns``."""
        options = self._options
        if options is None or options.fail is None or self._cluster is None:
            return
        due_ns = t_start_ns + int(options.fail.at_s * 1e9)

        def fail_then() -> None:
            while not self._stop_timer.is_set():
                left_ns = due_ns - monotonic_ns()
                if left_ns <= 0:
                    break
                self._stop_timer.wait(min(left_ns / 1e9, 0.05))
            if self._stop_timer.is_set() or self._cluster is None:
                return
            index = self._kill_index
            assert index is not None
            try:
                at_ns = self._cluster.kill(index)
            except Exception as exc:  # noqa: BLE001 - the run fails with this reason
                self._fault_error = f"mqtt-st: killing broker {index} failed: {exc}"
                return
            role = " (the root)" if index == self._root else ""
            self._faults.append(Fault(at_ns=at_ns, what=f"killed broker {index}{role}"))

        self._fault_timer = threading.Thread(target=fail_then, name="mqtt-st-fault",
                                             daemon=True)
        self._fault_timer.start()

    def faults(self) -> list[Fault]:
        return list(self._faults)

    def health(self) -> str | None:
        if self._fault_error is not None:
            return self._fault_error
        if self._proxies is not None and (broken := self._proxies.health()) is not None:
            return broken
        if self._single is not None:
            return self._single.health()
        if self._cluster is None:
            return "broker mqtt-st is not deployed"
        if self._torn_down:
            return "broker mqtt-st was torn down"
        return self._cluster.health()

    def resource_samples(self) -> list[BrokerResourceSample]:
        """The brokers' processes summed, sample by sample (a killed broker adds nothing
        after it died, its cumulative bytes stay)."""
        if self._single is not None:
            return self._single.resource_samples()
        series = [sampler.samples for sampler in self._samplers.values()]
        total: list[BrokerResourceSample] = []
        for k in range(max((len(s) for s in series), default=0)):
            alive = [s[k] for s in series if k < len(s)]
            last = [s[min(k, len(s) - 1)] for s in series if s]
            total.append(BrokerResourceSample(
                t_ns=max(x.t_ns for x in alive), cpu_percent=sum(x.cpu_percent for x in alive),
                rss_bytes=sum(x.rss_bytes for x in alive),
                bytes_recv=sum(x.bytes_recv for x in last),
                bytes_sent=sum(x.bytes_sent for x in last),
                processes=sum(x.processes for x in alive)))
        return total

    def broker_processes(self) -> dict[str, list[int]]:
        """Each broker of the tree, ``broker-<i>``: its Mosquitto and its tree node (the
        processes sampled); placement benchmark: the one Mosquitto."""
        if self._single is not None:
            return self._single.broker_processes()
        brokers: dict[str, list[int]] = {}
        for name, sampler in self._samplers.items():   # mosquitto-<i>, node-<i>
            brokers.setdefault(f"broker-{name.rpartition('-')[2]}", []).append(sampler.pid)
        return brokers

    def deployment(self) -> MqttStDeployment:
        """What was deployed: the tree (or the benchmark's one Mosquitto), how it formed,
        where the clients went, and the nodes' states at convergence and at the end."""
        options = self._options or Options()
        config = json.dumps(options.model_dump(mode="json"), sort_keys=True)
        geography = None
        if self._geography is not None and self._proxies is not None:
            with self._placing:  # broker_of adds paths as the agents are assigned
                clients = dict(self._client_paths)
            geography = MqttStGeography(
                broker_regions=self._endpoint_regions, wan_delay_ms=options.wan_delay_ms,
                locality_percent=options.locality_percent, clients=clients,
                proxy_prefix=self._proxies.prefix,
                proxy_prefix_journalled=self._proxies.journalled,
                proxies=self._proxies.describe())
        common: dict[str, Any] = {
            "backend": self.name, "config": config,
            "config_sha256": hashlib.sha256(config.encode()).hexdigest(),
            "placement": self._placement, "options": options,
            "serving_brokers": self._serving,
            "limits": MqttStLimits(max_queued_messages=options.max_queued_messages,
                                   max_inflight_messages=options.max_inflight_messages),
            "tree_node_sources_sha256": _sources_sha256(), "geography": geography}
        if self._single is not None:
            single = self._single.deployment()
            return MqttStDeployment(**common, pid=single.pid, benchmark_broker=single)
        return MqttStDeployment(
            **common, pid=self._serving_pid, endpoints=self._endpoints,
            edges=topology_edges(options.topology, options.brokers), root=self._root,
            convergence_s=(None if self._converged_ns is None
                           else (self._converged_ns - self._started_ns) / 1e9),
            faults=self._faults, root_at_end=self._final_root,
            cluster=None if self._cluster is None else self._cluster.deployment(),
            states_at_convergence=self._first_states, states_at_end=self._final_states)

    # -- teardown -----------------------------------------------------------------------

    def section_records(self) -> SectionRecords:
        if self._single is not None or self._options is None or not self._first_states:
            return {}
        options = self._options
        records: SectionRecords = {
            "brokers_deployed": [float(options.brokers)],
            "root": [] if self._root is None else [float(self._root)],
            "convergence_s": [] if self._converged_ns is None
            else [(self._converged_ns - self._started_ns) / 1e9],
            **{f"links.{role}": [float(n)] for role, n in link_counts(self._first_states).items()},
            **node_counter_records(self._final_states or self._first_states, options.keepalive_s),
            **self._load_records(),
        }
        if self._faults and self._final_root is not None and self._final_converged_ns:
            # the live nodes agreed on a tree again: when the last of them settled on it
            records["root_after_failure"] = [float(self._final_root)]
            records["reconvergence_s"] = [
                max(self._final_converged_ns - self._faults[0].at_ns, 0) / 1e9]
        return {name: values for name, values in records.items() if values}

    def _load_records(self) -> SectionRecords:
        """Per broker: CPU of its Mosquitto + node (and the node alone), their RSS."""
        records: SectionRecords = {}
        by_broker: dict[str, dict[str, list[BrokerResourceSample]]] = {}
        for name, sampler in self._samplers.items():
            kind, _, index = name.rpartition("-")
            by_broker.setdefault(index, {})[kind] = sampler.samples
        for index, kinds in sorted(by_broker.items()):
            cpu = [sum(s.cpu_percent for s in samples) / len(samples)
                   for samples in kinds.values() if samples]
            rss = [max(s.rss_bytes for s in samples) for samples in kinds.values() if samples]
            node = kinds.get("node") or []
            if cpu:
                records[f"brokers.{index}.cpu_percent_mean"] = [sum(cpu)]
                records[f"brokers.{index}.rss_bytes_max"] = [float(sum(rss))]
            if node:
                records[f"brokers.{index}.node_cpu_percent_mean"] = [
                    sum(s.cpu_percent for s in node) / len(node)]
        return records

    def teardown(self) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        self._stop_timer.set()
        if self._fault_timer is not None:
            self._fault_timer.join(timeout=5)
        for sampler in self._samplers.values():
            sampler.stop()
        if self._cluster is not None:
            self._final_states = self._cluster.states()
            self._final_root = self._cluster.converged_root()
            self._final_converged_ns = self._cluster.converged_at_ns()
            self._cluster.stop()
        if self._single is not None:
            self._single.teardown()
        if self._proxies is not None:
            self._proxies.close()
        if self._proxy_dir is not None:
            shutil.rmtree(self._proxy_dir, ignore_errors=True)


# -- reading the nodes' state files ------------------------------------------------------


def link_counts(states: list[dict[str, Any] | None]) -> dict[str, int]:
    """Links by role, each counted once: root (some node's root link), designated (the
    parent end of an active link), blocked (blocked at either end); links down at both
    ends are not counted."""
    roles: dict[frozenset[str], list[str]] = {}
    for state in states:
        if state is None:
            continue
        for link in state["links"]:
            roles.setdefault(frozenset((state["id"], link["peer"])), []).append(link["role"])
    counts = {"root": 0, "designated": 0, "blocked": 0}
    for ends in roles.values():
        if "blocked" in ends:
            counts["blocked"] += 1
        else:
            counts["root"] += "root" in ends
            counts["designated"] += "designated" in ends
    return counts


def node_counter_records(states: list[dict[str, Any] | None], keepalive_s: float
                         ) -> SectionRecords:
    """BPDU bytes all nodes sent per keep-alive over their lifetime, PINGREQ sizes, and
    what the nodes forwarded and dropped (nodes alive at the end: a killed node's last
    counters are lost with it)."""
    live = [s for s in states if s is not None]
    if not live:
        return {}

    def total(counter: str) -> list[float]:
        return [float(sum(s["counters"][counter] for s in live))]

    lifetime_s = max(s["written_at_ns"] - s["started_at_ns"] for s in live) / 1e9
    sizes = live[0]["counters"]["pingreq_bytes"]
    return {"signalling_bytes_per_keepalive": [
                total("signalling_bytes_sent")[0] * keepalive_s / lifetime_s]
            if lifetime_s > 0 else [],
            "pingreq_bytes_plain": [float(sizes["plain"])],
            "pingreq_bytes_mqtt_st": [float(sizes["bpdu"])],
            "forwarded": total("forwarded"), "discarded_blocked": total("discarded_blocked"),
            "deduplicated": total("deduplicated")}


def _sources_sha256() -> str:
    """One hash over the tree node's sources (what ran beside each Mosquitto)."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def unavailable() -> str | None:
    """Why the mqtt-st backend cannot deploy here: it needs Mosquitto."""
    return mosquitto_unavailable()
