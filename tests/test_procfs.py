"""Reading processes from /proc: what a tag search relies on.

The case the module exists for is a process between ``execve`` swapping in its new
memory and the kernel copying its strings there, when its environ and cmdline read as
empty. It was found by a loop of the killed-controller case (``test_run_retries.py``)
under ``make test``, where one scan in about 3,400 missed a live, tagged process. It is
also where a child is when ``subprocess.Popen`` returns (Python learns of the exec
through a close-on-exec pipe, which the kernel closes before it lays out the strings):
195 plain reads of 200 right after ``Popen`` were empty here.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from mqttbed.core.procfs import EXEC_RETRY_S, is_live, pids, process_strings, start_time

SPAWNS = 40


def test_a_process_caught_in_its_exec_is_read_again_not_read_as_empty():
    for _ in range(SPAWNS):
        proc = subprocess.Popen(["sleep", "30"], env={"MQTTBED_PROCFS_TEST": "yes"})
        try:
            assert process_strings(proc.pid, "environ") == [b"MQTTBED_PROCFS_TEST=yes", b""]
        finally:
            proc.kill()
            proc.wait()
    # ... where a plain read finds nothing: the case above was exercised
    for _ in range(10 * SPAWNS):
        proc = subprocess.Popen(["sleep", "30"], env={"MQTTBED_PROCFS_TEST": "yes"})
        try:
            if Path(f"/proc/{proc.pid}/environ").read_bytes() == b"":
                break
        finally:
            proc.kill()
            proc.wait()
    else:
        raise AssertionError(f"no plain read of {10 * SPAWNS} fell in an exec")


def test_a_live_process_reads_as_its_own_strings_and_a_reaped_one_as_none():
    proc = subprocess.Popen(["sleep", "30"], env={"MQTTBED_PROCFS_TEST": "yes"})
    try:
        assert process_strings(proc.pid, "cmdline") == [b"sleep", b"30", b""]
        assert b"MQTTBED_PROCFS_TEST=yes" in process_strings(proc.pid, "environ")
        assert is_live(proc.pid) and proc.pid in pids()
        assert start_time(proc.pid) is not None
    finally:
        proc.kill()
        proc.wait()
    assert process_strings(proc.pid, "environ") is None
    assert not is_live(proc.pid) and start_time(proc.pid) is None


def test_a_zombie_is_not_live_and_is_not_waited_for():
    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while is_live(proc.pid):   # exited, not yet reaped by us: a zombie
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert Path(f"/proc/{proc.pid}").exists()
        started = time.monotonic()
        assert process_strings(proc.pid, "environ") in (None, [])   # its memory is gone
        assert time.monotonic() - started < EXEC_RETRY_S   # not waited for
    finally:
        proc.wait()


def test_a_kernel_thread_is_answered_at_once():
    started = time.monotonic()
    assert process_strings(2, "cmdline") == []   # kthreadd: no user memory at all
    assert time.monotonic() - started < EXEC_RETRY_S


def test_a_process_with_an_empty_environment_is_answered_at_once():
    proc = subprocess.Popen(["sleep", "30"], env={})
    try:
        deadline = time.monotonic() + 10
        while process_strings(proc.pid, "cmdline") != [b"sleep", b"30", b""]:
            assert time.monotonic() < deadline   # its exec done: its own argv readable
            time.sleep(0.01)
        started = time.monotonic()
        assert process_strings(proc.pid, "environ") == []
        assert time.monotonic() - started < EXEC_RETRY_S   # env_end set: not in an exec
    finally:
        proc.kill()
        proc.wait()
