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

Host keys, as OpenSSH's ``StrictHostKeyChecking``: a host's key must be in its entry's
``known_hosts`` file (default ``~/.ssh/known_hosts``). An unknown key is refused, naming
the host, its key's fingerprint and the fix, unless the entry says ``trust_new: true``
(``accept-new``): then the key is appended to that file on first connect and checked
against it ever after. A key that differs from the pinned one is always refused.

Validated against a real OpenSSH server on this machine (tests/test_ssh_host.py and the
remote-agent campaign test); not against a Raspberry Pi.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
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
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


class SshError(RuntimeError):
    """SSH to a host failed, or a command there did."""


class SshTarget(BaseModel):
    """How to reach a machine over SSH."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str = Field(description="SSH destination, user@host (fabric syntax, :port allowed)")
    ssh_port: int | None = Field(default=None, ge=1, le=65535,
                                 description="SSH port (default: 22, or the :port in host)")
    key_filename: str | None = Field(default=None, description="private key for SSH")
    known_hosts: str | None = Field(
        default=None, description="known_hosts file the host key must be in (default "
                                  "~/.ssh/known_hosts); unknown keys are refused")
    trust_new: bool = Field(
        default=False, description="accept an unknown host key on first connect and pin it "
                                   "in known_hosts (a changed key is always refused)")
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300,
                                     description="how long connecting over SSH may take")

    @property
    def address(self) -> str:
        """The machine's address, without user and port."""
        return self.host.rpartition("@")[2].split(":")[0]


def connect(target: SshTarget, label: str) -> Any:
    """Open a fabric Connection to ``target``, its host key checked (module docstring)."""
    from fabric import Connection
    from paramiko.ssh_exception import BadHostKeyException, SSHException

    connect_kwargs: dict[str, Any] = {}
    if target.key_filename:
        connect_kwargs["key_filename"] = [str(Path(target.key_filename).expanduser())]
    connection = Connection(target.host, port=target.ssh_port,
                            connect_timeout=int(target.connect_timeout_s),
                            connect_kwargs=connect_kwargs)
    known_hosts = Path(target.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
    if known_hosts.exists():
        connection.client.load_host_keys(str(known_hosts))
    connection.client.set_missing_host_key_policy(_HostKeyPolicy(target, label, known_hosts))
    try:
        connection.open()
    except _UnknownHostKey as exc:
        raise SshError(str(exc)) from None
    except BadHostKeyException as exc:
        port = connection.port
        name = exc.hostname if port == 22 else f"[{exc.hostname}]:{port}"  # as known_hosts
        raise SshError(
            f"SSH to {label} failed: the host key of {name} changed: it offers "
            f"{exc.key.get_name()} {fingerprint(exc.key)}, {known_hosts} pins "
            f"{fingerprint(exc.expected_key)}. Someone may be in between; if the machine "
            f"was reinstalled, check the new fingerprint there, remove the old key with "
            f"`ssh-keygen -R '{name}' -f {known_hosts}` and connect again") from exc
    except (SSHException, OSError) as exc:
        raise SshError(f"SSH to {label} failed: {type(exc).__name__}: {exc}") from exc
    return connection


def fingerprint(key: Any) -> str:
    """A host key's fingerprint as ``ssh-keygen -l`` prints it (SHA256:...)."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


class _UnknownHostKey(Exception):
    """A host key in no known_hosts file, refused (the message is the user's)."""


class _HostKeyPolicy:
    """paramiko's missing-host-key hook: pin when the entry trusts new keys, else refuse."""

    def __init__(self, target: SshTarget, label: str, known_hosts: Path):
        self._target = target
        self._label = label
        self._known_hosts = known_hosts

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        if not self._target.trust_new:
            port = self._target.ssh_port or 22
            raise _UnknownHostKey(
                f"SSH to {self._label} failed: the host key of {hostname} ({key.get_name()} "
                f"{fingerprint(key)}) is not in {self._known_hosts}, so it is refused. Check "
                f"that fingerprint on the machine (ssh-keygen -lf on its "
                f"/etc/ssh/ssh_host_*_key.pub) and add its key (ssh-keyscan -p {port} "
                f"{self._target.address} >> {self._known_hosts}), or set trust_new: true in "
                "this host's entry to pin the key it offers on first connect")
        pin_host_key(self._known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


def pin_host_key(known_hosts: Path, hostname: str, key: Any) -> None:
    """Append ``hostname``'s key to ``known_hosts`` (created 0600 in a 0700 directory),
    under a lock so that agents connecting at once each add their line whole."""
    known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


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
