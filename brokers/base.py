"""The contract every broker backend implements, and the registry of backends."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

from mqttbed.core.host import Host
from mqttbed.core.protocol import Endpoint
from mqttbed.core.samples import BrokerStatsSample
from mqttbed.core.sections import BackendSection, SectionRecords


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
