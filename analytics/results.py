"""The results of a campaign as one typed document: ``CampaignStats``.

Points (one per sweep point, pooling its done runs) and runs carry the same typed
sections of figures; units are in the field names. Backends add their own sections
(:class:`mqttbed.core.sections.BackendSection`) under ``sections``: the document type is
generic over them, and :func:`results_model` builds the concrete type for the backends a
installation knows. ``stats.json`` is this model's JSON; ``stats.parquet`` is derived
from it (:mod:`mqttbed.analytics.results_files`); the report, the CLI and the API read it.
Definitions of the figures: :mod:`mqttbed.analytics.figures`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import cache
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, create_model

from mqttbed.analytics.connect_storm import ConnectStormFigures
from mqttbed.analytics.connections import ConnectionFigures
from mqttbed.analytics.reconnect import ReconnectFigures
from mqttbed.analytics.retained import RetainedFigures
from mqttbed.analytics.sessions import SessionFigures
from mqttbed.analytics.shared_subscriptions import SharedSubscriptionFigures
from mqttbed.analytics.topic_tree import TopicTreeFigures
from mqttbed.core.sections import BackendSection, Distribution

SCHEMA_VERSION = 2
CONFIDENCE_LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20260101
QUANTILE_SKETCH_LEVELS = 1001

Interval = tuple[float, float]
_CI = ("95 % interval across the point's runs: bootstrap over runs (see methods); "
       "null with fewer than two runs with data")

# re-exported for readers of the results
__all__ = ["Distribution", "BackendSection", "ConnectionFigures"]


class _Block(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LatencyDistribution(Distribution):
    """Publisher -> subscriber latency of every unique delivery, in microseconds."""

    p50_ci: Interval | None = Field(None, description=_CI)
    p99_ci: Interval | None = Field(None, description=_CI)


class SpreadDistribution(Distribution):
    """Per message: max - min arrival over its receivers (two or more), in microseconds."""

    p50_ci: Interval | None = Field(None, description=_CI)


class Jitter(_Block):
    """Jitter of the latency, in microseconds."""

    std: float | None = Field(None, description="mean over receivers of the std of latency")
    rfc3550: float | None = Field(None, description="mean over streams of the RFC 3550 "
                                                    "interarrival jitter at the stream's end")


class BrokerResources(_Block):
    """The broker's process tree, from its resource samples; ``_std`` across runs."""

    samples: int = 0
    cpu_percent_mean: float | None = None
    cpu_percent_std: float | None = None
    cpu_percent_max: float | None = None
    rss_bytes_max: int | None = None
    rss_bytes_std: float | None = None
    net_recv_kb_per_s: float | None = None
    net_recv_kb_per_s_std: float | None = None
    net_sent_kb_per_s: float | None = None
    net_sent_kb_per_s_std: float | None = None


class ScopeRun(_Block):
    """What the oscilloscope recorder did in one run."""

    run_id: str
    acquisitions: int | None = None
    requested: int | None = Field(None, description="acquisitions the spec asked for")
    shortfall: int = Field(0, description="requested minus made: the run ended (or the "
                                          "scope failed) before the scope caught them all")
    timeouts: int | None = None
    error: str | None = Field(None, description="why the scope stopped acquiring, if it did")


class ScopeFigures(_Block):
    """GPIO edge to edge delays caught by the oscilloscope, in microseconds."""

    acquisitions: int = 0
    requested: int = Field(0, description="acquisitions asked for, summed over the runs")
    shortfall: int = Field(0, description="acquisitions asked for but not made, summed over "
                                          "the runs: the scope figures rest on fewer")
    latency_us: Distribution = Field(default_factory=Distribution)
    sync_spread_us: Distribution | None = Field(
        None, description="per acquisition over the watched subscribers; null with one")
    runs: list[ScopeRun] = Field(default_factory=list)


class SubscriberSyncError(_Block):
    """A subscriber's clock error after adopting the time server's timestamp."""

    mean_error_us: float | None = None
    std_us: float | None = None
    max_abs_error_us: float | None = None
    samples: int = 0


class TimeSync(_Block):
    """MQTT time synchronisation (seed 000, section 4.2): errors per subscriber."""

    per_subscriber: dict[str, SubscriberSyncError] = Field(default_factory=dict)
    worst_max_abs_error_us: float | None = None
    between_subscribers_p99_us: float | None = None


class AgentClock(_Block):
    """One agent's clock in a run: where its offset came from and how good it was."""

    method: str = Field(description="same-clock, ntp (HTTP probes), chrony or ptp")
    discipline: str = Field("none", description="the agent machine's: chrony, ptp or none")
    discipline_error_us: float | None = Field(None, description="its bound, when synchronised")
    offset_uncertainty_us_max: float | None = Field(
        None, description="the largest uncertainty any of its events carries")
    offset_drift_us: float | None = Field(
        None, description="max - min of its offset estimates during the run")
    estimates: int | None = Field(None, description="offset estimates its events carry")


class RunClock(_Block):
    """How far a run's clocks can be trusted against the spread it measured."""

    offset_uncertainty_us_max: float | None = None
    max_fraction_of_spread: float
    flagged: bool
    agents: dict[str, AgentClock] = Field(default_factory=dict)


class Generator(_Block):
    """How the run's load generators kept the open-loop schedule (the agents' reports)."""

    requested_msgs_per_s: float = Field(description="sum of the open-loop publishers' rates")
    achieved_msgs_per_s: float = Field(
        description="per publisher: messages sent / (last send - first intended time + one "
                    "period), summed")
    send_lag_max_us: float = Field(description="the largest actual - intended send time")
    messages_unsent: int = Field(0, description="scheduled but not sent by the deadline")
    publishers_behind: list[str] = Field(
        default_factory=list, description="publishers below 95 % of their rate")
    rate_kept: bool = Field(description="every open-loop publisher sent at least 95 % of its "
                                        "rate and every scheduled message")
    mqtt_client: str = ""
    deliveries_kernel_stamped: int = Field(
        0, description="deliveries whose t_recv_ns is the kernel's receive stamp")
    deliveries_user_stamped: int = 0
    receive_clock: str = Field("kernel", description="which receive time the figures use "
                                                     "(measurement.receive_clock)")
    nofile_limit: int | None = Field(None, description="smallest RLIMIT_NOFILE of its agents")


class FaultRecovery(_Block):
    """A fault a backend caused during the run(s) on purpose, and how delivery came back."""

    faults: list[str] = Field(default_factory=list, description="what was done, per run")
    at_s: float | None = Field(None, description="when, since the run's start (mean)")
    delivery_resumed_s: Distribution = Field(
        default_factory=Distribution,
        description="per run: from the fault until every receiver had received a message "
                    "sent after it (the longest receiver's wait)")
    receivers_not_resumed: int = Field(
        0, description="receivers that received nothing sent after the fault")


class StreamFigures(_Block):
    """One stream of a message mix (``workload.streams``): the figures of its publishers'
    messages only, counted and pooled as the level's own (warm-up excluded)."""

    topic: str
    payload_bytes: int
    messages_sent: int = 0
    deliveries_expected: int = 0
    deliveries_received: int = 0
    deliveries_unexpected: int = 0
    lost: int = 0
    duplicates: int = 0
    reordered: int = 0
    latency_us: LatencyDistribution = Field(default_factory=LatencyDistribution)
    latency_from_intended_us: Distribution = Field(default_factory=Distribution)
    send_lag_us: Distribution = Field(default_factory=Distribution)
    sync_spread_us: SpreadDistribution = Field(default_factory=SpreadDistribution)


class BackendSections(_Block):
    """The sections backends add; :func:`sections_model` makes one field per section."""


SectionsT = TypeVar("SectionsT", bound=BackendSections)


class Figures(_Block, Generic[SectionsT]):
    """The figures of one run, or pooled over the done runs of one sweep point."""

    messages_sent: int = 0
    deliveries_expected: int = 0
    deliveries_received: int = 0
    deliveries_unexpected: int = Field(
        0, description="unique deliveries no subscription asked for: a mis-recorded "
                       "subscription")
    lost: int = 0
    duplicates: int = 0
    reordered: int = 0
    latency_us: LatencyDistribution = Field(default_factory=LatencyDistribution)
    latency_from_intended_us: Distribution = Field(
        default_factory=Distribution,
        description="arrival minus the open-loop intended send time: latency with "
                    "coordinated omission corrected")
    send_lag_us: Distribution = Field(
        default_factory=Distribution,
        description="per publish: actual minus intended send time")
    jitter_us: Jitter = Field(default_factory=Jitter)
    sync_spread_us: SpreadDistribution = Field(default_factory=SpreadDistribution)
    first_last_spread_us: Distribution = Field(
        default_factory=Distribution,
        description="per message: arrival at the last subscribed minus the first subscribed")
    throughput_msgs_per_s: float | None = None
    throughput_msgs_per_s_std: float | None = None
    publication_msgs_per_s: float | None = Field(
        None, description="per publisher: measured publishes over their first-to-last send "
                          "time, mean over publishers; with closed-loop pacing at QoS 2, the "
                          "publication throughput of the MQTT-ST paper")
    publication_msgs_per_s_std: float | None = Field(None, description="std over publishers")
    broker: BrokerResources = Field(default_factory=BrokerResources)
    connections: ConnectionFigures | None = Field(
        None, description="each phase of the clients' connections (TCP, TLS, WebSocket, "
                          "CONNECT -> CONNACK), timed by the agents; null where none were "
                          "timed (runs from before, or clients that do not time them)")
    scope: ScopeFigures | None = None
    time_sync: TimeSync | None = None
    fault: FaultRecovery | None = None
    streams: dict[str, StreamFigures] = Field(
        default_factory=dict, description="per stream of a message mix, by stream name in "
                                          "the spec's order; empty without workload.streams")
    shared: SharedSubscriptionFigures | None = Field(
        None, description="shared subscriptions ($share/GROUP/FILTER): per group, each "
                          "message delivered once, lost or duplicated; per member its share "
                          "and latency; null without a shared subscription")
    topic_tree: TopicTreeFigures | None = Field(
        None, description="a topic tree (workload.topic_tree): per filter, deliveries "
                          "against what it matches, and latency; null for other workloads")
    retained: RetainedFigures | None = Field(
        None, description="retained state (workload.retained): what the late subscribers "
                          "held (latest values, stale, missing, duplicated) and how soon; "
                          "these deliveries are left out of the latency and delivery "
                          "figures; null for other workloads")
    sessions: SessionFigures | None = Field(
        None, description="persistent sessions (workload.sessions): what the subscribers "
                          "that went away got of what was sent while they were away "
                          "(late, lost, duplicated) and how soon; null for other workloads")
    reconnect: ReconnectFigures | None = Field(
        None, description="a reconnect storm (workload.reconnect): the broker restarted, "
                          "every client back (when, attempts), the stream again, and what "
                          "each kind of subscriber lost of the outage; null for others")
    connect_storm: ConnectStormFigures | None = Field(
        None, description="a connection storm (workload.mode connect): connects made and "
                          "failed by reason, each timed from its intended time, the rate "
                          "achieved against the one asked, the broker's memory per held "
                          "connection; null for other workloads")
    sections: SectionsT


class PointStats(Figures[SectionsT], Generic[SectionsT]):
    """One sweep point: its figures pooled over its done runs."""

    point_index: int
    params: dict[str, Any]
    backend: str
    runs: int = Field(description="done runs pooled")
    runs_failed: int = Field(description="runs of the point that did not finish")
    partial: bool = Field(False, description="some runs of the point did not finish: its "
                                             "figures pool fewer runs than planned")
    run_ids: list[str]
    clock_flagged_runs: list[str] = Field(
        default_factory=list, description="runs whose clock uncertainty exceeds the allowed "
                                          "fraction of their spread")
    rate_not_kept_runs: list[str] = Field(
        default_factory=list, description="runs whose load generator could not keep the "
                                          "requested rate: their latency includes the "
                                          "generator's backlog")


class RunStats(Figures[SectionsT], Generic[SectionsT]):
    """One run, done or not: a failed run lists whatever figures its data gives."""

    run_id: str
    point_index: int
    repetition: int
    params: dict[str, Any]
    backend: str
    state: str
    reason: str | None = None
    partial: bool = Field(False, description="the run did not finish (failed or interrupted): "
                                             "its figures cover only the events stored "
                                             "before it ended")
    warmup_messages: int = 0
    clock: RunClock
    generator: Generator | None = Field(
        None, description="how the agents kept the schedule; None for runs from before it "
                          "was reported")


class Timeline(_Block):
    """One run's latency over time: per bin of send time since its first measured publish."""

    t_s: list[float] = Field(default_factory=list)
    p50_us: list[float] = Field(default_factory=list)
    p99_us: list[float] = Field(default_factory=list)
    deliveries: list[int] = Field(default_factory=list)


class SysTopicSeries(_Block):
    """One ``$SYS`` topic's values during a run, as the broker published them."""

    t_s: list[float] = Field(default_factory=list, description="since the run's start time")
    value: list[float] = Field(default_factory=list, description="in the broker's own unit")


class Series(_Block):
    """Plot series: a latency CDF per point index (101 quantiles), a timeline per run."""

    latency_cdf_us: dict[str, list[float]] = Field(default_factory=dict)
    stream_latency_cdf_us: dict[str, dict[str, list[float]]] = Field(
        default_factory=dict, description="point index -> stream of a message mix -> its "
                                          "latency CDF (101 quantiles)")
    latency_timeline: dict[str, Timeline] = Field(default_factory=dict)
    sys_topics: dict[str, dict[str, SysTopicSeries]] = Field(
        default_factory=dict, description="run -> $SYS topic -> its values over the run, for "
                                          "brokers that publish $SYS (Mosquitto does)")


class CampaignRef(_Block):
    id: str
    name: str | None = None
    spec: dict[str, Any] | None = None


class Methods(_Block):
    """How the figures were computed, for a reader of the numbers."""

    percentiles: str = "exact, linear interpolation between closest ranks, pooled over " \
                       "every value of a point's done runs"
    confidence_level: float = CONFIDENCE_LEVEL
    confidence_interval: str = (
        "percentile bootstrap over runs: the point's done runs are resampled with "
        "replacement, each resample's pooled percentile is read from the runs' "
        f"{QUANTILE_SKETCH_LEVELS}-quantile sketches weighted by their counts; the "
        "interval is the 2.5 and 97.5 % quantiles of the resampled estimates")
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES
    bootstrap_seed: int = BOOTSTRAP_SEED
    latency_clock: str = "offset-corrected send and receive timestamps; each event's " \
                         "clock source is in the dataset"


class SearchProbe(_Block):
    """One probe run of a capacity search: its value, the figures its SLO named, its
    verdict and why."""

    run_id: str
    value: float = Field(description="the searched parameter's value in this run")
    phase: str = Field(description="what chose it: bracketing, bisection or confirmation")
    verdict: str = Field(description="accepted (every SLO term held), rejected (one did "
                                     "not, or the run failed) or generator-limited (the load "
                                     "generator did not keep the rate: not the broker's "
                                     "limit)")
    why: str = Field(description="the SLO terms that failed with their measured values, or "
                                 "why the probe was accepted or generator-limited")
    figures: dict[str, float | None] = Field(
        default_factory=dict, description="the run's figures the SLO names, as in runs[]")


class SearchResults(_Block):
    """A capacity search (spec ``search``): the highest value meeting the SLO, its
    interval and every probe that led there."""

    parameter: str = Field(description="the dotted path searched over")
    slo: list[str] = Field(description="the SLO terms, as the spec gave them")
    capacity: float | None = Field(description="the highest value at which every probe met "
                                               "the SLO; null if even low did not")
    interval: tuple[float | None, float | None] = Field(
        description="[highest accepted, lowest rejected]: the capacity lies in it; null "
                    "where nothing bounds it (above high, below low, or a generator that "
                    "could not go higher)")
    stop_reason: str = Field(description="resolution, high-accepted, low-rejected, "
                                         "generator-limited or max-probes")
    conclusion: str = Field(description="the capacity in words, with what bounded it")
    probes: list[SearchProbe] = Field(default_factory=list, description="in the order run")


class DriftCheck(_Block):
    """Whether one point's per-run medians trend over the campaign (before pooling)."""

    figure: str = Field("latency_us.p50", description="the per-run figure tested")
    medians: list[float] = Field(default_factory=list,
                                 description="per done run, in the order the runs were made")
    tau: float | None = Field(None, description="Kendall's tau of the medians against run "
                                                "order (-1 .. 1); null with fewer than 3 runs")
    p_value: float | None = Field(None, description="two-sided, under no trend")
    drifting: bool = Field(False, description="p_value below the method's alpha: the runs "
                                              "may not be exchangeable, pool them with care")


class PointRepetitions(_Block):
    """How many runs one point got under ``repetitions.until``, and why it stopped."""

    point_index: int
    runs: int = Field(description="runs of the point (failed ones too)")
    stopped: str = Field(description="narrow: every interval narrower than its width; max: "
                                     "it hit repetitions.max first; unfinished: the "
                                     "campaign ended first")
    widths: dict[str, float | None] = Field(
        default_factory=dict, description="figure -> width of its 95 % interval across runs")
    drift: DriftCheck = Field(default_factory=DriftCheck)


class RepetitionsResults(_Block):
    """``repetitions: {min, max, until}``: which points stopped early, which hit max."""

    min: int
    max: int
    until: dict[str, float] = Field(description="figure -> the width asked for")
    points: list[PointRepetitions] = Field(default_factory=list)
    hit_max: list[int] = Field(default_factory=list,
                               description="indexes of the points that hit max runs while "
                                           "an interval was still too wide")
    drift_method: str = Field("", description="how drift across repetitions was tested")


class CampaignStats(_Block, Generic[SectionsT]):
    """The results of one campaign."""

    schema_version: int = SCHEMA_VERSION
    campaign: CampaignRef
    generated_at: datetime
    methods: Methods = Field(default_factory=Methods)
    points: list[PointStats[SectionsT]]
    runs: list[RunStats[SectionsT]]
    series: Series = Field(default_factory=Series)
    search: SearchResults | None = Field(
        None, description="a capacity search's outcome; null for a campaign without search")
    repetitions: RepetitionsResults | None = Field(
        None, description="repetitions until confident: runs per point, why each stopped, "
                          "and a drift check; null with a plain repetitions count")


@cache
def sections_model(section_types: tuple[type[BackendSection], ...]) -> type[BackendSections]:
    """The ``sections`` block with one optional field per backend section type."""
    keys = [t.key for t in section_types]
    if len(set(keys)) != len(keys):
        raise ValueError(f"backend sections share a key: {sorted(keys)}")
    fields: dict[str, Any] = {
        t.key: (t | None, Field(None, title=t.title, description=t.note or t.__doc__))
        for t in section_types}
    return create_model("BackendSections", __base__=BackendSections, **fields)


def results_model(section_types: Iterable[type[BackendSection]]) -> type[CampaignStats]:
    """The concrete results document for these backend sections (cached per set)."""
    ordered = tuple(sorted(set(section_types), key=lambda t: t.key))
    # type argument made at run time: mypy takes none but a static type
    return CampaignStats[sections_model(ordered)]  # type: ignore[misc,return-value]  # above


def figure_at(figures: BaseModel, path: str) -> float | None:
    """The number at a dotted path of a run's or point's figures (``latency_us.p99``,
    ``generator.achieved_msgs_per_s``); None where it was not measured."""
    value: Any = figures
    for part in path.split("."):
        if value is None:
            return None
        if not isinstance(value, BaseModel) or part not in type(value).model_fields:
            raise KeyError(f"no figure {path!r} in {type(figures).__name__}")
        value = getattr(value, part)
    return None if value is None else float(value)


def present_sections(sections: BackendSections) -> dict[str, BackendSection]:
    """The sections a run or point actually has, by key."""
    return {key: value for key, value in sections if value is not None}
