"""Open a scope by VISA resource and dialect name.

``open_scope("TCPIP0::192.168.1.50::5555::SOCKET", "rigol-ds1000z")`` opens the resource
with pyvisa-py (``pyvisa.ResourceManager("@py")``) unless a resource manager is given, and
returns the dialect's driver around it. Raw ``::SOCKET`` resources carry no message framing,
so reads and writes are terminated with a newline there (the guides' terminator); VXI-11
(``::INSTR``) and USBTMC resources keep pyvisa's defaults.
"""

from __future__ import annotations

from typing import Any

from mqttbed.instruments.scope.base import Oscilloscope, ScopeDriver
from mqttbed.instruments.scope.keysight import KeysightInfiniiVisionX
from mqttbed.instruments.scope.rigol import RigolDS1000Z

DRIVERS: dict[str, type[ScopeDriver]] = {
    driver.dialect: driver for driver in (RigolDS1000Z, KeysightInfiniiVisionX)
}


def driver_class(dialect: str) -> type[ScopeDriver]:
    """The driver for ``dialect``; ValueError listing the known dialects otherwise."""
    try:
        return DRIVERS[dialect]
    except (KeyError, TypeError):
        raise ValueError(f"unknown oscilloscope dialect {dialect!r}; known dialects: "
                         + ", ".join(sorted(DRIVERS))) from None


class _OwnedResource:
    """A pyvisa resource that also closes the resource manager opened for it."""

    def __init__(self, resource: Any, resource_manager: Any):
        self._resource = resource
        self._resource_manager = resource_manager

    def write(self, command: str) -> object:
        return self._resource.write(command)

    def query(self, command: str) -> str:
        return self._resource.query(command)

    def close(self) -> None:
        try:
            self._resource.close()
        finally:
            self._resource_manager.close()


def open_scope(resource: str, dialect: str, *, resource_manager: Any = None) -> Oscilloscope:
    """Open ``resource`` over VISA and return the driver for ``dialect``."""
    driver = driver_class(dialect)
    import pyvisa  # lazy: only the controller extra installs it
    from pyvisa.resources import MessageBasedResource

    owned = resource_manager is None
    manager = pyvisa.ResourceManager("@py") if owned else resource_manager
    try:
        instrument = manager.open_resource(resource)
    except Exception:
        if owned:
            manager.close()
        raise
    if not isinstance(instrument, MessageBasedResource):  # e.g. a GPIB interface board
        instrument.close()
        if owned:
            manager.close()
        raise ValueError(f"VISA resource {resource!r} is a {type(instrument).__name__}, not an "
                         "instrument that takes SCPI messages; give the scope's resource")
    if resource.strip().upper().endswith("::SOCKET"):
        instrument.read_termination = "\n"
        instrument.write_termination = "\n"
    return driver(_OwnedResource(instrument, manager) if owned else instrument)
