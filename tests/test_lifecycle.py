"""A campaign's lifecycle as its listeners see it: runs, analysing, then the final status.

The lifecycle is the engine's and the analysis': the run's agents are threads of this
process (``inproc_controller``), the same agent program over the same HTTP routes as a
process, which records the same events (tests/test_inproc_agents.py).
"""

from __future__ import annotations

import threading
import time
import types

import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.controller import Controller
from mqttbed.controller.db import RunRow
from mqttbed.controller.documents import CampaignUpdate, DocumentStream, ResultsReady, RunUpdate
from mqttbed.controller.states import CampaignStatus, RunState
from tests.conftest import wait_until


@pytest.fixture
def controller(inproc_controller) -> Controller:
    """Every controller here starts its agents on threads."""
    return inproc_controller


TINY = {"name": "tiny", "agents": {"count": 1},
        "workload": {"subscribers": 2, "rate_hz": 200, "messages": 40, "warmup_messages": 5}}


@pytest.mark.integration
def test_a_campaign_is_done_only_after_its_results_are_ready(controller, updates):
    campaign_id = controller.engine.create_campaign(parse_spec(TINY))
    assert controller.run_campaign(campaign_id) == CampaignStatus.DONE
    assert updates.statuses(campaign_id) == ["running", "analysing", "done"]
    assert updates.states(f"{campaign_id}-r0000") == ["deploying", "running", "collecting",
                                                      "done"]
    ready = next(d for d in updates if isinstance(d, ResultsReady))
    # the statistics are written, announced, and only then is the campaign done
    assert updates.index(ready) == len(updates) - 2
    assert updates[-1] == CampaignUpdate(campaign_id, CampaignStatus.DONE, None)
    assert ready.stats_path == controller.layout.campaign_dir(campaign_id) / "stats.json"
    assert ready.stats_path.exists() and ready.parquet_path.exists()


def test_a_campaign_cancelled_before_it_ran_is_not_analysed(controller, updates):
    campaign_id = controller.engine.create_campaign(parse_spec(TINY))
    controller.engine.cancel(campaign_id)
    assert controller.run_campaign(campaign_id) == CampaignStatus.CANCELLED
    assert updates.statuses(campaign_id) == ["cancelled"]
    assert updates.states(f"{campaign_id}-r0000") == ["interrupted"]
    assert not any(isinstance(d, ResultsReady) for d in updates)
    assert not (controller.layout.campaign_dir(campaign_id) / "stats.json").exists()


def test_a_listener_that_raises_is_passed_over():
    seen = []

    def broken(_document):
        raise RuntimeError("display went away")

    stream = DocumentStream([broken, seen.append])
    late = []
    stream.subscribe(late.append)
    update = RunUpdate("c1", "c1-r0000", 0, 1, {}, 0, RunState.DEPLOYING)
    stream.emit(update)
    assert seen == [update] and late == [update]


@pytest.mark.integration
def test_the_first_run_measures_only_once_the_analysis_jvm_has_started(controller,
                                                                         monkeypatch):
    """A JVM starting beside a run takes CPU from what it measures (engine.hold_measurements):
    the lifecycle's start-up thread must end before the first run's start time is handed
    out. The thread here stands in for the JVM's start (the test process's Spark session is
    shared and already up): it sleeps, then notes when it ended."""
    from mqttbed.controller import lifecycle
    from mqttbed.core.clock import monotonic_ns
    from mqttbed.core.run_record import run_record

    ended: list[int] = []
    options: list[dict[str, object]] = []

    def slow_start(_settings=None, **given) -> threading.Thread:
        options.append(given)
        def start() -> None:
            time.sleep(1.5)  # window: a JVM start-up that takes this long
            ended.append(monotonic_ns())
        thread = threading.Thread(target=start, name="jvm-start-stand-in", daemon=True)
        thread.start()
        return thread

    monkeypatch.setattr(lifecycle, "start_spark_in_background", slow_start)
    began = monotonic_ns()
    campaign_id = controller.engine.create_campaign(parse_spec({**TINY, "repetitions": 2}))
    assert controller.run_campaign(campaign_id) == CampaignStatus.DONE
    with controller.sessions() as s:
        starts = sorted(run_record(r.run_metadata, r.id).t_start_ns
                        for r in s.query(RunRow).filter_by(campaign_id=campaign_id))
    assert len(ended) == 1 and ended[0] - began >= 1.5e9
    assert all(t is not None and t > ended[0] for t in starts), (starts, ended)
    # the tests' environment turns the warm-up off (conftest); a campaign asks for it else
    assert options == [{"then": None}]
    monkeypatch.setattr(controller, "settings",
                        controller.settings.model_copy(update={"spark_warm_up": True}))
    again = controller.engine.create_campaign(parse_spec(TINY))
    assert controller.run_campaign(again) == CampaignStatus.DONE
    assert options[-1]["then"] is not None   # the warm-up, as it gives way: below


def per_run_campaign(controller, monkeypatch, *, slow_deploy: bool
                     ) -> tuple[str, list[str], dict[str, tuple[int, int, bool]]]:
    """A three-run campaign with ``analysis_per_run``; each run's own analysis as (began,
    ended, kept) on the monotonic clock. ``slow_deploy``: each run's deployment lasts until
    the analysis of the run before has ended (a broker slow to start), so none gives way."""
    from mqttbed.controller import lifecycle
    from mqttbed.core.clock import monotonic_ns

    analysed: dict[str, tuple[int, int, bool]] = {}
    store = lifecycle.store_run_partial

    def timed_store(layout, row, settings=None):
        began, kept = monotonic_ns(), False
        try:
            path = store(layout, row, settings)
            kept = True
            return path
        finally:
            analysed[row.id] = (began, monotonic_ns(), kept)

    monkeypatch.setattr(lifecycle, "store_run_partial", timed_store)
    monkeypatch.setattr(lifecycle, "PARTIAL_MIN_DEPLOY_S", 0.0)   # whatever the deploy took
    if slow_deploy:
        deploy = controller.engine._deploy

        def deploy_until_analysed(run, live):
            deploy(run, live)
            before = f"{run.campaign_id}-r{run.ordinal - 1:04d}"
            if run.ordinal:
                wait_until(lambda: before in analysed, 120, f"the analysis of {before}")

        monkeypatch.setattr(controller.engine, "_deploy", deploy_until_analysed)
    monkeypatch.setattr(controller, "settings",
                        controller.settings.model_copy(update={"analysis_per_run": True}))
    campaign_id = controller.engine.create_campaign(parse_spec({**TINY, "repetitions": 3}))
    assert controller.run_campaign(campaign_id) == CampaignStatus.DONE
    return campaign_id, [f"{campaign_id}-r{k:04d}" for k in range(3)], analysed


def check_merged_results_are_the_whole_analysis(controller, campaign_id, runs):
    """The campaign's results (merged from the kept run figures) are those of an analysis
    of the events alone."""
    from mqttbed.controller.analysis import PARTIAL_JSON, analyze_campaign, results_type

    merged = (controller.layout.campaign_dir(campaign_id) / "stats.json").read_text()
    for run_id in runs:
        (controller.layout.run_dir(campaign_id, run_id) / PARTIAL_JSON).unlink(missing_ok=True)
    whole, _, _ = analyze_campaign(controller.sessions, controller.layout, campaign_id,
                                   controller.settings)
    by_parts = results_type().model_validate_json(merged)
    assert (by_parts.model_dump(mode="json", exclude={"generated_at"})
            == whole.model_dump(mode="json", exclude={"generated_at"}))
    assert whole.points[0].latency_us.count == 3 * 2 * (TINY["workload"]["messages"]
                                                        - TINY["workload"]["warmup_messages"])


def measured_from(controller, campaign_id) -> dict[str, int]:
    from mqttbed.core.run_record import run_record

    with controller.sessions() as s:
        return {r.id: run_record(r.run_metadata, r.id).t_start_ns
                for r in s.query(RunRow).filter_by(campaign_id=campaign_id)}


@pytest.mark.integration
def test_each_ended_run_is_analysed_while_the_next_deploys_and_the_results_merge_it(
        controller, monkeypatch):
    """With ``analysis_per_run``, a run's own figures are computed when it ends, while the
    next run deploys, and kept beside it; the last run has none (the campaign's analysis
    takes it with the pooled figures). The results are those of an analysis from the
    events alone."""
    from mqttbed.controller.analysis import PARTIAL_JSON

    campaign_id, runs, analysed = per_run_campaign(controller, monkeypatch, slow_deploy=True)
    assert sorted(analysed) == runs[:2] and all(kept for _, _, kept in analysed.values())
    kept = [(controller.layout.run_dir(campaign_id, r) / PARTIAL_JSON).exists() for r in runs]
    assert kept == [True, True, False]
    starts = measured_from(controller, campaign_id)
    for before, after in zip(runs, runs[1:], strict=False):
        assert starts[after] > analysed[before][1], (before, after)
    check_merged_results_are_the_whole_analysis(controller, campaign_id, runs)


@pytest.mark.integration
def test_a_run_ready_to_measure_never_waits_for_the_run_befores_analysis(
        controller, monkeypatch):
    """Agents kept from the run before deploy a run in well under a second, less than a
    run's own analysis takes: that analysis gives way (its Spark jobs cancelled) as soon
    as the run is deployed; it is over before the run measures, and the campaign's
    analysis computes what it did not keep, to the same results."""
    from mqttbed.controller.analysis import PARTIAL_JSON

    campaign_id, runs, analysed = per_run_campaign(controller, monkeypatch, slow_deploy=False)
    assert sorted(analysed) == runs[:2]
    starts = measured_from(controller, campaign_id)
    for before, after in zip(runs, runs[1:], strict=False):
        _, ended, kept = analysed[before]
        assert starts[after] > ended, (before, after)   # given way or done: never beside
        path = controller.layout.run_dir(campaign_id, before) / PARTIAL_JSON
        assert path.exists() == kept, before
    assert not all(kept for _, _, kept in analysed.values()), analysed   # one gave way
    check_merged_results_are_the_whole_analysis(controller, campaign_id, runs)


def test_work_that_gives_way_tags_its_jobs_skips_once_asked_and_is_quiet_when_cut(
        monkeypatch, caplog):
    """GivesWay: its work's Spark jobs carry its tag; asked to give way it cancels that
    tag's jobs, does not start, and an error of work cut short is a log line, not a
    failure (an error of work not asked to stop still raises)."""
    from mqttbed.controller import lifecycle

    cancelled: list[str] = []
    monkeypatch.setattr(lifecycle, "cancel_tagged", cancelled.append)
    tags: list[str] = []
    context = types.SimpleNamespace(addJobTag=tags.append, removeJobTag=tags.append,
                                    setInterruptOnCancel=lambda _: None)
    spark = types.SimpleNamespace(sparkContext=context)
    done: list[object] = []

    lifecycle.GivesWay("t-1", "the work").wrap(done.append)(spark)
    assert done == [spark] and tags == ["t-1", "t-1"]   # tagged, then untagged

    def failing(_):
        raise RuntimeError("job cancelled")

    with pytest.raises(RuntimeError):   # not asked to stop: a real failure
        lifecycle.GivesWay("t-2", "the work").wrap(failing)(spark)
    cut = lifecycle.GivesWay("t-3", "the work")

    def cut_short(_):
        cut.give_way()   # the engine, as the next run is ready
        raise RuntimeError("job cancelled")

    with caplog.at_level("INFO", logger="mqttbed.lifecycle"):
        cut.wrap(cut_short)(spark)
    assert cancelled == ["t-3"] and "gave way to a run ready to measure" in caplog.text
    cut.wrap(done.append)(spark)   # asked before it began: never starts
    assert done == [spark]


@pytest.mark.integration
def test_runs_that_deploy_faster_than_an_analysis_leave_their_figures_to_the_campaigns(
        controller, monkeypatch):
    """A run's own analysis starts only where deploying a run lasts long enough for one
    (here a minute, longer than any of these deployments, each recorded in its run):
    nothing is analysed between runs, and the campaign's analysis computes every figure."""
    from mqttbed.controller import lifecycle
    from mqttbed.controller.analysis import PARTIAL_JSON
    from mqttbed.core.run_record import run_record

    monkeypatch.setattr(lifecycle, "PARTIAL_MIN_DEPLOY_S", 60.0)
    started: list[str] = []
    monkeypatch.setattr(lifecycle, "store_run_partial",
                        lambda layout, row, settings=None: started.append(row.id))
    monkeypatch.setattr(controller, "settings",
                        controller.settings.model_copy(update={"analysis_per_run": True}))
    campaign_id = controller.engine.create_campaign(parse_spec({**TINY, "repetitions": 3}))
    assert controller.run_campaign(campaign_id) == CampaignStatus.DONE
    with controller.sessions() as s:
        runs = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(RunRow.ordinal).all()
    deploys = [run_record(r.run_metadata, r.id).deploy_s for r in runs]
    assert all(d is not None and 0 < d < lifecycle.PARTIAL_MIN_DEPLOY_S for d in deploys)
    assert started == []
    assert not any((controller.layout.run_dir(campaign_id, r.id) / PARTIAL_JSON).exists()
                   for r in runs)
    assert (controller.layout.campaign_dir(campaign_id) / "stats.json").exists()
