"""The broker backends mqttbed knows, by the name a campaign spec uses for them.

Backend modules are imported only when a backend is asked for, so listing names (for a
CLI's help or a spec error message) never pays for a backend's imports.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pydantic import BaseModel

from mqttbed.brokers.base import BrokerBackend
from mqttbed.core.sections import BackendSection

# name -> "module:Class". Each module also exposes ``Options``, the pydantic model of the
# campaign's broker section for that backend, and ``unavailable()``: why it cannot be
# deployed on this machine with default options, or None.
BACKENDS: dict[str, str] = {
    "mosquitto": "mqttbed.brokers.mosquitto:MosquittoBackend",
    "fpga": "mqttbed.brokers.fpga.backend:FpgaBackend",
    "forkpipe": "mqttbed.brokers.forkpipe.backend:ForkPipeBackend",
    "mqtt-sn": "mqttbed.brokers.mqttsn.backend:MqttSnBackend",
    "p4": "mqttbed.brokers.p4.backend:P4Backend",
    "mqtt-st": "mqttbed.brokers.mqttst.backend:MqttStBackend",
    "adaptive": "mqttbed.brokers.adaptive.backend:AdaptiveBackend",
}


def backend_names() -> list[str]:
    """Return the registered backend names, sorted."""
    return sorted(BACKENDS)


def _target(name: str) -> tuple[ModuleType, str]:
    """Import the module of backend ``name``; return it with the backend class name."""
    try:
        target = BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown broker backend {name!r}; available: "
                         f"{', '.join(backend_names())}") from None
    module_name, _, class_name = target.partition(":")
    return importlib.import_module(module_name), class_name


def options_model(name: str) -> type[BaseModel]:
    """Return the pydantic model that validates backend ``name``'s options."""
    module, _ = _target(name)
    return module.Options


def backend_class(name: str) -> type[BrokerBackend]:
    """Return the class of backend ``name``."""
    module, class_name = _target(name)
    return getattr(module, class_name)


def section_types() -> tuple[type[BackendSection], ...]:
    """The results sections the registered backends declare (imports every backend)."""
    found = (backend_class(name).results_section for name in backend_names())
    return tuple(section for section in found if section is not None)


def create_backend(name: str) -> BrokerBackend:
    """Return a new, undeployed instance of backend ``name``."""
    backend = backend_class(name)()
    if not isinstance(backend, BrokerBackend):
        # A registry entry pointing at a class that misses part of the contract is a
        # programming error; catching it here beats an AttributeError mid-run.
        raise TypeError(f"{BACKENDS[name]} does not implement BrokerBackend")
    return backend


def unavailable_reason(name: str) -> str | None:
    """Why backend ``name`` cannot be deployed here with default options, or None."""
    module, _ = _target(name)
    return module.unavailable()
