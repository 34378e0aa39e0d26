"""A PostgreSQL restart under a running campaign: the controller reconnects, the campaign
finishes, and nothing is lost, neither a run state nor an event.

A real controller on a real PostgreSQL (the session's private cluster), real local agents
and a real Mosquitto. The server is restarted with ``pg_ctl restart -m fast`` (every
session ended, as an administrator's restart does) while each run measures and its agents
upload events every 0.2 s, and once more while the next run deploys; in the system test,
through the whole lifecycle, once more while Spark analyses the campaign.
"""

from __future__ import annotations

import threading
import time

import pyarrow.dataset as ds
import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.analysis import load_results
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import ChunkRow, RunRow, TransitionRow
from mqttbed.controller.documents import CampaignUpdate, RunUpdate
from mqttbed.controller.states import CampaignStatus
from mqttbed.core.settings import Settings
from tests.conftest import UpdateLog, child_processes, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MESSAGES, RATE_HZ, SUBSCRIBERS = 300, 100, 2  # a 3 s window per run
SPEC = {"name": "pg-restart", "agents": {"count": 2}, "repetitions": 2,
        "workload": {"publishers": 1, "subscribers": SUBSCRIBERS, "rate_hz": RATE_HZ,
                     "messages": MESSAGES, "warmup_messages": 0, "qos": 1},
        "timing": {"upload_interval_s": 0.2, "drain_s": 1.0}}
HAPPY_PATH = [("queued", "deploying"), ("deploying", "running"), ("running", "collecting"),
              ("collecting", "done")]


def first_update(updates: UpdateLog, state: str, after: int = 0) -> int | None:
    """The index of the first run update into ``state`` at or after ``after``."""
    for index, update in enumerate(updates[after:], start=after):
        if isinstance(update, RunUpdate) and update.state == state:
            return index
    return None


def chunks_from_every_agent(controller, run_id: str) -> bool:
    """Whether chunks of ``run_id``'s events from each of the spec's agents are stored."""
    with controller.sessions() as s:
        agents = {c.agent_id for c in s.query(ChunkRow).filter_by(run_id=run_id)}
    return len(agents) == SPEC["agents"]["count"]


def events_flowing(controller, updates: UpdateLog, running: int) -> None:
    """Wait until the run that went running at update ``running`` has stored chunks of
    events from every agent (they upload every 0.2 s)."""
    run_id = updates[running].run_id
    wait_until(lambda: chunks_from_every_agent(controller, run_id), 30,
               f"chunks of {run_id}'s events from all {SPEC['agents']['count']} agents")


def wait_for_update(updates: UpdateLog, state: str, after: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (found := first_update(updates, state, after)) is None:
        assert time.monotonic() < deadline, f"no run went {state} in {timeout_s} s: {updates}"
        time.sleep(0.02)
    return found


def test_a_postgresql_restart_mid_campaign_loses_no_state_and_no_event(postgres, tmp_path):
    url = postgres.create_database()
    updates = UpdateLog()
    settings = Settings(data_dir=tmp_path / "data", database_url=url)
    restarts: list[tuple[str, int, int]] = []  # (during which state, pid before, pid after)
    with create_controller(settings, listeners=[updates.append]) as controller:
        campaign_id = controller.engine.create_campaign(parse_spec(SPEC))
        outcome: dict[str, CampaignStatus] = {}
        runner = threading.Thread(target=lambda: outcome.setdefault(
            "status", controller.engine.run_campaign(campaign_id)))
        runner.start()
        try:
            seen = 0
            for _ in range(2):  # each run: restart while it measures and uploads
                seen = wait_for_update(updates, "running", seen, 60)
                events_flowing(controller, updates, seen)
                before = postgres.postmaster_pid()
                postgres.restart()
                restarts.append(("running", before, postgres.postmaster_pid()))
                seen += 1
                if len(restarts) == 1:  # ... and once as the next run starts
                    seen = wait_for_update(updates, "deploying", seen, 60)
                    before = postgres.postmaster_pid()
                    postgres.restart()
                    restarts.append(("deploying", before, postgres.postmaster_pid()))
                    seen += 1
        finally:
            runner.join(120)
        assert not runner.is_alive()
        # the restarts happened, each while a run was under way
        assert [r[0] for r in restarts] == ["running", "deploying", "running"]
        assert all(before != after and None not in (before, after)
                   for _, before, after in restarts)
        assert outcome["status"] == CampaignStatus.DONE
        with controller.sessions() as s:
            runs = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(RunRow.id).all()
            transitions = {run.id: [(t.from_state, t.to_state) for t in s.query(TransitionRow)
                                    .filter_by(run_id=run.id).order_by(TransitionRow.id)]
                           for run in runs}
            chunk_rows = {run.id: sum(c.rows for c in s.query(ChunkRow).filter_by(
                run_id=run.id)) for run in runs}
        # every run done, at its first attempt, each transition written once and in order
        assert [(run.state, run.attempt, run.reason) for run in runs] == [("done", 0, None)] * 2
        assert all(path == HAPPY_PATH for path in transitions.values()), transitions
        for run in runs:
            assert updates.states(run.id) == ["deploying", "running", "collecting", "done"]
        # every event: each publish, each delivery to each subscriber, each subscription
        expected = MESSAGES + MESSAGES * SUBSCRIBERS + SUBSCRIBERS
        for run in runs:
            path = (controller.layout.events / f"campaign_id={campaign_id}"
                    / f"run_id={run.id}")
            assert ds.dataset(path, format="parquet").count_rows() == expected, run.id
            assert chunk_rows[run.id] == expected, run.id
    assert child_processes("mqttbed.agents") == [] and child_processes("mosquitto") == []


def spark_busy() -> bool:
    """Whether this process's Spark session is running a job."""
    from mqttbed.analytics.spark import get_spark

    return bool(get_spark().sparkContext.statusTracker().getActiveJobsIds())


def first_status(updates: UpdateLog, status: str) -> bool:
    return any(isinstance(u, CampaignUpdate) and u.status == status for u in updates)


@pytest.mark.system
@pytest.mark.parallel
@pytest.mark.timeout(400)
def test_a_campaign_through_its_analysis_outlives_postgresql_restarts(postgres, tmp_path):
    """The whole lifecycle (runs, Spark analysis, final status) on PostgreSQL, restarted
    while the first run measures and again while the analysis runs."""
    url = postgres.create_database()
    updates = UpdateLog()
    settings = Settings(data_dir=tmp_path / "data", database_url=url)
    with create_controller(settings, listeners=[updates.append]) as controller:
        campaign_id = controller.engine.create_campaign(parse_spec(SPEC))
        outcome: dict[str, CampaignStatus] = {}
        runner = threading.Thread(target=lambda: outcome.setdefault(
            "status", controller.run_campaign(campaign_id)))
        runner.start()
        restarted_during = []
        try:
            events_flowing(controller, updates, wait_for_update(updates, "running", 0, 60))
            postgres.restart()
            restarted_during.append("running")
            deadline = time.monotonic() + 300
            while not first_status(updates, "analysing"):
                assert time.monotonic() < deadline and runner.is_alive(), updates
                time.sleep(0.05)
            # Spark is reading the events (or the analysis is over already)
            wait_until(lambda: spark_busy() or first_status(updates, "done"), 120,
                       "a Spark job of the analysis")
            if not first_status(updates, "done"):
                postgres.restart()
                restarted_during.append("analysing")
        finally:
            runner.join(300)
        assert not runner.is_alive()
        assert restarted_during == ["running", "analysing"], "the analysis ended too soon"
        assert outcome["status"] == CampaignStatus.DONE
        assert [u.status for u in updates if isinstance(u, CampaignUpdate)] == [
            "running", "analysing", "done"]
        results = load_results(controller.layout, campaign_id)
    assert results is not None
    (point,) = results.points
    assert (point.runs, point.runs_failed) == (2, 0)
    assert point.messages_sent == 2 * MESSAGES
    assert point.deliveries_received == point.deliveries_expected == 2 * MESSAGES * SUBSCRIBERS
    assert (point.duplicates, point.lost) == (0, 0)
