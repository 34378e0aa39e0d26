"""Where a thing runs: this machine (subprocesses) or a remote one (:mod:`.ssh`).

Backends and agents are started through a :class:`Host`, never with ad-hoc shell
strings, so the same backend code deploys locally and on a lab machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import resource
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from mqttbed.core.process_journal import ProcessJournal


def raise_nofile_limit() -> int:
    """Raise this process's open-file limit (soft) to its hard limit; return the soft one.

    A run of a thousand clients needs a socket each in the agent and in the broker; the
    processes this one starts inherit the raised limit. Runs record the value.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@runtime_checkable
class ProcessHandle(Protocol):
    """A process a host started."""

    pid: int

    def poll(self) -> int | None:
        """Return the exit code if the process has ended, else None."""
        ...

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """Stop the process and everything it started; return its exit code."""
        ...


@runtime_checkable
class Host(Protocol):
    """A machine mqttbed deploys processes to."""

    name: str
    address: str

    def spawn(self, argv: list[str], *, env: dict[str, str] | None = None,
              log_path: Path | None = None) -> ProcessHandle:
        """Start ``argv`` in its own process group."""
        ...

    def free_port(self) -> int:
        """Return a TCP port that is free on this host right now."""
        ...

    def make_dir(self, prefix: str) -> Path:
        """Create a fresh private directory on the host."""
        ...


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_libc = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child only calls it


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when its parent dies."""

    def preexec() -> None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork() and prctl(): then nobody sends it.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


class _Spawner:
    """Forks every local process from one thread that lives as long as this process.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the
    process: a broker forked from a short-lived thread (a request handler, a test's
    helper thread) would be killed when that thread returned. Forking from this thread
    only, the signal comes exactly when the process that started the child dies.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._owner_pid = 0

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._executor is None or self._owner_pid != os.getpid():  # fresh after fork
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="mqttbed-spawner")
                self._owner_pid = os.getpid()
            executor = self._executor
        die_with_us = _die_with_parent(os.getpid())
        return executor.submit(lambda: subprocess.Popen(argv, preexec_fn=die_with_us, **kwargs)
                               ).result()


_spawner = _Spawner()
# The journal of the controller running in this process, if any: every spawn is recorded
# there (mqttbed.core.process_journal). Process-wide like PDEATHSIG itself: backends
# build their own LocalHost, and each of their processes must be found after a crash.
_journal: ProcessJournal | None = None


def install_journal(journal: ProcessJournal | None) -> None:
    """Record every local spawn of this process in ``journal`` (None: stop recording)."""
    global _journal
    _journal = journal


def installed_journal() -> ProcessJournal | None:
    """The journal this process records its spawns in, if any."""
    return _journal


class LocalProcess:
    """A subprocess in its own session, so stopping it stops all its children too.

    It dies with the process that started it (PR_SET_PDEATHSIG, SIGKILL): a controller
    killed with SIGKILL leaves no broker, agent or proxy of its own running.
    """

    def __init__(self, popen: subprocess.Popen[bytes],
                 journal: ProcessJournal | None = None):
        self._popen = popen
        self.pid = popen.pid
        self._journal = journal

    def poll(self) -> int | None:
        """The exit code once the process has ended, else None; it is not reaped here.

        Until :meth:`stop` reaps it, an exited leader stays a zombie and its pid stays its
        own: a signal to that pid or its group (``stop``, a fault injector's kill, a pause)
        can never reach a later process the kernel gave the same number, which it may do
        once a reaped pid is free (``pid_max`` is 32,768 on many machines).
        """
        if self._popen.returncode is not None:
            return self._popen.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:   # reaped by someone else: Popen knows no more
            return self._popen.poll()
        if info is None:
            return None
        if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            return -info.si_status
        return info.si_status

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``timeout_s``;
        reap the leader. A second call returns its code and signals nothing."""
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            if self._popen.returncode is None:   # not reaped: the pid is still the leader's
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, sig)
            try:
                code = self._popen.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            self._forget()
            return code
        return self._popen.poll()

    def _forget(self) -> None:
        if self._journal is not None:
            self._journal.forget(self.pid)


class LocalHost:
    """This machine, reached by others at ``address`` (loopback unless on a lab network)."""

    name = "local"

    def __init__(self, address: str = "127.0.0.1"):
        self.address = address

    def spawn(self, argv: list[str], *, env: dict[str, str] | None = None,
              log_path: Path | None = None) -> LocalProcess:
        raise_nofile_limit()  # inherited: brokers and agents hold a socket per client
        journal = _journal
        tag = journal.env() if journal is not None else {}
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            popen = _spawner.popen(
                argv, env={**os.environ, **(env or {}), **tag}, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if not isinstance(out, int):  # the log file, not DEVNULL
                out.close()
        if journal is not None:
            journal.record(popen.pid, argv)
        return LocalProcess(popen, journal)

    def free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((self.address, 0))
            return s.getsockname()[1]

    def make_dir(self, prefix: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=prefix))


def describe_exit(code: int) -> str:
    """An exit code as text, naming the signal of a negative (killed) code: ``-9 (SIGKILL)``."""
    if code < 0:
        try:
            return f"{code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wait_for_tcp(host: str, port: int, timeout_s: float,
                 alive: ProcessHandle | None = None) -> None:
    """Block until ``host:port`` accepts a connection; raise TimeoutError otherwise.

    If ``alive`` is given and that process exits first, raise RuntimeError at once.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            raise RuntimeError(f"process {alive.pid} exited with code {alive.poll()} before "
                               f"listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s:.1f} s")
