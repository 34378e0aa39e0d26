"""The ``adaptive`` backend, as mqttbed knows it."""

from mqttbed.brokers.adaptive.backend import Options, unavailable
from mqttbed.brokers.adaptive.section import WithholdingFigures
from mqttbed.core.backends import BackendDeclaration, ServerCommand

DECLARATION = BackendDeclaration(
    name="adaptive",
    summary="seed 003's cloud-edge broker: size-aware withholding, lazy allocation",
    options=Options,
    backend="mqttbed.brokers.adaptive.backend:AdaptiveBackend",
    unavailable=unavailable,
    results_section=WithholdingFigures,
    standalone=ServerCommand("mqttbed.brokers.adaptive.server:main"),
)
