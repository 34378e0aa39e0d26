"""The ``external`` backend, as mqttbed knows it."""

from mqttbed.brokers.external.backend import unavailable
from mqttbed.brokers.external.options import Options
from mqttbed.core.backends import BackendDeclaration

DECLARATION = BackendDeclaration(
    name="external",
    summary="a broker that is already running, at a URL (never started or stopped by mqttbed)",
    options=Options,
    backend="mqttbed.brokers.external.backend:ExternalBackend",
    unavailable=unavailable,
)
