"""A campaign from its start to its final status: its runs, then its statistics.

``running -> analysing -> done | failed | cancelled``. Spark starts in the background as
the runs begin (:func:`mqttbed.analytics.spark.start_spark_in_background`), while the
first run deploys, and analyses a tiny synthetic campaign to warm up
(:mod:`mqttbed.controller.analysis_warm_up`, unless ``spark_warm_up`` is off): that run
measures only once the JVM is up and the warm-up has ended or given way (:class:`GivesWay`:
its jobs are cancelled once the run is deployed), and the JVM is niced from then on. With
``analysis_per_run``, each ended run but the last of the queue is then analysed alone
while the next run deploys, and gives way likewise when that run is ready
(:class:`RunAnalyses`); the campaign's analysis merges the runs' figures that were
finished and computes the others. Nothing analyses beside a measurement, and no run
waits for work that can be done after the last one. A served controller keeps that one
session for its life. What the runs came to (all done,
some failed, cancelled) becomes the campaign's status only after Spark has written
``stats.json``, so a client that sees ``done`` can fetch the statistics at once. Failed
and cancelled campaigns are analysed too: their partial results are kept. An analysis
that raises fails the campaign, keeps every event, and leaves no statistics behind.

A search campaign (spec ``search``) adds its runs as it goes: once its queued runs have
ended, the ended runs' figures are computed (the numbers its results will show) and the
search (:mod:`mqttbed.campaigns.search`) queues its next probe, until it has ended. A
``repetitions.until`` campaign likewise gets one more round of runs for the points whose
intervals are still too wide (:mod:`mqttbed.campaigns.repetitions`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from mqttbed.analytics.results import RunStats
from mqttbed.analytics.spark import (
    cancel_tagged,
    get_spark,
    start_spark_in_background,
    tagged_jobs,
)
from mqttbed.campaigns.repetitions import RepetitionsUntil
from mqttbed.campaigns.spec import CampaignSpec, expand_points, probe_point
from mqttbed.controller.analysis import (
    ANALYSIS_FAILED,
    analyze_campaign,
    analyze_runs,
    run_figures,
    store_run_partial,
)
from mqttbed.controller.analysis_warm_up import warm_up_analysis
from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.documents import ResultsReady
from mqttbed.controller.engine import RunEngine, latest_attempts
from mqttbed.controller.repetition_runs import next_round, runs_per_point
from mqttbed.controller.search_runs import conclusion, next_point_index, replay
from mqttbed.controller.states import TERMINAL_STATES, CampaignStatus, RunState
from mqttbed.controller.storage import DataLayout
from mqttbed.core.run_record import run_record
from mqttbed.core.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("mqttbed.lifecycle")

# A Spark failure's message carries the whole JVM stack trace; the log keeps it all.
REASON_MAX_CHARS = 1000
# A run's own analysis starts only when deploying a run takes at least this long: a
# quickstart run's took 5-13 s here at load 6-9, much of it in the driver's planning,
# which a run ready to measure cannot cut short (only Spark jobs can be cancelled).
PARTIAL_MIN_DEPLOY_S = 5.0


def conduct_campaign(engine: RunEngine, layout: DataLayout, campaign_id: str,
                     settings: Settings | None = None) -> CampaignStatus:
    """Run the campaign's runs, then analyse them; return its final status.

    Documents on the way (``engine.ctx.documents``): a RunUpdate per run transition, a
    CampaignUpdate per status (running, analysing, the final one), and ResultsReady
    between the analysis and the final status when it succeeded.
    """
    if engine.is_cancelled(campaign_id):
        return CampaignStatus.CANCELLED  # cancelled while queued: nothing ran
    # The JVM starts and warms up while the first run deploys (niced after); that run
    # measures once it is up (a starting JVM beside a measurement perturbed it) and the
    # warm-up has ended or given way: a warm-up the deployment had time for makes the
    # analysis after the last run a warm one.
    chosen = settings or Settings.load()
    warm_up = GivesWay("mqttbed-warm-up", "the warm-up analysis")
    starting = start_spark_in_background(
        settings, then=warm_up.wrap(warm_up_analysis) if chosen.spark_warm_up else None)
    engine.hold_measurements(starting, give_way=warm_up.give_way)
    run_analyses = RunAnalyses(engine, layout, settings, starting)
    if chosen.analysis_per_run:
        engine.after_each_run(run_analyses.run_ended)
    try:
        return _conduct(engine, layout, campaign_id, run_analyses, settings)
    finally:
        engine.after_each_run(None)
        run_analyses.wait()


def _conduct(engine: RunEngine, layout: DataLayout, campaign_id: str,
             run_analyses: RunAnalyses, settings: Settings | None) -> CampaignStatus:
    with engine.ctx.sessions() as s:
        spec = CampaignSpec.model_validate(s.get(CampaignRow, campaign_id).spec)
    # the same agents serve every run, a search's later probes too (kept_agents); they
    # stop before the campaign's analysis
    with engine.agents_kept():
        engine.run_campaign(campaign_id)
        probe_figures: dict[str, RunStats] = {}
        chosen_to_end = False   # the campaign's own choice (a search's stop), not a failure
        while engine.stopping is None and not engine.is_cancelled(campaign_id):
            run_analyses.wait()
            try:
                if not next_runs(engine, layout, campaign_id, spec, probe_figures, settings):
                    chosen_to_end = True
                    break
            except Exception:  # noqa: BLE001 - the analysis below says why, the events stay
                log.exception("campaign %s: its next runs could not be chosen; it ends here",
                              campaign_id)
                break
            engine.run_campaign(campaign_id)
    if engine.stopping is not None:
        # The controller is stopping: the campaign stays running, for the next controller
        # on the data dir to requeue (RunEngine.recover) and finish.
        return CampaignStatus.RUNNING
    outcome, reason = settle_outcome(spec, *engine.outcome(campaign_id),
                                     search_ended=chosen_to_end)
    engine.set_campaign_status(campaign_id, CampaignStatus.ANALYSING, reason)
    run_analyses.wait()
    try:
        stats, json_path, parquet_path = analyze_campaign(engine.ctx.sessions, layout,
                                                          campaign_id, settings)
    except Exception as exc:  # noqa: BLE001 - the campaign fails with the reason, events stay
        log.exception("analysis of campaign %s failed", campaign_id)
        discard_statistics(layout, campaign_id)
        failure = analysis_failure(exc)
        engine.set_campaign_status(campaign_id, CampaignStatus.FAILED,
                                   f"{failure}; {reason}" if reason else failure)
        return CampaignStatus.FAILED
    engine.ctx.documents.emit(ResultsReady(campaign_id, json_path, parquet_path, stats))
    engine.set_campaign_status(campaign_id, outcome, reason)
    return outcome


class RunAnalyses:
    """Each ended run's own figures (:mod:`mqttbed.analytics.partials`), computed on the
    analysis JVM while the next run deploys and kept beside the run; once the next run is
    deployed they give way (:class:`GivesWay`) and it measures (an analysis beside a
    measurement takes CPU from what is measured), so they are kept where the deployment
    lasts long enough (a broker slow to start, agents on lab hosts). The last run of a
    campaign's queue has none: the analysis that follows it computes its figures with the
    pooled ones at once. One analysis at a time: each waits for the one before (the JVM's
    start first).
    """

    def __init__(self, engine: RunEngine, layout: DataLayout, settings: Settings | None,
                 starting: threading.Thread | None):
        self._engine, self._layout, self._settings = engine, layout, settings
        self._starting = starting
        self._last: threading.Thread | None = None

    def run_ended(self, run_id: str) -> None:
        """Start the run's analysis if more runs are queued and deploying one lasts long
        enough to be worth it (an engine hook)."""
        with self._engine.ctx.sessions() as s:
            row = s.get(RunRow, run_id)
            queued = s.query(RunRow).filter_by(campaign_id=row.campaign_id,
                                               state=RunState.QUEUED).count()
            s.expunge(row)
        if not queued:
            return
        # The next run's deployment will take about what this one's did (the same broker,
        # the same kept agents): shorter than an analysis, the analysis would only start
        # and give way. It is left to the campaign's analysis, which is no slower for it.
        deploy_s = run_record(row.run_metadata, row.id).deploy_s
        if deploy_s is not None and deploy_s < PARTIAL_MIN_DEPLOY_S:
            log.info("run %s: its own figures are left to the campaign's analysis (a run "
                     "deploys in %.1f s, under the %.0f s an analysis needs)", run_id,
                     deploy_s, PARTIAL_MIN_DEPLOY_S)
            return
        before = self._last or self._starting
        own = GivesWay(f"mqttbed-partial-{run_id}", f"run {run_id}'s own figures")

        def store(_: SparkSession) -> None:
            path = store_run_partial(self._layout, row, self._settings)
            log.info("run %s: its own figures are kept in %s", run_id, path)

        def analyse() -> None:
            if before is not None:
                before.join()
            try:
                own.wrap(store)(get_spark(self._settings))
            except Exception:  # noqa: BLE001 - the campaign's analysis computes them instead
                log.exception("run %s: its own figures were not computed ahead; the "
                              "campaign's analysis computes them", run_id)

        thread = threading.Thread(target=analyse, name=f"analyse-{run_id}", daemon=True)
        thread.start()
        self._last = thread
        self._engine.hold_measurements(thread, f"the analysis of run {run_id}",
                                       give_way=own.give_way)

    def wait(self) -> None:
        """Wait for the runs' analyses started so far (before the campaign's own)."""
        if self._last is not None:
            self._last.join()


class GivesWay:
    """Analysis work that gives way to a run ready to measure: its Spark jobs carry a tag
    that :meth:`give_way` cancels (the engine calls it while the run waits,
    :meth:`RunEngine.hold_measurements`). What it did not finish is the campaign's
    analysis's to do: a run's own figures are computed with the pooled ones, a warm-up
    leaves the JVM less warm. A run then waits only for its own deployment and the JVM's
    start, never for work that can be done after the last run."""

    def __init__(self, tag: str, what: str):
        self._tag, self._what = tag, what
        self._asked = threading.Event()

    def give_way(self) -> None:
        """Stop the work's Spark jobs now, and any it would start after."""
        self._asked.set()
        cancel_tagged(self._tag)

    def wrap(self, work: Callable[[SparkSession], object]) -> Callable[[SparkSession], None]:
        """``work`` with its jobs tagged, not started once asked to give way, and quiet
        when cut short."""
        def run(spark: SparkSession) -> None:
            if self._asked.is_set():
                log.info("%s gave way to a run before it began", self._what)
                return
            try:
                with tagged_jobs(spark, self._tag):
                    work(spark)
            except Exception:
                if not self._asked.is_set():
                    raise
                log.info("%s gave way to a run ready to measure; the campaign's analysis "
                         "does it", self._what)
        return run


def settle_outcome(spec: CampaignSpec, outcome: CampaignStatus, reason: str | None, *,
                   search_ended: bool) -> tuple[CampaignStatus, str | None]:
    """The campaign's status from what its runs came to. A search that ended by its own
    rule has done what it was for even if some probe runs failed (a broker that died at a
    high rate): each failed probe is a rejection naming its reason in the results, so the
    campaign is ``done``, its reason saying how many failed. A search cut short (a
    cancel, a stopping controller, its next probe not chosen) keeps the general rule."""
    if spec.search is None or not search_ended or outcome != CampaignStatus.FAILED:
        return outcome, reason
    return CampaignStatus.DONE, (f"the search ended; {reason} (a failed probe is a "
                                 "rejection: its reason is in the results' probes)")


def next_runs(engine: RunEngine, layout: DataLayout, campaign_id: str, spec: CampaignSpec,
              figures: dict[str, RunStats], settings: Settings | None = None) -> bool:
    """Once a campaign's queued runs have ended: queue the runs its ``spec`` chooses as it
    goes (a search's next probe, another round of ``repetitions.until``); return whether
    it did. ``figures`` caches ended runs' figures across calls."""
    if spec.search is not None:
        return next_probe(engine, layout, campaign_id, figures, settings)
    if isinstance(spec.repetitions, RepetitionsUntil):
        return next_repetitions(engine, layout, campaign_id, settings)
    return False


def next_repetitions(engine: RunEngine, layout: DataLayout, campaign_id: str,
                     settings: Settings | None = None) -> bool:
    """For a ``repetitions.until`` campaign whose runs have ended: queue one more run of
    every point whose interval is still too wide and that has fewer than ``max`` runs (one
    round, in point order: interleaved as before); return whether any was queued."""
    with engine.ctx.sessions() as s:
        campaign = s.get(CampaignRow, campaign_id)
        rows = latest_attempts(s.query(RunRow).filter_by(campaign_id=campaign_id).all())
    spec = CampaignSpec.model_validate(campaign.spec)
    until = spec.repetitions
    if not isinstance(until, RepetitionsUntil) or any(
            r.state not in TERMINAL_STATES for r in rows):
        return False
    stats = analyze_runs(layout, campaign, rows, settings)
    wanted = next_round(until, rows, stats.points)
    counts = runs_per_point(rows)
    if not wanted:
        log.info("campaign %s: every point is narrow enough or has %d runs", campaign_id,
                 until.max)
        return False
    points = expand_points(spec)
    for index in wanted:
        engine.add_run(campaign_id, points[index], counts.get(index, 0))
    log.info("campaign %s: one more run of points %s (intervals still too wide)",
             campaign_id, wanted)
    return True


def next_probe(engine: RunEngine, layout: DataLayout, campaign_id: str,
               figures: dict[str, RunStats], settings: Settings | None = None) -> bool:
    """For a search campaign whose runs have ended: queue the probe its search asks for
    next; return whether it did (False: no search, or the search has ended).

    The probes are read back from the stored runs each time (``figures`` caches the ended
    runs' figures), so after a controller restart the search goes on from its runs.
    """
    with engine.ctx.sessions() as s:
        campaign = s.get(CampaignRow, campaign_id)
        rows = latest_attempts(s.query(RunRow).filter_by(campaign_id=campaign_id).all())
    spec = CampaignSpec.model_validate(campaign.spec)
    if spec.search is None or any(r.state not in TERMINAL_STATES for r in rows):
        return False
    missing = [r for r in rows if r.state == RunState.DONE and r.id not in figures]
    figures.update(run_figures(layout, campaign, missing, settings))
    probes, decision = replay(spec, rows, figures)
    if probes:
        last, _ = probes[-1]
        log.info("campaign %s: probe %s = %g %s (%s)", campaign_id, spec.search.parameter,
                 last.value, last.verdict, last.why)
    if decision.next_value is None:
        log.info("campaign %s: search ended (%s): %s", campaign_id, decision.stop,
                 conclusion(decision, spec.search.parameter))
        return False
    index, repetition = next_point_index(rows, decision.next_value, spec.search.parameter)
    engine.add_run(campaign_id, probe_point(spec, decision.next_value, index), repetition)
    log.info("campaign %s: next probe (%s) %s = %g", campaign_id, decision.phase,
             spec.search.parameter, decision.next_value)
    return True


def analysis_failure(exc: Exception) -> str:
    """The reason a failed analysis gives: ``analysis failed: <type>: <message>``."""
    message = str(exc).strip()
    if len(message) > REASON_MAX_CHARS:
        message = message[:REASON_MAX_CHARS] + " ... (cut; the controller's log has it all)"
    return f"{ANALYSIS_FAILED}: {type(exc).__name__}: {message}"


def discard_statistics(layout: DataLayout, campaign_id: str) -> None:
    """Remove what an analysis that failed half-way wrote: no stats means none."""
    for name in ("stats.json", "stats.parquet"):
        (layout.campaign_dir(campaign_id) / name).unlink(missing_ok=True)
