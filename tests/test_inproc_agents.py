"""Agents on threads of the test process (``mqttbed.agents.in_process``) stand in for
agent processes: the same events for the same campaign, and the engine's supervision
kept (a thread that dies or loses its controller is reported, one that does not stop is
named). Real controller, real Mosquitto, real HTTP; only the agent's process is gone.
"""

from __future__ import annotations

import re
import socket
import threading
from collections import Counter

import pyarrow.dataset as ds
import pytest

from mqttbed.agents.deploy import Site
from mqttbed.agents.in_process import (
    HOST,
    AgentThreadsStuck,
    InProcessAgents,
    is_local,
    start_agents,
)
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import RunRow
from mqttbed.controller.states import RunState
from mqttbed.core.host import LocalHost
from mqttbed.core.run_record import run_record
from mqttbed.core.settings import Settings
from tests.conftest import InProcessStarts, child_processes, eventually

pytestmark = pytest.mark.integration

SMALL = {"name": "small", "agents": {"count": 2},
         "workload": {"publishers": 1, "subscribers": 3, "rate_hz": 200, "messages": 100,
                      "warmup_messages": 0}}


def run_small_campaign(tmp_path, name: str, starts: InProcessStarts | None):
    """Run SMALL on a controller of its own; return its run's row, record and event kinds,
    and the agent processes seen while it ran."""
    extra = {} if starts is None else {"start_agents": starts}
    with create_controller(Settings(data_dir=tmp_path / name), **extra) as ctl:
        campaign_id = ctl.engine.create_campaign(parse_spec(SMALL))
        seen: set[int] = set()
        runner = threading.Thread(target=ctl.engine.run_campaign, args=(campaign_id,))
        runner.start()
        while runner.is_alive():
            seen |= {p.pid for p in child_processes("mqttbed.agents")}
            runner.join(0.1)
        with ctl.sessions() as s:
            (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        table = ds.dataset(ctl.layout.run_events(campaign_id, run.id),
                           format="parquet").to_table(columns=["kind"])
    return run, run_record(run.run_metadata, run.id), Counter(table["kind"].to_pylist()), seen


def test_in_process_agents_record_the_same_events_as_agent_processes(tmp_path):
    """One small campaign both ways: the same counts of publishes, deliveries and
    subscriptions, nothing lost, and only the process run started agent processes."""
    starts = InProcessStarts()
    by_process = run_small_campaign(tmp_path, "processes", None)
    by_thread = run_small_campaign(tmp_path, "threads", starts)
    expected = {"publish": 100, "delivery": 3 * 100, "subscribe": 3}
    for run, record, kinds, _ in (by_process, by_thread):
        assert run.state == RunState.DONE, run.reason
        assert dict(kinds) == expected
        assert sum(c.published for c in record.delivery_counts.values()) == 100
        assert sum(c.received for c in record.delivery_counts.values()) == 3 * 100
    # the same clients on the same agents, the same generator on each side
    assert by_process[1].agents.keys() != by_thread[1].agents.keys()   # run ids differ
    assert sorted(by_process[1].agents.values()) == sorted(by_thread[1].agents.values())
    assert ({g.mqtt_client for g in by_process[1].generators.values()}
            == {g.mqtt_client for g in by_thread[1].generators.values()})
    # processes: two agent processes, recorded as local; threads: none, recorded as such
    assert len(by_process[3]) == 2 and set(by_process[1].agent_hosts.values()) == {"local"}
    assert by_thread[3] == set() and set(by_thread[1].agent_hosts.values()) == {HOST}
    assert len(starts.in_process()) == 1 and starts.running() == []


def test_an_agent_thread_that_dies_fails_the_run_at_once_with_its_reason(inproc_controller,
                                                                        inproc_starts):
    """As an agent process that exits: no GPIO chip here, so the agent's constructor
    raises; the run fails with that reason, not after the setup timeout."""
    spec = parse_spec({**SMALL, "agents": {"count": 1, "gpio": "gpiod",
                                           "gpio_chip": "/dev/gpiochip-nowhere"},
                       "timing": {"setup_timeout_s": 60}})
    campaign_id = inproc_controller.engine.create_campaign(spec)
    assert inproc_controller.engine.run_campaign(campaign_id) == "failed"
    with inproc_controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.state == RunState.FAILED
    assert run.reason.startswith(f"agent lost: {run.id}-a0 (in-process thread) ended: raised "
                                 "GpioUnavailable: "), run.reason
    assert "/dev/gpiochip-nowhere" in run.reason
    assert (run.ended_at - run.started_at).total_seconds() < 30
    (pool,) = inproc_starts.in_process()
    log = inproc_controller.layout.run_dir(campaign_id, run.id) / "agents" / f"{run.id}-a0.log"
    assert "GpioUnavailable" in log.read_text()   # the traceback, where a process logs
    assert pool.running() == []


def test_an_agent_thread_that_loses_its_controller_is_reported_and_the_process_lives_on(
        tmp_path):
    """The agent program exits when its controller goes silent; a thread must not take
    the test process with it: it ends, and the pool reports the loss."""
    ctl = create_controller(Settings(data_dir=tmp_path / "data")).start()
    pool = InProcessAgents([Site(LocalHost())], ctl.url, ctl.engine.ctx.agent_token, "r1",
                           tmp_path / "agents")
    try:
        assert ctl.agent_registry.wait_for_agents({"r1-a0"}, 10) != {}
        assert pool.exited() == []
        ctl.stop()   # the controller goes: its agent routes no longer answer
        assert eventually(lambda: pool.exited() != [], timeout_s=10)
        assert pool.exited() == ["agent lost: r1-a0 (in-process thread) lost the controller "
                                 "(the process would have exited with code 5)"]
    finally:
        pool.stop(grace_s=0)
        ctl.stop()
    assert pool.running() == []


def test_a_pool_whose_agent_thread_does_not_stop_raises_naming_it(tmp_path):
    """A thread cannot be killed: one that does not end when stopped is an error naming
    it and where it sits, never left behind unnoticed."""
    with socket.create_server(("127.0.0.1", 0)) as silent:   # accepts, never answers
        host, port = silent.getsockname()
        pool = InProcessAgents([Site(LocalHost())], f"http://{host}:{port}", "token", "r1",
                               tmp_path / "agents", kill_wait_s=0.2)
        connection, _ = silent.accept()   # the agent's registration, hanging
        with pytest.raises(AgentThreadsStuck,
                           match=r"1 agent thread\(s\) still running 0\.2 s after they were "
                                 r"stopped: mqttbed-agent-r1-a0 \(at \w+\.py:\d+ in \w+\)"):
            pool.stop(grace_s=0, timeout_s=0)
        connection.close()   # its registration fails now, and the thread ends
    assert eventually(lambda: pool.running() == [], timeout_s=5)
    # a reset (ReadError) or a close (RemoteProtocolError): the request went unread
    (reason,) = pool.exited()
    assert re.fullmatch(r"agent lost: r1-a0 \(in-process thread\) ended: raised "
                        r"(ReadError|RemoteProtocolError): .+", reason), reason


def test_only_this_machines_agent_program_runs_on_a_thread(tmp_path):
    local = Site(LocalHost())
    elsewhere = [Site(LocalHost(), ("ssh", "pi", "mqttbed", "agent")),
                 Site(LocalHost(), controller_url="http://10.0.0.1:8000")]
    assert is_local(local) and not any(is_local(site) for site in elsewhere)
    with pytest.raises(ValueError, match=r"site 1 \(local, ssh pi mqttbed agent\) is not "
                                         "this machine's agent program"):
        InProcessAgents([local, elsewhere[0]], "http://127.0.0.1:1", "t", "r1", tmp_path)
    assert start_agents([], "http://127.0.0.1:1", "t", "r1", tmp_path, gpio="auto",
                        gpio_chip="/dev/gpiochip0", env=None).names == []
