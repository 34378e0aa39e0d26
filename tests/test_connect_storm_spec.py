"""A connection storm's spec and plan: the example campaign loads, every sweep point keeps
the storm, the clients are dealt round-robin over the agents with their intended times,
and the run's window holds the schedule, the connects' timeout and the hold."""

from __future__ import annotations

import pytest

from mqttbed.campaigns.spec import builtin_spec_path, expand_points, load_spec, parse_spec
from mqttbed.controller.assignments import (
    STORM_CONNECT_TIMEOUT_S,
    agents_needed,
    plan_assignments,
    run_window_ns,
)
from mqttbed.core.errors import SpecError
from mqttbed.core.protocol import Endpoint


def storm_spec(**connect) -> dict:
    return {"name": "storm", "broker": {"backend": "mosquitto"},
            "workload": {"mode": "connect", "connect": {"clients": 10, **connect}}}


def test_the_example_campaign_storms_mosquitto_over_tcp_and_tls():
    spec = load_spec(builtin_spec_path("connect-storm"))
    points = expand_points(spec)
    assert [p.spec.broker.transport for p in points] == ["tcp", "tls"]
    assert all(p.spec.workload.shape() == "connect" for p in points)
    assert points[0].spec.workload.connect is not None
    assert points[0].spec.workload.connect.clients == 2000


def test_a_storm_with_publishers_or_a_shape_is_refused_naming_them():
    spec = storm_spec()
    spec["workload"]["publishers"] = 3
    with pytest.raises(SpecError, match="mode 'connect' opens connections only: leave "
                                        "publishers out"):
        parse_spec(spec)


def test_storm_clients_are_dealt_round_robin_with_their_intended_times():
    spec = parse_spec({**storm_spec(rate_hz=100.0, hold_s=1.5), "agents": {"count": 3}})
    assert agents_needed(spec) == 3
    plans = plan_assignments(spec, "run-1", "camp-1", Endpoint(host="127.0.0.1", port=1883),
                             ["a0", "a1", "a2"])
    assert sorted(plans) == ["a0", "a1", "a2"]
    assert all(a.clients == [] for a in plans.values())
    dealt = {agent: list(a.storm.clients()) for agent, a in plans.items() if a.storm}
    assert dealt == {"a0": [0, 3, 6, 9], "a1": [1, 4, 7], "a2": [2, 5, 8]}
    storm = plans["a1"].storm
    assert storm is not None and storm.total == 10 and storm.hold_s == 1.5
    assert storm.offset_ns(7) == 70_000_000   # client 7 at 7 / 100 Hz
    # the schedule (9 / 100 Hz), every connect's timeout, then the hold
    assert run_window_ns(spec) == int((0.09 + STORM_CONNECT_TIMEOUT_S + 1.5) * 1e9)


def test_more_agents_than_storm_clients_uses_one_agent_per_client():
    spec = parse_spec({**storm_spec(clients=2), "agents": {"count": 4}})
    assert agents_needed(spec) == 2


def test_an_all_at_once_storm_intends_every_client_at_the_start():
    spec = parse_spec(storm_spec())
    plans = plan_assignments(spec, "run-1", "camp-1", Endpoint(host="h", port=1), ["a0"])
    storm = plans["a0"].storm
    assert storm is not None and storm.rate_hz is None
    assert {storm.offset_ns(k) for k in storm.clients()} == {0}
