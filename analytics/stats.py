"""The stats document of a campaign: figures per run and per sweep point, and its files.

A sweep point pools the runs of its ``point_index`` whose state is ``done``; the other
runs are counted in ``runs_failed`` and listed, with their reason and whatever figures
their data gives, in the runs section only. Keys carry their units; every value is a
plain int, float, str or None, so the document is JSON as it stands. Definitions of the
figures are in :mod:`mqttbed.analytics.figures`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqttbed.analytics.datasets import EVENTS_DDL, SAMPLES_DDL, read_runs
from mqttbed.analytics.figures import (
    POINT_LEVEL,
    RUN_LEVEL,
    LevelFigures,
    LevelKey,
    compute_level_figures,
)
from mqttbed.analytics.scope import (
    clock_uncertainty_us,
    scope_figures,
    split_by_clock,
    time_sync_errors,
)
from mqttbed.analytics.series import compute_series

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DONE = "done"
LATENCY_KEYS = ("mean", "std", "p50", "p90", "p99", "p999", "max")
SPREAD_KEYS = ("mean", "std", "p50", "p99", "max")
STATS_JSON = "stats.json"
STATS_PARQUET = "stats.parquet"


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
    mode: str = "pubsub"


def compute_campaign_stats(spark: SparkSession, *, events_path: Path, samples_path: Path,
                           campaign: dict[str, Any], runs: list[RunInfo]) -> dict[str, Any]:
    """Compute the stats document of ``campaign`` over ``runs`` from its two datasets.

    ``campaign`` needs ``id`` (its partition in both datasets) and may hold ``name`` and
    ``spec``. Only the listed runs are read; runs or datasets without files give zero
    counts and null figures.
    """
    run_ids = [run.run_id for run in runs]
    repeated = sorted({run_id for run_id in run_ids if run_ids.count(run_id) > 1})
    if repeated:
        raise ValueError(f"runs lists run ids more than once: {', '.join(repeated)}; "
                         "pass each run once")
    campaign_id = str(campaign["id"])
    levels = spark.createDataFrame(
        [(run.run_id, RUN_LEVEL, run.run_id) for run in runs]
        + [(run.run_id, POINT_LEVEL, str(run.point_index)) for run in runs if run.state == DONE],
        "run_id string, level string, key string")
    events, scope_events = split_by_clock(
        read_runs(spark, events_path, campaign_id, run_ids, EVENTS_DDL))
    figures = compute_level_figures(
        events, read_runs(spark, samples_path, campaign_id, run_ids, SAMPLES_DDL), levels)
    series = compute_series(events, {run.run_id: run.point_index for run in runs
                                     if run.state == DONE})
    scope = scope_figures(scope_events, levels)
    sync_errors = time_sync_errors(events, levels) if any(
        run.mode == "time-sync" for run in runs) else {}
    uncertainty = clock_uncertainty_us(events)
    ordered = sorted(runs, key=lambda run: (run.point_index, run.repetition, run.run_id))
    by_point: dict[int, list[RunInfo]] = {}
    for run in ordered:
        by_point.setdefault(run.point_index, []).append(run)
    return {
        "campaign": {"id": campaign["id"], "name": campaign.get("name"),
                     "spec": campaign.get("spec")},
        "generated_at": datetime.now(UTC).isoformat(),
        "points": [_point_entry(index, point_runs, figures, scope, uncertainty, sync_errors)
                   for index, point_runs in by_point.items()],
        "runs": [_run_entry(run, figures, scope, uncertainty) for run in ordered],
        # Plot series, kept out of stats.parquet: CDF per point index, timeline per run.
        "series": series,
    }


def _clock_entry(run: RunInfo, uncertainty_us: float | None,
                 spread_p50_us: float | None) -> dict[str, Any]:
    """How far the run's clocks can be trusted against the spread it measured."""
    limit = (None if spread_p50_us is None
             else run.max_clock_uncertainty_fraction * spread_p50_us)
    return {"offset_uncertainty_us_max": uncertainty_us,
            "max_fraction_of_spread": run.max_clock_uncertainty_fraction,
            "flagged": bool(uncertainty_us is not None and limit is not None
                            and uncertainty_us > limit)}


def _point_entry(point_index: int, runs: list[RunInfo], figures: LevelFigures,
                 scope: dict[LevelKey, dict[str, Any]], uncertainty: dict[str, float],
                 sync_errors: dict[LevelKey, dict[str, Any]]) -> dict[str, Any]:
    done = [run for run in runs if run.state == DONE]
    flagged = [run.run_id for run in done if _clock_entry(
        run, uncertainty.get(run.run_id),
        figures.distributions.get((RUN_LEVEL, run.run_id, "sync_spread_us"), {}).get("p50"),
    )["flagged"]]
    level = (POINT_LEVEL, str(point_index))
    return {
        "point_index": point_index,
        "params": runs[0].params,
        "backend": runs[0].backend,
        "runs": len(done),
        "runs_failed": len(runs) - len(done),
        "run_ids": [run.run_id for run in done],
        **_level_figures(figures, level),
        **({"scope": scope[level]} if level in scope else {}),
        **({"time_sync": {**sync_errors[level], "between_subscribers_p99_us":
                          figures.distributions.get((*level, "sync_spread_us"), {}).get("p99")}}
           if level in sync_errors and runs[0].mode == "time-sync" else {}),
        "clock_flagged_runs": flagged,
    }


def _run_entry(run: RunInfo, figures: LevelFigures, scope: dict[LevelKey, dict[str, Any]],
               uncertainty: dict[str, float]) -> dict[str, Any]:
    level = (RUN_LEVEL, run.run_id)
    spread_p50 = figures.distributions.get((*level, "sync_spread_us"), {}).get("p50")
    return {
        "run_id": run.run_id,
        "point_index": run.point_index,
        "repetition": run.repetition,
        "params": run.params,
        "backend": run.backend,
        "state": run.state,
        "reason": run.reason,
        "warmup_messages": run.warmup_messages,
        **_level_figures(figures, level),
        **({"scope": scope[level]} if level in scope else {}),
        "clock": _clock_entry(run, uncertainty.get(run.run_id), spread_p50),
    }


def _level_figures(figures: LevelFigures, level: LevelKey) -> dict[str, Any]:
    """Return the figures of one run or point; zero counts and None where there is no data."""
    counts = figures.counts.get(level, {})

    def count(name: str) -> int:
        return counts.get(name, 0)

    def item(figure: str, stat: str = "mean") -> float | None:
        return figures.items.get((*level, figure), {}).get(stat)

    def distribution(figure: str, keys: tuple[str, ...]) -> dict[str, float | None]:
        stats = figures.distributions.get((*level, figure), {})
        return {key: stats.get(key) for key in keys}

    rss_max = item("rss_bytes_max", "max")
    return {
        "messages_sent": count("messages_sent"),
        "deliveries_expected": count("deliveries_expected"),
        "deliveries_received": count("deliveries_received"),
        # Unique deliveries no subscription asked for: a sign of a mis-recorded subscription.
        "deliveries_unexpected": count("unique_deliveries") - count("deliveries_received"),
        "lost": count("deliveries_expected") - count("deliveries_received"),
        "duplicates": count("delivery_rows") - count("unique_deliveries"),
        "reordered": count("reordered"),
        "latency_us": distribution("latency_us", LATENCY_KEYS),
        "jitter_us": {"std": item("jitter_std_us"), "rfc3550": item("jitter_rfc3550_us")},
        "sync_spread_us": distribution("sync_spread_us", SPREAD_KEYS),
        "first_last_spread_us": distribution("first_last_spread_us", SPREAD_KEYS),
        "throughput_msgs_per_s": item("throughput_msgs_per_s"),
        "throughput_msgs_per_s_std": item("throughput_msgs_per_s", "std"),
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
    }


# -- files ----------------------------------------------------------------------------

# Flattened column types of stats.parquet; every other column is a double.
_STRING_COLUMNS = ("level", "campaign_id", "run_id", "state", "reason", "backend", "params",
                   "run_ids", "clock_flagged_runs")
_BOOL_COLUMNS = ("clock_flagged",)
_INT_COLUMNS = ("point_index", "repetition", "warmup_messages", "runs", "runs_failed",
                "messages_sent", "deliveries_expected", "deliveries_received",
                "deliveries_unexpected", "lost", "duplicates", "reordered", "broker_samples",
                "broker_rss_bytes_max", "scope_acquisitions")
_LEADING_COLUMNS = ("level", "campaign_id", "point_index", "run_id", "repetition", "state",
                    "reason", "backend", "params", "run_ids", "warmup_messages", "runs",
                    "runs_failed")


def write_stats(stats: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``stats.json`` and ``stats.parquet`` into ``out_dir``; return both paths.

    The Parquet file has one flat row per point and per run (column ``level``); nested
    keys are joined with "_" (``latency_us_p99``), params and run id lists are JSON text.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, parquet_path = out_dir / STATS_JSON, out_dir / STATS_PARQUET
    json_path.write_text(json.dumps(stats, indent=2, allow_nan=False, default=str) + "\n")

    rows = list(_flat_rows(stats))
    names = list(_LEADING_COLUMNS)
    for row in rows:
        names += [name for name in row if name not in names]
    # Text columns: the known ones, and any other that holds text (JSON of a list).
    text = set(_STRING_COLUMNS) | {name for row in rows for name, value in row.items()
                                   if isinstance(value, str)}
    schema = pa.schema([(name, pa.string() if name in text
                         else pa.bool_() if name in _BOOL_COLUMNS
                         else pa.int64() if name in _INT_COLUMNS else pa.float64())
                        for name in names])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), parquet_path)
    return json_path, parquet_path


def _flat_rows(stats: dict[str, Any]) -> Iterator[dict[str, Any]]:
    campaign_id = str(stats["campaign"]["id"])
    for level, entries in ((POINT_LEVEL, stats["points"]), (RUN_LEVEL, stats["runs"])):
        for entry in entries:
            yield {"level": level, "campaign_id": campaign_id, **_flatten(entry)}


def _flatten(entry: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "params" or isinstance(value, list):
            flat[prefix + key] = json.dumps(value, sort_keys=True, default=str)
        elif isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}_"))
        else:
            flat[prefix + key] = value
    return flat
