"""A broker restarted mid-run (``workload.reconnect``): stopped, down for a while, started
again with the same command line, config and port (the backends that can: Mosquitto, and
the command backend's brokers).

The restart runs on a thread of its own, armed for a time of the run; while it runs, the
backend's health says nothing (the stopped broker is not a dead one). Each restart is one
:class:`~mqttbed.core.backends.Fault`: when the stop began (``at_ns``) and when the
broker listened again (``until_ns``), on this machine's CLOCK_MONOTONIC, so the analysis
times the clients' way back from both.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from mqttbed.brokers.processes import BrokerProcess
from mqttbed.core.backends import Fault
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import ProcessHandle

STOP_TIMEOUT_S = 5.0       # SIGTERM (Mosquitto writes its persistence file), then SIGKILL
STARTUP_TIMEOUT_S = 5.0
PROBE_EVERY_S = 0.002       # how finely "listening again" is timed


class BrokerRestarts:
    """The restarts of one deployed broker process (local: its pid is this machine's)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._faults: list[Fault] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarting = False
        self.error: str | None = None   # a restart that failed: the run's reason

    def arm(self, proc: BrokerProcess, spawn: Callable[[int], ProcessHandle], address: str,
            port: int, at_ns: int, down_s: float, interval_s: float) -> None:
        """Restart ``proc`` at ``at_ns``: SIGTERM, ``down_s`` down, ``spawn(n)`` (the n-th
        restart) starts it again, listening on ``address:port`` again; sampled as before."""
        def restart_then() -> None:
            while not self._stop.is_set() and (left_ns := at_ns - monotonic_ns()) > 0:
                self._stop.wait(min(left_ns / 1e9, 0.05))
            if self._stop.is_set():
                return
            try:
                self._restart(proc, spawn, address, port, down_s, interval_s)
            except Exception as exc:  # noqa: BLE001 - the run fails with this reason
                self.error = (f"{self._name}: restarting the broker failed: "
                              f"{type(exc).__name__}: {exc}")
            finally:
                self.restarting = False

        self._thread = threading.Thread(target=restart_then, name=f"{self._name}-restart",
                                        daemon=True)
        self._thread.start()

    def _restart(self, proc: BrokerProcess, spawn: Callable[[int], ProcessHandle],
                 address: str, port: int, down_s: float, interval_s: float) -> None:
        old = proc.handle
        assert old is not None
        self.restarting = True
        t_stop = monotonic_ns()
        old.stop(timeout_s=STOP_TIMEOUT_S)
        t_down = monotonic_ns()
        if self._stop.wait(down_s):
            return
        handle = spawn(len(self._faults) + 1)
        proc.rewatch(handle, interval_s)
        t_up = _listening(address, port, handle)
        self._faults.append(Fault(
            at_ns=t_stop, until_ns=t_up,
            what=f"restarted broker {self._name}: stopped (SIGTERM) in "
                 f"{(t_down - t_stop) / 1e6:.1f} ms, down {down_s:g} s, listening again "
                 f"{(t_up - t_stop) / 1e9:.3f} s after the stop began (pid {old.pid} -> "
                 f"{handle.pid})"))

    def faults(self) -> list[Fault]:
        """The restarts done so far."""
        return list(self._faults)

    def cancel(self, timeout_s: float = 2 * STOP_TIMEOUT_S) -> None:
        """No restart after this (teardown): a pending one is dropped, a running one ends."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


def _listening(address: str, port: int, handle: ProcessHandle) -> int:
    """When the restarted broker first accepted a connection (CLOCK_MONOTONIC ns, to
    within PROBE_EVERY_S); RuntimeError if it exits or stays silent first."""
    deadline = monotonic_ns() + int(STARTUP_TIMEOUT_S * 1e9)
    while monotonic_ns() < deadline:
        if (code := handle.poll()) is not None:
            raise RuntimeError(f"the restarted broker (pid {handle.pid}) exited with code "
                               f"{code} before listening on {address}:{port}")
        try:
            with socket.create_connection((address, port), timeout=0.2):
                return monotonic_ns()
        except OSError:
            time.sleep(PROBE_EVERY_S)
    raise RuntimeError(f"the restarted broker listened on {address}:{port} not within "
                       f"{STARTUP_TIMEOUT_S:g} s")
