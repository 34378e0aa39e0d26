"""Connection figures: each client's connect phases, from an agent's Done to the run
record, the results (per run, pooled per point) and the report.

The figures are checked against numpy's percentiles over the same values; the Spark
analysis (a document merged from run partials equals the whole one to the bit, points pool
their done runs only) is checked in tests/test_analytics_stats.py, whose runs carry
connections.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from mqttbed.analytics.connections import (
    CONNECT_CLOCK,
    ConnectTimes,
    connect_times,
    connection_figures,
)
from mqttbed.analytics.results import results_model
from mqttbed.analytics.results_files import read_stats, read_stats_parquet, write_stats
from mqttbed.api.report import build_figures
from mqttbed.api.report_connections import connection_rows
from mqttbed.campaigns.spec import CampaignSpec, parse_spec
from mqttbed.controller.analysis import run_info
from mqttbed.controller.db import RunRow
from mqttbed.core.broker_access import ConnectPhases
from mqttbed.core.protocol import Done
from mqttbed.core.run_record import RunRecord, run_record

US = 1_000


def phases(client_id: str, tcp: int | None, connack: int | None, *, tls: int | None = None,
           websocket: int | None = None) -> ConnectPhases:
    return ConnectPhases(client_id=client_id, t_start_ns=10**12, tcp_ns=tcp, tls_ns=tls,
                         websocket_ns=websocket, connack_ns=connack)


def reference(values_ns: list[int]) -> dict[str, float]:
    """The distribution by numpy: linear interpolation between closest ranks, in µs."""
    values = np.array(values_ns, dtype=float) / 1e3
    return {"count": len(values), "mean": float(values.mean()),
            "std": float(values.std(ddof=1)),
            **{name: float(np.percentile(values, q * 100, method="linear"))
               for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))},
            "max": float(values.max())}


# -- the figures ---------------------------------------------------------------------------


def test_each_phase_is_the_exact_distribution_of_the_connections_that_went_through_it():
    rng = np.random.default_rng(40)
    tcp = [int(v) for v in rng.integers(20 * US, 900 * US, size=1_500)]
    tls = [int(v) for v in rng.integers(300 * US, 5_000 * US, size=1_500)]
    connack = [int(v) for v in rng.integers(50 * US, 2_000 * US, size=1_500)]
    # the first 500 over plain TCP (no TLS phase), the last 7 never got their CONNACK
    times = [ConnectTimes(tcp_ns=tcp[i], tls_ns=tls[i] if i >= 500 else None,
                          connack_ns=connack[i] if i < 1_493 else None) for i in range(1_500)]
    figures = connection_figures(times)
    assert figures is not None
    assert (figures.connections, figures.without_connack) == (1_500, 7)
    assert figures.clock == CONNECT_CLOCK
    expected = {"tcp_connect_us": reference(tcp), "tls_handshake_us": reference(tls[500:]),
                "connack_us": reference(connack[:1_493])}
    for name, want in expected.items():
        got = getattr(figures, name).model_dump()
        assert got == pytest.approx(want, rel=1e-12), name
    assert figures.tls_handshake_us.count == 1_000
    # nobody upgraded to WebSocket: the phase is there, with no values
    assert figures.websocket_upgrade_us.count == 0
    assert figures.websocket_upgrade_us.p50 is None and figures.websocket_upgrade_us.max is None


def test_one_connection_has_its_values_for_percentiles_and_no_std():
    figures = connection_figures([ConnectTimes(tcp_ns=1_500, connack_ns=250_000)])
    assert figures is not None
    assert figures.connack_us.model_dump() == {
        "count": 1, "mean": 250.0, "std": None, "p50": 250.0, "p90": 250.0, "p99": 250.0,
        "p999": 250.0, "max": 250.0}
    assert figures.tcp_connect_us.p99 == 1.5


def test_no_connections_timed_gives_no_block():
    assert connection_figures([]) is None


def test_the_figures_do_not_depend_on_the_order_the_connections_came_in():
    """A point pools its runs' connections: the same connections in another order (runs
    listed otherwise, agents reporting otherwise) give the same figures to the bit."""
    rng = np.random.default_rng(7)
    times = [ConnectTimes(tcp_ns=int(a), connack_ns=int(b))
             for a, b in rng.integers(1, 10**7, size=(333, 2))]
    shuffled = [times[i] for i in rng.permutation(len(times))]
    assert connection_figures(times) == connection_figures(shuffled)


# -- from the agents' Done to the record and the analysis --------------------------------


def test_done_carries_connections_and_the_record_keeps_them_per_agent():
    done = Done(run_id="c1-r0000", agent_id="a1", published=0, received=0, chunks=0,
                connections=[phases("pub-0", 80 * US, 400 * US, tls=2_000 * US)])
    record = RunRecord()
    record.connections = {"a1": Done.model_validate_json(done.model_dump_json()).connections}
    stored = record.stored()
    assert set(stored) == {"connections"}
    again = run_record(stored)
    assert again.connections["a1"][0].tls_ns == 2_000 * US
    assert again == record


def test_a_record_from_before_connections_were_timed_loads_with_none():
    record = run_record({"delivery_counts": {"a0": {"published": 1, "received": 2}}})
    assert record.connections == {}
    assert "connections" not in record.stored()


def test_a_bad_connection_in_a_record_names_its_field():
    record = RunRecord()
    with pytest.raises(ValueError, match="connack_ns"):
        record.connections = {"a1": [{"client_id": "pub-0", "t_start_ns": 1,
                                      "connack_ns": "fast"}]}  # type: ignore[list-item]


def test_the_analysis_is_told_every_agents_connections_in_agent_order():
    record = RunRecord(connections={
        "b-agent": [phases("sub-1", 30 * US, 300 * US)],
        "a-agent": [phases("pub-0", 10 * US, 100 * US), phases("sub-0", 20 * US, None)]})
    row = RunRow(id="c1-r0000", campaign_id="c1", ordinal=0, point_index=0, repetition=0,
                 params={}, spec=CampaignSpec(name="x").model_dump(mode="json"), state="done",
                 run_metadata=record.stored())
    info = run_info(row)
    assert info.connections == (ConnectTimes(tcp_ns=10 * US, connack_ns=100 * US),
                                ConnectTimes(tcp_ns=20 * US),
                                ConnectTimes(tcp_ns=30 * US, connack_ns=300 * US))
    assert connect_times({}) == ()


# -- the results files and the report ----------------------------------------------------


def _point(index: int, connections: dict | None) -> dict:
    return {"point_index": index, "backend": "mosquitto", "runs": 1, "runs_failed": 0,
            "run_ids": [], "sections": {}, "params": {"broker.transport": ["tcp", "tls"][index]},
            **({"connections": connections} if connections is not None else {})}


def _document(points: list[dict]):
    return results_model(()).model_validate({
        "campaign": {"id": "c1"}, "generated_at": datetime.now(UTC), "points": points,
        "runs": []})


def _figures(times: list[ConnectTimes]) -> dict:
    figures = connection_figures(times)
    assert figures is not None
    return figures.model_dump(mode="json")


PLAIN = [ConnectTimes(tcp_ns=(50 + i) * US, connack_ns=(200 + 10 * i) * US) for i in range(5)]
TLS = [ConnectTimes(tcp_ns=(60 + i) * US, tls_ns=(1_000 + 100 * i) * US,
                    connack_ns=(250 + 10 * i) * US) for i in range(5)]


def test_stats_files_carry_the_block_and_a_point_without_it_reads_null(tmp_path):
    document = _document([_point(0, _figures(PLAIN)), _point(1, _figures(TLS)),
                          {**_point(0, None), "point_index": 2}])
    json_path, parquet_path = write_stats(document, tmp_path)
    again = read_stats(json_path, type(document))
    assert again == document
    rows = {row["point_index"]: row for row in read_stats_parquet(parquet_path)}
    assert rows[0]["connections_connack_us_p50"] == 220.0
    assert rows[0]["connections_tls_handshake_us_count"] == 0
    assert rows[1]["connections_tls_handshake_us_p99"] == pytest.approx(1_396.0)
    assert rows[1]["connections_clock"] == CONNECT_CLOCK
    assert rows[2]["connections_connections"] is None
    assert rows[2]["connections_connack_us_p50"] is None


def test_the_report_has_a_row_per_timed_point_and_a_bar_per_phase_someone_went_through():
    document = _document([_point(0, _figures(PLAIN)), _point(1, _figures(TLS)),
                          {**_point(0, None), "point_index": 2}])
    rows = connection_rows([(f"point {p.point_index}", p) for p in document.points])
    assert [r["label"] for r in rows] == ["point 0", "point 1"]
    tcp, tls, websocket, connack = rows[1]["phases"]
    assert (tls.count, tls.p50, websocket.count) == (5, 1_200.0, 0)
    assert (tcp.p50, connack.p50) == (62.0, 270.0)
    figure = build_figures(document, {})["plot-connections"]
    bars = {bar["name"]: bar for bar in figure["data"]}
    assert sorted(bars) == ["CONNECT → CONNACK p50 (bar to p99)", "TCP connect p50 (bar to p99)",
                            "TLS handshake p50 (bar to p99)"]   # no WebSocket: no bars
    tls_bars = bars["TLS handshake p50 (bar to p99)"]
    assert tls_bars["y"] == [None, 1_200.0]
    assert tls_bars["error_y"]["array"] == [0, pytest.approx(1_396.0 - 1_200.0)]
    assert CONNECT_CLOCK in figure["layout"]["title"]["text"]


def test_the_report_page_shows_each_phases_p50_and_p99_per_point_and_its_clock(tmp_path):
    from mqttbed.api.report import render_report
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.states import CampaignStatus
    from mqttbed.core.settings import Settings

    with create_controller(Settings(data_dir=tmp_path / "data")) as ctl:
        campaign_id = ctl.engine.create_campaign(parse_spec({"name": "connects"}))
        ctl.engine.set_campaign_status(campaign_id, CampaignStatus.DONE)
        document = _document([_point(0, _figures(PLAIN)), _point(1, _figures(TLS))])
        write_stats(document.model_copy(update={"campaign": document.campaign.model_copy(
            update={"id": campaign_id})}), ctl.layout.campaign_dir(campaign_id))
        html = render_report(ctl, campaign_id, standalone=True)
    table = html[html.index('<table id="connections">'):]
    table = table[:table.index("</table>")]
    assert "CONNECT → CONNACK n" in table and "TLS handshake n" in table
    rows = table.split("<tr>")[2:]
    assert len(rows) == 2
    # point 1 (TLS): 5 connections, none without CONNACK; TCP, TLS, WebSocket, CONNACK
    cells = [cell.split("<")[0] for cell in rows[1].split("<td>")[1:]]
    assert cells[:2] == ["5", "0"]
    assert cells[2:] == ["5", "62.0", "64.0", "5", "1200.0", "1396.0", "0", "-", "-",
                         "5", "270.0", "289.6"]
    assert "CLOCK_MONOTONIC in user space" in html
    assert 'id="plot-connections"' in html


def test_a_campaign_without_connection_figures_has_no_connections_plot_or_rows():
    document = _document([_point(0, None)])
    assert "plot-connections" not in build_figures(document, {})
    assert connection_rows([("p", p) for p in document.points]) == []


# -- end to end: a short campaign against the real Mosquitto ----------------------------


@pytest.mark.integration
def test_the_controller_keeps_what_each_agent_reported_in_the_runs_record(
        inproc_controller, monkeypatch):
    """The controller's side alone: whatever connections an agent's Done carries (here
    marked ones, put in by the agent program on its way out) are the record's, per
    agent, and the analysis is told all of them."""
    from mqttbed.agents import runner

    real_done = runner.Done

    def marked_done(**fields):
        agent = fields["agent_id"]
        fields["connections"] = [phases(f"{agent}/x", 7 * US, 77 * US, websocket=700 * US)]
        return real_done(**fields)

    monkeypatch.setattr(runner, "Done", marked_done)
    controller = inproc_controller
    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "kept", "agents": {"count": 2},
         "workload": {"client": "lean", "subscribers": 2, "rate_hz": 100, "messages": 10,
                      "warmup_messages": 2}}))
    assert controller.engine.run_campaign(campaign_id) == "done"
    with controller.sessions() as s:
        (row,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        record = run_record(row.run_metadata, row.id)
        info = run_info(row)
    assert len(record.agents) == 2
    assert {agent: [p.client_id for p in reported]
            for agent, reported in record.connections.items()} == {
        agent: [f"{agent}/x"] for agent in record.agents}
    assert info.connections == (ConnectTimes(tcp_ns=7 * US, websocket_ns=700 * US,
                                             connack_ns=77 * US),) * 2


@pytest.mark.integration
@pytest.mark.parametrize("client", ["native", "lean", "paho"])
def test_a_real_run_records_every_clients_connack_and_its_point_pools_them(
        inproc_controller, client):
    """Every client of a run over plain TCP: its TCP connect and CONNECT -> CONNACK
    timed, no TLS or WebSocket phase; the point's figures pool them all."""
    controller = inproc_controller
    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "connects", "agents": {"count": 2},
         "workload": {"client": client, "subscribers": 3, "rate_hz": 100, "messages": 10,
                      "warmup_messages": 2}}))
    assert controller.engine.run_campaign(campaign_id) == "done"
    with controller.sessions() as s:
        (row,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        record = run_record(row.run_metadata, row.id)
        info = run_info(row)
    clients = sorted(c for agent_clients in record.agents.values() for c in agent_clients)
    timed = sorted(p.client_id for reported in record.connections.values() for p in reported)
    assert timed == clients, f"{client}: the agents timed {timed}, ran {clients}"
    assert set(record.connections) <= set(record.agents)
    for reported in record.connections.values():
        for connection in reported:
            assert connection.tcp_ns is not None and connection.tcp_ns > 0
            assert connection.connack_ns is not None and connection.connack_ns > 0
            assert connection.tls_ns is None and connection.websocket_ns is None
    figures = connection_figures(info.connections)
    assert figures is not None
    assert (figures.connections, figures.without_connack) == (len(clients), 0)
    assert figures.connack_us.count == len(clients) and figures.connack_us.p99 is not None
    assert figures.tls_handshake_us.count == 0
