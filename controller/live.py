"""Live figures of the runs under way, folded from event chunks as the agents upload them.

The analysed figures (``analytics``) come once a campaign's runs have ended; while a run
measures, a lab watching it from Prometheus or a dashboard wants to know now whether
deliveries arrive, how late, and whether the generator keeps its rate. Each stored chunk
(:class:`~mqttbed.controller.agent_api.ChunkStore`) is folded into its run's
:class:`RunTally` with Arrow compute and numpy, column at a time; the run's state, its
broker's last resource sample and the campaigns' analysis times come from the
controller's documents (:mod:`mqttbed.controller.documents`). Nothing here is stored:
the figures are a view of the chunks as they came, gone with the controller.

What the live figures are, and how they differ from the analysed ones:

- **deliveries**: delivery rows received so far, warm-up excluded, every copy counted.
  Analysed ``deliveries_received`` counts each (message, receiver) once and only where a
  subscription of the receiver matches; the two agree unless the run has duplicates or
  unexpected deliveries.
- **latency**: ``t_recv_ns - t_pub_ns`` of each delivery row, both as the row carries
  them (the receiver's receive stamp, the send time from the payload), without clock
  offsets. The analysed latency takes the first copy only, the publisher's own record of
  the send time where there is one, subtracts each side's clock offset, and follows
  ``measurement.receive_clock``. On one machine (every agent on one CLOCK_MONOTONIC,
  offsets zero) the two agree for every first copy; across machines the live figure is
  off by the difference of the two agents' offsets.
- **deliveries expected** and **lost**: each measured publish counts once for every
  receiver holding a subscription whose filter matches its topic (as the analysis'
  expected pairs). Lost is expected minus received so far, never below zero: while a run
  goes it also counts deliveries in flight and those not yet uploaded (agents upload
  about once a second), so it is an upper bound that settles when the last chunk is in.
- **send lag**: ``t_pub_ns - t_intended_ns`` of each measured publish (the open-loop
  schedule's lateness; closed-loop publishes have no intended time and are left out).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mqttbed.analytics.topics import is_wildcard, topic_filter_regex
from mqttbed.controller.documents import CampaignUpdate, Document, ResultsReady, RunUpdate
from mqttbed.controller.states import ACTIVE_STATES, CampaignStatus, RunState
from mqttbed.controller.storage import DataLayout
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.events import EventKind
from mqttbed.core.protocol import ResultChunk
from mqttbed.core.samples import BrokerResourceSample

log = logging.getLogger("mqttbed.live")

NS_PER_S = 1_000_000_000
# Upper bounds (seconds) of the fixed histogram buckets; +Inf is implied.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0)
SEND_LAG_BUCKETS_S: tuple[float, ...] = (
    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
ANALYSIS_BUCKETS_S: tuple[float, ...] = (
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
# Runs whose figures are kept (the most recently started): a bound on the label sets a
# scrape carries, with the last runs still readable after they ended.
KEPT_RUNS = 16


class FixedHistogram:
    """Counts of values (integers, ns) in fixed buckets, their sum and their maximum."""

    def __init__(self, bounds_s: Sequence[float]):
        if list(bounds_s) != sorted(set(bounds_s)) or not bounds_s:
            raise ValueError(f"histogram bounds must rise strictly: {list(bounds_s)}")
        self.bounds_s = tuple(bounds_s)
        self._bounds_ns = np.array([round(b * NS_PER_S) for b in bounds_s], dtype=np.int64)
        self.counts = np.zeros(len(bounds_s) + 1, dtype=np.int64)   # last: above every bound
        self.sum_ns = 0
        self.max_ns: int | None = None

    def add(self, values_ns: np.ndarray) -> None:
        """Count ``values_ns`` (Prometheus' ``le``: a value equal to a bound is in it)."""
        if values_ns.size == 0:
            return
        index = np.searchsorted(self._bounds_ns, values_ns, side="left")
        self.counts += np.bincount(index, minlength=self.counts.size)
        self.sum_ns += int(values_ns.sum(dtype=np.int64))
        top = int(values_ns.max())
        self.max_ns = top if self.max_ns is None else max(self.max_ns, top)

    def merge(self, other: FixedHistogram) -> None:
        if other.bounds_s != self.bounds_s:
            raise ValueError(f"cannot merge histograms of bounds {other.bounds_s} and "
                             f"{self.bounds_s}")
        self.counts += other.counts
        self.sum_ns += other.sum_ns
        if other.max_ns is not None:
            self.max_ns = other.max_ns if self.max_ns is None else max(self.max_ns,
                                                                       other.max_ns)

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound in seconds, values at or below it), ending with (+inf, count)."""
        totals = np.cumsum(self.counts)
        return [*zip(self.bounds_s, (int(t) for t in totals[:-1]), strict=True),
                (float("inf"), int(totals[-1]))]

    def copy(self) -> FixedHistogram:
        twin = FixedHistogram(self.bounds_s)
        twin.merge(self)
        return twin


@dataclass
class ChunkFigures:
    """What one chunk adds to its run's tally (computed before the tally is locked)."""

    messages_sent: int
    sent_by_topic: dict[str, int]
    deliveries: int
    latency: FixedHistogram
    send_lag: FixedHistogram
    subscriptions: set[tuple[str, str]]   # (receiver, topic filter)


def chunk_figures(chunk: ResultChunk) -> ChunkFigures:
    """Fold one chunk's rows into its figures, column at a time (Arrow compute, numpy)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = chunk.rows

    def column(name: str, kind: Any) -> Any:
        if name in chunk.columns:
            values = chunk.columns[name]   # lists (JSON chunks) or Arrow (binary chunks)
            return values if isinstance(values, pa.Array) else pa.array(values, type=kind)
        value = chunk.constants.get(name)
        return pa.nulls(rows, kind) if value is None else pa.repeat(pa.scalar(value, kind), rows)

    kinds = column("kind", pa.string())
    # masks of the rows each figure counts (Any: the pyarrow stubs type them as scalars)
    measured: Any = pc.invert(pc.fill_null(column("warmup", pa.bool_()), False))
    published: Any = pc.and_(pc.equal(kinds, pa.scalar(EventKind.PUBLISH.value)), measured)
    delivered: Any = pc.and_(pc.equal(kinds, pa.scalar(EventKind.DELIVERY.value)), measured)
    subscribed: Any = pc.equal(kinds, pa.scalar(EventKind.SUBSCRIBE.value))
    topics, t_pub = column("topic", pa.string()), column("t_pub_ns", pa.int64())

    latency = FixedHistogram(LATENCY_BUCKETS_S)
    latency.add(_values(pc.subtract(pc.filter(column("t_recv_ns", pa.int64()), delivered),
                                    pc.filter(t_pub, delivered))))
    send_lag = FixedHistogram(SEND_LAG_BUCKETS_S)
    send_lag.add(_values(pc.subtract(pc.filter(t_pub, published),
                                     pc.filter(column("t_intended_ns", pa.int64()), published))))
    by_topic: list[Any] = pc.value_counts(pc.filter(topics, published)).tolist()
    receivers = pc.filter(column("receiver", pa.string()), subscribed).to_pylist()
    filters = pc.filter(topics, subscribed).to_pylist()
    return ChunkFigures(
        messages_sent=int(pc.sum(pc.cast(published, pa.int64())).as_py() or 0),
        sent_by_topic={entry["values"]: entry["counts"] for entry in by_topic},
        deliveries=int(pc.sum(pc.cast(delivered, pa.int64())).as_py() or 0),
        latency=latency, send_lag=send_lag,
        subscriptions={(r, f) for r, f in zip(receivers, filters, strict=True)
                       if r is not None and f is not None})


def _values(differences: Any) -> np.ndarray:
    """The non-null values of an int64 Arrow array as numpy."""
    import pyarrow.compute as pc

    return pc.drop_null(differences).to_numpy(zero_copy_only=False).astype(np.int64)


@dataclass(frozen=True)
class RunFigures:
    """One run's live figures at one moment (what a scrape reads)."""

    campaign_id: str
    run_id: str
    state: RunState
    chunks: int
    messages_sent: int
    deliveries: int
    deliveries_expected: int
    latency: FixedHistogram
    send_lag: FixedHistogram
    broker: BrokerResourceSample | None

    @property
    def lost(self) -> int:
        """Expected minus received so far, never below zero (see the module docstring)."""
        return max(0, self.deliveries_expected - self.deliveries)


class RunTally:
    """The running sums of one run's chunks; folded from many upload threads at once."""

    def __init__(self, campaign_id: str, run_id: str, state: RunState = RunState.RUNNING):
        self.campaign_id = campaign_id
        self.run_id = run_id
        self.state = state
        self.broker: BrokerResourceSample | None = None
        self._lock = threading.Lock()
        self._chunks = 0
        self._sent = 0
        self._sent_by_topic: dict[str, int] = {}
        self._deliveries = 0
        self._latency = FixedHistogram(LATENCY_BUCKETS_S)
        self._send_lag = FixedHistogram(SEND_LAG_BUCKETS_S)
        self._subscriptions = Subscriptions()

    def fold(self, figures: ChunkFigures) -> None:
        """Add one chunk's figures."""
        with self._lock:
            self._chunks += 1
            self._sent += figures.messages_sent
            for topic, count in figures.sent_by_topic.items():
                self._sent_by_topic[topic] = self._sent_by_topic.get(topic, 0) + count
            self._deliveries += figures.deliveries
            self._latency.merge(figures.latency)
            self._send_lag.merge(figures.send_lag)
            self._subscriptions.add(figures.subscriptions)

    def figures(self) -> RunFigures:
        """A consistent copy of the figures so far."""
        with self._lock:
            expected = sum(sent * self._subscriptions.receivers_of(topic)
                           for topic, sent in self._sent_by_topic.items())
            return RunFigures(
                campaign_id=self.campaign_id, run_id=self.run_id, state=self.state,
                chunks=self._chunks, messages_sent=self._sent, deliveries=self._deliveries,
                deliveries_expected=expected, latency=self._latency.copy(),
                send_lag=self._send_lag.copy(), broker=self.broker)


class Subscriptions:
    """A run's (receiver, topic filter) pairs, and how many receivers a topic reaches.

    A receiver whose several filters match a topic counts once (MQTT 3.1.1 section 3.3.5:
    one delivery per matching client), as the analysis' expected pairs count it. Answers
    are kept per topic until a new subscription comes, so a scrape of a run with many
    topics and subscribers does not match them all again.
    """

    def __init__(self) -> None:
        self._exact: dict[str, set[str]] = {}                  # filter -> receivers
        self._wildcards: dict[str, tuple[re.Pattern[str], set[str]]] = {}
        self._pairs: set[tuple[str, str]] = set()
        self._reach: dict[str, int] = {}

    def add(self, pairs: set[tuple[str, str]]) -> None:
        new = pairs - self._pairs
        if not new:
            return
        self._pairs |= new
        self._reach.clear()
        for receiver, topic_filter in new:
            if is_wildcard(topic_filter):
                pattern, receivers = self._wildcards.setdefault(
                    topic_filter, (re.compile(topic_filter_regex(topic_filter)), set()))
                receivers.add(receiver)
            else:
                self._exact.setdefault(topic_filter, set()).add(receiver)

    def receivers_of(self, topic: str) -> int:
        """How many receivers a message on ``topic`` is expected at."""
        if (known := self._reach.get(topic)) is not None:
            return known
        receivers = set(self._exact.get(topic, ()))
        for pattern, wild in self._wildcards.values():
            if pattern.fullmatch(topic):
                receivers |= wild
        self._reach[topic] = len(receivers)
        return len(receivers)


@dataclass
class _Analysis:
    started_ns: int


@dataclass
class AnalysisTimes:
    """How long the campaigns' analyses took (running -> analysing -> results or failed)."""

    histogram: FixedHistogram = field(default_factory=lambda: FixedHistogram(ANALYSIS_BUCKETS_S))
    under_way: dict[str, _Analysis] = field(default_factory=dict)


class LiveFigures:
    """The controller's live view: a tally per recent run, fed by chunks and documents.

    ``chunk_stored`` is the chunk store's callback; ``on_document`` listens to the
    controller's documents (run states, the last broker sample when a run ends, analysis
    start and end). ``running_broker`` gives the latest sample of the broker of the run
    under way (``RunEngine.running_broker_sample``), read at each scrape.
    """

    def __init__(self, layout: DataLayout, kept_runs: int = KEPT_RUNS,
                 clock: Callable[[], int] = monotonic_ns):
        self._layout = layout
        self._kept_runs = kept_runs
        self._clock = clock
        self._lock = threading.Lock()
        self._tallies: OrderedDict[str, RunTally] = OrderedDict()
        self._analysis = AnalysisTimes()
        self.running_broker: Callable[[], tuple[str, BrokerResourceSample] | None] = (
            lambda: None)

    def tally(self, campaign_id: str, run_id: str) -> RunTally:
        """The run's tally, started if it has none (a chunk before its run's document)."""
        with self._lock:
            tally = self._tallies.get(run_id)
            if tally is None:
                tally = self._tallies[run_id] = RunTally(campaign_id, run_id)
                while len(self._tallies) > self._kept_runs:
                    self._tallies.popitem(last=False)
            return tally

    def chunk_stored(self, campaign_id: str, chunk: ResultChunk) -> None:
        """Fold a newly stored chunk into its run's tally; a chunk that cannot be folded
        is logged (it is stored: the analysis reads it whatever happens here)."""
        try:
            figures = chunk_figures(chunk)
        except Exception as exc:  # noqa: BLE001 - live figures must never refuse an upload
            log.warning("run %s: chunk %d of %s left out of the live figures (%s: %s)",
                        chunk.run_id, chunk.seq, chunk.agent_id, type(exc).__name__, exc)
            return
        self.tally(campaign_id, chunk.run_id).fold(figures)

    def on_document(self, document: Document) -> None:
        """Follow run states, keep an ended run's last broker sample, time analyses."""
        if isinstance(document, RunUpdate):
            # A run's figures start with its deployment (or its first chunk); the runs a
            # restarted controller marks interrupted, or a queued retry, have none.
            with self._lock:
                tally = self._tallies.get(document.run_id)
            if tally is None and document.state == RunState.DEPLOYING:
                tally = self.tally(document.campaign_id, document.run_id)
            if tally is None:
                return
            tally.state = document.state
            if document.state not in ACTIVE_STATES:
                tally.broker = (self._last_stored_sample(document.campaign_id,
                                                         document.run_id) or tally.broker)
        elif isinstance(document, CampaignUpdate):
            if document.status == CampaignStatus.ANALYSING:
                with self._lock:
                    self._analysis.under_way[document.campaign_id] = _Analysis(self._clock())
            else:
                self._end_analysis(document.campaign_id)
        elif isinstance(document, ResultsReady):
            self._end_analysis(document.campaign_id)

    def _end_analysis(self, campaign_id: str) -> None:
        with self._lock:
            started = self._analysis.under_way.pop(campaign_id, None)
            if started is not None:
                self._analysis.histogram.add(
                    np.array([self._clock() - started.started_ns], dtype=np.int64))

    def _last_stored_sample(self, campaign_id: str, run_id: str) -> BrokerResourceSample | None:
        """The last broker sample an ended run wrote (``storage.write_broker_samples``)."""
        import pyarrow.parquet as pq

        path: Path = self._layout.run_samples(campaign_id, run_id) / "samples.parquet"
        try:
            table = pq.read_table(path)
        except (OSError, ValueError):
            return None
        if table.num_rows == 0:
            return None
        last = {name: values[0] for name, values in table.slice(table.num_rows - 1)
                .to_pydict().items()}
        return BrokerResourceSample.model_validate(last)

    def runs(self) -> list[RunFigures]:
        """The kept runs' figures, oldest first; the run under way with its broker's
        latest sample."""
        running = self.running_broker()
        with self._lock:
            tallies = list(self._tallies.values())
        if running is not None and (tally := next(
                (t for t in tallies if t.run_id == running[0]), None)) is not None:
            tally.broker = running[1]
        return [tally.figures() for tally in tallies]

    def analysis_times(self) -> FixedHistogram:
        """The durations of the analyses that ended, in a copy."""
        with self._lock:
            return self._analysis.histogram.copy()
