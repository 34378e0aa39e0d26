"""A search campaign in the controller: probes added as runs end, read back after a restart.

No broker and no Spark: the runs' states are written as a controller would leave them,
and their figures are handed in as the analysis would compute them (the cache the
lifecycle keeps), so only the search's bookkeeping is under test here. The real thing,
Mosquitto and amqtt searched end to end, is tests/test_search_campaign.py.
"""

from __future__ import annotations

from mqttbed.analytics.results import Generator, LatencyDistribution, RunClock, RunStats
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.analysis import results_type
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import RunRow
from mqttbed.controller.engine import RESTARTED, latest_attempts
from mqttbed.controller.lifecycle import next_probe, settle_outcome
from mqttbed.controller.search_runs import search_results
from mqttbed.controller.states import CampaignStatus, RunState
from mqttbed.core.settings import Settings

CAPACITY = 1000.0
SPEC = {"name": "search", "workload": {"subscribers": 1, "messages": 100},
        "search": {"parameter": "workload.rate_hz", "low": 100, "high": 10_000,
                   "slo": ["latency_us.p99 <= 2000", "lost == 0"]}}


def figures_of(row: RunRow, rate_kept: bool = True) -> RunStats:
    """What the analysis would say of a run against a broker that saturates at CAPACITY."""
    rate = float(row.params["workload.rate_hz"])
    stats_type = results_type().model_fields["runs"].annotation.__args__[0]
    sections = stats_type.model_fields["sections"].annotation()
    return stats_type(
        run_id=row.id, point_index=row.point_index, repetition=row.repetition,
        params=row.params, backend="mosquitto", state=row.state, sections=sections,
        clock=RunClock(max_fraction_of_spread=0.1, flagged=False),
        latency_us=LatencyDistribution(count=100, p99=300.0 if rate <= CAPACITY else 9e4),
        generator=Generator(requested_msgs_per_s=rate, achieved_msgs_per_s=rate,
                            send_lag_max_us=5.0, rate_kept=rate_kept))


def finish_queued(controller, campaign_id: str, figures: dict[str, RunStats]) -> list[float]:
    """Mark the queued runs done, as the engine would, with their figures; their rates."""
    done = []
    with controller.sessions() as s:
        for row in s.query(RunRow).filter_by(campaign_id=campaign_id, state=RunState.QUEUED):
            row.state = RunState.DONE
            figures[row.id] = figures_of(row)
            done.append(row.params["workload.rate_hz"])
        s.commit()
    return done


def rows(controller, campaign_id: str) -> list[RunRow]:
    with controller.sessions() as s:
        return (s.query(RunRow).filter_by(campaign_id=campaign_id)
                .order_by(RunRow.ordinal, RunRow.attempt).all())


def test_a_search_adds_each_probe_as_the_one_before_ends_and_resumes_after_a_restart(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    figures: dict[str, RunStats] = {}
    with create_controller(settings) as controller:
        campaign_id = controller.engine.create_campaign(parse_spec(SPEC))
        assert [r.params for r in rows(controller, campaign_id)] == [
            {"workload.rate_hz": 100.0}]
        for _ in range(3):   # 100, 200, 400 done; 800 queued
            finish_queued(controller, campaign_id, figures)
            assert next_probe(controller.engine, controller.layout, campaign_id, figures)
        queued = rows(controller, campaign_id)[-1]
        assert (queued.ordinal, queued.state, queued.params) == (
            3, RunState.QUEUED, {"workload.rate_hz": 800.0})
        assert queued.spec["workload"]["rate_hz"] == 800.0 and queued.spec.get("search") is None
        # the controller dies while 800 runs
        with controller.sessions() as s:
            s.get(RunRow, queued.id).state = RunState.RUNNING
            s.commit()

    figures.clear()   # a new controller process: nothing in memory
    with create_controller(settings) as controller:   # starting, it recovers
        interrupted = next(r for r in rows(controller, campaign_id) if r.ordinal == 3)
        assert (interrupted.state, interrupted.reason) == (RunState.INTERRUPTED, RESTARTED)
        retry = rows(controller, campaign_id)[-1]
        assert retry.id.endswith("-r0003-retry1") and retry.params == {
            "workload.rate_hz": 800.0}
        # its figures, recomputed for every ended run (here: handed in)
        for row in rows(controller, campaign_id):
            if row.state == RunState.DONE:
                figures[row.id] = figures_of(row)
        rates = []
        while True:
            rates += finish_queued(controller, campaign_id, figures)
            if not next_probe(controller.engine, controller.layout, campaign_id, figures):
                break
        all_rows = rows(controller, campaign_id)
    # it went on from 800, never back to 100
    assert rates[0] == 800.0 and 100.0 not in rates
    assert rates[1] == 1600.0   # bracketing on: 800 accepted
    spec = parse_spec(SPEC)
    result = search_results(spec, latest_attempts(all_rows), figures)
    assert result is not None and result.stop_reason == "resolution"
    low, high = result.interval
    assert low is not None and high is not None and low <= CAPACITY < high
    assert result.capacity == low
    assert [p.value for p in result.probes][:5] == [100.0, 200.0, 400.0, 800.0, 1600.0]
    # a confirmation pools with its value's earlier probe: same sweep point
    by_value: dict[float, set[int]] = {}
    for row in all_rows:
        by_value.setdefault(row.params["workload.rate_hz"], set()).add(row.point_index)
    assert all(len(indexes) == 1 for indexes in by_value.values())
    assert len({min(i) for i in by_value.values()}) == len(by_value)


def test_a_run_that_failed_is_a_rejection_naming_its_reason(tmp_path):
    figures: dict[str, RunStats] = {}
    with create_controller(Settings(data_dir=tmp_path / "data")) as controller:
        campaign_id = controller.engine.create_campaign(parse_spec(SPEC))
        finish_queued(controller, campaign_id, figures)
        assert next_probe(controller.engine, controller.layout, campaign_id, figures)
        with controller.sessions() as s:
            row = s.query(RunRow).filter_by(campaign_id=campaign_id, ordinal=1).one()
            row.state, row.reason = RunState.FAILED, "broker died: SIGKILL"
            s.commit()
        assert next_probe(controller.engine, controller.layout, campaign_id, figures)
        result = search_results(parse_spec(SPEC), rows(controller, campaign_id)[:2], figures)
    assert result is not None
    assert [(p.value, p.verdict) for p in result.probes] == [(100.0, "accepted"),
                                                             (200.0, "rejected")]
    assert "broker died: SIGKILL" in result.probes[1].why
    assert result.interval == (100.0, 200.0)


def test_a_search_that_ended_is_done_though_a_probe_failed_and_one_cut_short_is_not():
    search, plain = parse_spec(SPEC), parse_spec({k: v for k, v in SPEC.items()
                                                  if k != "search"})
    why = "1 of 7 runs did not finish"
    status, reason = settle_outcome(search, CampaignStatus.FAILED, why, search_ended=True)
    assert status == CampaignStatus.DONE and reason is not None
    assert reason.startswith(f"the search ended; {why} (a failed probe is a rejection")
    # cut short (its next probe could not be chosen, or it was stopped): the general rule
    assert settle_outcome(search, CampaignStatus.FAILED, why, search_ended=False) == (
        CampaignStatus.FAILED, why)
    # no search: a failed run fails the campaign however it ended
    assert settle_outcome(plain, CampaignStatus.FAILED, why, search_ended=True) == (
        CampaignStatus.FAILED, why)
    # cancelled and done stay what they are
    for status in (CampaignStatus.CANCELLED, CampaignStatus.DONE):
        assert settle_outcome(search, status, None, search_ended=True) == (status, None)
