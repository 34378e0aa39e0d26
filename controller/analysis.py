"""Runs the analytics over a campaign's stored data and writes its results files.

The controller only gathers what it knows of each run (point, state, reason, the scope
recorder's facts) and the section types its backends declare; every figure is computed
in :mod:`mqttbed.analytics`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import sessionmaker

from mqttbed.analytics.results import (
    CampaignStats,
    RunStats,
    ScopeRun,
    SysTopicSeries,
    results_model,
)
from mqttbed.analytics.results_files import STATS_JSON, read_stats
from mqttbed.analytics.spark import quick_jit_suits
from mqttbed.campaigns.repetitions import RepetitionsUntil
from mqttbed.campaigns.spec import CampaignSpec, Workload
from mqttbed.controller.assignments import campaign_events_bound
from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.engine import RunEngine, latest_attempts
from mqttbed.controller.repetition_runs import repetitions_results
from mqttbed.controller.search_runs import search_results
from mqttbed.controller.states import CAMPAIGN_UNDER_WAY, CampaignStatus
from mqttbed.controller.storage import DataLayout, read_sys_samples, write_json
from mqttbed.core.backends import section_types
from mqttbed.core.errors import MqttbedError
from mqttbed.core.events import publisher_client_id
from mqttbed.core.run_record import RunRecord, run_record
from mqttbed.core.settings import Settings

if TYPE_CHECKING:
    from mqttbed.analytics.connect_storm import StormRun
    from mqttbed.analytics.partials import RunPartial
    from mqttbed.analytics.stats import RunInfo, StreamInfo

log = logging.getLogger("mqttbed.analysis")

# How the reason of a campaign whose analysis failed begins (``controller.lifecycle``).
ANALYSIS_FAILED = "analysis failed"
# A run's own figures, beside the run (mqttbed.analytics.partials)
PARTIAL_JSON = "partial.json"


def settings_for_one_campaign(settings: Settings, spec: CampaignSpec) -> Settings:
    """``settings`` for a process that runs and analyses ``spec`` alone (``mqttbed run``):
    where the quick JIT is left unset, its JVM takes it if the campaign is small enough
    (:func:`mqttbed.analytics.spark.quick_jit_suits` of :func:`campaign_events_bound`)."""
    if settings.spark_quick_jit is not None:
        return settings
    quick = quick_jit_suits(campaign_events_bound(spec))
    return settings.model_copy(update={"spark_quick_jit": quick})


def results_type() -> type[CampaignStats]:
    """The results document of this installation: with every known backend's section."""
    return results_model(section_types())


def load_results(layout: DataLayout, campaign_id: str) -> CampaignStats | None:
    """The campaign's results as stored in ``stats.json``, or None before they exist;
    :class:`~mqttbed.analytics.results_files.StaleResults` for a file of another schema
    version (``mqttbed analyze`` recomputes it)."""
    path = layout.campaign_dir(campaign_id) / STATS_JSON
    if not path.exists():
        return None
    return read_stats(path, results_type())


def analyze_campaign(sessions: sessionmaker, layout: DataLayout, campaign_id: str,
                     settings: Settings | None = None) -> tuple[CampaignStats, Path, Path]:
    """Compute the campaign's results with Spark; return (results, stats.json, stats.parquet).

    ``settings`` say which Spark (master, memory, partitions) if this process has none
    yet; the results are the same whichever runs them.
    """
    from mqttbed.analytics.results_files import write_stats

    with sessions() as s:
        campaign = s.get(CampaignRow, campaign_id)
        if campaign is None:
            raise KeyError(f"no campaign {campaign_id!r}")
        # An interrupted attempt that was retried stays on disk but counts no more.
        rows = latest_attempts(s.query(RunRow).filter_by(campaign_id=campaign_id).all())
    stats = analyze_runs(layout, campaign, rows, settings)
    series = stats.series.model_copy(update={"sys_topics": sys_topic_series(layout, rows)})
    spec = CampaignSpec.model_validate(campaign.spec)
    stats = stats.model_copy(update={
        "series": series,
        "search": search_results(spec, rows, {r.run_id: r for r in stats.runs}),
        "repetitions": (repetitions_results(spec.repetitions, rows, stats.points, stats.runs)
                        if isinstance(spec.repetitions, RepetitionsUntil) else None)})
    json_path, parquet_path = write_stats(stats, layout.campaign_dir(campaign_id))
    return stats, json_path, parquet_path


def analyze_runs(layout: DataLayout, campaign: CampaignRow, rows: list[RunRow],
                 settings: Settings | None = None) -> CampaignStats:
    """The figures of these runs of a campaign (and of their points), computed as its
    results compute them, so the numbers ``stats.json`` will show: a search judges its
    probes by them, ``repetitions.until`` its points' intervals."""
    from mqttbed.analytics.spark import get_spark
    from mqttbed.analytics.stats import compute_campaign_stats

    return compute_campaign_stats(
        get_spark(settings), events_path=layout.events, samples_path=layout.broker_samples,
        records_path=layout.backend_records, section_types=section_types(),
        campaign={"id": campaign.id, "name": campaign.name, "spec": campaign.spec},
        runs=[run_info(r, layout) for r in rows],
        partials=run_partials(layout, campaign.id, rows))


def partial_path(layout: DataLayout, campaign_id: str, run_id: str) -> Path:
    """Where a run's own figures are kept: beside the run."""
    return layout.run_dir(campaign_id, run_id) / PARTIAL_JSON


def store_run_partial(layout: DataLayout, row: RunRow, settings: Settings | None = None
                      ) -> Path:
    """Compute an ended run's own figures (:mod:`mqttbed.analytics.partials`) and keep
    them beside the run, for the campaign's analysis to merge; return the file."""
    from mqttbed.analytics.spark import get_spark
    from mqttbed.analytics.stats import compute_run_partial

    partial = compute_run_partial(
        get_spark(settings), events_path=layout.events, samples_path=layout.broker_samples,
        records_path=layout.backend_records, section_types=section_types(),
        campaign_id=row.campaign_id, run=run_info(row, layout))
    path = partial_path(layout, row.campaign_id, row.id)
    write_json(path, partial.to_json(), indent=None)
    return path


def run_partials(layout: DataLayout, campaign_id: str, rows: list[RunRow]
                 ) -> dict[str, RunPartial]:
    """The kept partials of these runs, by run id; one that cannot be read is left out
    (and logged): that run's figures are computed with the campaign's."""
    from mqttbed.analytics.partials import RunPartial

    found: dict[str, RunPartial] = {}
    for row in rows:
        path = partial_path(layout, campaign_id, row.id)
        if not path.exists():
            continue
        try:
            found[row.id] = RunPartial.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("run %s: its partial %s is not used (%s: %s)", row.id, path,
                        type(exc).__name__, exc)
    return found


def run_figures(layout: DataLayout, campaign: CampaignRow, rows: list[RunRow],
                settings: Settings | None = None) -> dict[str, RunStats]:
    """The figures of these runs by run id (:func:`analyze_runs`); none for no rows."""
    if not rows:
        return {}
    return {run.run_id: run for run in analyze_runs(layout, campaign, rows, settings).runs}


def run_info(row: RunRow, layout: DataLayout | None = None) -> RunInfo:
    """What the analytics are told of one run: its point and outcome, its spec's settings
    (defaults resolved by the spec model) and what the run recorded (with ``layout``, the
    files it kept beside its record too: a storm's outcomes)."""
    from mqttbed.analytics.connections import connect_times
    from mqttbed.analytics.sessions import away_windows
    from mqttbed.analytics.stats import RunInfo

    spec = CampaignSpec.model_validate(row.spec)
    record = run_record(row.run_metadata, row.id)
    return RunInfo(run_id=row.id, point_index=row.point_index, params=row.params,
                   repetition=row.repetition, state=row.state, reason=row.reason,
                   backend=spec.broker.backend, warmup_messages=spec.workload.warmup_messages,
                   max_clock_uncertainty_fraction=(
                       spec.measurement.max_clock_uncertainty_fraction),
                   agent_clocks={a: c.model_dump() for a, c in record.agent_clocks.items()},
                   mode=spec.workload.mode, scope=_scope_run(row.id, record),
                   streams=_streams(spec.workload), **_fault(record),
                   receive_clock=spec.measurement.receive_clock,
                   generator=pooled_generators(record),
                   connections=connect_times(record.connections),
                   shape=spec.workload.shape(),
                   away=away_windows(record.reconnects, record.agent_clocks),
                   restarts=tuple((f.at_ns, f.until_ns) for f in record.faults
                                  if f.until_ns is not None),
                   connect_storm=None if layout is None else _connect_storm(
                       layout, row, spec, record))


def _connect_storm(layout: DataLayout, row: RunRow, spec: CampaignSpec, record: RunRecord
                   ) -> StormRun | None:
    """A storm run's outcomes (its connect_storm.json) with the broker's RSS samples."""
    from mqttbed.analytics.connect_storm import read_storm_outcomes, storm_run

    storm = spec.workload.connect
    if storm is None:
        return None
    outcomes = read_storm_outcomes(layout.run_dir(row.campaign_id, row.id))
    samples = layout.run_samples(row.campaign_id, row.id) / "samples.parquet"
    rss: list[tuple[int, int]] = []
    if samples.exists():
        import pyarrow.parquet as pq

        table = pq.read_table(samples, columns=["t_ns", "rss_bytes"]).to_pydict()
        rss = list(zip(table["t_ns"], table["rss_bytes"], strict=True))
    return storm_run(outcomes, {a: c.offset_ns for a, c in record.agent_clocks.items()},
                     requested_clients=storm.clients, requested_rate_hz=storm.rate_hz,
                     rss=rss)


def sys_topic_series(layout: DataLayout, rows: list[RunRow]
                     ) -> dict[str, dict[str, SysTopicSeries]]:
    """Each run's ``$SYS`` values by topic, timed from the run's start (runs without any,
    or from before the start time was recorded, are left out)."""
    found: dict[str, dict[str, SysTopicSeries]] = {}
    for row in rows:
        t_start_ns = run_record(row.run_metadata, row.id).t_start_ns
        samples = read_sys_samples(layout, row.campaign_id, row.id)
        if t_start_ns is None or not samples:
            continue
        by_topic: dict[str, tuple[list[float], list[float]]] = {}
        for sample in sorted(samples, key=lambda s: s.t_ns):
            times, values = by_topic.setdefault(sample.topic, ([], []))
            times.append((sample.t_ns - t_start_ns) / 1e9)
            values.append(sample.value)
        found[row.id] = {topic: SysTopicSeries(t_s=times, value=values)
                         for topic, (times, values) in sorted(by_topic.items())}
    return found


def reanalysis_status(engine: RunEngine, campaign_id: str
                      ) -> tuple[CampaignStatus, str | None] | None:
    """Before re-analysing: the status the campaign takes if it succeeds, or None to keep it.

    A campaign under way belongs to the controller running it: re-analysing it would race
    that controller's own analysis, so it is refused. One whose analysis failed takes what
    its runs came to once it has results; any other keeps its status.
    """
    with engine.ctx.sessions() as s:
        row = s.get(CampaignRow, campaign_id)
        status, reason = row.status, row.reason or ""
    if status in CAMPAIGN_UNDER_WAY:
        raise MqttbedError(f"campaign {campaign_id} is {status}: its controller analyses it "
                           "when its runs have ended; analyse it again after that")
    if status == CampaignStatus.FAILED and reason.startswith(ANALYSIS_FAILED):
        return engine.outcome(campaign_id)
    return None


def pooled_generators(record: RunRecord) -> dict[str, Any] | None:
    """The run's agents' generator reports (``Done.generator``) as one: rates and counts
    summed, the worst lag, kept only if every agent kept its rate; None without reports."""
    reports = list(record.generators.values())
    if not reports:
        return None
    limits = [r.nofile_limit for r in reports if r.nofile_limit is not None]
    return {
        "requested_msgs_per_s": sum(r.requested_msgs_per_s for r in reports),
        "achieved_msgs_per_s": sum(r.achieved_msgs_per_s for r in reports),
        "send_lag_max_us": max(r.send_lag_max_ns for r in reports) / 1e3,
        "messages_unsent": sum(r.messages_unsent for r in reports),
        "publishers_behind": sorted(p for r in reports for p in r.publishers_behind),
        "rate_kept": all(r.rate_kept for r in reports),
        "mqtt_client": ",".join(sorted({r.mqtt_client for r in reports})),
        "deliveries_kernel_stamped": sum(r.kernel_deliveries for r in reports),
        "deliveries_user_stamped": sum(r.user_deliveries for r in reports),
        "nofile_limit": min(limits) if limits else None,
    }


def _scope_run(run_id: str, record: RunRecord) -> ScopeRun | None:
    """What the scope recorder did in the run (its acquisitions, timeouts, error)."""
    if (scope := record.scope) is None:
        return None
    return ScopeRun(run_id=run_id, acquisitions=scope.acquisitions, requested=scope.requested,
                    shortfall=scope.shortfall, timeouts=scope.timeouts, error=scope.error)


def _streams(workload: Workload) -> tuple[StreamInfo, ...]:
    """The streams of a run's message mix, with their publishers' client ids (none
    without ``workload.streams``)."""
    from mqttbed.analytics.stats import StreamInfo

    if not workload.streams:
        return ()
    return tuple(
        StreamInfo(name=stream.name, topic=stream.topic, payload_bytes=stream.payload_bytes,
                   publishers=tuple(publisher_client_id(stream.first_publisher + k)
                                    for k in range(stream.publishers)))
        for stream in workload.resolved_streams())


def _fault(record: RunRecord) -> dict[str, Any]:
    """RunInfo's fault fields from what the run's backend reported (the first fault)."""
    if not record.faults:
        return {}
    first, t_start = record.faults[0], record.t_start_ns
    return {"fault_at_ns": first.at_ns, "fault": first.what,
            "fault_at_s": None if t_start is None else (first.at_ns - t_start) / 1e9}
