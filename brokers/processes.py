"""Starting a broker that listens on TCP: a free port, a check that it is ours, retries."""

from __future__ import annotations

from collections.abc import Callable

import psutil

from mqttbed.core.errors import BackendError
from mqttbed.core.host import Host, ProcessHandle, wait_for_tcp


def listens_on(pid: int, port: int) -> bool:
    """Return True if process ``pid`` holds a listening TCP socket on ``port``."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
               for c in connections)


def start_listening(host: Host, program: str, launch: Callable[[int], ProcessHandle], *,
                    attempts: int, startup_timeout_s: float, stop_timeout_s: float,
                    log_tail: Callable[[], str]) -> tuple[int, ProcessHandle]:
    """Run ``launch(port)`` on a free port of ``host`` until the process listens there.

    ``free_port()`` only says a port was free a moment ago: another process can take it
    before the broker binds, so a failed start is retried on a new port. Each attempt
    checks that the listener is the launched process, not whoever took the port.
    Raises BackendError naming every attempt and the broker's last log lines.
    """
    failures: list[str] = []
    for attempt in range(1, attempts + 1):
        port = host.free_port()
        handle = launch(port)
        try:
            wait_for_tcp(host.address, port, startup_timeout_s, alive=handle)
            if not listens_on(handle.pid, port):
                raise RuntimeError(f"port {port} answered, but not from {program} "
                                   f"(pid {handle.pid}): another process took it")
            return port, handle
        except (RuntimeError, TimeoutError) as exc:
            handle.stop(timeout_s=stop_timeout_s)
            failures.append(f"attempt {attempt} on port {port}: {exc}")
    raise BackendError(f"{program} did not start after {attempts} attempts:\n"
                       + "\n".join(failures) + "\nlast log lines:\n" + log_tail())
