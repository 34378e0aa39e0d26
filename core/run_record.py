"""What a run recorded, as one typed document: :class:`RunRecord`.

The engine builds a run's record as the run goes (the broker's deployment and endpoint,
where the agents ran and which clients each ran, their clocks and GPIO lines, the scope,
the network, the start time, delivery counts, generator reports, each client's connect
phases, faults, retries) and
writes it to the run's row (``RunRow.run_metadata``, JSON) at every transition, validated
on the way in. Analytics, export and report read it back with :func:`run_record`, never
a key of the JSON.

Rows written by older versions load too: every field of a run that may not have got that
far, or that an older version did not record, is optional or has a default, and keys an
older version wrote that no longer exist (``subscribe_order``) are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mqttbed.core.backends import DeploymentRecord, Fault
from mqttbed.core.broker_access import ConnectPhases
from mqttbed.core.errors import MqttbedError
from mqttbed.core.protocol import ClientReconnects, ClockEstimate, Endpoint, GeneratorReport

DeploymentT = TypeVar("DeploymentT", bound=DeploymentRecord)


class _Fact(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokerDeployment(DeploymentRecord):
    """The broker's deployment as recorded: the fields every backend has, typed here.

    A backend records more in its own :class:`DeploymentRecord` subclass (Mosquitto's
    queue limits, MQTT-ST's tree); core cannot name those types, so their fields are kept
    as the backend's model dumped them (validated by it when the run recorded them) and
    read typed again with :meth:`as_type`.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    def as_type(self, model: type[DeploymentT]) -> DeploymentT:
        """This deployment as the backend's own record type (e.g. ``MosquittoDeployment``)."""
        return model.model_validate(self.model_dump(mode="json"))


class GpioLine(_Fact):
    """An agent's GPIO backend and how long one toggle of its line takes."""

    backend: str
    toggle_ns: int | None = None
    driver: str = Field("", description="what drove the lines during the run: 'native' "
                                        "(the C engine, right where it records each edge) "
                                        "or 'python'")
    chip: str | None = Field(None, description="the GPIO character device the native "
                                               "engine drove the lines on (uAPI v2)")


class ScopeLine(_Fact):
    """One scope channel's probe: the client it watched, where that client ran, its line."""

    client: str
    role: str = Field("", description="publisher, first subscriber, last subscriber, "
                                      "subscriber <rank>")
    agent: str = Field(description="the agent id that ran the client")
    host: str | None = Field(None, description="the host the agent ran on (a lab host's "
                                               "name, or 'local'); None: not known")
    bcm_pin: int = Field(description="the GPIO line (BCM number, gpiod line offset)")
    header_pin: int | None = Field(None, description="its pin on a 40-pin header")


class ScopeSetup(_Fact):
    """The oscilloscope that watched the run, and what it acquired.

    The counts are None until the run's collection (a run that failed before has none).
    """

    resource: str
    dialect: str
    identity: str = ""
    channels: dict[str, str] = Field(default_factory=dict,
                                     description="scope channel -> client id probed")
    wiring: dict[str, ScopeLine] = Field(
        default_factory=dict, description="scope channel -> the line it probed: client, "
                                          "agent, host, BCM pin (empty in records from "
                                          "before it was kept)")
    acquisitions: int | None = None
    requested: int | None = None
    shortfall: int = 0
    timeouts: int | None = None
    error: str | None = None


class ImpairedGroup(_Fact):
    """One group of clients behind an impaired link, and how the link was built."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    rate_kbit: int | None = None
    clients: list[str] = Field(default_factory=list)
    namespace: str | None = None
    proxy: str | None = Field(None, description="address:port of its delay proxy")
    commands: list[str] = Field(default_factory=list, description="tc/iptables, as run")
    # Free-form JSON the delay proxy (a subprocess) writes about itself: releases, bytes,
    # lateness percentiles; its shape is the proxy's, not the run's.
    proxy_stats: dict[str, Any] | None = None
    packets_dropped: dict[str, int] | None = Field(
        None, description="by the iptables rules, per direction (None: none were set)")


class NetworkRecord(_Fact):
    """The impaired network the run built for its clients."""

    mechanism: str | None = None
    netem_available: bool | None = None
    iptables: str | None = None
    semantics: str = ""
    topology_prefix: str | None = None
    groups: dict[str, ImpairedGroup] = Field(default_factory=dict)


class DeliveryCounts(_Fact):
    """What one agent said it published and received (``Done``)."""

    published: int
    received: int
    upload_retries: int = 0


class CgroupVersion(StrEnum):
    """Which kernel interface holds the quota."""

    V1 = "cgroup-v1"   # cpu.cfs_period_us + cpu.cfs_quota_us
    V2 = "cgroup-v2"   # cpu.max



class BrokerBudget(BaseModel):
    """One broker's cgroup, and what the quota did to it."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="the broker's cgroup directory")
    pids: list[int] = Field(description="the processes moved in at deploy (root first)")
    periods: int | None = Field(None, description="quota periods in which it ran")
    throttled_periods: int | None = Field(None, description="periods it used up its quota "
                                                            "in and had to wait")
    throttled_s: float | None = Field(None, description="time it spent waiting")
    cpus: list[int] | None = Field(None, description="the CPUs its processes were confined "
                                                     "to (a budget under one core: one CPU, "
                                                     "as on a small host); None: any")


class CpuBudgetRecord(BaseModel):
    """What a run's CPU budget was: cores per broker, the mechanism, where, and its effect."""

    model_config = ConfigDict(extra="forbid")
    cores: float = Field(description="per broker, e.g. 0.25 = a quarter of one core")
    mechanism: CgroupVersion
    period_us: int
    quota_us: int
    path: str = Field(description="the run's cgroup directory (removed at teardown)")
    brokers: dict[str, BrokerBudget] = Field(default_factory=dict)


class RunRecord(BaseModel):
    """What one run recorded; the engine fills it in as the run goes.

    Fields are assigned one at a time (each assignment validated); :meth:`stored` is the
    JSON the run's row keeps, with only the fields the run got as far as recording.
    """

    # Keys an older version wrote and this one no longer does are ignored on load.
    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    broker: BrokerDeployment | None = None
    endpoint: Endpoint | None = None
    host: str | None = Field(None, description="where the broker ran (a lab host's name, "
                                               "or 'local')")
    agent_hosts: dict[str, str] = Field(default_factory=dict,
                                        description="agent name -> host it ran on")
    agents: dict[str, list[str]] = Field(default_factory=dict,
                                         description="agent id -> its client ids")
    scope: ScopeSetup | None = None
    network: NetworkRecord | None = None
    subscribe_s: float | None = Field(None, description="from the first SUBSCRIBE to the "
                                                        "last agent ready")
    deploy_s: float | None = Field(None, ge=0, description=(
        "seconds from the run's start to every agent ready: the broker's start, the "
        "agents' (or the kept ones'), connections and subscriptions; not the analysis hold"))
    agent_clocks: dict[str, ClockEstimate] = Field(default_factory=dict)
    gpio: dict[str, GpioLine] = Field(default_factory=dict)
    t_start_ns: int | None = Field(None, description="the run's common start time, on the "
                                                     "controller's CLOCK_MONOTONIC")
    analysis_start_wait_s: float | None = Field(
        None, ge=0, description="seconds the deployed run held its measurement for the "
                                "analysis: while its JVM started and warmed up (a "
                                "campaign's first run), or the run before was analysed")
    delivery_counts: dict[str, DeliveryCounts] = Field(default_factory=dict)
    generators: dict[str, GeneratorReport] = Field(default_factory=dict)
    connections: dict[str, list[ConnectPhases]] = Field(
        default_factory=dict, description="agent id -> each connection its clients made, "
                                          "phase by phase (Done.connections); empty for a "
                                          "run from before they were timed")
    reconnects: dict[str, list[ClientReconnects]] = Field(
        default_factory=dict, description="agent id -> its persistent or reconnecting "
                                          "clients' absences and returns (Done.reconnects: "
                                          "workload.sessions, workload.reconnect)")
    faults: list[Fault] = Field(default_factory=list)
    retry_of: str | None = Field(None, description="the interrupted attempt this one retries")
    retried_as: str | None = Field(None, description="the attempt that retried this one")
    cpu_budget: CpuBudgetRecord | None = Field(None, description="the brokers' cgroup CPU "
                                                                 "quota (broker.cpu_limit)")

    def stored(self) -> dict[str, Any]:
        """The JSON the run's row keeps: the fields recorded so far, checked to load back."""
        data = self.model_dump(mode="json", include=set(self.model_fields_set))
        RunRecord.model_validate(data)
        return data


class BadRunRecord(MqttbedError):
    """A run's stored record does not load as a :class:`RunRecord`."""


def run_record(metadata: Mapping[str, Any] | None, run_id: str = "") -> RunRecord:
    """The record of a run from its row's ``run_metadata`` (None or empty: nothing yet)."""
    try:
        return RunRecord.model_validate(dict(metadata or {}))
    except ValidationError as exc:
        where = f"run {run_id}" if run_id else "a run"
        problems = "; ".join(f"{'.'.join(str(part) for part in error['loc'])} = "
                             f"{error['input']!r}: {error['msg']}" for error in exc.errors())
        raise BadRunRecord(f"the stored record of {where} does not load: {problems}") from exc
