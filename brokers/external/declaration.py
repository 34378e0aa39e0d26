"""The ``external`` backend, as mqttbed knows it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mqttbed.brokers.external.backend import unavailable
from mqttbed.brokers.external.options import Options
from mqttbed.core.backends import BackendDeclaration, BrokerFeatures
from mqttbed.core.broker_access import ListenerTransport


@contextmanager
def running_mosquitto() -> Iterator[dict[str, Any]]:
    """Options pointing at a Mosquitto started here for the example (and stopped after it:
    by this context, never by the backend)."""
    from mqttbed.brokers.mosquitto.backend import MosquittoBackend
    from mqttbed.brokers.mosquitto.backend import Options as MosquittoOptions
    from mqttbed.core.host import LocalHost

    broker = MosquittoBackend()
    endpoint = broker.deploy(MosquittoOptions(), LocalHost())
    try:
        yield {"url": f"mqtt://{endpoint.host}:{endpoint.port}",
               "sample": {"pid": broker.deployment().pid}}
    finally:
        broker.teardown()


DECLARATION = BackendDeclaration(
    name="external",
    summary="a broker that is already running, at a URL (never started or stopped by mqttbed)",
    options=Options,
    backend="mqttbed.brokers.external.backend:ExternalBackend",
    unavailable=unavailable,
    example_options=running_mosquitto,
    # what a url can reach; the features of one spec are its url's (Options.broker_features)
    features=BrokerFeatures(protocols=frozenset({"3.1.1", "5"}),
                            transports=frozenset(ListenerTransport), auth=True,
                            note="as the url and the declared features say"),
)
