"""Runs the analytics over a campaign's stored data and writes its results files.

The controller only gathers what it knows of each run (point, state, reason, the scope
recorder's facts) and the section types its backends declare; every figure is computed
in :mod:`mqttbed.analytics`.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import sessionmaker

from mqttbed.analytics.results import CampaignStats, ScopeRun, results_model
from mqttbed.analytics.results_files import STATS_JSON
from mqttbed.brokers.registry import section_types
from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.storage import DataLayout


def results_type() -> type[CampaignStats]:
    """The results document of this installation: with every known backend's section."""
    return results_model(section_types())


def load_results(layout: DataLayout, campaign_id: str) -> CampaignStats | None:
    """The campaign's results as stored in ``stats.json``, or None before they exist."""
    path = layout.campaign_dir(campaign_id) / STATS_JSON
    if not path.exists():
        return None
    return results_type().model_validate_json(path.read_bytes())


def analyze_campaign(sessions: sessionmaker, layout: DataLayout, campaign_id: str,
                     spark_master: str | None = None) -> tuple[CampaignStats, Path, Path]:
    """Compute the campaign's results with Spark; return (results, stats.json, stats.parquet)."""
    from mqttbed.analytics.results_files import write_stats
    from mqttbed.analytics.spark import get_spark
    from mqttbed.analytics.stats import RunInfo, compute_campaign_stats

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
                    mode=r.spec["workload"].get("mode", "pubsub"),
                    scope=_scope_run(r)) for r in rows]
    stats = compute_campaign_stats(
        get_spark(spark_master), events_path=layout.events, samples_path=layout.broker_samples,
        records_path=layout.backend_records, section_types=section_types(),
        campaign={"id": campaign.id, "name": campaign.name, "spec": campaign.spec}, runs=runs)
    json_path, parquet_path = write_stats(stats, layout.campaign_dir(campaign_id))
    return stats, json_path, parquet_path


def _scope_run(row: RunRow) -> ScopeRun | None:
    """What the scope recorder did in the run (its acquisitions, timeouts, error)."""
    scope = (row.run_metadata or {}).get("scope")
    if not scope:
        return None
    return ScopeRun(run_id=row.id, acquisitions=scope.get("acquisitions"),
                    timeouts=scope.get("timeouts"), error=scope.get("error"))
