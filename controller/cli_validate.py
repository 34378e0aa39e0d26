"""``mqttbed validate SPEC``: what a campaign would run, and how long, without running it.

Everything ``mqttbed run`` checks before its first run is checked here too (the spec's
fields, the backend's features and QoS, files the spec names, lab hosts, cgroups), plus
whether each backend the campaign deploys is available on this machine; then the planned
runs and an estimate of the time, each part of it shown.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqttbed.campaigns.spec import CampaignSpec, PlannedRun
    from mqttbed.core.settings import Settings

# What a run costs besides its measured window, when the data dir has no run of the backend
# to take it from: deploy, agents' start, connect and subscribe, upload, teardown (4-7 s on
# the 2-core reference machine, issue 42).
DEFAULT_RUN_OVERHEAD_S = 6.0
# Spark's start and a small campaign's analysis after the last run (30 s for a one-run
# campaign on the 2-core reference machine, 2026-11-29).
ANALYSIS_S = 30.0
# The runs of the data dir an overhead is taken from: the newest done ones of the backend.
OVERHEAD_SAMPLE_RUNS = 50


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add the ``validate`` command to the ``mqttbed`` parser."""
    validate = commands.add_parser(
        "validate", help="check a campaign spec as `run` would, and print its planned runs "
                         "and estimated time, without running anything")
    validate.add_argument("spec", help="a spec file (YAML or JSON) or a built-in campaign's "
                                       "name (e.g. quickstart)")
    validate.add_argument("--data-dir", help="where lab hosts and past runs' timings are read "
                                             "(default: MQTTBED_DATA_DIR or ./data)")
    validate.set_defaults(func=_validate)


@dataclass(frozen=True)
class Estimate:
    """How long a campaign should take, and from what."""

    runs: int
    measuring_s: float          # the runs' windows, start leads and drains
    overhead_per_run_s: float
    overhead_from: str          # where the per-run overhead came from
    analysis_s: float
    bounded: bool               # runs is an upper bound (a search, repetitions until)

    @property
    def total_s(self) -> float:
        return self.measuring_s + self.runs * self.overhead_per_run_s + self.analysis_s


def run_window_s(spec: CampaignSpec) -> float:
    """A run's measured window: its slowest publisher's messages at its rate, or the
    spec's min_window_s if longer, plus the start lead and the drain."""
    sending = max((stream.offset_s + stream.messages / stream.rate_hz
                   for stream in spec.workload.resolved_streams() if stream.publishers),
                  default=0.0)
    return (max(sending, spec.workload.min_window_s) + spec.timing.start_lead_s
            + spec.timing.drain_s)


def _validate(args: argparse.Namespace) -> int:
    from mqttbed.brokers.cpu_budget import cpu_budget_unavailable
    from mqttbed.campaigns.library import spec_path
    from mqttbed.campaigns.repetitions import most_repetitions
    from mqttbed.campaigns.spec import check_access_files, load_spec, plan_runs
    from mqttbed.core.backends import declaration
    from mqttbed.core.errors import MqttbedError
    from mqttbed.core.settings import Settings

    settings = Settings.from_env(args.data_dir)
    try:
        path = spec_path(args.spec)
        spec = load_spec(path)
        spec = _resolve_lab_hosts(spec, settings)
        check_access_files(spec)
        planned = plan_runs(spec)
    except MqttbedError as exc:
        raise SystemExit(f"mqttbed validate: invalid campaign spec {args.spec}: {exc}") from None
    points = {run.point.index: run.point for run in planned}
    backends = sorted({point.spec.broker.backend for point in points.values()})
    problems = [f"backend {name}: {why}" for name in backends
                if (why := declaration(name).unavailable()) is not None]
    if any(point.spec.broker.cpu_limit is not None for point in points.values()) \
            and (why := cpu_budget_unavailable()) is not None:
        problems.append(f"broker.cpu_limit: {why}")

    print(f"{spec.name} ({path}): valid")
    print("checked:")
    print("  the spec's fields and bounds; sweep keys, scenarios and overrides resolve for "
          "every point")
    for name in backends:
        declared = declaration(name)
        features = declared.features_for(points[min(points)].spec.broker.options())
        qos = sorted({q for point in points.values() for q in _qos_of(point.spec)})
        state = "unavailable" if declared.unavailable() else "available here"
        print(f"  backend {name}: {state}; delivers QoS "
              f"{', '.join(map(str, sorted(features.qos)))} (the workload uses "
              f"{', '.join(map(str, qos))}); MQTT {', '.join(sorted(features.protocols))}; "
              f"listeners {', '.join(sorted(str(t) for t in features.transports))}")
    print("  files the spec names (TLS, passwords): "
          f"{'readable here' if _names_files(spec) else 'none'}")
    print(f"  lab hosts: {'resolved' if _names_lab_hosts(spec) else 'none named'}")
    if any(point.spec.broker.cpu_limit is not None for point in points.values()):
        usable = cpu_budget_unavailable() is None
        print(f"  broker.cpu_limit: {'cgroups usable here' if usable else 'refused here'}")

    estimate = estimate_time(spec, planned, settings)
    print(_plan_text(spec, planned, estimate, most_repetitions(spec.repetitions)))
    if problems:
        for problem in problems:
            print(f"cannot run here: {problem}")
        raise SystemExit(f"mqttbed validate: {spec.name} is valid but cannot run on this "
                         f"machine: {'; '.join(problems)}")
    return 0


def _qos_of(spec: CampaignSpec) -> list[int]:
    return [stream.qos for stream in spec.workload.streams or ()] or [spec.workload.qos]


def _names_files(spec: CampaignSpec) -> bool:
    return spec.broker.tls is not None or spec.broker.auth is not None


def _names_lab_hosts(spec: CampaignSpec) -> bool:
    return spec.broker.host is not None or any(h.name for h in spec.agents.hosts)


def _resolve_lab_hosts(spec: CampaignSpec, settings: Settings) -> CampaignSpec:
    """Lab hosts named in the spec, from the data dir's database (as ``run`` does)."""
    from mqttbed.controller.db import database_url, open_database
    from mqttbed.controller.lab_hosts import resolve_named_hosts
    from mqttbed.core.errors import SpecError

    if not _names_lab_hosts(spec):
        return spec
    url = settings.database_url
    if url is None:
        sqlite = settings.data_dir / "mqttbed.sqlite"
        if not sqlite.is_file():
            raise SpecError(f"the spec names lab hosts, and {settings.data_dir} has no "
                            "database to find them in (mqttbed lab provision adds them; "
                            "--data-dir names another data dir)")
        url = database_url(settings.data_dir)
    sessions = open_database(url, settings.database_reconnect_s)
    try:
        return resolve_named_hosts(spec, sessions)
    finally:
        sessions.kw["bind"].dispose()


def estimate_time(spec: CampaignSpec, planned: list[PlannedRun], settings: Settings
                  ) -> Estimate:
    """The campaign's time: its runs' windows, a per-run overhead, and the analysis."""
    from mqttbed.campaigns.repetitions import first_repetitions, most_repetitions

    if spec.search is not None:
        runs, measuring = _search_bound(spec)
        bounded = True
    else:
        per_point = most_repetitions(spec.repetitions)
        bounded = per_point != first_repetitions(spec.repetitions)
        points = {run.point.index: run.point for run in planned}
        runs = per_point * len(points)
        measuring = per_point * sum(run_window_s(p.spec) for p in points.values())
    backend = planned[0].point.spec.broker.backend
    overhead, source = _overhead_from_history(settings, backend)
    return Estimate(runs=runs, measuring_s=measuring, overhead_per_run_s=overhead,
                    overhead_from=source, analysis_s=ANALYSIS_S, bounded=bounded)


def _search_bound(spec: CampaignSpec) -> tuple[int, float]:
    """A search's most probes and their windows: bracketing from ``low`` by ``growth`` up
    to ``high``, the bisections that narrow one growth step to ``resolution``, then the
    confirmations (each of those at the longest bracketing window), within max_probes."""
    from mqttbed.campaigns.spec import probe_point

    search = spec.search
    assert search is not None
    values, value = [], search.low
    while True:
        values.append(min(value, search.high))
        if value >= search.high:
            break
        value *= search.growth
    bisections = (math.ceil(math.log2(math.log(search.growth) / math.log1p(search.resolution)))
                  if search.growth > 1 + search.resolution else 0)
    probes = min(search.max_probes, len(values) + bisections + search.confirmations)
    windows = [run_window_s(probe_point(spec, v, i).spec) for i, v in enumerate(values)]
    measured = windows[:probes]
    return probes, sum(measured) + (probes - len(measured)) * max(windows)


def _overhead_from_history(settings: Settings, backend: str) -> tuple[float, str]:
    """The mean overhead of the data dir's newest done runs of ``backend`` (their time
    minus their window), else the default."""
    from mqttbed.campaigns.spec import CampaignSpec
    from mqttbed.controller.db import RunRow, database_url, make_engine
    from mqttbed.controller.states import RunState

    default = (DEFAULT_RUN_OVERHEAD_S, "a default: the data dir has no done run of "
                                       f"{backend} to take it from")
    url = settings.database_url
    if url is None:
        if not (settings.data_dir / "mqttbed.sqlite").is_file():
            return default
        url = database_url(settings.data_dir)
    from sqlalchemy.orm import Session

    engine = make_engine(url, settings.database_reconnect_s)
    try:
        with Session(engine) as s:
            rows = (s.query(RunRow).filter(RunRow.state == RunState.DONE,
                                           RunRow.started_at.is_not(None),
                                           RunRow.ended_at.is_not(None))
                    .order_by(RunRow.ended_at.desc()).limit(OVERHEAD_SAMPLE_RUNS * 4).all())
    except Exception:  # noqa: BLE001 - an estimate never stops a validation
        return default
    finally:
        engine.dispose()
    overheads = []
    for row in rows:
        try:
            run_spec = CampaignSpec.model_validate(row.spec)
        except ValueError:   # a run stored by an older mqttbed: its spec no longer loads
            continue
        if run_spec.broker.backend != backend or row.started_at is None or row.ended_at is None:
            continue
        took = (row.ended_at - row.started_at).total_seconds()
        overheads.append(max(0.0, took - run_window_s(run_spec)))
        if len(overheads) == OVERHEAD_SAMPLE_RUNS:
            break
    if not overheads:
        return default
    return (sum(overheads) / len(overheads),
            f"the mean of the data dir's {len(overheads)} newest done runs of {backend}")


def _plan_text(spec: CampaignSpec, planned: list[PlannedRun], estimate: Estimate,
               per_point: int) -> str:
    lines = []
    if spec.search is not None:
        search = spec.search
        lines.append(f"planned runs: a capacity search over {search.parameter} from "
                     f"{search.low:g} to {search.high:g}, each probe chosen from the ones "
                     f"before: at most {estimate.runs} (bracketing, bisection to "
                     f"{search.resolution:g}, {search.confirmations} confirmation(s); "
                     f"max_probes {search.max_probes}); the first at "
                     f"{search.parameter}={planned[0].point.params[search.parameter]}")
    else:
        points = {run.point.index: run.point for run in planned}
        how_many = (f"{per_point}" if not estimate.bounded
                    else f"up to {per_point} (until an interval is narrow enough)")
        lines.append(f"planned runs: {'at most ' if estimate.bounded else ''}{estimate.runs} "
                     f"({len(points)} point{'s' if len(points) != 1 else ''} x {how_many} "
                     "repetitions, interleaved)")
        for point in points.values():
            params = ", ".join(f"{k}={v}" for k, v in point.params.items()) or "(no sweep)"
            lines.append(f"  point {point.index}: {params}  "
                         f"[{point.spec.broker.backend}, {run_window_s(point.spec):.1f} s "
                         "window per run]")
    bound = "at most " if estimate.bounded else "about "
    lines.append(f"estimated time: {bound}{_duration(estimate.total_s)} = "
                 f"{_duration(estimate.measuring_s)} measuring + {estimate.runs} x "
                 f"{estimate.overhead_per_run_s:.1f} s per run ({estimate.overhead_from}) + "
                 f"{_duration(estimate.analysis_s)} for Spark and the analysis")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    """``1 min 05 s`` style, rounded up to the second."""
    whole = timedelta(seconds=math.ceil(seconds))
    minutes, secs = divmod(int(whole.total_seconds()), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"
