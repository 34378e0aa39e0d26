"""Resource use of a process and everything it forked, sampled in a background thread.

A broker is measured as a process *tree*: a fork-per-client broker (the fork/pipe seed
system) does its work in children, and a tree sum is the only fair comparison with a
single-process broker such as Mosquitto. The tree is re-listed on every sample, so
children forked mid-run are counted from the sample after they appear.

What each field of a :class:`BrokerResourceSample` means here:

- ``cpu_percent``: sum over the tree of CPU time used since the previous sample divided
  by the wall time between them (100 = one core busy). CPU time is read from
  ``/proc/<pid>/task/*/schedstat`` (nanoseconds, all threads): the tick-based counters
  psutil reads advance in 10 ms steps, which reads as 0 % for a broker relaying a few
  hundred messages per second. Where schedstat is unreadable, psutil's user + system
  times are the fallback. A process's first sighting only primes it and contributes 0.
- ``rss_bytes``: sum of resident set sizes (shared pages of forked children are counted
  once per process, as ``ps`` would).
- ``bytes_recv`` / ``bytes_sent``: sum of ``/proc/<pid>/io`` ``rchar`` / ``wchar``, the
  bytes passed through read()/write() system calls (recv()/send() on a socket do not
  count there). Linux keeps no per-process network counters, so these are a per-process
  *proxy* for network bytes: they include the broker's own small file I/O (config, log
  lines, persistence if enabled) and pipe traffic between a forked broker's processes.
  They are cumulative since each process started. Nothing is kept of a process that
  ended: when its parent reaps it with ``wait()``, Linux adds its counters to the
  parent's, so the tree total already holds them (keeping them too counted a fork/pipe
  broker's bytes two to three times). An exited child that is not reaped yet (a zombie)
  still shows its counters, so the bytes are always in exactly one place. A sample reads
  the tree one process at a time, though, and a reaping between two of those reads
  would put them in neither read (parent read before, child gone when read: the total
  drops by the child's bytes for one sample) or in both. So a sample is only kept if
  every process listed was read and none of them started being reaped before the last
  read; otherwise it is taken again (see :meth:`ProcessTreeSampler._read_tree`).
  A broker that counts its own traffic can say so instead: given ``io_counters``, the
  sampler takes (bytes received, bytes sent) from it at each sample (the FPGA model does,
  as its UDP ``recvfrom``/``sendto`` never show in ``/proc/<pid>/io``).
- ``processes``: how many processes of the tree were read in that sample.

Timestamps are CLOCK_MONOTONIC nanoseconds (:func:`mqttbed.core.clock.monotonic_ns`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from mqttbed.core.clock import monotonic_ns
from mqttbed.core.samples import BrokerResourceSample

logger = logging.getLogger(__name__)

# Decimal kilobytes, as network tools and the fork/pipe study report them.
BYTES_PER_KB = 1000


# A sample the tree changed under is taken again at once, up to this many tries in all;
# a reaping takes microseconds and a sample milliseconds, so a second try nearly always
# holds. A tree that keeps changing gets no sample that tick rather than a wrong one.
READ_ATTEMPTS = 5


@dataclass
class _Tracked:
    """A process of the tree and its CPU time at the previous kept sample."""

    process: psutil.Process
    cpu_ns: int | None = None     # CPU time at the previous sample
    seen_ns: int = 0              # monotonic time of the previous sample


@dataclass(frozen=True)
class _Reading:
    """What one process's counters read, before the sample they belong to is kept."""

    process: psutil.Process
    t_ns: int
    cpu_ns: int
    rss_bytes: int
    read_chars: int
    write_chars: int


class _TreeChanged(Exception):
    """A process of the tree was reaped while the tree was being read."""


def _cpu_time_ns(process: psutil.Process) -> int:
    """CPU time of all threads of ``process`` in nanoseconds (schedstat, else psutil)."""
    total = 0
    try:
        for task in Path(f"/proc/{process.pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
        return total
    except (OSError, ValueError, IndexError):
        times = process.cpu_times()
        return int((times.user + times.system) * 1e9)


def _read_process(process: psutil.Process) -> _Reading:
    """Read ``process``'s counters; psutil.NoSuchProcess if it is gone (reaped)."""
    with process.oneshot():
        t_ns = monotonic_ns()
        cpu_ns = _cpu_time_ns(process)
        rss = process.memory_info().rss
        io = process.io_counters()
    return _Reading(process, t_ns, cpu_ns, rss,
                    getattr(io, "read_chars", 0), getattr(io, "write_chars", 0))


def _not_being_reaped(process: psutil.Process) -> bool:
    """True if ``process`` exists and its parent has not started reaping it.

    A reaping parent marks the child dead (``X``) before it adds the child's I/O to its
    own and removes the child's /proc entry, so a process seen here neither gone nor
    dead still held its own bytes at every earlier read of its parent.
    """
    try:
        return process.is_running() and process.status() != psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return False


def _cpu_percent(tracked: _Tracked, reading: _Reading) -> float:
    """Percent of one core ``tracked`` used since it was last read (0 on first sight)."""
    previous, previous_t = tracked.cpu_ns, tracked.seen_ns
    tracked.cpu_ns, tracked.seen_ns = reading.cpu_ns, reading.t_ns
    if previous is None or reading.t_ns <= previous_t:
        return 0.0
    return max(reading.cpu_ns - previous, 0) * 100.0 / (reading.t_ns - previous_t)


class ProcessTreeSampler:
    """Samples CPU, RSS and syscall I/O bytes of ``pid`` and all its descendants."""

    def __init__(self, pid: int, interval_s: float = 0.2,
                 io_counters: Callable[[], tuple[int, int]] | None = None):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.pid = pid
        self.interval_s = interval_s
        self._io_counters = io_counters
        self._tracked: dict[int, _Tracked] = {}
        self._samples: list[BrokerResourceSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: Exception | None = None

    @property
    def samples(self) -> list[BrokerResourceSample]:
        """Return a copy of the samples taken so far, oldest first."""
        with self._lock:
            return list(self._samples)

    @property
    def error(self) -> Exception | None:
        """Return the exception that ended sampling early, if one did."""
        return self._error

    @property
    def running(self) -> bool:
        """Return True while the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Prime the CPU counters and start sampling; raise if ``pid`` does not exist."""
        if self._thread is not None:
            raise RuntimeError(f"sampler for pid {self.pid} was already started")
        # Priming in the caller's thread makes a wrong pid fail here, loudly, and makes
        # the first recorded sample's cpu_percent a real measurement rather than 0.
        root = psutil.Process(self.pid)
        self._tracked[root.pid] = _Tracked(root)
        # A tree changing throughout priming only leaves the first sample's CPU at 0.
        with contextlib.suppress(_TreeChanged):
            self._read_tree()
        self._thread = threading.Thread(
            target=self._run, name=f"process-tree-sampler-{self.pid}", daemon=True)
        self._thread.start()

    def stop(self) -> list[BrokerResourceSample]:
        """Stop sampling (within one sample's time, not one interval) and return all samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.interval_s))
        return self.samples

    def _run(self) -> None:
        try:
            # Event.wait, not sleep: stop() must not wait out a whole interval.
            while not self._stop.wait(self.interval_s):
                if not self._record():
                    return
            # One last sample at stop, so the window covers traffic up to the stop call.
            self._record()
        except Exception as exc:
            # A dying sampler must not take the run down with it: log, keep what was
            # sampled, and let the caller see the cause through ``error``.
            logger.exception("sampling process tree of pid %d failed", self.pid)
            self._error = exc

    def _record(self) -> bool:
        """Take one sample and store it; return False once the root process is gone."""
        try:
            sample = self._read_tree()
        except _TreeChanged:
            logger.debug("process tree of pid %d changed during %d reads; no sample this "
                         "tick", self.pid, READ_ATTEMPTS)
            return True
        if sample is None:
            return False
        with self._lock:
            self._samples.append(sample)
        return True

    def _read_tree(self) -> BrokerResourceSample | None:
        """Read every process of the tree once; None if the root process has ended.

        Raises _TreeChanged if no consistent reading was had in READ_ATTEMPTS tries.
        """
        for _ in range(READ_ATTEMPTS):
            listed = self._list_tree()
            if listed is None:
                return None
            try:
                readings = self._read_consistently(listed)
            except _TreeChanged:
                continue
            return self._keep(readings)
        raise _TreeChanged(self.pid)

    def _list_tree(self) -> list[psutil.Process] | None:
        """The root and its descendants, each after its parent; None if the root ended."""
        root = self._tracked.get(self.pid)
        if root is None:
            return None
        try:
            if root.process.status() == psutil.STATUS_ZOMBIE:
                return None
            return [root.process, *root.process.children(recursive=True)]
        except psutil.NoSuchProcess:
            return None

    def _read_consistently(self, listed: list[psutil.Process]) -> list[_Reading]:
        """Read ``listed``; raise _TreeChanged if a reaping may have moved bytes meanwhile.

        Linux moves a child's I/O into its parent's when the parent reaps it. Parents are
        read before their children, so a child reaped after its parent's read is found
        gone at its own read (its bytes would be in neither reading); one reaped between
        its own read and its parent's is found gone or dead by the check after all reads
        (its bytes would be in both).
        """
        readings = []
        for process in listed:
            try:
                readings.append(_read_process(process))
            except psutil.AccessDenied:
                # Never readable (another user's process): not counted in any sample, so
                # leaving it out keeps the total consistent; its reaper counts it later.
                continue
            except psutil.NoSuchProcess:
                raise _TreeChanged(process.pid) from None
        for reading in readings:
            if not _not_being_reaped(reading.process):
                raise _TreeChanged(reading.process.pid)
        return readings

    def _keep(self, readings: list[_Reading]) -> BrokerResourceSample:
        """Turn a consistent set of readings into a sample and move the CPU baselines on."""
        cpu_percent = 0.0
        for reading in readings:
            tracked = self._tracked.get(reading.process.pid)
            # psutil.Process equality includes the creation time, so a reused pid is a
            # new process and must not inherit the old one's CPU baseline.
            if tracked is None or tracked.process != reading.process:
                tracked = _Tracked(reading.process)
                self._tracked[reading.process.pid] = tracked
            cpu_percent += _cpu_percent(tracked, reading)

        # Ended processes are forgotten: their reaping parent now holds their I/O.
        read = {reading.process.pid for reading in readings}
        for pid in [pid for pid in self._tracked if pid not in read and pid != self.pid]:
            del self._tracked[pid]

        if self._io_counters is not None:
            bytes_recv, bytes_sent = self._io_counters()
        else:
            bytes_recv = sum(reading.read_chars for reading in readings)
            bytes_sent = sum(reading.write_chars for reading in readings)
        return BrokerResourceSample(
            t_ns=monotonic_ns(),
            cpu_percent=cpu_percent,
            rss_bytes=sum(reading.rss_bytes for reading in readings),
            bytes_recv=bytes_recv,
            bytes_sent=bytes_sent,
            processes=len(readings),
        )


def summarize(samples: Sequence[BrokerResourceSample]) -> dict[str, float | int | None]:
    """Reduce samples to the per-run broker resource figures reports show.

    Means and maxima need one sample; byte deltas and rates need two (first → last) and
    are None otherwise, so "not measured" never reads as "zero". Rates are decimal
    kB/s over the sampled window.
    """
    count = len(samples)
    summary: dict[str, float | int | None] = {
        "samples": count,
        "cpu_percent_mean": None,
        "cpu_percent_max": None,
        "rss_bytes_mean": None,
        "rss_bytes_max": None,
        "bytes_recv": None,
        "bytes_sent": None,
        "window_s": None,
        "net_recv_kb_per_s": None,
        "net_sent_kb_per_s": None,
    }
    if count == 0:
        return summary
    cpu = [s.cpu_percent for s in samples]
    rss = [s.rss_bytes for s in samples]
    summary.update(
        cpu_percent_mean=sum(cpu) / count,
        cpu_percent_max=max(cpu),
        rss_bytes_mean=sum(rss) / count,
        rss_bytes_max=max(rss),
    )
    if count < 2:
        return summary
    first, last = samples[0], samples[-1]
    window_s = (last.t_ns - first.t_ns) / 1e9
    bytes_recv = last.bytes_recv - first.bytes_recv
    bytes_sent = last.bytes_sent - first.bytes_sent
    summary.update(bytes_recv=bytes_recv, bytes_sent=bytes_sent, window_s=window_s)
    if window_s > 0:
        summary.update(
            net_recv_kb_per_s=bytes_recv / BYTES_PER_KB / window_s,
            net_sent_kb_per_s=bytes_sent / BYTES_PER_KB / window_s,
        )
    return summary
