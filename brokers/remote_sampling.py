"""Sampling a broker's processes on an SSH host, read from /proc there, never signalled.

An agent host has no psutil, so the scripts here are plain Python over /proc, run with
the host's ``python3``. :data:`SAMPLER` prints one JSON line per sample and streams it
back over its SSH channel; :class:`RemoteSampler` turns the lines into
:class:`~mqttbed.core.samples.BrokerResourceSample` on this machine's CLOCK_MONOTONIC (an
offset measured once when sampling starts: half a round trip of error, milliseconds,
against samples 200 ms apart). It samples either

- ``group PGID``: the processes of a process group but its leader (a broker mqttbed
  started over SSH, whose leader is the SSH wrapper shell), or
- ``tree PID STARTTIME``: a process and all its descendants (a broker mqttbed did not
  start), ``STARTTIME`` guarding against the pid being reused once it ended.

:func:`processes_named` and :func:`process_with_pid` find the process of a broker mqttbed
did not start, and say what it runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import ProcessHandle
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.ssh import SshHost

# argv: mode (group|tree), pid, interval (s)[, root's start time (tree)]. Per sample:
# [t_ns, cpu ticks, rss bytes, read chars, written chars, processes]. It exits 0 once its
# target (the group's leader, the tree's root) has ended, after a last sample.
SAMPLER = r"""
import json, os, sys, time
mode, target, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
born = sys.argv[4] if len(sys.argv) > 4 else None
page = os.sysconf("SC_PAGE_SIZE")

def stat_of(pid):
    text = open(f"/proc/{pid}/stat").read()
    return text[text.rindex(")") + 2:].split()   # from field 3 (state) on

def target_alive():
    try:
        fields = stat_of(target)
    except (OSError, ValueError):
        return False
    return fields[0] != "Z" and (born is None or fields[19] == born)

while True:
    alive = target_alive()
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stats[int(pid)] = stat_of(pid)
        except (OSError, ValueError):
            continue
    if mode == "group":
        members = [p for p, f in stats.items() if int(f[2]) == target and p != target]
    else:
        children = {}
        for p, f in stats.items():
            children.setdefault(int(f[1]), []).append(p)
        members, todo = [], [target] if alive else []
        while todo:
            p = todo.pop()
            members.append(p)
            todo.extend(children.get(p, []))
    ticks = rss = rchar = wchar = count = 0
    for pid in members:
        fields = stats[pid]
        if fields[0] == "Z":
            continue
        try:
            io = dict(line.split(": ") for line in open(f"/proc/{pid}/io").read().splitlines())
        except (OSError, ValueError):
            continue
        ticks += int(fields[11]) + int(fields[12])
        rss += int(fields[21]) * page
        rchar += int(io["rchar"])
        wchar += int(io["wchar"])
        count += 1
    print(json.dumps([time.clock_gettime_ns(time.CLOCK_MONOTONIC), ticks, rss, rchar, wchar,
                      count]), flush=True)
    if not alive:
        break
    time.sleep(interval)
"""

# argv: "pid" PID, or "name" NAME. Prints a JSON list of the processes found: for a name,
# the roots of the trees of processes with that name (a broker forking workers under its
# own name is one tree). The kernel keeps 15 characters of a name (comm): a longer NAME
# matches a cut comm whose argv[0] or executable has the whole name.
FINDER = r"""
import hashlib, json, os, sys
mode, wanted = sys.argv[1], sys.argv[2]
me = {os.getpid(), os.getppid()}

def describe(pid):
    base = f"/proc/{pid}"
    stat = open(f"{base}/stat").read()
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    found = {"pid": pid, "ppid": int(fields[1]), "start_time": fields[19],
             "name": open(f"{base}/comm").read().rstrip("\n"),
             "cmdline": [a for a in open(f"{base}/cmdline", "rb").read().decode(
                 errors="replace").split("\0") if a],
             "exe": None, "exe_sha256": None, "io_readable": os.access(f"{base}/io", os.R_OK)}
    try:
        found["exe"] = os.readlink(f"{base}/exe")
    except OSError:
        pass
    return found

def hash_exe(found):
    try:
        digest = hashlib.sha256()
        with open(f"/proc/{found['pid']}/exe", "rb") as exe:   # the very file that runs
            for block in iter(lambda: exe.read(1 << 20), b""):
                digest.update(block)
        found["exe_sha256"] = digest.hexdigest()
    except OSError:
        pass
    return found

def named(found):
    if found["name"] == wanted:
        return True
    if len(wanted) <= 15 or found["name"] != wanted[:15]:
        return False
    argv0 = found["cmdline"][0] if found["cmdline"] else ""
    return wanted in (os.path.basename(argv0), os.path.basename(found["exe"] or ""))

found = []
pids = [int(wanted)] if mode == "pid" else [int(p) for p in os.listdir("/proc") if p.isdigit()]
for pid in pids:
    if pid in me:
        continue
    try:
        process = describe(pid)
    except (OSError, ValueError):
        continue
    if process is not None and (mode == "pid" or named(process)):
        found.append(process)
matched = {p["pid"] for p in found}
print(json.dumps([hash_exe(p) for p in found if p["ppid"] not in matched]))
"""
CLOCK_TICKS_PROBE = "import os; print(os.sysconf('SC_CLK_TCK'))"
MONOTONIC_PROBE = "import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC))"


@dataclass(frozen=True)
class RemoteProcess:
    """A process on an SSH host, as :data:`FINDER` saw it."""

    pid: int
    name: str
    start_time: str   # in clock ticks since that host booted: the pid's identity with it
    cmdline: list[str] = field(default_factory=list)
    exe: str | None = None
    exe_sha256: str | None = None
    io_readable: bool = True   # the SSH user may read its I/O counters (and so sample it)


def process_with_pid(host: SshHost, pid: int) -> RemoteProcess | None:
    """Process ``pid`` on ``host``, or None if none runs there (a zombie does not count)."""
    found = _find(host, "pid", str(pid))
    return found[0] if found else None


def processes_named(host: SshHost, name: str) -> list[RemoteProcess]:
    """The roots of the process trees named ``name`` on ``host`` (by comm): none, one or more."""
    return _find(host, "name", name)


def _find(host: SshHost, mode: str, wanted: str) -> list[RemoteProcess]:
    printed = host.run(["python3", "-c", FINDER, mode, wanted],
                       f"find the broker's process ({mode} {wanted})")
    return [RemoteProcess(pid=p["pid"], name=p["name"], start_time=p["start_time"],
                          cmdline=p["cmdline"], exe=p["exe"], exe_sha256=p["exe_sha256"],
                          io_readable=p["io_readable"])
            for p in json.loads(printed)]


class RemoteSampler:
    """:data:`SAMPLER` running on an SSH host, its lines streamed into a local file."""

    def __init__(self, host: SshHost, log_path: Path):
        self.host = host
        self.path = log_path
        self._process: ProcessHandle | None = None
        self._offset_ns = 0
        self._ticks_per_s = 100
        self._kept: list[BrokerResourceSample] | None = None   # read once stopped

    def start_group(self, group: int, interval_s: float) -> None:
        """Sample process group ``group`` but its leader, every ``interval_s``."""
        self._start(["group", str(group), str(interval_s)])

    def start_tree(self, process: RemoteProcess, interval_s: float) -> None:
        """Sample ``process`` and its descendants, every ``interval_s``."""
        self._start(["tree", str(process.pid), str(interval_s), process.start_time])

    def _start(self, args: list[str]) -> None:
        self._ticks_per_s = int(self.host.run(["python3", "-c", CLOCK_TICKS_PROBE],
                                              "read its clock tick rate"))
        t0 = monotonic_ns()
        theirs = int(self.host.run(["python3", "-c", MONOTONIC_PROBE], "read its clock"))
        self._offset_ns = theirs - (t0 + monotonic_ns()) // 2
        self._process = self.host.spawn(["python3", "-c", SAMPLER, *args],
                                        log_path=self.path)

    def exit_code(self) -> int | None:
        """The sampler's exit code once it ended (0: its target ended first), else None."""
        return None if self._process is None else self._process.poll()

    def output_tail(self) -> str:
        """The last lines the sampler printed (a traceback, if it failed)."""
        lines = self.path.read_text(errors="replace").splitlines() if self.path.exists() else []
        return "\n".join(lines[-5:])

    def samples(self) -> list[BrokerResourceSample]:
        """The samples streamed back so far, on this machine's clock, CPU % per interval."""
        if self._kept is not None:
            return list(self._kept)
        rows = []
        for line in self.path.read_text().splitlines() if self.path.exists() else []:
            try:
                row = json.loads(line)
            except ValueError:
                continue   # a line still being written (or a traceback's)
            if isinstance(row, list) and len(row) == 6:
                rows.append(row)
        samples = []
        for previous, row in zip([None, *rows], rows, strict=False):
            t_ns, ticks, rss, rchar, wchar, count = row
            cpu = 0.0
            if previous is not None and t_ns > previous[0]:
                cpu = ((ticks - previous[1]) / self._ticks_per_s) / ((t_ns - previous[0]) / 1e9)
            samples.append(BrokerResourceSample(
                t_ns=t_ns - self._offset_ns, cpu_percent=100.0 * max(cpu, 0.0), rss_bytes=rss,
                bytes_recv=rchar, bytes_sent=wchar, processes=count))
        return [s for s in samples if s.processes > 0]

    def stop(self) -> list[BrokerResourceSample]:
        """Stop the sampler (its own process group only) and keep its samples."""
        if self._kept is None:
            if self._process is not None:
                self._process.stop(timeout_s=2.0)
            self._kept = self.samples()
        return list(self._kept)
