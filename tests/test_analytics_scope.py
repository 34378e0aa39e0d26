"""Scope rows give their own figures and never leak into the software ones; clock flags."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqttbed.analytics.results import ScopeRun
from mqttbed.analytics.stats import RunInfo, compute_campaign_stats
from mqttbed.core.events import EVENT_COLUMNS, arrow_schema

# integration: every test reads the figures Spark computed (the stats fixture)
pytestmark = pytest.mark.integration

US = 1000


def row(**fields):
    base = {c: None for c in EVENT_COLUMNS}
    base.update(agent_id="a", topic="t", payload_bytes=64, qos=0, warmup=False,
                clock_source="user", clock_offset_ns=0, clock_offset_uncertainty_ns=0)
    base.update(fields)
    return base


def write(root, run_id, rows):
    path = root / "events" / "campaign_id=c" / f"run_id={run_id}" / "part.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), path)


def software_rows(uncertainty_ns):
    rows = [row(kind="subscribe", receiver=r, t_recv_ns=i, clock_offset_uncertainty_ns=u)
            for i, (r, u) in enumerate((("sub-0", 0), ("sub-1", uncertainty_ns)))]
    for seq in range(4):
        t_pub = 1_000_000 * (seq + 1)
        rows.append(row(kind="publish", publisher="pub-0", seq=seq, t_pub_ns=t_pub))
        # sub-1 arrives 40 us after sub-0 every time: spread 40 us
        for receiver, extra, u in (("sub-0", 0, 0), ("sub-1", 40 * US, uncertainty_ns)):
            rows.append(row(kind="delivery", publisher="pub-0", seq=seq, receiver=receiver,
                            t_pub_ns=t_pub, t_recv_ns=t_pub + 300 * US + extra,
                            clock_offset_uncertainty_ns=u))
    return rows


SCOPE_DELAYS = [(0, "sub-0", 80), (0, "sub-1", 100), (1, "sub-0", 90), (1, "sub-1", 130),
                (2, "sub-0", 85)]


def scope_rows():
    return [row(kind="delivery", agent_id="scope", publisher="pub-0", seq=seq, receiver=r,
                t_pub_ns=0, t_recv_ns=d * US, clock_source="scope")
            for seq, r, d in SCOPE_DELAYS]


@pytest.fixture(scope="module")
def stats(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("scope")
    write(root, "r-trusted", software_rows(2 * US) + scope_rows())
    write(root, "r-doubtful", software_rows(9 * US))
    write(root, "r-timesync", software_rows(0))
    runs = [RunInfo(run_id="r-trusted", point_index=0, params={}, repetition=0,
                    state="done", backend="mosquitto", max_clock_uncertainty_fraction=0.1,
                    scope=ScopeRun(run_id="r-trusted", acquisitions=3, requested=5,
                                   shortfall=2, timeouts=1,
                                   error="VisaIOError: timeout")),
            RunInfo(run_id="r-doubtful", point_index=1, params={}, repetition=0,
                    state="done", backend="mosquitto", max_clock_uncertainty_fraction=0.1),
            RunInfo(run_id="r-timesync", point_index=2, params={}, repetition=0,
                    state="done", backend="mosquitto", mode="time-sync")]
    results = compute_campaign_stats(spark, events_path=root / "events",
                                     samples_path=root / "none",
                                     campaign={"id": "c", "name": "scope"}, runs=runs)
    return results.model_dump(mode="json")


def test_scope_figures_come_from_the_scope_rows(stats):
    point = stats["points"][0]
    delays = [d for _, _, d in SCOPE_DELAYS]
    assert point["scope"]["acquisitions"] == 3
    assert point["scope"]["latency_us"]["mean"] == pytest.approx(np.mean(delays))
    assert point["scope"]["latency_us"]["p50"] == pytest.approx(np.percentile(delays, 50))
    # acquisition 2 caught one subscriber only: no spread from it
    assert point["scope"]["sync_spread_us"]["mean"] == pytest.approx(30.0)
    assert point["scope"]["sync_spread_us"]["max"] == pytest.approx(40.0)
    # what the recorder did in each run comes with the figures, at the point and the run
    recorded = {"run_id": "r-trusted", "acquisitions": 3, "requested": 5, "shortfall": 2,
                "timeouts": 1, "error": "VisaIOError: timeout"}
    # 3 of the 5 acquisitions asked for: the point says it rests on fewer
    assert (point["scope"]["requested"], point["scope"]["shortfall"]) == (5, 2)
    assert point["scope"]["runs"] == [recorded]
    assert stats["runs"][0]["scope"]["runs"] == [recorded]


def test_scope_rows_never_enter_the_software_figures(stats):
    point = stats["points"][0]
    assert point["deliveries_expected"] == 8 and point["deliveries_received"] == 8
    assert point["duplicates"] == 0
    assert point["latency_us"]["p50"] == pytest.approx(320.0)
    assert point["sync_spread_us"]["p50"] == pytest.approx(40.0)
    assert stats["points"][1]["scope"] is None


def test_a_run_whose_clock_uncertainty_exceeds_the_fraction_of_its_spread_is_flagged(stats):
    runs = {r["run_id"]: r for r in stats["runs"]}
    # spread p50 40 us, fraction 0.1: the limit is 4 us
    # one agent here, "a", whose rows carry two (offset, uncertainty) estimates
    assert runs["r-trusted"]["clock"] == {
        "offset_uncertainty_us_max": 2.0, "max_fraction_of_spread": 0.1, "flagged": False,
        "agents": {"a": {"method": "unknown", "discipline": "none",
                         "discipline_error_us": None, "offset_uncertainty_us_max": 2.0,
                         "offset_drift_us": 0.0, "estimates": 2}}}
    assert runs["r-doubtful"]["clock"]["flagged"] is True
    assert stats["points"][1]["clock_flagged_runs"] == ["r-doubtful"]
    assert stats["points"][0]["clock_flagged_runs"] == []


def test_time_sync_reports_each_subscribers_clock_error(stats):
    sync = stats["points"][2]["time_sync"]
    # adopting the server's timestamp on receipt leaves each clock behind by its latency
    assert sync["per_subscriber"]["sub-0"]["mean_error_us"] == pytest.approx(-300.0)
    assert sync["per_subscriber"]["sub-1"]["mean_error_us"] == pytest.approx(-340.0)
    assert sync["per_subscriber"]["sub-1"]["samples"] == 4
    assert sync["worst_max_abs_error_us"] == pytest.approx(340.0)
    assert sync["between_subscribers_p99_us"] == pytest.approx(40.0)
    assert stats["points"][0]["time_sync"] is None
