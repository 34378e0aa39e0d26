"""Running ``ip``, ``tc`` and ``bpftool``: one place that turns a failure into a clear error.

The network is built through these programs rather than netlink from Python: their
commands read the same in a log as in a terminal, which is what someone debugging a
half-built topology needs.
"""

from __future__ import annotations

import shutil
import subprocess

from mqttbed.core.errors import MissingSystemDependency, MqttbedError, system_deps_hint

COMMAND_TIMEOUT_S = 30
INSTALL_HINT = "install iproute2, bpftool and clang: " + system_deps_hint(
    "network", "iproute2 bpftool clang")


class NetworkCommandError(MqttbedError):
    """An ``ip``/``tc``/``bpftool`` command failed; the message has the command and its error."""

    def __init__(self, argv: list[str], returncode: int, stderr: str):
        super().__init__(f"`{' '.join(argv)}` failed (exit {returncode}): {stderr.strip()}")
        self.argv = argv
        self.stderr = stderr


def run(argv: list[str], *, check: bool = True, input_text: str | None = None) -> str:
    """Run ``argv`` and return its standard output; raise NetworkCommandError on failure."""
    if shutil.which(argv[0]) is None:
        raise MissingSystemDependency(f"`{argv[0]}` is not on PATH; {INSTALL_HINT}")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, input=input_text,
                              timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise NetworkCommandError(argv, -1, f"no answer after {COMMAND_TIMEOUT_S} s") from None
    if check and done.returncode != 0:
        raise NetworkCommandError(argv, done.returncode, done.stderr)
    return done.stdout


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """``ip [-n NETNS] ARGS``."""
    return run(["ip", *(("-n", netns) if netns else ()), *args], check=check)


def tc(*args: str, netns: str | None = None, check: bool = True) -> str:
    """``tc ARGS`` in namespace NETNS.

    Through ``nsenter --net`` rather than ``tc -n``: -n also remounts /sys, which hides
    the bpffs at /sys/fs/bpf that pinned programs are attached from.
    """
    enter = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
    return run([*enter, "tc", *args], check=check)


def bpftool(*args: str, check: bool = True) -> str:
    """``bpftool ARGS`` (in the root namespace: pins and maps are not per namespace)."""
    return run(["bpftool", *args], check=check)
