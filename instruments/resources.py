"""Resource use of a process and everything it forked, sampled in a background thread.

A broker is measured as a process *tree*: a fork-per-client broker (the fork/pipe seed
system) does its work in children, and a tree sum is the only fair comparison with a
single-process broker such as Mosquitto. The tree is re-listed on every sample, so
children forked mid-run are counted from the sample after they appear.

What each field of a :class:`BrokerStatsSample` means here:

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
  broker's bytes two to three times). Between a child's exit and its reaping its bytes
  are briefly in neither place, so a sample that falls there reads slightly low.
  A broker that counts its own traffic can say so instead: given ``io_counters``, the
  sampler takes (bytes received, bytes sent) from it at each sample (the FPGA model does,
  as its UDP ``recvfrom``/``sendto`` never show in ``/proc/<pid>/io``).
- ``processes``: how many processes of the tree were read in that sample.

Timestamps are CLOCK_MONOTONIC nanoseconds (:func:`mqttbed.core.clock.monotonic_ns`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from mqttbed.core.clock import monotonic_ns
from mqttbed.core.samples import BrokerStatsSample

logger = logging.getLogger(__name__)

# Decimal kilobytes, as network tools and the fork/pipe study report them.
BYTES_PER_KB = 1000


@dataclass
class _Tracked:
    """A process of the tree and the last I/O counters read from it."""

    process: psutil.Process
    read_chars: int = 0
    write_chars: int = 0
    cpu_ns: int | None = None     # CPU time at the previous sample
    seen_ns: int = 0              # monotonic time of the previous sample


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


def _cpu_percent(tracked: _Tracked, now_ns: int) -> float:
    """Percent of one core ``tracked`` used since it was last read (0 on first sight)."""
    cpu_ns = _cpu_time_ns(tracked.process)
    previous, previous_t = tracked.cpu_ns, tracked.seen_ns
    tracked.cpu_ns, tracked.seen_ns = cpu_ns, now_ns
    if previous is None or now_ns <= previous_t:
        return 0.0
    return max(cpu_ns - previous, 0) * 100.0 / (now_ns - previous_t)


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
        # I/O of processes that left the tree, so cumulative bytes stay monotonic.
        self._samples: list[BrokerStatsSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: Exception | None = None

    @property
    def samples(self) -> list[BrokerStatsSample]:
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
        self._read_tree()
        self._thread = threading.Thread(
            target=self._run, name=f"process-tree-sampler-{self.pid}", daemon=True)
        self._thread.start()

    def stop(self) -> list[BrokerStatsSample]:
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
        sample = self._read_tree()
        if sample is None:
            return False
        with self._lock:
            self._samples.append(sample)
        return True

    def _read_tree(self) -> BrokerStatsSample | None:
        """Read every process of the tree once; None if the root process has ended."""
        root = self._tracked.get(self.pid)
        if root is None:
            return None
        try:
            if root.process.status() == psutil.STATUS_ZOMBIE:
                return None
            listed = [root.process, *root.process.children(recursive=True)]
        except psutil.NoSuchProcess:
            return None

        cpu_percent = 0.0
        rss_bytes = 0
        live_read = 0
        live_write = 0
        seen: set[int] = set()
        for listed_process in listed:
            tracked = self._tracked.get(listed_process.pid)
            # psutil.Process equality includes the creation time, so a reused pid is a
            # new process and must not inherit the old one's CPU baseline.
            if tracked is None or tracked.process != listed_process:
                tracked = _Tracked(listed_process)
                self._tracked[listed_process.pid] = tracked
            process = tracked.process
            try:
                with process.oneshot():
                    cpu = _cpu_percent(tracked, monotonic_ns())
                    rss = process.memory_info().rss
                    io = process.io_counters()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                # Exited (or became a zombie) between listing and reading: leave it to
                # the retirement below, which keeps its last counters.
                continue
            tracked.read_chars = getattr(io, "read_chars", 0)
            tracked.write_chars = getattr(io, "write_chars", 0)
            seen.add(process.pid)
            cpu_percent += cpu
            rss_bytes += rss
            live_read += tracked.read_chars
            live_write += tracked.write_chars

        # Ended processes are forgotten: their reaping parent now holds their I/O.
        for pid in [pid for pid in self._tracked if pid not in seen and pid != self.pid]:
            del self._tracked[pid]

        if self._io_counters is not None:
            live_read, live_write = self._io_counters()
        return BrokerStatsSample(
            t_ns=monotonic_ns(),
            cpu_percent=cpu_percent,
            rss_bytes=rss_bytes,
            bytes_recv=live_read,
            bytes_sent=live_write,
            processes=len(seen),
        )


def summarize(samples: Sequence[BrokerStatsSample]) -> dict[str, float | int | None]:
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
