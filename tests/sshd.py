"""A real OpenSSH server on a free loopback port, configured entirely inside one directory.

sshd runs as a child of the test (``-D``) with its own host key, and root may log in with
the client key it generates; ``bin/`` comes first on the PATH of every session, for
stand-ins of programs a lab machine has and this one does not.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import terminate

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")


class LocalSshd:
    """A real sshd on 127.0.0.1:<free port>, configured entirely inside ``root``."""

    def __init__(self, root: Path):
        if not os.path.exists(SSHD):
            pytest.fail(f"{SSHD} not found: install openssh-server "
                        f"(scripts/system-deps.sh does it as part of `make install`)")
        try:
            PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)   # sshd refuses to start without it
        except OSError as exc:
            pytest.fail(f"sshd needs {PRIVSEP_DIR} and it cannot be created: {exc}")
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        for name in ("host_key", "client_key", "other_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(root / name)], check=True)
        shutil.copy(root / "client_key.pub", root / "authorized_keys")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = root / "sshd_config"
        config.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1",
            f"HostKey {root / 'host_key'}", f"AuthorizedKeysFile {root / 'authorized_keys'}",
            f"PidFile {root / 'sshd.pid'}", "UsePAM no", "StrictModes no",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "Subsystem sftp internal-sftp",
            f"SetEnv PATH={self.bin}:/usr/local/bin:/usr/bin:/bin", ""]))
        self.log = root / "sshd.log"
        self._start()
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(self.known_hosts_line())

    def _start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self._wait_for_banner()

    def known_hosts_line(self) -> str:
        """The server's current host key as a known_hosts line."""
        host_key = (self.root / "host_key.pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n"

    def rotate_host_key(self) -> None:
        """Restart on the same port with a new host key (a reinstalled machine, or a
        machine in between)."""
        self.stop()
        for name in ("host_key", "host_key.pub"):
            (self.root / name).unlink()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        str(self.root / "host_key")], check=True)
        self._start()

    def _wait_for_banner(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"sshd exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-2.0"):
                        return
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"sshd did not answer on port {self.port}: {self.log.read_text()}")

    def stop(self) -> None:
        terminate(self.proc)

    def target(self, **extra: object) -> dict[str, object]:
        """SshTarget fields for logging in as root with the client key, host key checked."""
        return {"host": "root@127.0.0.1", "ssh_port": self.port,
                "key_filename": str(self.root / "client_key"),
                "known_hosts": str(self.known_hosts), **extra}
