"""Runs the statistics job over a finished campaign and writes its stats files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import sessionmaker

from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.storage import DataLayout


def analyze_campaign(sessions: sessionmaker, layout: DataLayout, campaign_id: str,
                     spark_master: str | None = None) -> tuple[dict[str, Any], Path, Path]:
    """Compute the campaign's statistics with Spark; return (stats, stats.json, stats.parquet)."""
    from mqttbed.analytics.spark import get_spark
    from mqttbed.analytics.stats import RunInfo, compute_campaign_stats, write_stats

    with sessions() as s:
        campaign = s.get(CampaignRow, campaign_id)
        if campaign is None:
            raise KeyError(f"no campaign {campaign_id!r}")
        rows = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(RunRow.ordinal).all()
    runs = [RunInfo(run_id=r.id, point_index=r.point_index, params=r.params,
                    repetition=r.repetition, state=r.state, reason=r.reason,
                    backend=r.spec["broker"]["backend"],
                    warmup_messages=r.spec["workload"]["warmup_messages"],
                    max_clock_uncertainty_fraction=r.spec.get("measurement", {}).get(
                        "max_clock_uncertainty_fraction", 0.1),
                    mode=r.spec["workload"].get("mode", "pubsub")) for r in rows]
    stats = compute_campaign_stats(
        get_spark(spark_master), events_path=layout.events, samples_path=layout.broker_samples,
        campaign={"id": campaign.id, "name": campaign.name, "spec": campaign.spec}, runs=runs)
    _attach_broker_reports(stats, rows)
    _attach_scope_runs(stats, rows)
    json_path, parquet_path = write_stats(stats, layout.campaign_dir(campaign_id))
    return stats, json_path, parquet_path


def _attach_broker_reports(stats: dict[str, Any], rows: list[RunRow]) -> None:
    """Put what a backend reports of itself (e.g. the FPGA model's modelled hardware
    latency) beside each point's measured figures, from the runs' metadata."""
    by_run = {r.id: (r.run_metadata or {}).get("broker", {}) for r in rows}
    for point in stats["points"]:
        reports = [by_run[run_id]["hardware_latency_ns"] for run_id in point["run_ids"]
                   if by_run.get(run_id, {}).get("hardware_latency_ns")]
        if reports:
            point["broker_reported"] = {"hardware_latency_ns": combine_latency_reports(reports),
                                        "runs_reporting": len(reports),
                                        "per_run": reports}


def _attach_scope_runs(stats: dict[str, Any], rows: list[RunRow]) -> None:
    """Per point measured by a scope: each run's acquisitions, timeouts and scope error,
    so an acquisition that failed mid-run shows in the stats, not only in run metadata."""
    by_run = {r.id: (r.run_metadata or {}).get("scope") for r in rows}
    for point in stats["points"]:
        scoped = [(run_id, by_run[run_id]) for run_id in point["run_ids"] if by_run.get(run_id)]
        if scoped:
            point["scope_runs"] = [
                {"run_id": run_id, "acquisitions": scope.get("acquisitions"),
                 "timeouts": scope.get("timeouts"), "error": scope.get("error")}
                for run_id, scope in scoped]


def combine_latency_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One point's figure from its runs' reports: packets summed, means weighted by each
    run's packets, max the largest, p50 and p99 the median over the runs (the runs keep
    their own under ``per_run``)."""
    weights = [r.get("publish_packets", 0) for r in reports]
    total = sum(weights)

    def weighted(values: list[float | None]) -> float | None:
        pairs = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None and w]
        return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs else None

    def median(values: list[float | None]) -> float | None:
        present = sorted(v for v in values if v is not None)
        if not present:
            return None
        middle = len(present) // 2
        return present[middle] if len(present) % 2 else (present[middle - 1] + present[middle]) / 2

    combined: dict[str, Any] = {"publish_packets": total}
    if not total:
        return combined
    combined["copies_per_publish_mean"] = weighted(
        [r.get("copies_per_publish_mean") for r in reports])
    for block in ("modelled", "emulator_measured"):
        figures = {name for r in reports for name in r.get(block, {})}
        combined[block] = {}
        for name in sorted(figures):
            stats = [r.get(block, {}).get(name) or {} for r in reports]
            maxima = [s["max"] for s in stats if s.get("max") is not None]
            combined[block][name] = {
                "mean": weighted([s.get("mean") for s in stats]),
                "p50": median([s.get("p50") for s in stats]),
                "p99": median([s.get("p99") for s in stats]),
                "max": max(maxima) if maxima else None}
    return combined
