"""A remote machine over SSH (fabric): the :class:`~mqttbed.core.host.Host` of a lab.

Commands go over the wire as quoted argv (``shlex.join``), never as strings built by
hand. A process started with :meth:`SshHost.spawn` keeps its SSH channel open for as long
as it runs, which is what makes it cheap to watch: its exit status arrives on that
channel, so :meth:`SshProcess.poll` asks nothing of the network. Its output is streamed
into a local log file, so a failure reads the same as a local one.

What runs on the remote side, per process: sshd starts the command in a session of its
own, so the wrapper shell's pid (printed first) is the process group that
:meth:`SshProcess.stop` signals. The environment (e.g. an agent token) is read from the
channel's stdin, so it never shows in the remote ``ps``; then the wrapper runs argv with
stdin at end of file and reports its exit status (``128 + n`` for signal ``n``, the
shell's convention, which poll turns into ``-n`` like :class:`subprocess.Popen`).

Validated against a real OpenSSH server on this machine (tests/test_ssh_host.py and the
remote-agent campaign test); not against a Raspberry Pi.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Reads KEY=VALUE lines from stdin up to an empty one, exports them, runs "$@" and
# reports its status on exit (sh keeps the status of a child killed by signal n as 128+n).
WRAPPER = ('echo "mqttbed-pid $$"; '
           'while IFS= read -r kv && [ -n "$kv" ]; do export "$kv"; done; '
           '"$@" </dev/null 2>&1; exit $?')
PID_PREFIX = b"mqttbed-pid "


class SshError(RuntimeError):
    """SSH to a host failed, or a command there did."""


class SshTarget(BaseModel):
    """How to reach a machine over SSH."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str = Field(description="SSH destination, user@host (fabric syntax, :port allowed)")
    ssh_port: int | None = Field(default=None, ge=1, le=65535)
    key_filename: str | None = Field(default=None, description="private key for SSH")
    known_hosts: str | None = Field(
        default=None, description="known_hosts file; when set, unknown host keys are refused")
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)

    @property
    def address(self) -> str:
        """The machine's address, without user and port."""
        return self.host.rpartition("@")[2].split(":")[0]


def connect(target: SshTarget, label: str) -> Any:
    """Open a fabric Connection to ``target`` (host keys checked when known_hosts is set)."""
    from fabric import Connection
    from paramiko import RejectPolicy
    from paramiko.ssh_exception import SSHException

    connect_kwargs: dict[str, Any] = {}
    if target.key_filename:
        connect_kwargs["key_filename"] = [str(Path(target.key_filename).expanduser())]
    connection = Connection(target.host, port=target.ssh_port,
                            connect_timeout=int(target.connect_timeout_s),
                            connect_kwargs=connect_kwargs)
    if target.known_hosts:
        connection.client.load_host_keys(str(Path(target.known_hosts).expanduser()))
        connection.client.set_missing_host_key_policy(RejectPolicy())
    try:
        connection.open()
    except (SSHException, OSError) as exc:
        raise SshError(f"SSH to {label} failed: {type(exc).__name__}: {exc}") from exc
    return connection


class SshHost:
    """A machine reached over SSH; one connection, shared by every command and process."""

    def __init__(self, target: SshTarget, name: str | None = None):
        self.target = target
        self.name = name or target.host
        self.address = target.address
        self._connection = connect(target, self.name)
        self._lock = threading.Lock()

    def run(self, argv: list[str], purpose: str) -> str:
        """Run ``argv`` (quoted) and return its stdout; raise SshError if it fails."""
        from paramiko.ssh_exception import SSHException

        command = shlex.join(argv)
        try:
            result = self._connection.run(command, hide=True, warn=True, in_stream=False)
        except (SSHException, OSError) as exc:
            raise SshError(f"on {self.name}: `{command}` (to {purpose}) failed: "
                           f"{type(exc).__name__}: {exc}") from exc
        if result.exited != 0:
            raise SshError(f"on {self.name}: `{command}` (to {purpose}) exited with "
                           f"{result.exited}: {(result.stderr or result.stdout).strip()[-500:]}")
        return result.stdout.strip()

    def put(self, local: Path, remote: str) -> None:
        """Copy a local file to ``remote`` (SFTP)."""
        self._connection.put(str(local), remote=remote)

    def spawn(self, argv: list[str], *, env: dict[str, str] | None = None,
              log_path: Path | None = None) -> SshProcess:
        """Start ``argv`` in its own process group there; its output goes to local ``log_path``."""
        for key, value in (env or {}).items():
            if "\n" in key + value or "=" in key or not key:
                raise ValueError(f"environment entry {key!r} cannot be sent line by line")
        with self._lock:
            channel = self._connection.client.get_transport().open_session()
        channel.set_combine_stderr(True)
        channel.exec_command(shlex.join(["exec", "sh", "-c", WRAPPER, "sh", *argv]))
        lines = "".join(f"{key}={value}\n" for key, value in (env or {}).items())
        channel.sendall((lines + "\n").encode())
        channel.shutdown_write()
        return SshProcess(self, channel, log_path, " ".join(argv[:2]))

    def free_port(self) -> int:
        """A TCP port free there right now (asked of the remote Python, which agents need)."""
        code = ("import socket; s = socket.socket(); s.bind(('', 0)); "
                "print(s.getsockname()[1])")
        return int(self.run(["python3", "-c", code], "find a free port"))

    def make_dir(self, prefix: str) -> PurePosixPath:
        """A fresh private (0700) directory there."""
        return PurePosixPath(self.run(["mktemp", "-d", "-t", f"{prefix}XXXXXXXX"],
                                      "create a private directory"))

    def close(self) -> None:
        self._connection.close()


class SshProcess:
    """A process on an SSH host, watched through its channel (see the module docstring)."""

    def __init__(self, host: SshHost, channel: Any, log_path: Path | None, label: str,
                 pid_timeout_s: float = 10.0):
        self._host = host
        self._channel = channel
        self._label = label
        self._log = log_path.open("ab") if log_path else None
        self._code: int | None = None
        try:
            pid_line = self._read_pid_line(pid_timeout_s)
        except BaseException:
            if self._log is not None:
                self._log.close()
            raise
        self.pid = int(pid_line[len(PID_PREFIX):])
        self._reader = threading.Thread(target=self._copy_output, daemon=True,
                                        name=f"ssh-out-{self.pid}")
        self._reader.start()

    def _read_pid_line(self, timeout_s: float) -> bytes:
        buffer = b""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in buffer:
            if time.monotonic() > deadline or (self._channel.exit_status_ready()
                                               and not self._channel.recv_ready()):
                self._channel.close()
                raise SshError(f"on {self._host.name}: `{self._label}` did not start "
                               f"(no pid within {timeout_s:.0f} s): {buffer.decode()[-300:]}")
            if self._channel.recv_ready():
                buffer += self._channel.recv(4096)
            else:
                time.sleep(0.005)
        line, _, rest = buffer.partition(b"\n")
        if not line.startswith(PID_PREFIX):
            self._channel.close()
            raise SshError(f"on {self._host.name}: unexpected first line from the process "
                           f"wrapper: {line[:200]!r}")
        self._write(rest)
        return line

    def _write(self, data: bytes) -> None:
        if self._log is not None and data:
            self._log.write(data)
            self._log.flush()

    def _copy_output(self) -> None:
        while data := self._channel.recv(65536):
            self._write(data)
        if self._log is not None:
            self._log.close()

    def poll(self) -> int | None:
        """The exit code once the process ended (``-n`` for signal ``n``), else None."""
        if self._code is None and self._channel.exit_status_ready():
            self._code = _decode_status(self._channel.recv_exit_status())
        return self._code

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM the process group there, SIGKILL after ``timeout_s``; return the exit code."""
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            if self.poll() is not None:
                break
            with contextlib.suppress(SshError):
                # kill fails once the group is gone: that is what we want
                self._host.run(["kill", f"-{sig.name[3:]}", "--", f"-{self.pid}"],
                               f"stop {self._label}")
            deadline = time.monotonic() + wait_s
            while not self._channel.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._channel.exit_status_ready():
                status = self._channel.recv_exit_status()
                # No status: the signal took the wrapper down with the group.
                self._code = -sig.value if status == -1 else _decode_status(status)
        self._reader.join(2.0)
        self._channel.close()
        return self._code


def _decode_status(status: int) -> int:
    """The wrapper's status as Popen gives it: ``-n`` for signal ``n``.

    paramiko says -1 when the channel closed without a status (the wrapper was killed, or
    the connection dropped): that reads 255, the ssh client's own code for a lost session.
    """
    if status == -1:
        return 255
    if status > 128:
        return -(status - 128)
    return status
