"""The ``command`` backend, as mqttbed knows it."""

from functools import partial

from mqttbed.brokers.command.backend import unavailable
from mqttbed.brokers.command.options import Options
from mqttbed.core.backends import BackendDeclaration, fixed_options

DECLARATION = BackendDeclaration(
    name="command",
    summary="any broker started per run from a command template (or a named preset)",
    options=Options,
    backend="mqttbed.brokers.command.backend:CommandBackend",
    unavailable=unavailable,
    # Mosquitto from a template: the example needs only what this machine has
    example_options=partial(fixed_options, command="mosquitto -c {config}",
                            config_template="listener {port} 127.0.0.1\n"
                                            "allow_anonymous true\n"),
)
