"""Any broker from a command line: the ``command`` backend.

``broker: {backend: command, command: "mosquitto -c {config}", config_template: ...}``
or ``broker: {backend: command, preset: NAME}``. mqttbed picks the port, renders the
config into a private directory, starts the command, waits until it answers MQTT,
samples it, reads its ``$SYS`` topics, and stops its whole process group at teardown.

- :mod:`.templates`: the placeholders ``{port}``, ``{config}``, ``{dir}`` and rendering.
- :mod:`.presets`: named brokers (:class:`~.presets.CommandPreset`).
- :mod:`.options`: the ``broker:`` section; a preset fills what it leaves out.
- :mod:`.backend`: the backend; :mod:`.declaration`: what mqttbed knows of it.
"""

from mqttbed.brokers.command.declaration import DECLARATION

__all__ = ["DECLARATION"]
