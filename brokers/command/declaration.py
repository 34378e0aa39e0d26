"""The ``command`` backend, as mqttbed knows it."""

from mqttbed.brokers.command.backend import unavailable
from mqttbed.brokers.command.options import Options
from mqttbed.core.backends import BackendDeclaration

DECLARATION = BackendDeclaration(
    name="command",
    summary="any broker started per run from a command template (or a named preset)",
    options=Options,
    backend="mqttbed.brokers.command.backend:CommandBackend",
    unavailable=unavailable,
)
