"""A local process's pid stays its own until mqttbed stops it.

``LocalProcess.poll`` reports an exit without reaping the leader (``waitid`` with
``WNOWAIT``): the exited leader stays a zombie, so its pid, and the process group named
by it, cannot be handed to another process before ``stop`` has signalled the group and
reaped it. A signal through a stale handle can so never reach a process mqttbed did not
start.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from mqttbed.core.host import LocalHost
from mqttbed.core.procfs import is_live


def state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def wait_for_exit(proc) -> int:
    deadline = time.monotonic() + 10
    while (code := proc.poll()) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return code


def test_an_exited_leader_is_reported_and_held_until_stop_reaps_it(monkeypatch):
    proc = LocalHost().spawn(["sh", "-c", "exit 3"])
    assert wait_for_exit(proc) == 3
    assert proc.poll() == 3                       # asked again: the same answer
    assert state(proc.pid) == "Z"                 # not reaped: the pid is still its own
    assert proc.stop() == 3
    assert state(proc.pid) is None                # reaped by stop
    signalled = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: signalled.append((pgid, sig)))
    assert proc.stop() == 3 and proc.poll() == 3  # a second stop signals nothing
    assert signalled == []


def test_a_killed_leader_reports_the_signal_and_stop_still_ends_its_group(tmp_path):
    pid_file = tmp_path / "sleep.pid"
    proc = LocalHost().spawn(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"])
    try:
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        straggler = int(pid_file.read_text())
        os.kill(proc.pid, signal.SIGKILL)         # the leader only: its sleep lives on
        assert wait_for_exit(proc) == -signal.SIGKILL
        assert is_live(straggler) and os.getpgid(straggler) == proc.pid
        proc.stop()                               # the group, still named by the zombie
        deadline = time.monotonic() + 10
        while is_live(straggler):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.stop()
