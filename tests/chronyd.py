"""A chronyd of a test's own: its config, pid file and command socket in a private
directory, run with ``-x`` so that it never touches this machine's clock."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.conftest import terminate

CHRONYD = "/usr/sbin/chronyd"


def free_udp_port(address: str = "127.0.0.1") -> int:
    """A UDP port nothing on ``address`` uses right now (for a chronyd's NTP port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class Chronyd:
    """One chronyd in the foreground, its files in ``root`` (0700, as chronyd demands)."""

    def __init__(self, root: Path, lines: list[str]):
        root.mkdir(mode=0o700)
        self.socket = root / "chronyd.sock"
        (root / "chrony.conf").write_text("\n".join([
            *lines, f"bindcmdaddress {self.socket}", "cmdport 0",
            f"pidfile {root / 'chronyd.pid'}", ""]))
        self.log = root / "chronyd.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([CHRONYD, "-x", "-d", "-u", "root", "-f",
                                          str(root / "chrony.conf")], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def tracking(self, csv: bool = True) -> str:
        """``chronyc [-c] tracking`` against this daemon, once it answers."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done = subprocess.run(["chronyc", "-h", str(self.socket),
                                   *(["-c"] if csv else []), "tracking"],
                                  capture_output=True, text=True, timeout=5, check=False)
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"chronyd did not answer: {self.log.read_text()}")

    def stop(self) -> None:
        terminate(self.proc)
