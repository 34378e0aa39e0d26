"""The contract every broker backend implements, and the registry of backends.

Optional parts, each looked up by the engine with getattr (a backend without one keeps
the engine's default):

- ``placements: ClassVar[tuple[str, ...]]``: the ``workload.placement`` values it takes
  (a backend that deploys several brokers); ``prepare(workload)`` is called before
  :meth:`BrokerBackend.deploy` with the run's workload, and ``broker_of(client) ->
  Endpoint`` after it, for each client: the broker that client uses.
- ``started(t_start_ns)``: the run's common start time (CLOCK_MONOTONIC) was handed out;
  a backend with a fault at a time of the run arms it here, and ``faults() ->
  list[Fault]`` says, after teardown, what it did and when (kept in the run's metadata;
  analytics measures the recovery from the events).

A backend that builds its own network also says where the run's agents must
run: ``agent_placement(roles, controller_url) -> AgentPlacement | None``, called by the
engine after :meth:`BrokerBackend.deploy`. ``roles[i]`` holds the client roles
(``"publisher"``, ``"subscriber"``) agent ``i`` will play; the backend returns one host
per agent, in that order, and the URL agents there reach the controller at. Backends
without the method (or returning None) keep the engine's default: the campaign's agent
hosts, or this machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.core.host import Host
from mqttbed.core.protocol import Endpoint
from mqttbed.core.samples import BrokerStatsSample
from mqttbed.core.sections import BackendSection, SectionRecords


class Fault(BaseModel):
    """A fault a backend caused during a run, on purpose (e.g. a broker killed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    at_ns: int = Field(description="when, on CLOCK_MONOTONIC of the controller's machine")
    what: str = Field(description="e.g. 'killed broker 2 (the root)'")


@dataclass(frozen=True)
class AgentPlacement:
    """Where a backend wants the run's agents: a host per agent, and the controller's URL
    as those hosts reach it."""

    hosts: list[Host]
    controller_url: str


@runtime_checkable
class BrokerBackend(Protocol):
    """A broker deployed per run: deploy, check, sample, tear down."""

    name: str
    # The figures this backend adds to the results (None: it adds none).
    results_section: ClassVar[type[BackendSection] | None]

    def deploy(self, spec: Any, host: Host) -> Endpoint:
        """Start the broker described by ``spec`` (the campaign's broker section) on ``host``."""
        ...

    def health(self) -> str | None:
        """Return None while healthy, else the reason the broker is unusable."""
        ...

    def stats(self) -> list[BrokerStatsSample]:
        """Return the resource samples taken since deploy."""
        ...

    def metadata(self) -> dict[str, Any]:
        """Return what was deployed: version, config text and hash, binary hash."""
        ...

    def section_records(self) -> SectionRecords:
        """Return, after teardown, the run's raw values for ``results_section``'s figures."""
        ...

    def teardown(self) -> None:
        """Stop the broker and remove everything it left; safe to call twice."""
        ...
