"""Reading a campaign's runs from the hive-partitioned Parquet datasets.

Both datasets live under ``<root>/campaign_id=<c>/run_id=<r>/*.parquet`` with the
partition columns only in the directory names. Only the directories of the runs asked
for are read, with an explicit schema, so a run without files (a failed run, a run with
no broker samples) or a campaign missing entirely gives an empty frame, not an error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from mqttbed.core.events import EVENT_FIELDS, PARTITION_COLUMNS

if TYPE_CHECKING:
    from pyspark import StorageLevel
    from pyspark.sql import DataFrame, SparkSession

_SPARK_TYPES = {"string": "string", "int64": "bigint", "int32": "int", "int8": "tinyint",
                "bool": "boolean"}

# Spark DDL of an event file, derived from the one definition in mqttbed.core.events.
EVENTS_DDL = ", ".join(f"{name} {_SPARK_TYPES[kind]}" for name, kind, _ in EVENT_FIELDS)

# The broker sample columns the stats use (bytes are cumulative). ``processes`` is left
# out: nothing reads it, and its integer width differs between writers.
SAMPLES_DDL = ("t_ns bigint, cpu_percent double, rss_bytes bigint, bytes_recv bigint, "
               "bytes_sent bigint")


# Parquet bytes on disk per partition of a held frame (several times that once
# decoded): a quickstart's few MB are one partition, 100 MB of events a handful.
HELD_BYTES_PER_PARTITION = 16 * 1024 * 1024
# From this many stored rows on, the held frame is kept on disk only, never in memory. A
# 10 M-row campaign's held partitions (~490 MB each once decoded) do not fit a 2 GB
# driver's storage memory: with memory-and-disk, every read of a spilled partition tried
# to unroll it into memory again, taking the execution memory that an aggregation beside
# it needed (AGGREGATE_OUT_OF_MEMORY in the first call of bench/analysis.py, 2026-11-28).
HELD_IN_MEMORY_BELOW_ROWS = 1_000_000


def _data_files(directory: Path) -> list[Path]:
    # Spark skips names starting with "." or "_" (temporary files, _SUCCESS markers).
    if not directory.is_dir():
        return []
    return [f for f in directory.glob("*.parquet") if not f.name.startswith((".", "_"))]


def _has_data_files(directory: Path) -> bool:
    return bool(_data_files(directory))


def read_runs(spark: SparkSession, root: Path, campaign_id: str, run_ids: Sequence[str],
              ddl: str) -> DataFrame:
    """Read the rows of ``run_ids`` of one campaign, with ``campaign_id`` and ``run_id``.

    ``ddl`` is the schema of the files; the partition columns are added as strings.
    """
    from pyspark.sql import functions as F

    partitions_ddl = ", ".join(f"{name} string" for name in PARTITION_COLUMNS)
    campaign_dir = Path(root) / f"campaign_id={campaign_id}"
    paths = [str(campaign_dir / f"run_id={run_id}") for run_id in run_ids
             if _has_data_files(campaign_dir / f"run_id={run_id}")]
    if not paths:
        return spark.createDataFrame([], f"{ddl}, {partitions_ddl}")
    frame = spark.read.schema(ddl).option("basePath", str(root)).parquet(*paths)
    return frame.where((F.col("campaign_id") == campaign_id)
                       & F.col("run_id").isin(list(run_ids)))


def read_runs_held(spark: SparkSession, root: Path, campaign_id: str, run_ids: Sequence[str],
                   ddl: str, *, stored: StoredRuns | None = None) -> DataFrame:
    """:func:`read_runs`, read once and held in few partitions; unpersist it.

    Every figure pass scans the same rows: without this, each pass re-reads the run's many
    small chunk files, a task per file group, and on a small campaign Spark's per-file and
    per-task overhead is most of the analysis. The rows are the same; only where they come
    from changes. Cached with Spark's default (memory, spilling to disk), or on disk only
    from HELD_IN_MEMORY_BELOW_ROWS stored rows on (:func:`held_on_disk`); ``stored`` is
    what these runs store (:func:`stored_runs`) when the caller has read it already.
    """
    stored = stored or stored_runs(root, campaign_id, run_ids)
    held = read_runs(spark, root, campaign_id, run_ids, ddl).coalesce(stored.partitions)
    on_disk = held_on_disk(stored.rows)
    return held.cache() if on_disk is None else held.persist(on_disk)


def held_on_disk(rows: int) -> StorageLevel | None:
    """DISK_ONLY for what the analysis holds of a campaign of ``rows`` stored rows, from
    HELD_IN_MEMORY_BELOW_ROWS on; None (Spark's default, memory spilling to disk) below."""
    from pyspark import StorageLevel

    return StorageLevel.DISK_ONLY if rows >= HELD_IN_MEMORY_BELOW_ROWS else None


def _runs_data_files(root: Path, campaign_id: str, run_ids: Sequence[str]) -> list[Path]:
    campaign_dir = Path(root) / f"campaign_id={campaign_id}"
    return [f for run_id in run_ids for f in _data_files(campaign_dir / f"run_id={run_id}")]


def run_files_signature(root: Path, campaign_id: str, run_id: str) -> list[list[str | int]]:
    """Each data file of one run as ``[name, size, modification time in ns]``, by name:
    what a run partial's fingerprint holds (:mod:`mqttbed.analytics.partials`)."""
    files = _data_files(Path(root) / f"campaign_id={campaign_id}" / f"run_id={run_id}")
    return [[f.name, (st := f.stat()).st_size, st.st_mtime_ns]
            for f in sorted(files, key=lambda f: f.name)]


class StoredRuns(NamedTuple):
    """What the Parquet files of some runs hold, read without reading their data."""

    rows: int         # from the files' footers
    partitions: int   # :func:`read_runs_held` holds them in: one per
    #                   HELD_BYTES_PER_PARTITION of the files, at least one


def stored_runs(root: Path, campaign_id: str, run_ids: Sequence[str]) -> StoredRuns:
    """The :class:`StoredRuns` of these runs, from one listing of their files."""
    import pyarrow.parquet as pq

    files = _runs_data_files(root, campaign_id, run_ids)
    size = sum(f.stat().st_size for f in files)
    return StoredRuns(rows=sum(pq.read_metadata(f).num_rows for f in files),
                      partitions=max(1, math.ceil(size / HELD_BYTES_PER_PARTITION)))
