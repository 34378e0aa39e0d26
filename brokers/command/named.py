"""Third-party brokers by name: each preset of :mod:`.presets` as a backend of its own.

``broker: {backend: rabbitmq}`` is ``broker: {backend: command, preset: rabbitmq}`` with the
broker's name kept everywhere a result is labelled (report curves, the ranking, the run's
record), and the conformance suite run on it. Every other field of the ``command``
backend may still be given, and overrides the preset's.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from mqttbed.brokers.command.backend import CommandBackend
from mqttbed.brokers.command.backend import unavailable as command_unavailable
from mqttbed.brokers.command.options import Options
from mqttbed.brokers.command.presets import preset
from mqttbed.core.backends import BackendDeclaration


class PresetOptions(Options):
    """A preset's own backend: its options name the preset, which fills what is left out."""

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        name = cls.model_fields["preset"].default
        if isinstance(data, dict):
            return {**data, "backend": data.get("backend", name), "preset": name}
        return data


class RabbitMqOptions(PresetOptions):
    """The broker section of a campaign spec for the ``rabbitmq`` backend."""

    backend: Literal["rabbitmq"] = "rabbitmq"  # type: ignore[assignment]  # the subtype's tag
    preset: Literal["rabbitmq"] = "rabbitmq"


class NatsOptions(PresetOptions):
    """The broker section of a campaign spec for the ``nats`` backend."""

    backend: Literal["nats"] = "nats"  # type: ignore[assignment]  # the subtype's tag
    preset: Literal["nats"] = "nats"


class AmqttOptions(PresetOptions):
    """The broker section of a campaign spec for the ``amqtt`` backend."""

    backend: Literal["amqtt"] = "amqtt"  # type: ignore[assignment]  # the subtype's tag
    preset: Literal["amqtt"] = "amqtt"


class RabbitMqBackend(CommandBackend):
    """RabbitMQ's MQTT plugin, a private node per run (the ``rabbitmq`` preset)."""

    name = "rabbitmq"
    options_model = RabbitMqOptions


class NatsBackend(CommandBackend):
    """NATS server's MQTT support with JetStream, per run (the ``nats`` preset)."""

    name = "nats"
    options_model = NatsOptions


class AmqttBackend(CommandBackend):
    """amqtt, the Python broker, per run (the ``amqtt`` preset)."""

    name = "amqtt"
    options_model = AmqttOptions


def _needs(program: str, install: str) -> str | None:
    """Why the preset cannot run here: its program is missing (and how to install it)."""
    if (reason := command_unavailable()) is not None:
        return reason
    if shutil.which(program) is None and not any(
            shutil.which(program, path=p) for p in ("/usr/sbin", "/usr/lib/rabbitmq/bin")):
        return f"{program} is not installed; {install} (`make install` does)"
    return None


def _declare(name: str, summary: str, options: type[Options], backend: type[CommandBackend],
             program: str, install: str) -> BackendDeclaration:
    return BackendDeclaration(
        name=name, summary=summary, options=options,
        backend=f"{__name__}:{backend.__name__}",
        unavailable=lambda: _needs(program, install),
        features=preset(name).features)


RABBITMQ = _declare("rabbitmq", "RabbitMQ's MQTT plugin, a private node per run",
                    RabbitMqOptions, RabbitMqBackend, "rabbitmq-server",
                    "apt-get install rabbitmq-server")
NATS = _declare("nats", "NATS server's MQTT support (JetStream), per run", NatsOptions,
                NatsBackend, "nats-server", "apt-get install nats-server")
AMQTT = _declare("amqtt", "amqtt, the asyncio Python broker, per run", AmqttOptions,
                 AmqttBackend, str(Path(sys.executable).parent / "amqtt"),
                 "pip install 'mqttbed[brokers]'")
