"""What every broker that runs as a local process tree shares.

Starting it on a free port that is really its own (:func:`start_listening`), asking its
binary for a version (:func:`capture_output`), and the bookkeeping of one deploy
(:class:`BrokerProcess`): a private directory, the process handle, the resource sampler,
the exit code and the log tail, kept after the directory is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from mqttbed.core.errors import BackendError
from mqttbed.core.host import Host, ProcessHandle, describe_exit, wait_for_tcp
from mqttbed.core.protocol import Endpoint
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.ssh import SshHost
from mqttbed.instruments.resources import ProcessTreeSampler

LOG_TAIL_LINES = 50


def listens_on(pid: int, port: int) -> bool:
    """Return True if process ``pid`` holds a listening TCP socket on ``port``."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
               for c in connections)


def processes_in_group(group: int) -> list[psutil.Process]:
    """The live (not zombie) processes whose process group is ``group``.

    A broker or agent started by a Host leads a group of its own: what is left of it
    after a stop or a kill -9 is found here.
    """
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == group and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


def start_listening(host: Host | SshHost, program: str, launch: Callable[[int], ProcessHandle], *,
                    attempts: int, startup_timeout_s: float, stop_timeout_s: float,
                    log_tail: Callable[[], str],
                    check_listener: bool = True) -> tuple[int, ProcessHandle]:
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
            # (on a remote host the pid is not this machine's to look up)
            if check_listener and not listens_on(handle.pid, port):
                raise RuntimeError(f"port {port} answered, but not from {program} "
                                   f"(pid {handle.pid}): another process took it")
            return port, handle
        except (RuntimeError, TimeoutError) as exc:
            handle.stop(timeout_s=stop_timeout_s)
            failures.append(f"attempt {attempt} on port {port}: {exc}")
    raise BackendError(f"{program} did not start after {attempts} attempts:\n"
                       + "\n".join(failures) + "\nlast log lines:\n" + log_tail())


def capture_output(host: Host, argv: list[str], out_path: Path, timeout_s: float) -> str:
    """Run a short command (``--version``, ``-h``) on ``host``; return what it printed.

    The exit code is ignored (``mosquitto -h`` exits with 3): only the text matters.
    """
    handle = host.spawn(argv, log_path=out_path)
    deadline = time.monotonic() + timeout_s
    while handle.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    handle.stop(timeout_s=1.0)
    try:
        return out_path.read_text(errors="replace")
    except OSError:
        return ""


def tail_of(paths: list[Path], lines: int = LOG_TAIL_LINES) -> str:
    """Return the last ``lines`` lines of ``paths`` read one after the other."""
    text = ""
    for path in paths:
        try:
            text += path.read_text(errors="replace")
        except OSError:
            continue
        if text and not text.endswith("\n"):
            text += "\n"
    return "\n".join(text.splitlines()[-lines:])


class BrokerProcess:
    """One deploy of a broker process tree: its directory, process, samples and end.

    Teardown is two steps so a backend can read what the broker leaves in its directory
    in between: :meth:`stop` ends sampling, then the process group (keeping the exit
    code of a broker that died on its own); :meth:`remove` keeps the log tail, then
    deletes the directory. Both are safe to call more than once.
    """

    def __init__(self, name: str, host: Host, dir_prefix: str, log_names: tuple[str, ...]):
        self.name = name
        self.dir = host.make_dir(dir_prefix)
        self._log_paths = [self.dir / log_name for log_name in log_names]
        self.handle: ProcessHandle | None = None
        self._sampler: ProcessTreeSampler | None = None
        self._samples: list[BrokerResourceSample] = []
        self.exit_code: int | None = None
        self._log_tail: str | None = None
        self.stopped = False

    @property
    def pid(self) -> int | None:
        return None if self.handle is None else self.handle.pid

    def watch(self, handle: ProcessHandle, interval_s: float,
              io_counters: Callable[[], tuple[int, int]] | None = None) -> None:
        """Take ``handle`` as the broker and sample its process tree every ``interval_s``.

        ``io_counters`` replaces the syscall byte counts, for a broker that counts its own
        traffic (see :class:`~mqttbed.instruments.resources.ProcessTreeSampler`).
        """
        self.handle = handle
        self._sampler = ProcessTreeSampler(handle.pid, interval_s, io_counters)
        self._sampler.start()

    def rewatch(self, handle: ProcessHandle, interval_s: float) -> None:
        """Take ``handle`` as the broker from now on (the same broker started again, a
        restart): the samples so far are kept, the new process sampled after them."""
        if self._sampler is not None:
            self._samples.extend(self._sampler.stop())
            self._sampler = None
        self.watch(handle, interval_s)

    def log_tail(self) -> str:
        """The broker's last log lines (kept from :meth:`remove` on)."""
        return self._log_tail if self._log_tail is not None else tail_of(self._log_paths)

    def exit_reason(self) -> str | None:
        """None while the broker runs (or before it started), else how it ended."""
        if self.handle is None or (code := self.handle.poll()) is None:
            return None
        return (f"broker {self.name} (pid {self.handle.pid}) exited with code "
                f"{describe_exit(code)}; last log lines:\n{self.log_tail()}")

    def samples(self) -> list[BrokerResourceSample]:
        """The resource samples taken so far (all of them once stopped)."""
        if self._sampler is not None and not self.stopped:
            return [*self._samples, *self._sampler.samples]  # (before a restart, then now)
        return list(self._samples)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling, then the broker's process group (SIGTERM, SIGKILL after timeout)."""
        if self.stopped:
            return
        self.stopped = True
        if self._sampler is not None:
            self._samples.extend(self._sampler.stop())
        if self.handle is not None:
            # A code already set means the broker died on its own before teardown.
            self.exit_code = self.handle.poll()
            stopped = self.handle.stop(timeout_s=timeout_s)
            if self.exit_code is None:
                self.exit_code = stopped

    def remove(self) -> None:
        """Keep the log tail, then delete the directory."""
        if self._log_tail is None:
            self._log_tail = tail_of(self._log_paths)
            shutil.rmtree(self.dir, ignore_errors=True)


def local_processes(proc: object) -> dict[str, list[int]]:
    """A one-broker backend's ``broker_processes`` (:class:`~mqttbed.core.backends.
    LocalProcesses`): its name -> the pid its sampler watches, once started here (a
    broker on a lab host is no process of this machine)."""
    if not isinstance(proc, BrokerProcess) or proc.pid is None:
        return {}
    return {proc.name: [proc.pid]}


def wait_for_ready_file(proc: BrokerProcess, ready: Path, timeout_s: float) -> dict[str, Any]:
    """Wait until a broker started with ``--port 0`` wrote ``ready``; return what it wrote.

    The broker writes its bound address there, so nobody races it for a free port.
    Raises BackendError when it exits first or stays silent past ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if (exited := proc.exit_reason()) is not None:
            raise BackendError(f"{exited} (before binding)")
        if time.monotonic() > deadline:
            raise BackendError(f"{proc.name} did not bind within {timeout_s:.1f} s; "
                               f"last log lines:\n{proc.log_tail()}")
        time.sleep(0.01)
    return json.loads(ready.read_text())


def ping_over_udp(endpoint: Endpoint, timeout_s: float, request: bytes,
                  answer: Callable[[bytes], str | None], protocol: str,
                  make_socket: Callable[[], socket.socket] | None = None) -> None:
    """Send ``request`` (a PINGREQ) to ``endpoint`` over UDP and check the reply.

    ``answer`` returns None for the expected reply, else what came instead (and may
    raise ValueError for a malformed one). Raises BackendError unless the reply came.
    ``make_socket`` opens the UDP socket (default: one in this process's namespace).
    """
    family = socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET
    with (make_socket or (lambda: socket.socket(family, socket.SOCK_DGRAM)))() as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect((endpoint.host, endpoint.port))
            sock.send(request)
            wrong = answer(sock.recv(64))
        except (OSError, ValueError) as exc:
            raise BackendError(f"no {protocol} broker answers PINGREQ on udp://{endpoint.host}:"
                               f"{endpoint.port} within {timeout_s:.1f} s: "
                               f"{type(exc).__name__}: {exc}") from exc
    if wrong is not None:
        raise BackendError(f"udp://{endpoint.host}:{endpoint.port} answered PINGREQ with "
                           f"{wrong}, not PINGRESP")
