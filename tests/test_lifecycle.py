"""A campaign's lifecycle as its listeners see it: runs, analysing, then the final status.

The lifecycle is the engine's and the analysis': the run's agents are threads of this
process (``inproc_controller``), the same agent program over the same HTTP routes as a
process, which records the same events (tests/test_inproc_agents.py).
"""

from __future__ import annotations

import threading
import time

import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.controller import Controller
from mqttbed.controller.db import RunRow
from mqttbed.controller.documents import CampaignUpdate, DocumentStream, ResultsReady, RunUpdate
from mqttbed.controller.states import CampaignStatus, RunState


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
    from mqttbed.controller.analysis_warm_up import warm_up_analysis
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
    assert options[-1] == {"then": warm_up_analysis}


@pytest.mark.integration
def test_each_ended_run_is_analysed_before_the_next_measures_and_the_results_merge_it(
        controller, monkeypatch):
    """With ``analysis_per_run``, a run's own figures are computed when it ends (the next
    run measures only once they are done) and kept beside it; the last run has none (the
    campaign's analysis takes it with the pooled figures). The results are those of an
    analysis from the events alone."""
    from mqttbed.controller import lifecycle
    from mqttbed.controller.analysis import PARTIAL_JSON, analyze_campaign
    from mqttbed.core.clock import monotonic_ns
    from mqttbed.core.run_record import run_record

    analysed: dict[str, int] = {}
    store = lifecycle.store_run_partial

    def timed_store(layout, row, settings=None):
        path = store(layout, row, settings)
        analysed[row.id] = monotonic_ns()
        return path

    monkeypatch.setattr(lifecycle, "store_run_partial", timed_store)
    monkeypatch.setattr(controller, "settings",
                        controller.settings.model_copy(update={"analysis_per_run": True}))
    campaign_id = controller.engine.create_campaign(parse_spec({**TINY, "repetitions": 3}))
    assert controller.run_campaign(campaign_id) == CampaignStatus.DONE
    runs = [f"{campaign_id}-r{k:04d}" for k in range(3)]
    assert sorted(analysed) == runs[:2]
    kept = [(controller.layout.run_dir(campaign_id, r) / PARTIAL_JSON).exists() for r in runs]
    assert kept == [True, True, False]
    with controller.sessions() as s:
        starts = {r.id: run_record(r.run_metadata, r.id).t_start_ns
                  for r in s.query(RunRow).filter_by(campaign_id=campaign_id)}
    for before, after in zip(runs, runs[1:], strict=False):
        assert starts[after] > analysed[before], (before, after)
    merged = (controller.layout.campaign_dir(campaign_id) / "stats.json").read_text()
    for run_id in runs[:2]:
        (controller.layout.run_dir(campaign_id, run_id) / PARTIAL_JSON).unlink()
    whole, _, _ = analyze_campaign(controller.sessions, controller.layout, campaign_id,
                                   controller.settings)
    from mqttbed.controller.analysis import results_type

    by_parts = results_type().model_validate_json(merged)
    assert (by_parts.model_dump(mode="json", exclude={"generated_at"})
            == whole.model_dump(mode="json", exclude={"generated_at"}))
    assert whole.points[0].latency_us.count == 3 * 2 * (TINY["workload"]["messages"]
                                                        - TINY["workload"]["warmup_messages"])
