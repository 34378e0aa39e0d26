"""Finding the process of a broker mqttbed did not start, to sample it (never to signal it):
on this machine (psutil), or on a lab host over SSH (:mod:`mqttbed.brokers.remote_sampling`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field

from mqttbed.brokers.remote_sampling import RemoteProcess, process_with_pid, processes_named
from mqttbed.core.errors import BackendError
from mqttbed.core.host import sha256_file
from mqttbed.core.ssh import SshError, SshHost


class SampledProcess(BaseModel):
    """The process tree of an external broker that a run sampled."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str = Field("local", description="where it ran: local (this machine) or the name "
                                           "of the lab host (broker.host) it was sampled on")
    pid: int = Field(description="its process id there")
    name: str
    cmdline: list[str] = Field(default_factory=list)
    exe: str | None = Field(None, description="its executable's path there, where readable")
    exe_sha256: str | None = None
    interval_s: float


def _named(process: psutil.Process, name: str) -> bool:
    """Whether ``process`` runs program ``name``: by its name, executable or argv[0]
    (the kernel's name is cut to 15 characters; the others are not)."""
    try:
        if process.name() == name:
            return True
        with contextlib.suppress(psutil.AccessDenied):
            if os.path.basename(process.exe()) == name:
                return True
        argv = process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return False
    return bool(argv) and os.path.basename(argv[0]) == name


def find_process(pid: int | None, name: str | None) -> psutil.Process:
    """The broker's root process: ``pid``, or the one tree of processes named ``name``.

    Raises BackendError when the pid does not exist, no process has the name, or several
    unrelated trees do (then the pid must be given).
    """
    if pid is not None:
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(pid)
        except psutil.NoSuchProcess:
            raise BackendError(f"broker.sample.pid {pid}: no such process on this "
                               "machine") from None
        return process
    assert name is not None
    me = os.getpid()
    found = {p.pid: p for p in psutil.process_iter() if p.pid != me and _named(p, name)}
    # A broker that forks workers under the same name is one tree: sample from its root.
    roots = []
    for process in found.values():
        with contextlib.suppress(psutil.Error):
            if process.ppid() not in found:
                roots.append(process)
    if not roots:
        raise BackendError(f"broker.sample.process_name {name!r}: no process of that name "
                           "runs on this machine")
    if len(roots) > 1:
        pids = ", ".join(str(p.pid) for p in sorted(roots, key=lambda p: p.pid))
        raise BackendError(f"broker.sample.process_name {name!r}: {len(roots)} separate "
                           f"processes have that name (pids {pids}); give broker.sample.pid")
    return roots[0]


def describe_process(process: psutil.Process, interval_s: float) -> SampledProcess:
    """What the record keeps of the sampled process: name, command line, executable hash."""
    exe: str | None = None
    exe_sha256: str | None = None
    with contextlib.suppress(psutil.Error):
        exe = process.exe() or None
    if exe:
        # /proc/<pid>/exe opens the very file that runs, even if it was replaced since
        with contextlib.suppress(OSError):
            exe_sha256 = sha256_file(Path(f"/proc/{process.pid}/exe"))
    cmdline: list[str] = []
    with contextlib.suppress(psutil.Error):
        cmdline = process.cmdline()
    return SampledProcess(pid=process.pid, name=process.name(), cmdline=cmdline, exe=exe,
                          exe_sha256=exe_sha256, interval_s=interval_s)


def gone(process: psutil.Process) -> bool:
    """Whether ``process`` has ended (a zombie counts: it does nothing any more)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def find_remote_process(host: SshHost, pid: int | None, name: str | None) -> RemoteProcess:
    """The broker's root process on lab host ``host``: ``pid``, or the one tree named ``name``.

    Raises BackendError when SSH fails, the pid does not exist there, no process has the
    name or several unrelated trees do, or the SSH user may not read its counters.
    """
    try:
        if pid is not None:
            found = process_with_pid(host, pid)
            if found is None:
                raise BackendError(f"broker.sample.pid {pid}: no such process on lab host "
                                   f"{host.name}")
        else:
            assert name is not None
            roots = processes_named(host, name)
            if not roots:
                raise BackendError(f"broker.sample.process_name {name!r}: no process of that "
                                   f"name runs on lab host {host.name}")
            if len(roots) > 1:
                pids = ", ".join(str(p.pid) for p in sorted(roots, key=lambda p: p.pid))
                raise BackendError(f"broker.sample.process_name {name!r}: {len(roots)} "
                                   f"separate processes have that name on lab host "
                                   f"{host.name} (pids {pids}); give broker.sample.pid")
            found = roots[0]
    except SshError as exc:
        raise BackendError(f"cannot look up the external broker's process on lab host "
                           f"{host.name}: {exc}") from None
    if not found.io_readable:
        # Its CPU and memory alone would be readable, but a sample without its I/O would
        # be skipped: better to say so now than to measure nothing.
        raise BackendError(f"broker.sample: process {found.pid} ({found.name}) on lab host "
                           f"{host.name} is not readable by the SSH user "
                           f"({host.target.host}): /proc/{found.pid}/io is the broker user's; "
                           "connect as root or as that user")
    return found


def describe_remote_process(host: SshHost, process: RemoteProcess,
                            interval_s: float) -> SampledProcess:
    """What the record keeps of a process sampled on a lab host."""
    return SampledProcess(host=host.name, pid=process.pid, name=process.name,
                          cmdline=process.cmdline, exe=process.exe,
                          exe_sha256=process.exe_sha256, interval_s=interval_s)
