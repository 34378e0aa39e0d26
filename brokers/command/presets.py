"""Named brokers for the ``command`` backend: ``broker: {backend: command, preset: NAME}``.

A preset fills a command broker's fields (command, config template, version command,
environment, user, readiness timeout, features); fields given in the spec override the
preset's (``env`` key by key). The table is filled by the third-party broker presets.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mqttbed.brokers.command.templates import check_command, check_placeholders
from mqttbed.core.backends import BrokerFeatures


class CommandPreset(BaseModel):
    """A broker the ``command`` backend knows by name."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    command: str = Field(description="the command line, with {port}, {config}, {dir}")
    config_template: str | None = Field(None, description="written to {config}")
    version_command: str | None = Field(None, description="its output's first line is "
                                                          "the version")
    env: dict[str, str] = Field(default_factory=dict, description="environment; values "
                                                                   "take the placeholders")
    user: str | None = Field(None, description="run as this user")
    ready_timeout_s: float = Field(30.0, gt=0, description="how long it may take to answer")
    features: BrokerFeatures = Field(default_factory=BrokerFeatures,
                                     description="what the broker delivers")

    @field_validator("command", "version_command")
    @classmethod
    def _a_command_line(cls, text: str | None) -> str | None:
        if text is not None:
            check_command(text)
        return text

    @field_validator("config_template")
    @classmethod
    def _known_placeholders(cls, text: str | None) -> str | None:
        if text is not None:
            check_placeholders(text)
        return text


# name -> preset; see the module docstring.
PRESETS: dict[str, CommandPreset] = {}


def preset_names() -> list[str]:
    """The names of the known presets, sorted."""
    return sorted(PRESETS)


def preset(name: str) -> CommandPreset:
    """The preset called ``name``; ValueError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(preset_names()) or "none yet"
        raise ValueError(f"unknown preset {name!r}; known presets: {known}") from None
