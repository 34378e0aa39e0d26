"""The run engine with real agents and a real Mosquitto, when things go wrong.

A lost agent or a dead broker fails the run with that reason and keeps every event that
already arrived; no process outlives its run.

The agents are processes where the process is what is tested (killed with SIGKILL,
stopped with SIGSTOP). The transitions of a run are the engine's alone: the agents of
that test run on threads of this process (``inproc_controller``), the same agent program
over the same HTTP routes, which records the same events (tests/test_inproc_agents.py).
"""

from __future__ import annotations

import re
import threading
import time

import httpx
import pyarrow.dataset as ds
import pytest

from mqttbed.brokers.mosquitto.backend import MosquittoDeployment
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.compaction import COMPACTED_NAME, data_files
from mqttbed.controller.db import AgentRow, ChunkRow, RunRow, TransitionRow
from mqttbed.controller.states import RunState
from mqttbed.core.events import EVENT_COLUMNS
from mqttbed.core.protocol import ResultChunk
from mqttbed.core.run_record import run_record
from tests.conftest import child_processes, wait_until

pytestmark = pytest.mark.integration

LONG_RUN = {"name": "long", "agents": {"count": 2},
            "workload": {"publishers": 1, "subscribers": 2, "rate_hz": 200, "messages": 3000,
                         "warmup_messages": 0},
            "timing": {"heartbeat_timeout_s": 2.0}}


def start_campaign(controller, spec_data):
    campaign_id = controller.engine.create_campaign(parse_spec(spec_data))
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("status", controller.engine.run_campaign(campaign_id)))
    thread.start()
    return campaign_id, thread, result



def stored_rows(controller, run_id):
    with controller.sessions() as s:
        chunks = s.query(ChunkRow).filter_by(run_id=run_id).all()
        return {(c.agent_id, c.seq): c.rows for c in chunks}


def dataset_rows(controller, campaign_id, run_id):
    path = controller.layout.events / f"campaign_id={campaign_id}" / f"run_id={run_id}"
    return ds.dataset(path, format="parquet").count_rows() if path.exists() else 0


def only_run(controller, campaign_id) -> RunRow:
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        return run


def test_killed_agent_fails_run_with_reason_keeps_uploaded_events_and_next_run_proceeds(
        controller, updates):
    """Fault row "agent killed (SIGKILL) mid-run"; the campaign's second run is short."""
    spec = {**LONG_RUN, "sweep": {"workload.messages": [3000, 100]}}
    campaign_id, thread, result = start_campaign(controller, spec)
    run_id, next_run_id = f"{campaign_id}-r0000", f"{campaign_id}-r0001"
    wait_until(lambda: RunState.RUNNING in updates.states(run_id), 30, "run to start")
    wait_until(lambda: sum(stored_rows(controller, run_id).values()) > 200, 15, "some chunks")
    victim = child_processes("mqttbed.agents")[0]
    victim_name = next(part for part in victim.cmdline() if part.startswith(f"{run_id}-a"))
    victim.kill()
    thread.join(60)
    assert not thread.is_alive()

    with controller.sessions() as s:
        run, next_run = s.get(RunRow, run_id), s.get(RunRow, next_run_id)
        agent_states = {a.pid: a.state for a in s.query(AgentRow)}
    assert run.state == RunState.FAILED
    assert run.reason.startswith(f"agent lost: {victim_name} (pid {victim.pid}) exited with "
                                 "code -9 (killed by SIGKILL)"), run.reason
    assert agent_states[victim.pid] == "gone"
    # every chunk acknowledged before the kill is still in the dataset
    stored = stored_rows(controller, run_id)
    assert sum(stored.values()) > 200
    assert dataset_rows(controller, campaign_id, run_id) == sum(stored.values())
    # the next run proceeds: done, its 100 publishes, 2 x 100 deliveries, 2 subscriptions
    assert next_run.state == RunState.DONE, next_run.reason
    assert dataset_rows(controller, campaign_id, next_run_id) == 100 + 200 + 2
    # on agents of its own: a failed run's surviving agents are not kept for the next
    assert sorted(next_run.run_metadata["agent_hosts"]) == [f"{next_run_id}-a0",
                                                            f"{next_run_id}-a1"]
    # both runs' chunks were compacted as each ended, the failed one too
    for ended in (run_id, next_run_id):
        partition = controller.layout.run_events(campaign_id, ended)
        assert [f.name for f in data_files(partition)] == [COMPACTED_NAME], ended
    assert result["status"] == "failed"
    # and nothing the runs started is left
    assert child_processes("mqttbed.agents") == []
    assert child_processes("mosquitto") == []


# A broker killed mid-run, for every backend: tests/test_backend_conformance.py.


def test_every_transition_is_recorded_in_order(inproc_controller, updates, db_url,
                                               inproc_starts):
    controller = inproc_controller
    spec = {"name": "tiny", "agents": {"count": 1},
            "workload": {"subscribers": 2, "rate_hz": 200, "messages": 40, "warmup_messages": 5}}
    campaign_id, thread, result = start_campaign(controller, spec)
    thread.join(60)
    run_id = f"{campaign_id}-r0000"
    assert result["status"] == "done"
    with controller.sessions() as s:
        path = [(t.from_state, t.to_state) for t in
                s.query(TransitionRow).filter_by(run_id=run_id).order_by(TransitionRow.id)]
    assert path == [("queued", "deploying"), ("deploying", "running"),
                    ("running", "collecting"), ("collecting", "done")]
    assert updates.states(run_id) == ["deploying", "running", "collecting", "done"]
    with controller.sessions() as s:
        agents = s.query(AgentRow).all()
    assert [(a.name, a.state) for a in agents] == [(f"{run_id}-a0", "gone")]
    run = only_run(controller, campaign_id)
    broker = run_record(run.run_metadata, run.id).broker
    assert broker is not None and broker.version is not None and broker.version.startswith("2.")
    assert broker.as_type(MosquittoDeployment).limits.max_queued_messages == 1000
    # 40 publishes + 2 x 40 deliveries + 2 subscriptions, all stored
    assert dataset_rows(controller, campaign_id, run_id) == 40 + 80 + 2
    assert len(inproc_starts.in_process()) == 1 and inproc_starts.running() == []
    assert child_processes("mqttbed.agents") == [] and child_processes("mosquitto") == []


def test_a_chunk_sent_twice_is_stored_once(controller, db_url):
    campaign_id = controller.engine.create_campaign(parse_spec({"name": "idem"}))
    run_id = f"{campaign_id}-r0000"
    columns = {"kind": ["publish"] * 2, "publisher": ["pub-0"] * 2, "seq": [1, 2],
               "receiver": [None] * 2, "topic": ["t"] * 2, "payload_bytes": [64] * 2,
               "qos": [0] * 2, "warmup": [False] * 2, "t_intended_ns": [1, 2],
               "t_pub_ns": [2, 3], "t_recv_ns": [None] * 2}
    constants = {"agent_id": "a", "clock_source": "user", "clock_offset_ns": 0,
                 "clock_offset_uncertainty_ns": 0}
    chunk = ResultChunk(run_id=run_id, agent_id="a", seq=0, columns=columns, constants=constants)
    token = controller.engine.ctx.agent_token
    with httpx.Client(base_url=controller.url,
                      headers={"authorization": f"Bearer {token}",
                               "content-type": "application/json"}) as http:
        answers = [http.post(f"/agent/v1/runs/{run_id}/chunks",
                             content=chunk.model_dump_json()).json() for _ in range(2)]
        wrong = httpx.post(f"{controller.url}/agent/v1/runs/{run_id}/chunks",
                           content=chunk.model_dump_json(),
                           headers={"authorization": "Bearer nope",
                                    "content-type": "application/json"})
    assert answers == [{"stored": True}, {"stored": False}]
    assert stored_rows(controller, run_id) == {("a", 0): 2}
    assert dataset_rows(controller, campaign_id, run_id) == 2
    assert wrong.status_code == 401


def test_malformed_agent_messages_are_422_and_store_nothing(controller):
    campaign_id = controller.engine.create_campaign(parse_spec({"name": "malformed"}))
    run_id = f"{campaign_id}-r0000"
    token = controller.engine.ctx.agent_token
    columns = {"kind": ["publish"], "publisher": ["pub-0"], "seq": [1], "receiver": [None],
               "topic": ["t"], "payload_bytes": [64], "qos": [0], "warmup": [False],
               "t_intended_ns": [1], "t_pub_ns": ["not a time"], "t_recv_ns": [None]}
    constants = {"agent_id": "a", "clock_source": "user", "clock_offset_ns": 0,
                 "clock_offset_uncertainty_ns": 0}
    bad_chunk = ResultChunk(run_id=run_id, agent_id="a", seq=0, columns=columns,
                            constants=constants)
    hello = {"name": "pi", "hostname": "pi", "pid": 2**70, "cores": 4, "gpio_backend": "virtual",
             "clock": "CLOCK_MONOTONIC", "clock_resolution_ns": 1}
    with httpx.Client(base_url=controller.url,
                      headers={"authorization": f"Bearer {token}",
                               "content-type": "application/json"}) as http:
        chunk_answer = http.post(f"/agent/v1/runs/{run_id}/chunks",
                                 content=bad_chunk.model_dump_json())
        register_answer = http.post("/agent/v1/register", json=hello)
    assert chunk_answer.status_code == 422
    assert "does not fit the event schema" in chunk_answer.json()["detail"]
    assert register_answer.status_code == 422 and "pid" in register_answer.text
    assert stored_rows(controller, run_id) == {}
    assert dataset_rows(controller, campaign_id, run_id) == 0


def test_a_chunk_missing_a_column_is_rejected_naming_it():
    with pytest.raises(ValueError, match=r"missing \['t_recv_ns'\]"):
        ResultChunk(run_id="r", agent_id="a", seq=0,
                    columns={c: [] for c in EVENT_COLUMNS if c != "t_recv_ns"})


def test_runs_left_active_by_a_dead_controller_are_marked_interrupted(controller,
                                                                             db_url):
    campaign_id = controller.engine.create_campaign(parse_spec({"name": "crash"}))
    with controller.sessions() as s:
        run = s.get(RunRow, f"{campaign_id}-r0000")
        run.state = RunState.RUNNING
        s.commit()
    assert controller.engine.recover() == 1
    with controller.sessions() as s:
        run, retry = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(
            RunRow.attempt).all()
    assert run.state == RunState.INTERRUPTED
    assert run.reason == "controller restarted during the run"
    assert (retry.id, retry.attempt, retry.state) == (f"{campaign_id}-r0000-retry1", 1,
                                                      RunState.QUEUED)


def test_agent_that_stops_heartbeating_is_lost_and_fails_the_run(controller, updates):
    """The remote-agent case: the process may live on, but the controller hears nothing."""
    campaign_id, thread, _ = start_campaign(controller, LONG_RUN)
    run_id = f"{campaign_id}-r0000"
    wait_until(lambda: RunState.RUNNING in updates.states(run_id), 30, "run to start")
    wait_until(lambda: sum(stored_rows(controller, run_id).values()) > 200, 15, "some chunks")
    victim = child_processes("mqttbed.agents")[0]
    victim.suspend()  # SIGSTOP: alive, silent
    thread.join(60)

    run = only_run(controller, campaign_id)
    assert run.state == RunState.FAILED
    assert re.fullmatch(rf"agent lost: agent-\d+-{run_id}-a\d: no heartbeat for 2\.0 s",
                        run.reason), run.reason
    assert dataset_rows(controller, campaign_id, run_id) >= 200
    assert child_processes("mqttbed.agents") == [] and child_processes("mosquitto") == []


def test_a_broker_whose_exit_shows_after_its_agents_reports_still_has_the_last_word():
    # Its sockets close (the agents report "broker closed the connection") a moment
    # before the kernel lets its exit be seen; the engine waits that moment out.
    from mqttbed.controller.engine import BROKER_EXIT_GRACE_S, RunEngine

    class Dying:
        def __init__(self, shows_after_s: float):
            self.shows_at = time.monotonic() + shows_after_s

        def health(self) -> str | None:
            return ("mosquitto (pid 1) exited with code -9 (killed by SIGKILL)"
                    if time.monotonic() >= self.shows_at else None)

    assert RunEngine._broker_broken_within(Dying(0.1), BROKER_EXIT_GRACE_S) == (
        "mosquitto (pid 1) exited with code -9 (killed by SIGKILL)")
    started = time.monotonic()
    assert RunEngine._broker_broken_within(Dying(60), 0.2) is None   # healthy: the agents'
    assert 0.2 <= time.monotonic() - started < 2                    # reasons stand
