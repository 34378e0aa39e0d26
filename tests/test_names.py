"""Names that meant two or three things stay resolved (issue 26).

"stats" is the campaign's results document only (``stats.json``, ``analytics/stats.py``);
a backend's CPU/RSS readings are its ``resource_samples()`` (:class:`BrokerResourceSample`);
an in-broker server's own counts are its ``counters_snapshot()``; the native engine's
per-client figures are ``client_counters(client)``. "registry" in the controller is always
qualified: ``agent_registry`` (who is connected) or ``metrics_registry()`` (Prometheus').
These tests fail if an old name comes back, on the contract or on any built-in backend.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from mqttbed.core import backends
from mqttbed.core.backends import BrokerBackend

# object -> the names issue 26 retired from it, and the names that replaced them
BACKEND_OLD, BACKEND_NEW = ("stats",), ("resource_samples",)
SERVER_OLD, SERVER_NEW = ("stats",), ("counters_snapshot",)


def old_names_found(owner: object, old: tuple[str, ...], new: tuple[str, ...]) -> list[str]:
    """What of ``owner`` still goes by a retired name, or misses its new one."""
    shown = getattr(owner, "__qualname__", type(owner).__qualname__)
    return ([f"{shown}.{name} is back (retired by issue 26)" for name in old
             if hasattr(owner, name)]
            + [f"{shown}.{name} is missing" for name in new if not hasattr(owner, name)])


def test_the_name_check_sees_an_old_name_and_a_missing_new_one():
    class OldBackend:
        def stats(self) -> list[object]:
            return []

    class Renamed:
        def resource_samples(self) -> list[object]:
            return []

    assert old_names_found(OldBackend, BACKEND_OLD, BACKEND_NEW) == [
        f"{OldBackend.__qualname__}.stats is back (retired by issue 26)",
        f"{OldBackend.__qualname__}.resource_samples is missing"]
    assert old_names_found(Renamed, BACKEND_OLD, BACKEND_NEW) == []
    assert not isinstance(OldBackend(), BrokerBackend)


def test_the_backend_contract_calls_resource_samples_not_stats():
    assert old_names_found(BrokerBackend, BACKEND_OLD, BACKEND_NEW) == []
    from mqttbed.core import samples
    assert hasattr(samples, "BrokerResourceSample")
    assert not hasattr(samples, "BrokerStatsSample")


@pytest.mark.parametrize("name", backends.backend_names())
def test_every_backend_class_calls_its_samples_resource_samples(name):
    cls = backends.declaration(name).backend_class()
    assert old_names_found(cls, BACKEND_OLD, BACKEND_NEW) == []


def test_the_in_broker_servers_hand_out_counters_not_stats():
    from mqttbed.agents.native.engine import Engine
    from mqttbed.brokers.adaptive.broker import AdaptiveBroker
    from mqttbed.brokers.fpga.server import FpgaModelServer
    from mqttbed.brokers.mqttsn.server import GatewayServer
    from mqttbed.brokers.mqttst.node import Node

    found = [hit for server in (AdaptiveBroker, FpgaModelServer, GatewayServer, Node)
             for hit in old_names_found(server, SERVER_OLD, SERVER_NEW)]
    assert found + old_names_found(Engine, ("stats",), ("client_counters",)) == []


def test_the_controller_names_its_registries(tmp_path):
    from prometheus_client.registry import CollectorRegistry

    from mqttbed.controller import prometheus
    from mqttbed.controller.agent_registry import AgentRegistry
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.engine import EngineContext
    from mqttbed.core.settings import Settings

    assert "registry" not in {f.name for f in fields(EngineContext)}
    assert "agent_registry" in {f.name for f in fields(EngineContext)}
    assert not hasattr(prometheus, "controller_registry")
    controller = create_controller(Settings(data_dir=tmp_path), controller_url="")
    try:
        assert old_names_found(controller, ("registry",), ("agent_registry",)) == []
        assert isinstance(controller.agent_registry, AgentRegistry)
        assert isinstance(controller.metrics, CollectorRegistry)
    finally:
        controller.close()


def test_a_backend_with_the_old_method_name_is_refused_naming_the_new_one(monkeypatch):
    import dataclasses
    import sys
    import types

    class OldPlugin:  # a plug-in backend written before the rename: all but one method
        name = "old"

        def deploy(self, spec: object, host: object) -> None: ...
        def health(self) -> None: ...
        def stats(self) -> list[object]: return []
        def deployment(self) -> None: ...
        def section_records(self) -> None: ...
        def teardown(self) -> None: ...

    module = types.ModuleType("old_plugin")
    module.OldPlugin = OldPlugin  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "old_plugin", module)
    declaration = dataclasses.replace(backends.declaration("mosquitto"),
                                      backend="old_plugin:OldPlugin")
    with pytest.raises(TypeError, match=r"^old_plugin:OldPlugin does not implement "
                                        r"BrokerBackend: it has no resource_samples$"):
        declaration.create()
