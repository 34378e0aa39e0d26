"""A journal of every process group a controller starts, so none outlives it unnoticed.

Every local process (:class:`~mqttbed.core.host.LocalHost`) leads a process group of its
own. While a journal is installed (a controller between ``start()`` and ``stop()``) each
spawn is written to ``DATA_DIR/processes/TAG.json`` *before* the spawn returns, with the
controller's pid and start time, and the process gets ``MQTTBED_JOURNAL=TAG`` in its
environment, which every process it forks inherits. A controller killed with SIGKILL
leaves its journal behind; the next controller on the same data dir
(:func:`reap_stale`) kills whatever still carries the dead one's tag, in the recorded
groups first and then anywhere (a child that started a session of its own), and removes
the journal. The tag is what makes it safe: a recorded pgid that the kernel has since
given to an unrelated process does not carry it, so nothing else is ever killed.

The same idea as the topology journal (:mod:`mqttbed.network.topology`), which records
kernel objects (namespaces, links) under /run; this one records processes, per data dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from mqttbed.core.procfs import pids, process_strings, start_time, with_environment

JOURNAL_ENV = "MQTTBED_JOURNAL"
JOURNAL_SUBDIR = "processes"


def carries_tag(pid: int, tag: str) -> bool:
    """Whether process ``pid`` has ``MQTTBED_JOURNAL=tag`` in its environment (read
    again if it is in the middle of an ``execve``: :func:`mqttbed.core.procfs.process_strings`)."""
    return f"{JOURNAL_ENV}={tag}".encode() in (process_strings(pid, "environ") or [])


@dataclass(frozen=True)
class ReapedJournal:
    """What :func:`reap_stale` found of one dead controller: its pid and what it killed."""

    tag: str
    controller_pid: int
    groups: tuple[int, ...]
    killed: tuple[int, ...]


class ProcessJournal:
    """The journal of one controller: the process groups it started and has not stopped."""

    def __init__(self, data_dir: Path):
        self.directory = Path(data_dir) / JOURNAL_SUBDIR
        self.tag = secrets.token_hex(8)
        self.path = self.directory / f"{self.tag}.json"
        self._groups: dict[int, list[str]] = {}
        self._lock = threading.Lock()

    def open(self) -> ProcessJournal:
        """Write the (empty) journal with this process's identity."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._write()
        return self

    def env(self) -> dict[str, str]:
        """What every process spawned under this journal gets in its environment."""
        return {JOURNAL_ENV: self.tag}

    def record(self, pgid: int, argv: list[str]) -> None:
        """Note a process group just started (its leader's pid is ``pgid``)."""
        with self._lock:
            self._groups[pgid] = list(argv)
            self._write()

    def forget(self, pgid: int) -> None:
        """Drop a group that was stopped."""
        with self._lock:
            if self._groups.pop(pgid, None) is not None:
                self._write()

    @property
    def groups(self) -> list[int]:
        with self._lock:
            return list(self._groups)

    def close(self) -> None:
        """Remove the journal (the controller stopped everything it started)."""
        self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        pid = os.getpid()
        document = {"pid": pid, "start": start_time(pid),
                    "groups": [{"pgid": g, "argv": a} for g, a in self._groups.items()]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(document))
        tmp.replace(self.path)


def tagged_processes(tag: str) -> list[int]:
    """Pids of live processes (not zombies) whose environment carries ``tag``."""
    return with_environment(f"{JOURNAL_ENV}={tag}")


def _group_members(pgid: int) -> list[int]:
    members = []
    for pid in pids():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pgid:
                members.append(pid)
    return members


def reap_stale(data_dir: Path) -> list[ReapedJournal]:
    """Kill what dead controllers on ``data_dir`` left running; remove their journals.

    A journal whose controller (pid and start time) still runs is left alone: that
    controller owns its processes. Everything else tagged with a dead controller's tag
    gets SIGKILL: the recorded groups first, then any tagged process elsewhere.
    """
    directory = Path(data_dir) / JOURNAL_SUBDIR
    reaped = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            document = json.loads(path.read_text())
            owner, owner_start = int(document["pid"]), document.get("start")
            groups = [int(g["pgid"]) for g in document.get("groups", [])]
        except (OSError, ValueError, KeyError, TypeError):
            owner, owner_start, groups = -1, None, []
        if owner > 0 and owner_start is not None and start_time(owner) == owner_start:
            continue  # its controller is alive (perhaps this one)
        tag = path.stem
        victims = [pid for group in groups for pid in _group_members(group)
                   if carries_tag(pid, tag)]
        victims += [pid for pid in tagged_processes(tag) if pid not in victims]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        path.unlink(missing_ok=True)
        path.with_suffix(".tmp").unlink(missing_ok=True)
        reaped.append(ReapedJournal(tag, owner, tuple(groups), tuple(victims)))
    return reaped
