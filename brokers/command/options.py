"""The ``broker:`` section of the ``command`` backend."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from mqttbed.brokers.command.presets import CommandPreset, preset
from mqttbed.brokers.command.templates import TemplateChecks, placeholders_in
from mqttbed.core.backends import BrokerFeatures
from mqttbed.core.protocol import Transport

# What a preset may fill: every field of CommandPreset is also a field here.
PRESET_FIELDS = tuple(CommandPreset.model_fields)


class Options(TemplateChecks):
    """The broker section of a campaign spec for the ``command`` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: Literal["command"] = "command"
    preset: str | None = Field(
        None, description="a named broker (brokers/command/presets.py) whose command, "
                          "config_template, version_command, env, user, ready_timeout_s "
                          "and features fill the fields not given here")
    command: str | None = Field(
        None, description="the broker's command line, split like a shell would (nothing "
                          "expands); placeholders {port} (a free port mqttbed chose), "
                          "{config} (the rendered config_template's path), {dir} (the "
                          "run's private directory); {port} must appear here, in "
                          "config_template or in env")
    config_template: str | None = Field(
        None, description="the config file's text, with the same placeholders; written to "
                          "{config} before the command starts")
    version_command: str | None = Field(
        None, description="a command whose output's first line is the broker's version "
                          "(default: what the broker says on $SYS/broker/version, if any)")
    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables for the broker (values "
                                          "take the placeholders); merged over a preset's")
    user: str | None = Field(
        None, min_length=1, description="run the broker as this user (mqttbed must be "
                                        "root); the private directory is made theirs")
    ready_timeout_s: float = Field(
        30.0, gt=0, description="how long the broker may take to answer MQTT (a CONNECT "
                                "answered by a CONNACK; a PINGREQ over UDP)")
    stop_grace_s: float = Field(
        5.0, ge=0, description="at teardown, seconds between SIGTERM and SIGKILL to the "
                               "broker's whole process group")
    transport: Transport = Field(Transport.MQTT_TCP, description="what the agents speak to it")
    features: BrokerFeatures = Field(
        default_factory=BrokerFeatures,
        description="what the broker delivers (default: a preset's, else every QoS level)")
    sys_topics: bool = Field(True, description="subscribe to $SYS/# and keep the numeric "
                                               "values the broker publishes there")
    stats_interval_s: float = Field(0.2, gt=0, description="seconds between resource "
                                                           "samples of its process tree")

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: Any) -> Any:
        """Fill the fields the spec leaves out from the named preset (an unknown name is
        left to the ``preset`` field's own check, which names it)."""
        if not isinstance(data, dict) or not isinstance(data.get("preset"), str):
            return data
        try:
            named = preset(data["preset"])
        except ValueError:
            return data
        filled = dict(data)
        for field in PRESET_FIELDS:
            value = getattr(named, field)
            if field == "env":
                filled["env"] = {**named.env, **(data.get("env") or {})}
            elif field not in data:
                filled[field] = value
        return filled

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, name: str | None) -> str | None:
        if name is not None:
            preset(name)
        return name

    @model_validator(mode="after")
    def _broker_is_told_its_port(self) -> Options:
        if self.command is None:
            raise ValueError("give command (the broker's command line, with {port}) or a "
                             "preset")
        # what the process is told: its command line and its environment
        told = placeholders_in(self.command)
        for value in self.env.values():
            told |= placeholders_in(value)
        if "port" not in told | placeholders_in(self.config_template or ""):
            raise ValueError(f"command {self.command!r}: {{port}} appears nowhere (command, "
                             "config_template or env): the broker must listen on the port "
                             "mqttbed chooses")
        if self.config_template is not None and "config" not in told:
            raise ValueError("config_template is written to {config}, but neither command "
                             "nor env names {config}: the broker would never read it")
        return self

    def broker_features(self) -> BrokerFeatures:
        """What the broker delivers: the spec's features, else the preset's, else all QoS."""
        return self.features
