"""Network namespaces: create, delete, list, and open sockets inside one from this process.

A socket belongs to the namespace it was created in for its whole life, so a test or a
controller can switch its thread into a namespace just long enough to create a socket
and then use it from the root namespace like any other.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

from mqttbed.network.commands import NetworkCommandError, ip

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000


def create(name: str) -> None:
    """Create the namespace ``name`` and bring its loopback up."""
    ip("netns", "add", name)
    ip("link", "set", "lo", "up", netns=name)


def delete(name: str) -> None:
    """Kill every process inside namespace ``name``, then delete it; absent is fine.

    The processes first: a namespace outlives its name while anything runs in it, so a
    broker or agent left by a killed run would keep its sockets and links alive unseen.
    """
    if not (NETNS_DIR / name).exists():
        return
    for pid in ip("netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    try:
        ip("netns", "delete", name)
    except NetworkCommandError:
        if (NETNS_DIR / name).exists():
            raise  # else another process deleted it meanwhile (two reapers of one run)


def names() -> list[str]:
    """The names of every named network namespace on this machine."""
    return sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into a network namespace failed: {os.strerror(err)}")


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the body with this thread in namespace ``name``, then switch back."""
    with open("/proc/thread-self/ns/net", "rb") as home, open(NETNS_DIR / name, "rb") as there:
        _setns(there.fileno())
        try:
            yield
        finally:
            _setns(home.fileno())


def socket_in(name: str, family: int = socket.AF_INET,
              kind: int = socket.SOCK_DGRAM, proto: int = 0) -> socket.socket:
    """A socket created inside namespace ``name``, usable from any thread afterwards."""
    with entered(name):
        return socket.socket(family, kind, proto)
