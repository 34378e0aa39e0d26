"""Dataset exports: the Parquet dataset as a zip with its provenance, or deliveries as CSV.

The zip also holds each sweep point's latency and sync spread as HdrHistogram logs
(``hdrhistogram/point-NNN-latency.hlog``, ``...-sync_spread.hlog``; see
:mod:`mqttbed.analytics.hdr_export`), computed with Spark from the events when the zip is
built, and listed in ``manifest.json`` under ``hdrhistogram``. Only a campaign with results
(``stats.json``) has them: they are the distributions its results report, and a campaign
still running or analysing would have the export wait for Spark beside its own analysis.
"""

from __future__ import annotations

import io
import json
import os
import platform
import tempfile
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

import mqttbed
from mqttbed.analytics.hdr_export import PointLog, RunWindow, point_logs, run_values
from mqttbed.analytics.results_files import STATS_JSON
from mqttbed.controller.analysis import run_info
from mqttbed.controller.controller import Controller
from mqttbed.controller.db import AgentRow, CampaignRow, RunRow
from mqttbed.controller.engine import latest_attempts
from mqttbed.controller.states import RunState
from mqttbed.core.clock import CLOCK_NAME
from mqttbed.core.events import EVENT_FIELDS, EventKind
from mqttbed.core.run_record import BrokerDeployment, RunRecord, run_record

CSV_COLUMNS = ("campaign_id", "run_id", "publisher", "seq", "receiver", "topic",
               "payload_bytes", "qos", "warmup", "t_intended_ns", "t_pub_ns", "t_recv_ns",
               "clock_source", "clock_offset_ns", "clock_offset_uncertainty_ns", "agent_id")


def _host_facts() -> dict[str, Any]:
    uname = platform.uname()
    return {"system": uname.system, "release": uname.release, "machine": uname.machine,
            "hostname": uname.node, "cpus": os.cpu_count(),
            "memory_bytes": psutil.virtual_memory().total,
            "python": platform.python_version()}


def _agent_facts(record: RunRecord, rows: dict[str, AgentRow]) -> dict[str, Any]:
    """Where each agent of a run took its timestamps: host, cores, clock, offset, GPIO."""
    facts = {}
    for agent_id, clients in record.agents.items():
        row = rows.get(agent_id)
        info = row.info if row is not None else {}
        clock, gpio = record.agent_clocks.get(agent_id), record.gpio.get(agent_id)
        facts[agent_id] = {
            "clients": clients, "hostname": info.get("hostname"), "cores": info.get("cores"),
            "clock": info.get("clock"), "clock_resolution_ns": info.get("clock_resolution_ns"),
            "clock_offset": None if clock is None else clock.model_dump(),
            "gpio": None if gpio is None else gpio.model_dump()}
    return facts


# What the manifest says of each run's broker; source_sha256: the sources of a broker that
# runs from mqttbed's own code (the adaptive broker, the FPGA model or RTL, the MQTT-SN
# gateway), whose version is mqttbed's; limits: a backend's queue limits (Mosquitto's).
_DEPLOYMENT_FACTS = ("backend", "version", "binary", "binary_sha256", "source_sha256",
                     "config_sha256", "limits")


def _deployment_facts(broker: BrokerDeployment | None) -> dict[str, Any]:
    """The provenance facts of a run's broker deployment (None each where not recorded)."""
    recorded = {} if broker is None else broker.model_dump(mode="json")
    return {key: recorded.get(key) for key in _DEPLOYMENT_FACTS}


def _clock_sources(controller: Controller, campaign_id: str) -> list[str]:
    import pyarrow.dataset as ds

    root = controller.layout.events / f"campaign_id={campaign_id}"
    if not root.exists():
        return []
    table = ds.dataset(root, format="parquet").to_table(columns=["clock_source"])
    return sorted({source for source in table["clock_source"].to_pylist() if source is not None})


def manifest(controller: Controller, campaign_id: str,
             hdr_logs: list[PointLog] | None = None) -> dict[str, Any]:
    """Provenance of a campaign's data: spec, what was deployed, where, with which clocks
    (and what each of ``hdr_logs``, the export's HdrHistogram logs, holds)."""
    with controller.sessions() as s:
        campaign = s.get(CampaignRow, campaign_id)
        runs = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(RunRow.ordinal).all()
    records = {r.id: run_record(r.run_metadata, r.id) for r in runs}
    agent_ids = {a for record in records.values() for a in record.agents}
    with controller.sessions() as s:
        agent_rows = {a.id: a for a in s.query(AgentRow).filter(AgentRow.id.in_(agent_ids))}
    backends = []
    for run in runs:
        backends.append(_deployment_facts(records[run.id].broker) | {"run_id": run.id})
    return {
        "mqttbed_version": mqttbed.__version__,
        "exported_at": datetime.now(UTC).isoformat(),
        "campaign": {"id": campaign.id, "name": campaign.name, "status": campaign.status,
                     "spec": campaign.spec, "created_at": campaign.created_at.isoformat()},
        "runs": [{"run_id": r.id, "point_index": r.point_index, "repetition": r.repetition,
                  "params": r.params, "state": r.state, "reason": r.reason,
                  "agents": _agent_facts(records[r.id], agent_rows)} for r in runs],
        "backends": backends,
        "controller_host": _host_facts(),
        "clock": {"software": CLOCK_NAME,
                  "sources_in_data": _clock_sources(controller, campaign_id)},
        "hdrhistogram": [log.facts() | {"file": f"{HDR_DIR}/{log.file_name}"}
                         for log in hdr_logs or []],
        "hdrhistogram_omitted": (None if hdr_logs is not None else
                                 "the campaign has no results (stats.json) yet: export it "
                                 "again once it is done for its HdrHistogram logs"),
        "event_schema": [{"name": n, "type": t, "nullable": nb} for n, t, nb in EVENT_FIELDS],
        "layout": "events/campaign_id=<c>/run_id=<r>/*.parquet (hive partitions); "
                  "broker_samples/ and backend_records/ likewise; stats.json (schema: "
                  "GET /api/v1/schemas/stats); runs/<r>/run.json",
    }


HDR_DIR = "hdrhistogram"


def hdr_logs(controller: Controller, campaign_id: str) -> list[PointLog] | None:
    """The campaign's HdrHistogram logs: per point and figure, one interval per done run
    (the runs its results pool: the latest attempts that are done); None before the
    campaign has results. Runs Spark."""
    from mqttbed.analytics.spark import get_spark

    if not (controller.layout.campaign_dir(campaign_id) / STATS_JSON).exists():
        return None
    with controller.sessions() as s:
        campaign = s.get(CampaignRow, campaign_id)
        rows = [r for r in latest_attempts(s.query(RunRow).filter_by(campaign_id=campaign_id))
                if r.state == RunState.DONE]
    if not rows:
        return []
    windows = []
    for r in rows:
        # a done run has both times; 0 s for one that somehow lacks them
        start_s = r.started_at.timestamp() if r.started_at is not None else 0.0
        end_s = r.ended_at.timestamp() if r.ended_at is not None else start_s
        windows.append(RunWindow(run_id=r.id, point_index=r.point_index,
                                 repetition=r.repetition, params=r.params, start_s=start_s,
                                 length_s=max(0.0, end_s - start_s)))
    values = run_values(get_spark(controller.settings), controller.layout.events,
                        campaign_id, [run_info(r) for r in rows])
    heading = (f"mqttbed {mqttbed.__version__}, campaign {campaign_id} ({campaign.name})",)
    return point_logs(values, windows, heading)


def build_dataset_zip(controller: Controller, campaign_id: str) -> Path:
    """Write the campaign's dataset, stats, HdrHistogram logs and manifest.json into a
    temporary zip file."""
    layout = controller.layout
    logs = hdr_logs(controller, campaign_id)
    handle, name = tempfile.mkstemp(prefix=f"{campaign_id}-", suffix=".zip")
    os.close(handle)
    path = Path(name)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("manifest.json", json.dumps(manifest(controller, campaign_id, logs),
                                                     indent=2, default=str))
        for log in logs or []:
            archive.writestr(f"{HDR_DIR}/{log.file_name}", log.text)
        for root in (layout.events, layout.broker_samples, layout.backend_records):
            campaign_root = root / f"campaign_id={campaign_id}"
            for file in sorted(campaign_root.rglob("*.parquet")) if campaign_root.exists() else []:
                archive.write(file, str(file.relative_to(layout.root)))
        campaign_dir = layout.campaign_dir(campaign_id)
        for file in sorted(campaign_dir.rglob("*")) if campaign_dir.exists() else []:
            if file.is_file() and file.suffix in (".json", ".parquet"):
                archive.write(file, str(file.relative_to(campaign_dir)))
    return path


def stream_deliveries_csv(controller: Controller, campaign_id: str) -> Iterator[bytes]:
    """Yield the campaign's deliveries as CSV, one run's file at a time, header first."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    header = True
    root = controller.layout.events / f"campaign_id={campaign_id}"
    for run_dir in sorted(root.iterdir()) if root.exists() else []:
        run_id = run_dir.name.removeprefix("run_id=")
        for file in sorted(run_dir.glob("*.parquet")):
            table = pq.read_table(file)
            table = table.filter(pc.equal(table["kind"], pa.scalar(EventKind.DELIVERY.value)))
            n = table.num_rows
            table = table.append_column("campaign_id", pa.array([campaign_id] * n, pa.string()))
            table = table.append_column("run_id", pa.array([run_id] * n, pa.string()))
            if n == 0 and not header:
                continue
            buffer = io.BytesIO()
            pa_csv.write_csv(table.select(list(CSV_COLUMNS)), buffer,
                             write_options=pa_csv.WriteOptions(include_header=header))
            header = False
            yield buffer.getvalue()
    if header:  # no events at all: still a valid CSV with its header
        yield (",".join(f'"{c}"' for c in CSV_COLUMNS) + "\n").encode()
