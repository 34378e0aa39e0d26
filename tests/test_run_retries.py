"""Runs interrupted by their controller are retried; what a dead controller started is reaped.

The end-to-end case (real ``mqttbed serve`` killed and stopped mid-run) is in
``test_controller_faults.py``; these are its parts, each on its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow
from mqttbed.controller.states import CampaignStatus, RunState
from mqttbed.core.errors import SpecError
from mqttbed.core.process_journal import JOURNAL_SUBDIR, reap_stale, tagged_processes
from mqttbed.core.procfs import is_live


def mark_running(controller, run_id: str) -> None:
    """What a controller killed mid-run leaves in the database."""
    with controller.sessions() as s:
        s.get(RunRow, run_id).state = RunState.RUNNING
        s.commit()


def runs(controller, campaign_id: str) -> list[tuple[str, int, str]]:
    with controller.sessions() as s:
        rows = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(
            RunRow.ordinal, RunRow.attempt)
        return [(r.id.removeprefix(campaign_id), r.attempt, r.state) for r in rows]


def test_a_run_interrupted_by_a_restart_is_retried_until_its_retries_are_used(controller, db_url):
    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "crash", "retries": 2, "sweep": {"workload.subscribers": [1, 2]}}))
    mark_running(controller, f"{campaign_id}-r0000")
    assert controller.engine.recover() == 1
    assert runs(controller, campaign_id) == [("-r0000", 0, "interrupted"),
                                             ("-r0000-retry1", 1, "queued"),
                                             ("-r0001", 0, "queued")]
    with controller.sessions() as s:
        first, retry = s.get(RunRow, f"{campaign_id}-r0000"), \
            s.get(RunRow, f"{campaign_id}-r0000-retry1")
        assert first.reason == "controller restarted during the run"
        assert first.run_metadata == {"retried_as": f"{campaign_id}-r0000-retry1"}
        assert retry.run_metadata == {"retry_of": f"{campaign_id}-r0000"}
        assert (retry.point_index, retry.repetition, retry.params) == \
            (first.point_index, first.repetition, first.params)
    for attempt in (1, 2):
        mark_running(controller, f"{campaign_id}-r0000-retry{attempt}")
        assert controller.engine.recover() == 1
    assert runs(controller, campaign_id) == [("-r0000", 0, "interrupted"),
                                             ("-r0000-retry1", 1, "interrupted"),
                                             ("-r0000-retry2", 2, "interrupted"),
                                             ("-r0001", 0, "queued")]


def test_the_outcome_counts_a_retried_run_by_its_last_attempt(controller, db_url):
    campaign_id = controller.engine.create_campaign(parse_spec({"name": "crash"}))
    mark_running(controller, f"{campaign_id}-r0000")
    controller.engine.recover()
    with controller.sessions() as s:
        s.get(RunRow, f"{campaign_id}-r0000-retry1").state = RunState.DONE
        s.commit()
    assert controller.engine.outcome(campaign_id) == (CampaignStatus.DONE, None)


def test_retries_zero_leaves_an_interrupted_run_interrupted(controller, db_url):
    campaign_id = controller.engine.create_campaign(parse_spec({"name": "crash",
                                                                "retries": 0}))
    mark_running(controller, f"{campaign_id}-r0000")
    controller.engine.recover()
    assert runs(controller, campaign_id) == [("-r0000", 0, "interrupted")]
    assert controller.engine.outcome(campaign_id) == (CampaignStatus.FAILED,
                                                      "1 of 1 runs did not finish")


@pytest.mark.parametrize("value", [-1, 11, "twice"])
def test_bad_retries_are_refused_naming_the_field_and_value(value):
    with pytest.raises(SpecError, match=rf"^retries: bad value {value!r}: "):
        parse_spec({"name": "x", "retries": value})


def test_retries_default_to_one():
    assert parse_spec({"name": "x"}).retries == 1


DYING_CONTROLLER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from mqttbed.core.host import LocalHost, install_journal
    from mqttbed.core.process_journal import ProcessJournal
    install_journal(ProcessJournal(Path(sys.argv[1])).open())
    # The group leader dies with this process (PDEATHSIG); the sleep it forked does not.
    handle = LocalHost().spawn(["sh", "-c", "sleep 60 & echo $! > " + sys.argv[2] + "; wait"])
    print(handle.pid, flush=True)
    time.sleep(60)  # window: lives until the test kills it
""")


def test_what_a_killed_controller_left_is_reaped_by_the_next_one(tmp_path):
    grandchild_file = tmp_path / "sleep.pid"
    controller = subprocess.Popen([sys.executable, "-c", DYING_CONTROLLER, str(tmp_path),
                                   str(grandchild_file)], stdout=subprocess.PIPE, text=True)
    try:
        leader = int(controller.stdout.readline())
        deadline = time.monotonic() + 10
        while not grandchild_file.exists() or not grandchild_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        grandchild = int(grandchild_file.read_text())
        (journal,) = (tmp_path / JOURNAL_SUBDIR).glob("*.json")
        assert os.getpgid(grandchild) == leader
        assert reap_stale(tmp_path) == []  # its controller lives: not touched
        controller.send_signal(signal.SIGKILL)
        controller.wait(5)
        deadline = time.monotonic() + 5
        while is_live(leader):
            assert time.monotonic() < deadline, "PDEATHSIG did not kill the group leader"
            time.sleep(0.02)
        assert tagged_processes(journal.stem) == [grandchild]  # escaped PDEATHSIG

        (reaped,) = reap_stale(tmp_path)
        assert (reaped.controller_pid, reaped.groups, reaped.killed) == \
            (controller.pid, (leader,), (grandchild,))
        deadline = time.monotonic() + 5
        while tagged_processes(journal.stem):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not journal.exists()
    finally:
        controller.kill()
        if grandchild_file.exists() and grandchild_file.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(grandchild_file.read_text()), signal.SIGKILL)

