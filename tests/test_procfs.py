"""Reading processes from /proc: what a tag search relies on.

The case the module exists for, a process caught between ``execve`` swapping its memory
and the new image's strings being copied in, cannot be produced on demand: it was found
by a loop of the killed-controller case (``test_run_retries.py``) under ``make test``,
where one scan in about 3,400 missed a live process. These are the deterministic parts.
"""

from __future__ import annotations

import os
import subprocess
import time

from mqttbed.core.procfs import EXEC_RETRY_S, is_live, pids, process_strings, start_time


def test_a_live_process_reads_as_its_own_strings_and_a_reaped_one_as_none():
    proc = subprocess.Popen(["sleep", "30"], env={"MQTTBED_PROCFS_TEST": "yes"})
    try:
        assert process_strings(proc.pid, "cmdline")[:2] == [b"sleep", b"30"]
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
        assert os.path.exists(f"/proc/{proc.pid}")
        started = time.monotonic()
        assert process_strings(proc.pid, "environ") in (None, [])   # its memory is gone
        assert time.monotonic() - started < EXEC_RETRY_S   # not waited for
    finally:
        proc.wait()


def test_a_kernel_thread_is_answered_at_once():
    started = time.monotonic()
    assert process_strings(2, "cmdline") == []   # kthreadd: no user memory at all
    assert time.monotonic() - started < EXEC_RETRY_S


def test_a_process_with_an_empty_environment_is_read_as_empty_after_the_retry():
    proc = subprocess.Popen(["sleep", "30"], env={})
    try:
        started = time.monotonic()
        assert process_strings(proc.pid, "environ") == []
        assert time.monotonic() - started >= EXEC_RETRY_S   # read again, then believed
    finally:
        proc.kill()
        proc.wait()
