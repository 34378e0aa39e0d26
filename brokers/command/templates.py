"""The placeholders of a broker command, its config template and its environment.

A placeholder is a name in braces: ``{port}`` (the TCP/UDP port mqttbed chose),
``{config}`` (the rendered config file's path) and ``{dir}`` (the run's private
directory). Any other ``{name}`` is refused, so a typo never reaches a broker. Braces
that do not hold a bare name (``{ "a": 1 }``, ``[{rabbit, [...]}]``) are kept as they
are, so config formats with braces need no escaping; ``{{port}}`` is a literal ``{port}``.
A command is split into words like a POSIX shell would (quotes group, nothing expands),
then each word is rendered: a path with spaces stays one argument.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from pydantic import BaseModel, field_validator

PLACEHOLDERS = ("port", "config", "dir")
# a doubled name first (the escape), else a name in single braces
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_]\w*)\}\}|\{([A-Za-z_]\w*)\}")


def placeholders_in(text: str) -> set[str]:
    """The placeholder names ``text`` uses (escaped ones not counted)."""
    return {match.group(2) for match in _PLACEHOLDER.finditer(text) if match.group(2)}


def check_placeholders(text: str) -> None:
    """Raise ValueError naming the first unknown placeholder of ``text``."""
    for name in sorted(placeholders_in(text) - set(PLACEHOLDERS)):
        known = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
        raise ValueError(f"unknown placeholder {{{name}}}; the placeholders are {known} "
                         f"(write {{{{{name}}}}} for a literal {{{name}}})")


def check_command(text: str) -> None:
    """Raise ValueError unless ``text`` is a command line with known placeholders."""
    check_placeholders(text)
    try:
        words = shlex.split(text)
    except ValueError as exc:   # an unclosed quote
        raise ValueError(f"cannot split {text!r} into words: {exc}") from None
    if not words:
        raise ValueError("the command is empty")


def render(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each placeholder replaced by its value (escapes made literal)."""

    def replace(match: re.Match[str]) -> str:
        escaped, name = match.groups()
        return f"{{{escaped}}}" if escaped else values[name]

    return _PLACEHOLDER.sub(replace, text)


def render_command(text: str, values: Mapping[str, str]) -> list[str]:
    """The argv of command line ``text``: split into words, then each word rendered."""
    return [render(word, values) for word in shlex.split(text)]


class TemplateChecks(BaseModel):
    """The checks of every model that holds a broker's command template (the backend's
    options and each preset): a command that splits, placeholders it knows."""

    @field_validator("command", "version_command", check_fields=False)
    @classmethod
    def _a_command_line(cls, text: str | None) -> str | None:
        if text is not None:
            check_command(text)
        return text

    @field_validator("config_template", check_fields=False)
    @classmethod
    def _known_placeholders(cls, text: str | None) -> str | None:
        if text is not None:
            check_placeholders(text)
        return text

    @field_validator("env", check_fields=False)
    @classmethod
    def _env_placeholders(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            try:
                check_placeholders(value)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return env
