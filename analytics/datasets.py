"""Reading a campaign's runs from the hive-partitioned Parquet datasets.

Both datasets live under ``<root>/campaign_id=<c>/run_id=<r>/*.parquet`` with the
partition columns only in the directory names. Only the directories of the runs asked
for are read, with an explicit schema, so a run without files (a failed run, a run with
no broker samples) or a campaign missing entirely gives an empty frame, not an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mqttbed.core.events import EVENT_FIELDS, PARTITION_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_SPARK_TYPES = {"string": "string", "int64": "bigint", "int32": "int", "int8": "tinyint",
                "bool": "boolean"}

# Spark DDL of an event file, derived from the one definition in mqttbed.core.events.
EVENTS_DDL = ", ".join(f"{name} {_SPARK_TYPES[kind]}" for name, kind, _ in EVENT_FIELDS)

# The broker sample columns the stats use (bytes are cumulative). ``processes`` is left
# out: nothing reads it, and its integer width differs between writers.
SAMPLES_DDL = ("t_ns bigint, cpu_percent double, rss_bytes bigint, bytes_recv bigint, "
               "bytes_sent bigint")


def _has_data_files(directory: Path) -> bool:
    # Spark skips names starting with "." or "_" (temporary files, _SUCCESS markers).
    return directory.is_dir() and any(
        not f.name.startswith((".", "_")) for f in directory.glob("*.parquet"))


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
