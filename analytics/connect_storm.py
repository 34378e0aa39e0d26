"""Connection-storm figures (``workload.mode: connect``), per run and per point.

Every agent reports each of its storm clients' connect (``Done.storm``,
:class:`~mqttbed.core.protocol.StormOutcomes`): its intended time, when each phase ended
(TCP, TLS, WebSocket, CONNECT written, CONNACK read) on the agent's CLOCK_MONOTONIC, and
its outcome. The controller keeps them as a file of the run (:data:`STORM_FILE`, not in
the run's database row: 20,000 clients are about a megabyte), and the analysis reads them
back into a :class:`StormRun` with the broker's RSS samples of the run. Figures are plain
Python, exact percentiles pooled over every connect of a level, as
:mod:`mqttbed.analytics.connections` does.

The broker's memory per held connection: its RSS while every connection was held (the
median of the resource samples between the last connect made and the storm's leaving)
minus its RSS before the storm (the last sample before the start), over the connections
held; None when no sample fell in either window (a hold shorter than the sampling
interval).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.analytics.connections import CONNECT_CLOCK, phase_distribution
from mqttbed.core.protocol import StormOutcomes
from mqttbed.core.sections import Distribution

STORM_FILE = "connect_storm.json"
# why a connect failed, as the agents name it (src/storm.c; "pending": never opened)
FAILURES = ("connack", "refused", "reset", "closed", "timeout", "tls", "websocket", "other",
            "pending")
# figure -> (the phase end it runs to, the phase end it runs from; None: the intended time)
FROM_INTENDED = {"connect_lag_us": "connect_ns", "tcp_from_intended_us": "tcp_ns",
                 "tls_from_intended_us": "tls_ns",
                 "websocket_from_intended_us": "websocket_ns",
                 "connack_from_intended_us": "connack_ns"}
PHASES = {"tcp_connect_us": ("tcp_ns", "connect_ns"),
          "tls_handshake_us": ("tls_ns", "tcp_ns"),
          "websocket_upgrade_us": ("websocket_ns", "tls_ns|tcp_ns"),
          "connack_us": ("connack_ns", "mqtt_sent_ns")}


def write_storm_outcomes(run_dir: Path, storms: Mapping[str, StormOutcomes]) -> Path:
    """Keep a run's storm outcomes (agent id -> its clients') beside its run.json."""
    path = run_dir / STORM_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {agent: storm.model_dump(mode="json") for agent, storm in sorted(storms.items())}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document, separators=(",", ":")))
    temporary.replace(path)
    return path


def read_storm_outcomes(run_dir: Path) -> dict[str, StormOutcomes]:
    """A run's storm outcomes by agent id; empty for a run without a storm."""
    path = run_dir / STORM_FILE
    if not path.exists():
        return {}
    return {agent: StormOutcomes.model_validate(storm)
            for agent, storm in json.loads(path.read_text()).items()}


@dataclass(frozen=True)
class StormRun:
    """One run's storm as the analysis takes it: every client's connect (columns, in the
    agents' order), instants after the client's intended time in ns (None: not reached),
    absolute times on the controller's CLOCK_MONOTONIC."""

    requested_clients: int
    requested_rate_hz: float | None
    intended_ns: tuple[int, ...]           # absolute, controller clock
    columns: tuple[tuple[str, tuple[int | None, ...]], ...]  # name -> after intended
    outcome: tuple[str, ...]
    code: tuple[int, ...]
    t_start_ns: int                        # controller clock
    t_all_done_ns: int | None              # every agent's connects made or failed
    t_left_ns: int | None                  # the first agent's leaving
    rss: tuple[tuple[int, int], ...] = ()  # the broker's (t_ns, rss_bytes), controller clock

    def column(self, name: str) -> tuple[int | None, ...]:
        """One phase column (``connect_ns``, ``tcp_ns``, ... ``ended_ns``)."""
        return dict(self.columns)[name]


def storm_run(storms: Mapping[str, StormOutcomes], offsets_ns: Mapping[str, int], *,
              requested_clients: int, requested_rate_hz: float | None,
              rss: Sequence[tuple[int, int]] = ()) -> StormRun | None:
    """A run's :class:`StormRun` from its agents' outcomes, each agent's clock brought to
    the controller's (agent = controller + offset); None without outcomes."""
    if not storms:
        return None
    names = ("connect_ns", "tcp_ns", "tls_ns", "websocket_ns", "mqtt_sent_ns", "connack_ns",
             "ended_ns")
    intended: list[int] = []
    columns: dict[str, list[int | None]] = {name: [] for name in names}
    outcome: list[str] = []
    code: list[int] = []
    starts, all_done, left = [], [], []
    for agent in sorted(storms):
        storm, offset = storms[agent], offsets_ns.get(agent, 0)
        starts.append(storm.t_start_ns - offset)
        all_done.append(None if storm.t_all_done_ns is None else storm.t_all_done_ns - offset)
        left.append(None if storm.t_left_ns is None else storm.t_left_ns - offset)
        intended.extend(storm.t_start_ns - offset + t for t in storm.intended_ns)
        for name in names:
            columns[name].extend(getattr(storm, name))
        outcome.extend(storm.outcome)
        code.extend(storm.code)
    done = None if None in all_done else max(t for t in all_done if t is not None)
    return StormRun(
        requested_clients=requested_clients, requested_rate_hz=requested_rate_hz,
        intended_ns=tuple(intended), columns=tuple((n, tuple(columns[n])) for n in names),
        outcome=tuple(outcome), code=tuple(code), t_start_ns=min(starts), t_all_done_ns=done,
        t_left_ns=min((t for t in left if t is not None), default=None),
        rss=tuple((int(t), int(b)) for t, b in sorted(rss)))


class BrokerMemory(BaseModel):
    """The broker's memory for the connections it held (RSS of its process tree)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rss_before_bytes: int = Field(description="the last sample before the storm began "
                                              "(a point: summed over its runs)")
    rss_held_bytes: int = Field(description="median of the samples while every connection "
                                            "was held (a point: summed over its runs)")
    held_connections: int = Field(description="connections held then")
    bytes_per_connection: float = Field(description="(held - before) / held_connections")


class ConnectStormFigures(BaseModel):
    """A connection storm's figures (of a run, or pooled over a point's done runs): how
    its connects went, timed from each client's intended connect time, in microseconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    clock: str = Field(CONNECT_CLOCK, description="what the phases are timed on")
    runs: int = Field(0, description="runs pooled")
    requested_clients: int = Field(0, description="workload.connect.clients, over the runs")
    clients: int = Field(0, description="connects the agents reported")
    connected: int = Field(0, description="connects that got their CONNACK (accepted)")
    failed: int = Field(0, description="connects that did not (by reason in failures)")
    lost_while_held: int = Field(0, description="connected, then dropped before the storm "
                                                "left (broker close, keep-alive unanswered)")
    failures: dict[str, int] = Field(
        default_factory=dict, description="failed connects by reason: connack (refused by "
        "CONNACK: codes in connack_codes), refused (TCP RST to the SYN), reset, closed "
        "(before CONNACK), timeout, tls, websocket, other, pending (never opened)")
    connack_codes: dict[str, int] = Field(
        default_factory=dict, description="CONNACK refusals by return / reason code")
    requested_connects_per_s: float | None = Field(
        None, description="workload.connect.rate_hz; null: every client at once")
    achieved_connects_per_s: float | None = Field(
        None, description="connects accepted over (last CONNACK - first intended time + one "
                          "period); a point: mean over runs")
    connect_lag_us: Distribution = Field(
        default_factory=Distribution, description="connect() called minus the intended "
                                                  "time: how far the storm fell behind")
    tcp_from_intended_us: Distribution = Field(
        default_factory=Distribution, description="TCP established, from the intended time")
    tls_from_intended_us: Distribution = Field(
        default_factory=Distribution, description="TLS handshake done, from the intended "
                                                  "time (TLS only)")
    websocket_from_intended_us: Distribution = Field(
        default_factory=Distribution, description="WebSocket 101 read, from the intended "
                                                  "time (WebSocket only)")
    connack_from_intended_us: Distribution = Field(
        default_factory=Distribution, description="CONNACK read, from the intended time: "
                                                  "the whole connect, schedule lag included")
    tcp_connect_us: Distribution = Field(default_factory=Distribution,
                                         description="connect() to TCP established")
    tls_handshake_us: Distribution = Field(default_factory=Distribution,
                                           description="TCP established to TLS done")
    websocket_upgrade_us: Distribution = Field(
        default_factory=Distribution, description="the layer below done to the 101 read")
    connack_us: Distribution = Field(default_factory=Distribution,
                                     description="CONNECT written to CONNACK read")
    broker_memory: BrokerMemory | None = Field(
        None, description="the broker's RSS per held connection; null without samples "
                          "before and during the hold")


def _span(end: int | None, start: int | None) -> int | None:
    return None if end is None or start is None else end - start


def _phase(run: StormRun, end: str, start: str) -> list[int | None]:
    ends = run.column(end)
    if "|" in start:   # the first of these columns that was reached
        firsts = [run.column(name) for name in start.split("|")]
        starts: Sequence[int | None] = [next((c[n] for c in firsts if c[n] is not None), None)
                                        for n in range(len(ends))]
    else:
        starts = run.column(start)
    return [_span(e, s) for e, s in zip(ends, starts, strict=True)]


def achieved_rate(run: StormRun) -> float | None:
    """Accepted connects per second of one run (None without any)."""
    connacks = [t + c for t, c, o in zip(run.intended_ns, run.column("connack_ns"),
                                         run.outcome, strict=True)
                if o == "connected" and c is not None]
    if not connacks:
        return None
    period_ns = 1e9 / run.requested_rate_hz if run.requested_rate_hz else 0.0
    span_ns = max(connacks) - min(run.intended_ns) + period_ns
    return len(connacks) / (span_ns / 1e9) if span_ns > 0 else None


def held_connections(run: StormRun) -> int:
    """Connections accepted and still held when the storm left."""
    return sum(o == "connected" and e is None
               for o, e in zip(run.outcome, run.column("ended_ns"), strict=True))


def broker_rss(run: StormRun) -> tuple[int, int] | None:
    """The broker's RSS before the storm and while every connection was held, or None."""
    before = [b for t, b in run.rss if t <= run.t_start_ns]
    if run.t_all_done_ns is None or run.t_left_ns is None or not before:
        return None
    held = [b for t, b in run.rss if run.t_all_done_ns <= t <= run.t_left_ns]
    if not held:
        return None
    return before[-1], int(statistics.median(held))


def connect_storm_figures(runs: Sequence[StormRun]) -> ConnectStormFigures | None:
    """The storm block of a level (a run, or a point's done runs pooled); None without."""
    if not runs:
        return None
    outcomes = Counter(o for run in runs for o in run.outcome)
    codes = Counter(str(c) for run in runs
                    for o, c in zip(run.outcome, run.code, strict=True) if o == "connack")
    rates = [r for run in runs if (r := achieved_rate(run)) is not None]
    memory = None
    measured = [(rss, held_connections(run)) for run in runs
                if (rss := broker_rss(run)) is not None]
    if measured and (held := sum(h for _, h in measured)):
        before = sum(rss[0] for rss, _ in measured)
        during = sum(rss[1] for rss, _ in measured)
        memory = BrokerMemory(rss_before_bytes=before, rss_held_bytes=during,
                              held_connections=held,
                              bytes_per_connection=(during - before) / held)
    rate = runs[0].requested_rate_hz
    return ConnectStormFigures(
        runs=len(runs), requested_clients=sum(run.requested_clients for run in runs),
        clients=sum(outcomes.values()), connected=outcomes["connected"],
        failed=sum(outcomes.values()) - outcomes["connected"],
        lost_while_held=sum(o == "connected" and e is not None for run in runs
                            for o, e in zip(run.outcome, run.column("ended_ns"), strict=True)),
        failures={why: outcomes[why] for why in FAILURES if outcomes[why]},
        connack_codes=dict(sorted(codes.items())),
        requested_connects_per_s=rate,
        achieved_connects_per_s=statistics.fmean(rates) if rates else None,
        **{figure: phase_distribution([t for run in runs for t in run.column(column)])
           for figure, column in FROM_INTENDED.items()},
        **{figure: phase_distribution([d for run in runs for d in _phase(run, *ends)])
           for figure, ends in PHASES.items()},
        broker_memory=memory)
