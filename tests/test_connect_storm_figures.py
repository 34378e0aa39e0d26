"""The connection-storm section of the results (analytics/connect_storm.py) from the agents'
outcomes, in plain Python: counts by outcome and CONNACK code, every phase from the
intended time on the controller's clock, the rate achieved, the broker's memory per held
connection, a point pooled over its runs; and the report's table and figures."""

from __future__ import annotations

import pytest

from mqttbed.analytics.connect_storm import (
    connect_storm_figures,
    read_storm_outcomes,
    storm_run,
    write_storm_outcomes,
)
from mqttbed.api.report_connect_storm import connect_storm_figures as report_figures
from mqttbed.core.protocol import StormOutcomes

MS = 1_000_000


def outcomes(t_start_ns: int, clients: list[int], *, connack: list[int | None],
             outcome: list[str], code: list[int] | None = None,
             ended: list[int | None] | None = None) -> StormOutcomes:
    """An agent's storm at 1,000/s: client k intended k ms after the start, connect()
    called 10 µs after it, TCP 50 µs, CONNECT written 60 µs, CONNACK as given."""
    n = len(clients)
    reached = [c is not None or o != "refused" for c, o in zip(connack, outcome, strict=True)]
    return StormOutcomes(
        t_start_ns=t_start_ns, t_all_done_ns=t_start_ns + 10 * MS,
        t_left_ns=t_start_ns + 510 * MS, clients=clients, intended_ns=[k * MS for k in clients],
        connect_ns=[10_000] * n, tcp_ns=[50_000 if r else None for r in reached],
        tls_ns=[None] * n, websocket_ns=[None] * n,
        mqtt_sent_ns=[60_000 if r else None for r in reached], connack_ns=connack,
        ended_ns=ended or [None if o == "connected" else 200_000 for o in outcome],
        outcome=outcome, code=code or [0] * n)


# agent a: clients 0, 2, 4, 6 on its own clock (the controller's + 5 ms); agent b: 1, 3, 5,
# 7 on the controller's; b's client 5 refused by CONNACK code 5, 7 closed before CONNACK
AGENT_A = outcomes(1_000 * MS + 5 * MS, [0, 2, 4, 6], connack=[300_000] * 4,
                   outcome=["connected"] * 4)
AGENT_B = outcomes(1_000 * MS + 1 * MS, [1, 3, 5, 7],
                   connack=[400_000, 400_000, None, None],
                   outcome=["connected", "connected", "connack", "closed"],
                   code=[0, 0, 5, 0])
OFFSETS = {"a": 5 * MS, "b": 1 * MS}
RSS = [(990 * MS, 10_000_000), (1_005 * MS, 10_100_000),   # before the start (1,000 ms)
       (1_100 * MS, 10_600_000), (1_200 * MS, 10_700_000), (1_300 * MS, 10_800_000),
       (2_000 * MS, 10_000_000)]                          # after the storm left


def the_run(rss=RSS):
    return storm_run({"a": AGENT_A, "b": AGENT_B}, OFFSETS, requested_clients=8,
                     requested_rate_hz=1000.0, rss=rss)


def test_a_run_counts_each_outcome_and_connack_code_and_times_phases_from_the_intended_time():
    figures = connect_storm_figures([the_run()])

    assert figures is not None
    assert (figures.clients, figures.connected, figures.failed) == (8, 6, 2)
    assert figures.failures == {"connack": 1, "closed": 1}
    assert figures.connack_codes == {"5": 1}
    assert figures.lost_while_held == 0
    assert figures.connect_lag_us.count == 8 and figures.connect_lag_us.max == 10.0
    assert figures.connack_from_intended_us.count == 6
    assert figures.connack_from_intended_us.max == 400.0
    assert figures.tcp_connect_us.p50 == 40.0                # 50 - 10 µs
    assert figures.connack_us.count == 6 and figures.connack_us.max == 340.0  # 400 - 60
    assert figures.tls_handshake_us.count == 0               # plain TCP


def test_the_achieved_rate_runs_from_the_first_intended_time_to_the_last_connack():
    figures = connect_storm_figures([the_run()])
    # on the controller's clock both agents start at 1,000 ms: the first intended time is
    # 1,000 ms, the last CONNACK client 6's, 6 ms + 300 µs later; 6 accepted over that
    # span plus one period (1 ms)
    assert figures is not None
    assert figures.achieved_connects_per_s == pytest.approx(6 / (6.3e-3 + 1e-3))
    assert figures.requested_connects_per_s == 1000.0


def test_broker_memory_per_held_connection_is_held_rss_minus_the_rss_before_over_held():
    figures = connect_storm_figures([the_run()])
    assert figures is not None and figures.broker_memory is not None
    memory = figures.broker_memory
    # before: the last sample at or before the start (1,000 ms) is 990 ms's; held: the
    # median of the samples from every connect done (1,010 ms) to leaving (1,510 ms)
    assert memory.rss_before_bytes == 10_000_000
    assert memory.rss_held_bytes == 10_700_000
    assert memory.held_connections == 6
    assert memory.bytes_per_connection == pytest.approx(700_000 / 6)


def test_without_samples_in_the_hold_there_is_no_memory_figure():
    figures = connect_storm_figures([the_run(rss=RSS[:2])])
    assert figures is not None and figures.broker_memory is None


def test_a_connection_lost_while_held_is_counted_apart():
    lost = outcomes(0, [0, 1], connack=[100_000, 100_000], outcome=["connected"] * 2,
                    ended=[None, 300 * MS])
    run = storm_run({"a": lost}, {}, requested_clients=2, requested_rate_hz=None)
    figures = connect_storm_figures([run] if run else [])
    assert figures is not None
    assert (figures.connected, figures.lost_while_held) == (2, 1)
    assert figures.requested_connects_per_s is None


def test_a_point_pools_every_connect_of_its_runs():
    figures = connect_storm_figures([the_run(), the_run()])
    assert figures is not None
    assert (figures.runs, figures.clients, figures.connected) == (2, 16, 12)
    assert figures.failures == {"connack": 2, "closed": 2}
    assert figures.connack_from_intended_us.count == 12
    assert figures.broker_memory is not None
    assert figures.broker_memory.held_connections == 12
    assert figures.broker_memory.bytes_per_connection == pytest.approx(700_000 / 6)


def test_no_storm_no_section():
    assert connect_storm_figures([]) is None
    assert storm_run({}, {}, requested_clients=1, requested_rate_hz=None) is None


def test_the_outcomes_file_of_a_run_reads_back_as_written(tmp_path):
    write_storm_outcomes(tmp_path, {"b": AGENT_B, "a": AGENT_A})
    assert read_storm_outcomes(tmp_path) == {"a": AGENT_A, "b": AGENT_B}
    assert read_storm_outcomes(tmp_path / "elsewhere") == {}


def test_the_report_draws_phases_from_the_intended_time_and_the_rate_asked_and_achieved():
    from mqttbed.analytics.results import PointStats

    figures = connect_storm_figures([the_run()])
    point = PointStats.model_construct(point_index=0, connect_storm=figures)
    drawn = report_figures([point], {0: "tcp"})

    latency = {trace["name"]: trace for trace in drawn["plot-connect-storm-latency"]["data"]}
    assert sorted(latency) == ["CONNACK p50 (bar to p99)", "TCP established p50 (bar to p99)",
                               "connect() called p50 (bar to p99)"]   # no TLS, no WebSocket
    assert latency["CONNACK p50 (bar to p99)"]["y"] == [figures.connack_from_intended_us.p50]
    rate = drawn["plot-connect-storm-rate"]["data"]
    assert [t["y"] for t in rate] == [[1000.0], [figures.achieved_connects_per_s]]
