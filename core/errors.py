"""Errors a user or an operator can cause, each with a message that names the fix."""

from __future__ import annotations


class MqttbedError(Exception):
    """Base of every error mqttbed raises on purpose."""


class SpecError(MqttbedError):
    """A campaign spec is invalid; the message names the field and the bad value."""


class IllegalTransition(MqttbedError):
    """A run was asked to move between two states the state machine does not connect."""


class RunFailed(MqttbedError):
    """A run cannot finish; ``reason`` is what gets recorded with the run."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class BackendError(MqttbedError):
    """A broker backend could not be deployed or has died."""


class MissingSystemDependency(MqttbedError):
    """A program mqttbed needs is not installed; the message says how to install it."""


# The script that installs the system packages, by profile (scripts/system-deps.sh --help).
SYSTEM_DEPS_SCRIPT = "scripts/system-deps.sh"


def system_deps_hint(profile: str, packages: str) -> str:
    """How to install a missing system package: apt-get, or the checkout's one command.

    ``profile`` is the system-deps.sh profile that brings ``packages`` (with whatever else
    its targets need), so a message names the exact command; tests/test_install_profiles.py
    checks that every hint's profile lists its packages.
    """
    return (f"apt-get install {packages} (as root; in the mqttbed checkout "
            f"`{SYSTEM_DEPS_SCRIPT} {profile}` does it)")
