"""The results of a campaign, computed: figures per run and per sweep point.

A sweep point pools the runs of its ``point_index`` whose state is ``done``; the other
runs are counted in ``runs_failed`` and listed, with their reason and whatever figures
their data gives, in the runs section only. Every figure derived from events, broker
samples or backend records is computed here, with Spark; the result is the typed
document :class:`mqttbed.analytics.results.CampaignStats`. Definitions of the figures
are in :mod:`mqttbed.analytics.figures`.

An analysis is three Spark jobs, whatever the number of figures: (1) the subscriptions
and clocks, collected (small); (2) the per-delivery rows every figure starts from,
materialised; (3) one aggregation of every family's figure rows
(:mod:`mqttbed.analytics.passes`), collected. From :data:`RANKED_FROM_EVENTS` stored
events on, (3) is two: the moments aggregated, then the quantiles read by rank from a
sorted window, so that no group's values are ever held in one buffer.

A run's own figures (its level, its timeline) can come from its partial, computed when
it ended (:func:`compute_run_partial`, :mod:`mqttbed.analytics.partials`): the passes then
aggregate only the points' pooled figures and the runs without one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqttbed.analytics.confidence import bootstrap_interval
from mqttbed.analytics.connect_storm import StormRun, connect_storm_figures
from mqttbed.analytics.connections import ConnectTimes, connection_figures
from mqttbed.analytics.datasets import (
    EVENTS_DDL,
    SAMPLES_DDL,
    held_on_disk,
    read_runs,
    read_runs_held,
    stored_runs,
)
from mqttbed.analytics.figures import (
    POINT_LEVEL,
    RUN_LEVEL,
    STREAM_DISTRIBUTIONS,
    LevelFigures,
    LevelKey,
    Levels,
    PublisherStreams,
    delivery_rows,
    level_figure_rows,
    read_level_figures,
    subscription_rows,
)
from mqttbed.analytics.partials import RunPartial, own_groups, run_fingerprint
from mqttbed.analytics.passes import (
    Aggregate,
    GroupKey,
    aggregate_figures,
    analysis_conf,
    collect_facts,
    shuffle_partitions,
)
from mqttbed.analytics.reconnect import Restart, reconnect_figures
from mqttbed.analytics.results import CampaignStats, ScopeRun, results_model
from mqttbed.analytics.retained import (
    RETAINED_SHAPE,
    RetainedFacts,
    retained_facts,
    retained_figures,
    retained_rows,
    retained_sample_rows,
)
from mqttbed.analytics.scope import (
    agent_clocks,
    clock_rows,
    clock_uncertainty_us,
    read_scope_figures,
    read_time_sync_errors,
    scope_rows,
    split_by_clock,
    time_sync_rows,
)
from mqttbed.analytics.sections import (
    RECORDS_DDL,
    SectionStats,
    build_sections,
    read_section_statistics,
    section_rows,
)
from mqttbed.analytics.series import read_series, series_rows, start_rows
from mqttbed.analytics.sessions import (
    AWAY_SHAPES,
    RECONNECT_SHAPE,
    SESSIONS_SHAPE,
    AwayWindow,
    away_facts,
    away_rows,
    session_figures,
)
from mqttbed.analytics.shared_subscriptions import members as shared_members
from mqttbed.analytics.shared_subscriptions import shared_figures
from mqttbed.analytics.topic_tree import filters_of, topic_tree_figures
from mqttbed.core.sections import BackendSection

if TYPE_CHECKING:
    from pyspark import StorageLevel
    from pyspark.sql import SparkSession

DONE = "done"
# From this many stored events on, quantiles are taken by rank (passes.ranked_values)
# instead of gathered into one aggregation buffer per group: at 10 M events the gathered
# buffers ran the 2 GB heap out of memory; on a quickstart (93,000 events) ranks cost
# ~1.5x the gathering's JVM CPU (bench/analyze_small.py's campaign, 4 calls each).
RANKED_FROM_EVENTS = 1_000_000


@dataclass(frozen=True)
class StreamInfo:
    """A stream of a run's message mix: its name, what it sends, and its publishers."""

    name: str
    topic: str
    payload_bytes: int
    publishers: tuple[str, ...]


@dataclass(frozen=True)
class RunInfo:
    """What the controller knows of one run: its sweep point, outcome and parameters."""

    run_id: str
    point_index: int
    params: dict[str, Any]
    repetition: int
    state: str
    backend: str
    reason: str | None = None
    warmup_messages: int = 0
    # Flag the run when its clocks' uncertainty exceeds this fraction of its spread (p50).
    max_clock_uncertainty_fraction: float = 0.1
    # Per agent, its clock estimate when it got ready (ClockEstimate as a dict).
    agent_clocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    mode: str = "pubsub"
    # What the scope recorder did in this run, if a scope watched it.
    scope: ScopeRun | None = None
    # A fault the backend caused on purpose: when (controller's CLOCK_MONOTONIC), how
    # long after the run's start, and what it was.
    fault_at_ns: int | None = None
    fault_at_s: float | None = None
    fault: str | None = None
    # The streams of a message mix (workload.streams), in the spec's order; none without.
    streams: tuple[StreamInfo, ...] = ()
    # Which receive time the figures use: "kernel" (the socket's stamp where recorded) or
    # "user" (t_recv_user_ns, the receive loop's own time).
    receive_clock: str = "kernel"
    # The agents' generator reports (Done.generator), pooled: see results.Generator.
    generator: dict[str, Any] | None = None
    # Every connection its clients made, phase by phase (Done.connections, from the run's
    # record: analytics.connections.connect_times); none for runs from before they were.
    connections: tuple[ConnectTimes, ...] = ()
    # The traffic shape of its workload (campaigns.shapes: "shared", "topic_tree", ...;
    # None for a plain stream): a topic tree's figures come out per filter.
    shape: str | None = None
    # workload.sessions / workload.reconnect: each client's absences and returns
    # (analytics.sessions.away_windows), and the broker's restarts (stop, listening again)
    away: tuple[AwayWindow, ...] = ()
    restarts: tuple[Restart, ...] = ()
    # workload.mode connect: every storm client's connect and the broker's RSS samples
    # (analytics.connect_storm.storm_run, from the run's connect_storm.json)
    connect_storm: StormRun | None = None


@dataclass(frozen=True)
class _Inputs:
    """Everything the per-level entries are built from."""

    figures: LevelFigures
    scope: dict[LevelKey, dict[str, Any]]
    sync_errors: dict[LevelKey, dict[str, Any]]
    uncertainty: dict[str, float]
    agent_clocks: dict[str, dict[str, dict[str, Any]]]
    sections: SectionStats
    section_types: tuple[type[BackendSection], ...]
    # the runs' subscriptions (pass 1's), which the shapes' sections name their members
    # and filters from; the topic tree's runs
    subscriptions: tuple[dict[str, Any], ...] = ()
    tree_runs: tuple[str, ...] = ()
    groups: Mapping[GroupKey, Aggregate] = field(default_factory=dict)
    retained: RetainedFacts | None = None   # pass 1's rows of the retained-state runs
    # pass 1's rows of the subscribers that went away (analytics.sessions), by (run, id)
    away: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)


def compute_campaign_stats(spark: SparkSession, *, events_path: Path, samples_path: Path,
                           campaign: dict[str, Any], runs: list[RunInfo],
                           records_path: Path | None = None,
                           section_types: Sequence[type[BackendSection]] = (),
                           partials: Mapping[str, RunPartial] | None = None
                           ) -> CampaignStats:
    """Compute the results of ``campaign`` over ``runs`` from its datasets.

    ``campaign`` needs ``id`` (its partition in every dataset) and may hold ``name`` and
    ``spec``. Only the listed runs are read; runs or datasets without files give zero
    counts and null figures. ``records_path`` is the backend records dataset, pooled
    into the ``section_types`` the backends declare. ``partials`` (by run id, from
    :func:`compute_run_partial`) give runs their own figures; one whose fingerprint no
    longer holds is ignored, and that run's figures are computed here.
    """
    run_ids = [run.run_id for run in runs]
    repeated = sorted({run_id for run_id in run_ids if run_ids.count(run_id) > 1})
    if repeated:
        raise ValueError(f"runs lists run ids more than once: {', '.join(repeated)}; "
                         "pass each run once")
    data = _Data(spark, events_path, samples_path, records_path, str(campaign["id"]),
                 tuple(section_types))
    held = {run.run_id: partial for run in runs
            if (partial := (partials or {}).get(run.run_id)) is not None
            and partial.fingerprint == data.fingerprint(run)}
    levels: Levels = {run.run_id: ([] if run.run_id in held else [(RUN_LEVEL, run.run_id)]) + (
        [(POINT_LEVEL, str(run.point_index))] if run.state == DONE else []) for run in runs}
    facts, groups = data.groups(runs, levels,
                                [r for r in run_ids if r not in held] if held else None)
    for partial in held.values():
        groups.update(partial.groups)
    return _document(campaign, runs, facts, groups, data.section_types,
                     with_sections=data.records_root is not None)


def compute_run_partial(spark: SparkSession, *, events_path: Path, samples_path: Path,
                        campaign_id: str, run: RunInfo, records_path: Path | None = None,
                        section_types: Sequence[type[BackendSection]] = ()) -> RunPartial:
    """The run's own figures (:mod:`mqttbed.analytics.partials`), for the campaign's
    analysis to merge: what :func:`compute_campaign_stats` computes for that run's level
    and timeline, from that run's data alone."""
    data = _Data(spark, events_path, samples_path, records_path, campaign_id,
                 tuple(section_types))
    _, groups = data.groups([run], {run.run_id: [(RUN_LEVEL, run.run_id)]}, None)
    return RunPartial(run_id=run.run_id, fingerprint=data.fingerprint(run),
                      groups=own_groups(groups, run.run_id))


@dataclass(frozen=True)
class _Data:
    """A campaign's datasets, as one analysis reads them."""

    spark: SparkSession
    events_path: Path
    samples_path: Path
    records_path: Path | None
    campaign_id: str
    section_types: tuple[type[BackendSection], ...]

    @property
    def records_root(self) -> Path | None:
        """The backend records' dataset, when the document asks for sections."""
        return self.records_path if self.section_types else None

    def fingerprint(self, run: RunInfo) -> str:
        """What a partial of ``run`` must have been computed from (partials.run_fingerprint)."""
        roots = [self.events_path, self.samples_path]
        if self.records_root is not None:
            roots.append(self.records_root)
        return run_fingerprint(run, [(Path(root), self.campaign_id) for root in roots],
                               [t.__name__ for t in self.section_types])

    def groups(self, runs: list[RunInfo], levels: Levels, timeline_runs: list[str] | None
               ) -> tuple[dict[str, list[dict[str, Any]]], dict[GroupKey, Aggregate]]:
        """Pass 1's facts of ``runs`` and the aggregated figure groups of ``levels`` (the
        timelines of ``timeline_runs``, of every run if None)."""
        spark, campaign_id = self.spark, self.campaign_id
        run_ids = [run.run_id for run in runs]
        stored = stored_runs(self.events_path, campaign_id, run_ids)
        stored_events = read_runs_held(spark, self.events_path, campaign_id, run_ids,
                                       EVENTS_DDL, stored=stored)
        partitions = shuffle_partitions(spark, stored.partitions)
        records_root = self.records_root
        records = (None if records_root is None
                   else read_runs(spark, records_root, campaign_id, run_ids, RECORDS_DDL))
        try:
            with analysis_conf(spark, partitions):
                return _groups(runs, levels, timeline_runs, stored_events,
                               read_runs(spark, self.samples_path, campaign_id, run_ids,
                                         SAMPLES_DDL),
                               records, ranked=stored.rows >= RANKED_FROM_EVENTS,
                               on_disk=held_on_disk(stored.rows))
        finally:
            stored_events.unpersist()


def _groups(runs: list[RunInfo], levels: Levels, timeline_runs: list[str] | None,
            stored_events: Any, samples: Any, records: Any, *, ranked: bool,
            on_disk: StorageLevel | None
            ) -> tuple[dict[str, list[dict[str, Any]]], dict[GroupKey, Aggregate]]:
    """The three passes over the campaign's events as read (held: see
    datasets.read_runs_held); the per-delivery rows are held as ``on_disk`` says
    (datasets.held_on_disk)."""
    _, scope_events = split_by_clock(stored_events)
    events = software_events(stored_events, runs)
    faults = {run.run_id: run.fault_at_ns for run in runs if run.fault_at_ns is not None}
    streams: PublisherStreams = {
        run.run_id: {publisher: stream.name for stream in run.streams
                     for publisher in stream.publishers} for run in runs if run.streams}
    # Pass 1 (one action, small result): the subscriptions, which the topic matching of
    # pass 2 needs on the driver, the clocks and where each run's timeline starts. It
    # also fills the held events.
    # (and the retained-state runs' rows per subscriber: analytics.retained)
    retained = [run.run_id for run in runs if run.shape == RETAINED_SHAPE]
    # (and the rows of the subscribers that went away: analytics.sessions)
    away = {run.run_id: run.away for run in runs if run.shape in AWAY_SHAPES and run.away}
    facts = collect_facts({"subscriptions": subscription_rows(events),
                           "clocks": clock_rows(events), "starts": start_rows(events),
                           **({"retained": retained_rows(events, retained),
                               "retained_samples": retained_sample_rows(samples, retained)}
                              if retained else {}),
                           **({"away": away_rows(events, away)} if away else {})})
    subscriptions = facts["subscriptions"]
    # Pass 2: the per-delivery rows every figure starts from, materialised (its lineage
    # cut, so that pass 3's plan stays small; Spark's cleaner frees the blocks once the
    # frame is unreachable).
    deliveries = delivery_rows(events, subscriptions).localCheckpoint(storageLevel=on_disk)
    # Pass 3 (one action): every grouped figure, series and section at once.
    frames = [*level_figure_rows(events, deliveries, samples, levels, subscriptions,
                                 faults, streams, tree_runs=_tree_runs(runs)),
              scope_rows(scope_events, levels),
              *series_rows(deliveries, facts["starts"], timeline_runs)]
    if any(run.mode == "time-sync" for run in runs):
        frames.append(time_sync_rows(events, levels))
    if records is not None:
        frames.append(section_rows(records, levels))
    return facts, aggregate_figures(frames, ranked=ranked)


def _document(campaign: dict[str, Any], runs: list[RunInfo],
              facts: dict[str, list[dict[str, Any]]], groups: dict[GroupKey, Aggregate],
              section_types: tuple[type[BackendSection], ...], *, with_sections: bool
              ) -> CampaignStats:
    """The results document of ``runs`` from pass 1's facts and the figure groups."""
    inputs = _Inputs(
        figures=read_level_figures(groups),
        scope=read_scope_figures(groups),
        sync_errors=read_time_sync_errors(groups),
        uncertainty=clock_uncertainty_us(facts["clocks"]),
        agent_clocks=agent_clocks(facts["clocks"]),
        sections=read_section_statistics(groups) if with_sections else {},
        section_types=section_types,
        subscriptions=tuple(facts["subscriptions"]), tree_runs=_tree_runs(runs),
        groups=groups,
        retained=retained_facts(facts.get("retained", []), facts.get("retained_samples", [])),
        away=away_facts(facts.get("away", [])))
    series = read_series(groups)
    ordered = sorted(runs, key=lambda run: (run.point_index, run.repetition, run.run_id))
    by_point: dict[int, list[RunInfo]] = {}
    for run in ordered:
        by_point.setdefault(run.point_index, []).append(run)
    document = {
        "campaign": {"id": str(campaign["id"]), "name": campaign.get("name"),
                     "spec": campaign.get("spec")},
        "generated_at": datetime.now(UTC),
        "points": [_point_entry(index, point_runs, inputs)
                   for index, point_runs in by_point.items()],
        "runs": [_run_entry(run, inputs) for run in ordered],
        "series": series,
    }
    return results_model(section_types).model_validate(document)


def software_events(events: Any, runs: Sequence[RunInfo]) -> Any:
    """The events the software figures are computed from: without the scope's rows, and
    with each run's ``t_recv_ns`` on its receive clock (``RunInfo.receive_clock``).

    For readers of the per-value rows outside :func:`compute_campaign_stats` (the
    HdrHistogram export), so that their values are the ones the results pool.
    """
    events, _ = split_by_clock(events)
    return _on_receive_clock(events, [run.run_id for run in runs
                                      if run.receive_clock == "user"])


def _on_receive_clock(events: Any, user_clock_runs: list[str]) -> Any:
    """The events with ``t_recv_ns`` replaced by the user-space receive time in the runs
    analysed on the user clock (where a row has one)."""
    if not user_clock_runs:
        return events
    from pyspark.sql import functions as F

    use_user = F.col("run_id").isin(user_clock_runs) & F.col("t_recv_user_ns").isNotNull()
    return events.withColumn("t_recv_ns", F.when(use_user, F.col("t_recv_user_ns"))
                             .otherwise(F.col("t_recv_ns")))


def _rate_kept(run: RunInfo) -> bool:
    return run.generator is None or bool(run.generator.get("rate_kept", True))


def _clock_entry(run: RunInfo, uncertainty_us: float | None,
                 spread_p50_us: float | None) -> dict[str, Any]:
    """How far the run's clocks can be trusted against the spread it measured."""
    limit = (None if spread_p50_us is None
             else run.max_clock_uncertainty_fraction * spread_p50_us)
    return {"offset_uncertainty_us_max": uncertainty_us,
            "max_fraction_of_spread": run.max_clock_uncertainty_fraction,
            "flagged": bool(uncertainty_us is not None and limit is not None
                            and uncertainty_us > limit)}


def _spread_p50(inputs: _Inputs, run: RunInfo) -> float | None:
    return inputs.figures.distributions.get(
        (RUN_LEVEL, run.run_id, "sync_spread_us"), {}).get("p50")


def _point_entry(point_index: int, runs: list[RunInfo], inputs: _Inputs) -> dict[str, Any]:
    done = [run for run in runs if run.state == DONE]
    flagged = [run.run_id for run in done if _clock_entry(
        run, inputs.uncertainty.get(run.run_id), _spread_p50(inputs, run))["flagged"]]
    entry = {
        "point_index": point_index,
        "params": runs[0].params,
        "backend": runs[0].backend,
        "runs": len(done),
        "runs_failed": len(runs) - len(done),
        "partial": len(runs) != len(done),
        "run_ids": [run.run_id for run in done],
        **_level_figures(inputs, (POINT_LEVEL, str(point_index)), done, runs[0].streams),
        "clock_flagged_runs": flagged,
        "rate_not_kept_runs": [run.run_id for run in done if not _rate_kept(run)],
    }
    _add_intervals(entry, done, inputs.figures.sketches, lambda run_id, figure: (run_id, figure))
    stream_sketches = inputs.figures.stream_sketches
    for name, stream_entry in entry["streams"].items():
        def stream_key(run_id: str, figure: str, name: str = name) -> tuple[str, str, str]:
            return (run_id, name, figure)

        _add_intervals(stream_entry, done, stream_sketches, stream_key)
    return entry


_INTERVALS = (("latency_us", (("p50_ci", 0.5), ("p99_ci", 0.99))),
              ("sync_spread_us", (("p50_ci", 0.5),)))


def _add_intervals(entry: dict[str, Any], done: list[RunInfo], sketches: dict[Any, Any],
                   key: Callable[[str, str], Any]) -> None:
    """Set the bootstrap intervals over ``done`` runs of a point's (or its stream's)
    distributions; ``key(run_id, figure)`` finds a run's sketch."""
    for figure, quantiles in _INTERVALS:
        per_run = [sketches[key(run.run_id, figure)] for run in done
                   if key(run.run_id, figure) in sketches]
        for name, quantile in quantiles:
            entry[figure][name] = bootstrap_interval(per_run, quantile)


def _run_entry(run: RunInfo, inputs: _Inputs) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "point_index": run.point_index,
        "repetition": run.repetition,
        "params": run.params,
        "backend": run.backend,
        "state": run.state,
        "reason": run.reason,
        "partial": run.state != DONE,
        "warmup_messages": run.warmup_messages,
        **_level_figures(inputs, (RUN_LEVEL, run.run_id), [run], run.streams),
        "clock": {**_clock_entry(run, inputs.uncertainty.get(run.run_id),
                                 _spread_p50(inputs, run)),
                  "agents": _agent_clock_entries(run, inputs.agent_clocks.get(run.run_id, {}))},
        "generator": None if run.generator is None else {
            **run.generator, "receive_clock": run.receive_clock},
    }


def _agent_clock_entries(run: RunInfo, measured: dict[str, dict[str, Any]]
                         ) -> dict[str, dict[str, Any]]:
    """Each agent's clock: how its offset was found (at its start) and what its events say."""
    entries = {}
    for agent_id in sorted(set(measured) | set(run.agent_clocks)):
        start = run.agent_clocks.get(agent_id, {})
        bound = start.get("discipline_error_ns")
        entries[agent_id] = {
            "method": start.get("method", "unknown"),
            "discipline": start.get("discipline", "none"),
            "discipline_error_us": None if bound is None else bound / 1000.0,
            **measured.get(agent_id, {})}
    return entries


def _level_figures(inputs: _Inputs, level: LevelKey, runs: list[RunInfo],
                   streams: tuple[StreamInfo, ...]) -> dict[str, Any]:
    """The figures of one run or point (of ``runs`` pooled, with the ``streams`` of its
    message mix); zero counts and None where there is no data."""
    figures = inputs.figures
    counts = figures.counts.get(level, {})

    def count(name: str) -> int:
        return counts.get(name, 0)

    def item(figure: str, stat: str = "mean") -> float | None:
        return figures.items.get((*level, figure), {}).get(stat)

    def distribution(figure: str) -> dict[str, Any]:
        return dict(figures.distributions.get((*level, figure), {}))

    rss_max = item("rss_bytes_max", "max")
    entry: dict[str, Any] = {
        **_delivery_counts(counts),
        "latency_us": distribution("latency_us"),
        "latency_from_intended_us": distribution("latency_from_intended_us"),
        "send_lag_us": distribution("send_lag_us"),
        "jitter_us": {"std": item("jitter_std_us"), "rfc3550": item("jitter_rfc3550_us")},
        "sync_spread_us": distribution("sync_spread_us"),
        "first_last_spread_us": distribution("first_last_spread_us"),
        "throughput_msgs_per_s": item("throughput_msgs_per_s"),
        "throughput_msgs_per_s_std": item("throughput_msgs_per_s", "std"),
        "publication_msgs_per_s": item("publication_msgs_per_s"),
        "publication_msgs_per_s_std": item("publication_msgs_per_s", "std"),
        "connections": connection_figures(
            [connection for run in runs for connection in run.connections]),
        "connect_storm": connect_storm_figures(
            [run.connect_storm for run in runs if run.connect_storm is not None]),
        "broker": {
            "samples": int(item("samples", "sum") or 0),
            "cpu_percent_mean": item("cpu_percent_mean"),
            "cpu_percent_std": item("cpu_percent_mean", "std"),
            "cpu_percent_max": item("cpu_percent_max", "max"),
            "rss_bytes_max": None if rss_max is None else int(rss_max),
            "rss_bytes_std": item("rss_bytes_max", "std"),
            "net_recv_kb_per_s": item("net_recv_kb_per_s"),
            "net_recv_kb_per_s_std": item("net_recv_kb_per_s", "std"),
            "net_sent_kb_per_s": item("net_sent_kb_per_s"),
            "net_sent_kb_per_s_std": item("net_sent_kb_per_s", "std"),
        },
        "scope": _scope_entry(inputs.scope.get(level), runs),
        "time_sync": ({**inputs.sync_errors[level], "between_subscribers_p99_us":
                       distribution("sync_spread_us").get("p99")}
                      if level in inputs.sync_errors and runs
                      and runs[0].mode == "time-sync" else None),
        "fault": _fault_entry(runs, count("receivers_not_resumed"),
                              distribution("delivery_resumed_s")),
        "sections": build_sections(inputs.sections, level, inputs.section_types),
        "streams": {stream.name: _stream_entry(figures, level, stream) for stream in streams},
        **_shape_entries(inputs, level, runs),
        "retained": None if inputs.retained is None else retained_figures(
            inputs.retained, [run.run_id for run in runs]),
        "sessions": session_figures(inputs.away, {
            run.run_id: run.away for run in runs if run.shape == SESSIONS_SHAPE}),
        "reconnect": reconnect_figures(
            inputs.away, {run.run_id: run.away for run in runs if run.shape == RECONNECT_SHAPE},
            {run.run_id: run.restarts for run in runs if run.shape == RECONNECT_SHAPE}),
    }
    return entry


def _tree_runs(runs: Sequence[RunInfo]) -> tuple[str, ...]:
    return tuple(run.run_id for run in runs if run.shape == "topic_tree")


def _shape_entries(inputs: _Inputs, level: LevelKey, runs: list[RunInfo]) -> dict[str, Any]:
    """The traffic shapes' sections of one level: shared subscriptions' groups (wherever
    its runs subscribed to one) and a topic tree's filters."""
    run_ids = {run.run_id for run in runs}
    level_members: dict[str, set[str]] = {}
    for run_id, groups in shared_members(inputs.subscriptions).items():
        if run_id in run_ids:
            for group, of in groups.items():
                level_members.setdefault(group, set()).update(of)
    tree_runs = [run_id for run_id in inputs.tree_runs if run_id in run_ids]
    return {"shared": shared_figures(inputs.groups, level, level_members),
            "topic_tree": topic_tree_figures(inputs.groups, level,
                                             filters_of(inputs.subscriptions, tree_runs),
                                             tree_runs)}


def _delivery_counts(counts: dict[str, int]) -> dict[str, int]:
    """Sent, expected, received, unexpected, lost, duplicated and reordered, from the
    counted figures of a level or a stream."""
    def count(name: str) -> int:
        return counts.get(name, 0)

    return {
        "messages_sent": count("messages_sent"),
        "deliveries_expected": count("deliveries_expected"),
        "deliveries_received": count("deliveries_received"),
        "deliveries_unexpected": count("unique_deliveries") - count("deliveries_received"),
        "lost": count("deliveries_expected") - count("deliveries_received"),
        "duplicates": count("delivery_rows") - count("unique_deliveries"),
        "reordered": count("reordered"),
    }


def _stream_entry(figures: LevelFigures, level: LevelKey, stream: StreamInfo
                  ) -> dict[str, Any]:
    """The figures of one stream of a message mix in one run or point."""
    key = (*level, stream.name)
    return {"topic": stream.topic, "payload_bytes": stream.payload_bytes,
            **_delivery_counts(figures.stream_counts.get(key, {})),
            **{figure: dict(figures.stream_distributions.get((*key, figure), {}))
               for figure in STREAM_DISTRIBUTIONS}}


def _fault_entry(runs: list[RunInfo], not_resumed: int,
                 resumed: dict[str, Any]) -> dict[str, Any] | None:
    """The recovery figures of a level whose runs had a fault, else None."""
    faulted = [run for run in runs if run.fault is not None]
    if not faulted:
        return None
    times = [run.fault_at_s for run in faulted if run.fault_at_s is not None]
    return {"faults": [f"{run.run_id}: {run.fault}" for run in faulted],
            "at_s": sum(times) / len(times) if times else None,
            "delivery_resumed_s": resumed, "receivers_not_resumed": not_resumed}


def _scope_entry(figures: dict[str, Any] | None, runs: list[RunInfo]) -> dict[str, Any] | None:
    """The scope's figures of a level with what the recorder did in each of its runs."""
    recorded = [run.scope for run in runs if run.scope is not None]
    if figures is None and not recorded:
        return None
    return {**(figures or {}), "runs": recorded,
            "requested": sum(scope.requested or 0 for scope in recorded),
            "shortfall": sum(scope.shortfall for scope in recorded)}
