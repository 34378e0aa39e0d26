"""A campaign's agents start once and take each run's assignment (controller.kept_agents).

Real agent processes against a real Mosquitto, fresh for every run. What is checked: the
runs of a campaign are served by the same agent processes; every run still has exactly
its own events and GPIO edges, none from the run before; a run that wants other agents
(a sweep over ``agents.count``) gets new ones; and nothing is
left running once the campaign's runs are over.
"""

from __future__ import annotations

import time

import pyarrow.dataset as ds
import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow, TransitionRow
from mqttbed.controller.states import RunState
from tests.test_remote_agents import agent_processes

pytestmark = pytest.mark.integration

MESSAGES = 300
SUBSCRIBERS = 2
SPEC = {"name": "kept", "agents": {"count": 2, "gpio": "virtual"},
        "workload": {"publishers": 1, "subscribers": SUBSCRIBERS, "rate_hz": 300,
                     "messages": MESSAGES, "warmup_messages": 0}}


def runs_of(controller, campaign_id: str) -> list[RunRow]:
    with controller.sessions() as s:
        return s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(RunRow.ordinal).all()


def rows(controller, root, campaign_id: str, run_id: str) -> list[dict]:
    path = root / f"campaign_id={campaign_id}" / f"run_id={run_id}"
    return ds.dataset(path, format="parquet").to_table().to_pylist()


def deploy_began_ns(controller, run_id: str) -> int:
    """When the run entered ``deploying``, on the monotonic clock (the agents' clock here)."""
    with controller.sessions() as s:
        at = s.query(TransitionRow).filter_by(run_id=run_id,
                                              to_state=RunState.DEPLOYING).one().at
    wall_minus_monotonic = time.time_ns() - time.monotonic_ns()
    return int(at.timestamp() * 1e9) - wall_minus_monotonic


def test_the_runs_share_the_agents_and_each_keeps_only_its_own_events(controller):
    campaign_id = controller.engine.create_campaign(parse_spec({**SPEC, "repetitions": 3}))
    assert controller.engine.run_campaign(campaign_id) == "done"
    runs = runs_of(controller, campaign_id)
    assert [r.state for r in runs] == [RunState.DONE] * 3
    # the first run started the agents; the other two were handed to them
    names = [sorted(r.run_metadata["agent_hosts"]) for r in runs]
    assert names == [[f"{runs[0].id}-a0", f"{runs[0].id}-a1"]] * 3
    agent_ids = [sorted(r.run_metadata["agents"]) for r in runs]
    assert agent_ids[0] == agent_ids[1] == agent_ids[2]
    previous_edge_ns = 0
    for run in runs:
        events = rows(controller, controller.layout.events, campaign_id, run.id)
        kinds = [e["kind"] for e in events]
        assert kinds.count("publish") == MESSAGES
        assert kinds.count("delivery") == MESSAGES * SUBSCRIBERS
        assert kinds.count("subscribe") == SUBSCRIBERS
        # every edge a run's agents uploaded was made after that run began deploying
        # (an edge left from the run before would be older) and after the last one's
        edges = rows(controller, controller.layout.gpio_edges, campaign_id, run.id)
        assert len(edges) >= MESSAGES * (1 + SUBSCRIBERS)
        began = deploy_began_ns(controller, run.id)
        first = min(e["t_ns"] for e in edges)
        assert first > max(began - 5_000_000, previous_edge_ns), (run.id, first, began)
        previous_edge_ns = max(e["t_ns"] for e in edges)
    # the campaign's runs are over: its agents are gone
    assert agent_processes(controller.url) == []


def test_a_run_that_wants_other_agents_gets_new_ones(controller):
    """(A run after a failed one gets new agents too: tests/test_engine_failures.py.)"""
    spec = {**SPEC, "sweep": {"agents.count": [1, 2]}}
    campaign_id = controller.engine.create_campaign(parse_spec(spec))
    assert controller.engine.run_campaign(campaign_id) == "done"
    first, second = runs_of(controller, campaign_id)
    assert sorted(first.run_metadata["agent_hosts"]) == [f"{first.id}-a0"]
    assert sorted(second.run_metadata["agent_hosts"]) == [f"{second.id}-a0", f"{second.id}-a1"]
    assert agent_processes(controller.url) == []

