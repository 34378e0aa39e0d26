"""A broker process on a lab host over SSH: its directory there, its samples taken there.

The remote counterpart of :class:`~mqttbed.brokers.processes.BrokerProcess`, with the same
methods, so a backend deploys to a Pi or a server the way it deploys here. Config files
are written here and copied (SFTP); the broker's stdout streams into the local run
directory; its own log stays there and is fetched for the tail. Resource sampling runs on
the host (:data:`SAMPLER`, plain Python over /proc: an agent host has no psutil) and
streams one JSON line per sample back over its SSH channel; its CLOCK_MONOTONIC times are
moved onto this machine's with an offset measured once at deploy (half a round trip of
error: milliseconds, against samples 200 ms apart).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from mqttbed.brokers.processes import tail_of
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import ProcessHandle, describe_exit
from mqttbed.core.samples import BrokerStatsSample
from mqttbed.core.ssh import SshError, SshHost

# argv: process group, interval (s). Per sample: [t_ns, cpu ticks, rss bytes, read chars,
# written chars, processes] over the group's processes but its leader (the SSH wrapper).
SAMPLER = r"""
import json, os, sys, time
group, interval = int(sys.argv[1]), float(sys.argv[2])
page = os.sysconf("SC_PAGE_SIZE")
while True:
    ticks = rss = rchar = wchar = count = 0
    leader_alive = os.path.exists(f"/proc/{group}")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) != group or int(pid) == group or fields[0] == "Z":
                continue
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
    if not leader_alive:
        break
    time.sleep(interval)
"""
CLOCK_TICKS_PROBE = "import os; print(os.sysconf('SC_CLK_TCK'))"
MONOTONIC_PROBE = "import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC))"


class RemoteBrokerProcess:
    """One deploy of a broker on an SSH host (see the module docstring)."""

    def __init__(self, name: str, host: SshHost, dir_prefix: str, log_names: tuple[str, ...]):
        self.name = name
        self.host = host
        self.remote_dir: PurePosixPath = host.make_dir(dir_prefix)
        self.dir = Path(tempfile.mkdtemp(prefix=dir_prefix))   # here: stdout, samples
        # stdout streams here; whatever the broker writes itself stays there
        self._local_logs = [self.dir / "stdout.log"]
        self._remote_logs = [self.remote_dir / n for n in log_names if n != "stdout.log"]
        self.handle: ProcessHandle | None = None
        self._sampler: ProcessHandle | None = None
        self._offset_ns = 0
        self._kept: list[BrokerStatsSample] | None = None   # read once the sampler stopped
        self._ticks_per_s = 100
        self.exit_code: int | None = None
        self._log_tail: str | None = None
        self.stopped = False

    @property
    def pid(self) -> int | None:
        return None if self.handle is None else self.handle.pid

    def put_text(self, name: str, text: str) -> PurePosixPath:
        """Write ``text`` to ``name`` in the remote directory (copied from a local file)."""
        local = self.dir / name
        local.write_text(text)
        remote = self.remote_dir / name
        self.host.put(local, str(remote))
        return remote

    def watch(self, handle: ProcessHandle, interval_s: float) -> None:
        """Take ``handle`` as the broker; sample its process group there every interval."""
        self.handle = handle
        self._ticks_per_s = int(self.host.run(["python3", "-c", CLOCK_TICKS_PROBE],
                                              "read its clock tick rate"))
        t0 = monotonic_ns()
        theirs = int(self.host.run(["python3", "-c", MONOTONIC_PROBE], "read its clock"))
        self._offset_ns = theirs - (t0 + monotonic_ns()) // 2
        self._sampler = self.host.spawn(["python3", "-c", SAMPLER, str(handle.pid),
                                         str(interval_s)], log_path=self.dir / "samples.jsonl")

    def samples(self) -> list[BrokerStatsSample]:
        """The samples streamed back so far, on this machine's clock, CPU % per interval."""
        if self._kept is not None:
            return list(self._kept)
        path = self.dir / "samples.jsonl"
        rows = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue   # a line still being written
        samples = []
        for previous, row in zip([None, *rows], rows, strict=False):
            t_ns, ticks, rss, rchar, wchar, count = row
            cpu = 0.0
            if previous is not None and t_ns > previous[0]:
                cpu = ((ticks - previous[1]) / self._ticks_per_s) / ((t_ns - previous[0]) / 1e9)
            samples.append(BrokerStatsSample(
                t_ns=t_ns - self._offset_ns, cpu_percent=100.0 * max(cpu, 0.0), rss_bytes=rss,
                bytes_recv=rchar, bytes_sent=wchar, processes=count))
        return [s for s in samples if s.processes > 0]

    def log_tail(self) -> str:
        """The broker's last log lines: its stdout here, its own log fetched from there."""
        if self._log_tail is not None:
            return self._log_tail
        parts = [tail_of(self._local_logs)]
        for remote in self._remote_logs:
            try:
                parts.append(self.host.run(["tail", "-n", "20", str(remote)],
                                           "read the broker's log"))
            except SshError:
                continue
        return "\n".join(p for p in parts if p)

    def exit_reason(self) -> str | None:
        if self.handle is None or (code := self.handle.poll()) is None:
            return None
        return (f"broker {self.name} (pid {self.handle.pid} on {self.host.name}) exited with "
                f"code {describe_exit(code)}; last log lines:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker's process group there, then its sampler (after a last sample)."""
        if self.stopped:
            return
        self.stopped = True
        if self.handle is not None:
            self.exit_code = self.handle.poll()
            stopped = self.handle.stop(timeout_s=timeout_s)
            if self.exit_code is None:
                self.exit_code = stopped
        if self._sampler is not None:
            self._sampler.stop(timeout_s=2.0)
        self._kept = self.samples()

    def remove(self) -> None:
        """Keep the log tail, then delete both directories."""
        if self._log_tail is None:
            self._log_tail = self.log_tail()
            # (a host that went away keeps the directory: nothing to do about it from here)
            with contextlib.suppress(SshError):
                self.host.run(["rm", "-rf", "--", str(self.remote_dir)],
                              "remove the broker's directory")
            shutil.rmtree(self.dir, ignore_errors=True)
