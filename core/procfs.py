"""Reading a process's identity from /proc without being fooled by an ``execve`` under way.

A process's environment and command line live in its own memory (``/proc/PID/environ``,
``/proc/PID/cmdline``). While it runs ``execve`` the kernel has swapped in the new image's
memory but not yet copied the strings there, and both files read as empty. The window is
short, but a busy machine can preempt the process inside it (loading the dynamic linker
is file I/O). A search for the processes that carry a tag must not read "empty" as "not
tagged": a reaper would leave such a process running, and a check would miss it. So an
empty read is read again, briefly, while the process is in that window: alive, not a
kernel thread (``PF_KTHREAD``; they have no user memory at all) and with no strings laid
out yet (``env_end``, field 51 of /proc/PID/stat, still 0; the kernel's own test before
it answers an empty read). A process whose environment is truly empty has ``env_end``
set and is answered at once.
"""

from __future__ import annotations

import time
from pathlib import Path

PF_KTHREAD = 0x00200000  # include/linux/sched.h
ENV_END = 51 - 3         # env_end (field 51, Linux 3.5+) among the fields after the name
EXEC_RETRY_S = 0.5       # an exec's window is micro- to milliseconds; this is ample
EXEC_RETRY_STEP_S = 0.002


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 onwards), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its ')'.
    return stat[stat.rindex(")") + 2:].split()


def is_live(pid: int) -> bool:
    """Whether ``pid`` names a process that has not exited (zombies and the dead are not)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X", "x")


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat),
    or None if it is gone: with the pid it names one process, never a later reuse."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def _in_exec(pid: int) -> bool:
    """Whether ``pid`` is a live user process whose new image has no strings yet."""
    fields = _stat_fields(pid)
    return (fields is not None and len(fields) > ENV_END and fields[0] not in ("Z", "X", "x")
            and not int(fields[6]) & PF_KTHREAD and fields[ENV_END] == "0")


def process_strings(pid: int, name: str) -> list[bytes] | None:
    """The NUL-separated strings of ``/proc/PID/<name>`` (``environ`` or ``cmdline``).

    None if the process is gone or not readable. An empty read of a process in the middle
    of ``execve`` is retried for up to :data:`EXEC_RETRY_S`; any other empty read is
    ``[]`` at once.
    """
    path = Path(f"/proc/{pid}/{name}")
    deadline = None
    while True:
        try:
            data = path.read_bytes()
            if not data and not _in_exec(pid):
                # not (or no longer: the exec may have ended since the read) in the window
                data = path.read_bytes()
                return data.split(b"\0") if data else []
        except OSError:
            return None
        if data:
            return data.split(b"\0")
        now = time.monotonic()
        deadline = deadline if deadline is not None else now + EXEC_RETRY_S
        if now > deadline:
            return []
        time.sleep(EXEC_RETRY_STEP_S)


def pids() -> list[int]:
    """Every pid in /proc at this moment."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def with_environment(entry: str) -> list[int]:
    """Pids of live processes (zombies excluded) with ``entry`` (``NAME=value``) in their
    environment; one in the middle of an ``execve`` is read again, not missed."""
    wanted = entry.encode()
    return [pid for pid in pids() if wanted in (process_strings(pid, "environ") or [])
            and is_live(pid)]
