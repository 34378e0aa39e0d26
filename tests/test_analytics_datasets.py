"""How the analysis holds a campaign's rows between its passes (real Spark, real Parquet)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mqttbed.analytics.datasets as datasets


def _write(root, campaign_id: str, run_id: str, values: list[int]) -> None:
    directory = root / f"campaign_id={campaign_id}" / f"run_id={run_id}"
    directory.mkdir(parents=True)
    pq.write_table(pa.table({"x": pa.array(values, pa.int64())}), directory / "part.parquet")


@pytest.mark.parametrize(("rows", "in_memory"), [(9, True), (10, False), (25, False)])
def test_a_large_campaign_is_held_on_disk_only_and_a_small_one_in_memory(
        spark, tmp_path, monkeypatch, rows, in_memory):
    """From HELD_IN_MEMORY_BELOW_ROWS stored rows on, the held frame never takes storage
    memory (which the aggregations beside its reads need); below, it is held in memory.
    Either way it holds every row, once."""
    monkeypatch.setattr(datasets, "HELD_IN_MEMORY_BELOW_ROWS", 10)
    _write(tmp_path, "c1", "r1", list(range(rows - 3)))
    _write(tmp_path, "c1", "r2", [100, 101, 102])
    held = datasets.read_runs_held(spark, tmp_path, "c1", ["r1", "r2"], "x bigint")
    try:
        level = held.storageLevel
        assert level.useDisk
        assert level.useMemory is in_memory
        assert sorted(r["x"] for r in held.collect()) == [*range(rows - 3), 100, 101, 102]
    finally:
        held.unpersist()
