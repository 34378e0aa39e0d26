"""Where a campaign's data lives under the data dir, and how events reach Parquet.

```
<data_dir>/mqttbed.sqlite
<data_dir>/events/campaign_id=<c>/run_id=<r>/<agent>-<seq>.parquet     one file per chunk
<data_dir>/events/campaign_id=<c>/run_id=<r>/run.parquet     the same rows, once the run ended
<data_dir>/broker_samples/campaign_id=<c>/run_id=<r>/samples.parquet
<data_dir>/gpio_edges/campaign_id=<c>/run_id=<r>/<agent>-<seq>.parquet  agents' GPIO edges
<data_dir>/gpio_edges/campaign_id=<c>/run_id=<r>/run.parquet  ... once the run ended
<data_dir>/{events,gpio_edges}/.compaction/...  a compaction's staging dirs (readers skip)
<data_dir>/.compaction/locks/<c>/<r>.lock       a run's lock (chunk uploads, compaction)
<data_dir>/backend_records/campaign_id=<c>/run_id=<r>/<section>.parquet  a backend's own figures
<data_dir>/campaigns/<c>/stats.json, stats.parquet, runs/<r>/run.json
```
A chunk's file name is its identity (agent, seq), so a chunk written twice is the same
file, and everything that arrived is on disk the moment it is acknowledged. When a run
ends its chunks are compacted into one file per partition (``controller.compaction``);
readers read the partition directory either way.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqttbed.core.events import EVENT_COLUMNS, arrow_schema
from mqttbed.core.names import check_name
from mqttbed.core.samples import BrokerResourceSample, SysSample
from mqttbed.core.sections import SectionRecords

# A run's numeric $SYS values (time, topic, value), beside its run.json.
SYS_TOPICS_FILE = "sys_topics.parquet"


@dataclass(frozen=True)
class DataLayout:
    """The paths of everything mqttbed stores under one data dir."""

    root: Path

    @property
    def events(self) -> Path:
        return self.root / "events"

    @property
    def broker_samples(self) -> Path:
        return self.root / "broker_samples"

    # Every id is checked before it becomes a path (UnsafeName): a last line behind the
    # checks where ids arrive (request paths, agents' messages, the command line).
    def campaign_dir(self, campaign_id: str) -> Path:
        return self.root / "campaigns" / check_name(campaign_id, "campaign id")

    def run_dir(self, campaign_id: str, run_id: str) -> Path:
        return self.campaign_dir(campaign_id) / "runs" / check_name(run_id, "run id")

    def run_events(self, campaign_id: str, run_id: str) -> Path:
        return self.events / _partition(campaign_id, run_id)

    def run_samples(self, campaign_id: str, run_id: str) -> Path:
        return self.broker_samples / _partition(campaign_id, run_id)

    @property
    def gpio_edges(self) -> Path:
        return self.root / "gpio_edges"

    @property
    def backend_records(self) -> Path:
        return self.root / "backend_records"

    @property
    def compaction(self) -> Path:
        """The runs' lock files (``controller.compaction.run_lock``)."""
        return self.root / ".compaction"


def _partition(campaign_id: str, run_id: str) -> Path:
    """The hive partition of one run: ``campaign_id=C/run_id=R``."""
    return (Path(f"campaign_id={check_name(campaign_id, 'campaign id')}")
            / f"run_id={check_name(run_id, 'run id')}")


def _atomic_write_table(table: Any, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        # A full disk leaves a truncated temporary file: remove it, and name the file
        # that could not be written (Arrow's own errors often name none).
        with contextlib.suppress(OSError):  # a read-only dir refuses even that
            tmp.unlink(missing_ok=True)
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise OSError(exc.errno, reason, str(path)) from exc


def write_event_chunk(layout: DataLayout, campaign_id: str, run_id: str, agent_id: str,
                      seq: int, columns: dict[str, list[Any]],
                      constants: dict[str, Any]) -> Path:
    """Write one chunk of event rows as its own Parquet file; return its path.

    ``columns`` are lists (a JSON chunk) or Arrow arrays of the schema's types (a binary
    chunk); ``constants`` are columns with one value for every row of the chunk.
    """
    import pyarrow as pa

    agent = check_name(agent_id, "agent id")
    path = layout.run_events(campaign_id, run_id) / f"{agent}-{seq:06d}.parquet"
    rows = len(next(iter(columns.values()), []))
    table = pa.table({name: columns[name] if name in columns else [constants.get(name)] * rows
                      for name in EVENT_COLUMNS}, schema=arrow_schema())
    _atomic_write_table(table, path)
    return path


def write_edges(layout: DataLayout, campaign_id: str, run_id: str, agent_id: str, seq: int,
                edges: Mapping[str, Any]) -> Path:
    """Write the GPIO edges that came with a chunk (pin, t_ns on the agent's clock, level).

    ``edges`` holds the columns ``pin``, ``t_ns`` and ``level``: lists (a JSON chunk) or
    Arrow arrays (a binary chunk's, :func:`mqttbed.core.binary_chunk.edge_arrays`).
    """
    import pyarrow as pa

    rows = len(edges["pin"])
    table = pa.table({"agent_id": pa.repeat(pa.scalar(agent_id, pa.string()), rows),
                      "pin": edges["pin"], "t_ns": edges["t_ns"], "level": edges["level"]},
                     schema=edges_schema())
    path = (layout.gpio_edges / _partition(campaign_id, run_id)
            / f"{check_name(agent_id, 'agent id')}-{seq:06d}.parquet")
    _atomic_write_table(table, path)
    return path


def edges_schema() -> Any:
    """The pyarrow schema of a GPIO edges file (pyarrow imported lazily)."""
    import pyarrow as pa

    fields: list[tuple[str, pa.DataType]] = [
        ("agent_id", pa.string()), ("pin", pa.int32()), ("t_ns", pa.int64()),
        ("level", pa.int8())]
    return pa.schema(fields)


def write_broker_samples(layout: DataLayout, campaign_id: str, run_id: str,
                         samples: list[BrokerResourceSample]) -> Path | None:
    """Write a run's broker resource samples; None when there are none."""
    import pyarrow as pa

    if not samples:
        return None
    fields = list(BrokerResourceSample.model_fields)
    table = pa.table({f: [getattr(s, f) for s in samples] for f in fields})
    path = layout.run_samples(campaign_id, run_id) / "samples.parquet"
    _atomic_write_table(table, path)
    return path


def write_sys_samples(layout: DataLayout, campaign_id: str, run_id: str,
                      samples: list[SysSample]) -> Path | None:
    """Write the numeric ``$SYS`` values a broker published during a run (beside run.json,
    not among the resource samples: Spark reads those as one dataset of their own schema);
    None when there are none."""
    import pyarrow as pa

    if not samples:
        return None
    table = pa.table({"t_ns": pa.array([s.t_ns for s in samples], pa.int64()),
                      "topic": pa.array([s.topic for s in samples], pa.string()),
                      "value": pa.array([s.value for s in samples], pa.float64())})
    path = layout.run_dir(campaign_id, run_id) / SYS_TOPICS_FILE
    _atomic_write_table(table, path)
    return path


def read_sys_samples(layout: DataLayout, campaign_id: str, run_id: str) -> list[SysSample]:
    """A run's ``$SYS`` values as written by :func:`write_sys_samples` (none: empty)."""
    import pyarrow.parquet as pq

    path = layout.run_dir(campaign_id, run_id) / SYS_TOPICS_FILE
    if not path.exists():
        return []
    columns = pq.read_table(path).to_pydict()
    return [SysSample(t_ns=t, topic=topic, value=value) for t, topic, value in
            zip(columns["t_ns"], columns["topic"], columns["value"], strict=True)]


def write_backend_records(layout: DataLayout, campaign_id: str, run_id: str, section: str,
                          records: SectionRecords) -> Path | None:
    """Write the values a backend kept of a run for its results section; None if none."""
    import pyarrow as pa

    figures = [(figure, value) for figure, values in records.items() for value in values]
    if not figures:
        return None
    table = pa.table({"section": pa.array([section] * len(figures), pa.string()),
                      "figure": pa.array([f for f, _ in figures], pa.string()),
                      "value": pa.array([float(v) for _, v in figures], pa.float64())})
    path = (layout.backend_records / _partition(campaign_id, run_id)
            / f"{check_name(section, 'section')}.parquet")
    _atomic_write_table(table, path)
    return path


def write_json(path: Path, document: dict[str, Any], *, indent: int | None = 2) -> None:
    """Write ``document`` as JSON (indented unless ``indent`` is None), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document, indent=indent, default=str))
    os.replace(tmp, path)
