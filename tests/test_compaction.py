"""Compacting a run's chunk files into one verified file: real files, real pyarrow, real
processes killed with SIGKILL at every step, Spark reading the result."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.cli import main
from mqttbed.controller.compaction import (
    COMPACTED_NAME,
    EVENTS,
    GPIO_EDGES,
    ROW_GROUP_ROWS,
    STAGE_DIR,
    CompactionError,
    compact_run,
    compacted_chunks,
    data_files,
)
from mqttbed.controller.db import RunRow
from mqttbed.controller.row_checksum import row_checksum
from mqttbed.controller.states import RunState
from mqttbed.controller.storage import DataLayout, write_edges, write_event_chunk
from mqttbed.core.events import EVENT_COLUMNS, arrow_schema
from mqttbed.core.protocol import ResultChunk

CAMPAIGN = "c0compact0001"
RUN = f"{CAMPAIGN}-r0000"
AGENTS = ("agent-a", "agent-b", "agent-c")
CHUNKS_PER_AGENT = 4
MESSAGES = 60
SUBSCRIBERS = 3


def event_columns(rng: random.Random, agent: int, seq: int) -> dict[str, list]:
    """One chunk of an agent: publishes and deliveries of its share, in arrival order."""
    rows = []
    for message in range(seq * MESSAGES // CHUNKS_PER_AGENT,
                         (seq + 1) * MESSAGES // CHUNKS_PER_AGENT):
        t_pub = 1_000_000 * message + rng.randrange(1000)
        if agent == 0:
            rows.append(("publish", "pub-0", message, None, t_pub, None))
        else:
            for subscriber in range(SUBSCRIBERS):
                if rng.random() < 0.9:   # a few losses: rows differ between receivers
                    rows.append(("delivery", "pub-0", message, f"sub-{agent}-{subscriber}",
                                 t_pub, t_pub + rng.randrange(50_000, 900_000)))
    rng.shuffle(rows)
    kind, publisher, seqs, receiver, t_pub_ns, t_recv_ns = (list(c) for c in zip(*rows,
                                                                              strict=True))
    count = len(rows)
    return {"kind": kind, "publisher": publisher, "seq": seqs, "receiver": receiver,
            "t_pub_ns": t_pub_ns, "t_recv_ns": t_recv_ns, "t_intended_ns": t_pub_ns,
            "t_recv_user_ns": [None if t is None else t + 7 for t in t_recv_ns],
            "topic": ["t/0"] * count, "payload_bytes": [64] * count, "qos": [1] * count,
            "warmup": [message < 5 for message in seqs]}


def write_run(layout: DataLayout, run_id: str = RUN, seed: int = 7) -> None:
    """Store a run's chunks (and GPIO edges) the way the agent API stores uploads."""
    rng = random.Random(seed)
    for agent, name in enumerate(AGENTS):
        for seq in range(CHUNKS_PER_AGENT):
            write_chunk(layout, run_id, name, seq, event_columns(rng, agent, seq))
            write_edges(layout, CAMPAIGN, run_id, name, seq,
                        {"pin": [17, 27] * 5, "t_ns": sorted(rng.sample(range(10**9), 10)),
                         "level": [1, 0] * 5})


def write_chunk(layout: DataLayout, run_id: str, agent: str, seq: int,
                columns: dict[str, list]) -> Path:
    return write_event_chunk(layout, CAMPAIGN, run_id, agent, seq, columns,
                             {"agent_id": agent, "clock_source": "kernel",
                              "clock_offset_ns": 12, "clock_offset_uncertainty_ns": 3})


def read(partition: Path) -> pa.Table:
    """The partition as a reader sees it (pyarrow skips names starting . or _, as Spark)."""
    if not partition.is_dir():
        return arrow_schema().empty_table()
    return ds.dataset(partition, format="parquet").to_table()


def seen(partition: Path) -> tuple[int, int]:
    table = read(partition)
    return table.num_rows, row_checksum(table.select(list(EVENT_COLUMNS)))


@pytest.fixture
def layout(tmp_path: Path) -> DataLayout:
    layout = DataLayout(tmp_path / "data")
    write_run(layout)
    return layout


def test_row_checksum_ignores_order_and_files_but_sees_a_lost_doubled_or_changed_row():
    table = pa.table({"who": ["a", None, "b", "a"], "n": pa.array([1, 2, None, 1], pa.int64()),
                      "ok": [True, False, None, True]})
    checksum = row_checksum(table)
    assert row_checksum(table.take([3, 1, 0, 2])) == checksum
    assert row_checksum(pa.concat_tables([table.slice(2), table.slice(0, 2)])) == checksum
    assert row_checksum(table.slice(1)) != checksum                        # lost
    assert row_checksum(pa.concat_tables([table, table.slice(1, 1)])) != checksum  # doubled
    swapped = table.set_column(0, "who", pa.array(["b", None, "a", "a"]))  # moved between rows
    assert row_checksum(swapped) != checksum
    nulled = table.set_column(1, "n", pa.array([1, 2, 0, 1], pa.int64()))  # null became 0
    assert row_checksum(nulled) != checksum


def test_compacted_run_is_one_sorted_file_holding_every_chunk_row_once(layout):
    partition = layout.run_events(CAMPAIGN, RUN)
    before = seen(partition)
    assert len(data_files(partition)) == len(AGENTS) * CHUNKS_PER_AGENT

    results = {r.dataset: r for r in compact_run(layout, CAMPAIGN, RUN)}

    assert [f.name for f in data_files(partition)] == [COMPACTED_NAME]
    assert seen(partition) == before
    assert results["events"].rows == before[0] and results["events"].checksum == before[1]
    assert results["events"].inputs == len(AGENTS) * CHUNKS_PER_AGENT
    table = pq.read_table(partition / COMPACTED_NAME)
    keys = list(zip(*(table[c].to_pylist() for c in ("publisher", "seq", "receiver")),
                    strict=True))
    assert keys == sorted(keys, key=lambda k: (k[0], k[1], k[2] is None, k[2] or ""))
    assert compacted_chunks(partition / COMPACTED_NAME) == {
        f"{agent}-{seq:06d}.parquet" for agent in AGENTS for seq in range(CHUNKS_PER_AGENT)}
    edges = GPIO_EDGES.partition(layout, CAMPAIGN, RUN)
    assert [f.name for f in data_files(edges)] == [COMPACTED_NAME]
    assert read(edges).num_rows == len(AGENTS) * CHUNKS_PER_AGENT * 10
    assert not (layout.events / STAGE_DIR / f"campaign_id={CAMPAIGN}" / f"run_id={RUN}").exists()
    # done once: compacting again finds nothing to do
    assert compact_run(layout, CAMPAIGN, RUN) == []


def test_row_groups_hold_the_row_group_size(tmp_path):
    layout = DataLayout(tmp_path / "data")
    rows = ROW_GROUP_ROWS + 10
    columns = {"kind": ["publish"] * rows, "publisher": ["pub-0"] * rows,
               "seq": list(range(rows)), "receiver": [None] * rows, "topic": ["t"] * rows,
               "payload_bytes": [8] * rows, "qos": [0] * rows, "warmup": [False] * rows,
               "t_intended_ns": [1] * rows, "t_pub_ns": [2] * rows, "t_recv_ns": [None] * rows}
    write_chunk(layout, RUN, "agent-a", 0, columns)
    compact_run(layout, CAMPAIGN, RUN)
    metadata = pq.ParquetFile(layout.run_events(CAMPAIGN, RUN) / COMPACTED_NAME).metadata
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [
        ROW_GROUP_ROWS, 10]


KILL_SCRIPT = """
import os, signal, sys
from pathlib import Path
from mqttbed.controller import compaction
from mqttbed.controller.storage import DataLayout

root, campaign, run, step, exchange = sys.argv[1:]
if exchange == "without":   # a filesystem that has no RENAME_EXCHANGE
    compaction.exchange_paths = lambda first, second: False

def checkpoint(name):
    if name == step:
        os.kill(os.getpid(), signal.SIGKILL)

compaction.compact_run(DataLayout(Path(root)), campaign, run, checkpoint=checkpoint)
sys.exit(3)   # the step never came
"""

STEPS = ("written", "synced", "verified", "swapped", "cleaned")


def kill_compaction_at(layout: DataLayout, step: str, exchange: str = "with") -> None:
    done = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(layout.root), CAMPAIGN, RUN,
                           step, exchange], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr


@pytest.mark.parametrize("step", STEPS)
def test_compaction_killed_at_any_step_loses_no_row_and_doubles_none(layout, step):
    partition = layout.run_events(CAMPAIGN, RUN)
    before = seen(partition)

    kill_compaction_at(layout, step)

    # the partition a reader lists, and the whole dataset, hold each row once
    assert seen(partition) == before
    assert ds.dataset(layout.events, format="parquet", partitioning="hive").count_rows() \
        == before[0]
    compact_run(layout, CAMPAIGN, RUN)   # the next compaction finishes the job
    assert [f.name for f in data_files(partition)] == [COMPACTED_NAME]
    assert seen(partition) == before
    assert not (layout.events / STAGE_DIR / f"campaign_id={CAMPAIGN}").exists() or not any(
        (layout.events / STAGE_DIR / f"campaign_id={CAMPAIGN}").iterdir())


@pytest.mark.parametrize("step", ("verified", "half-swapped", "swapped"))
def test_without_an_atomic_exchange_a_kill_between_the_renames_is_repaired(layout, step):
    """Two renames instead of one exchange: a kill between them leaves no partition for an
    instant; the next holder of the run's lock puts the verified file in place."""
    partition = layout.run_events(CAMPAIGN, RUN)
    before = seen(partition)

    kill_compaction_at(layout, step, exchange="without")

    if step != "half-swapped":
        assert seen(partition) == before
    compact_run(layout, CAMPAIGN, RUN)
    assert [f.name for f in data_files(partition)] == [COMPACTED_NAME]
    assert seen(partition) == before


def test_a_file_that_reads_back_wrong_is_never_swapped_in(layout):
    partition = layout.run_events(CAMPAIGN, RUN)
    before = seen(partition)
    chunks = sorted(data_files(partition))

    def lose_a_row(step: str) -> None:
        if step == "synced":
            tmp = EVENTS.stage(layout, CAMPAIGN, RUN) / "new" / f"{COMPACTED_NAME}.tmp"
            table = pq.read_table(tmp)
            pq.write_table(table.slice(1), tmp)

    with pytest.raises(CompactionError, match=rf"read back {before[0] - 1} rows"):
        compact_run(layout, CAMPAIGN, RUN, checkpoint=lose_a_row)
    assert sorted(data_files(partition)) == chunks
    assert seen(partition) == before
    assert not EVENTS.stage(layout, CAMPAIGN, RUN).exists()


def test_a_chunk_of_an_older_writer_without_an_optional_column_compacts(tmp_path):
    layout = DataLayout(tmp_path / "data")
    write_run(layout)
    partition = layout.run_events(CAMPAIGN, RUN)
    old = pq.read_table(partition / "agent-a-000000.parquet").drop_columns(["t_recv_user_ns"])
    pq.write_table(old, partition / "agent-a-000000.parquet")
    rows = read(partition).num_rows

    compact_run(layout, CAMPAIGN, RUN)

    table = read(partition)
    assert table.num_rows == rows
    assert table.filter(pa.compute.equal(table["agent_id"], "agent-a")).num_rows > 0


def test_a_chunk_missing_a_column_is_refused_naming_it_and_the_chunks_stay(layout):
    partition = layout.run_events(CAMPAIGN, RUN)
    broken = partition / "agent-b-000001.parquet"
    pq.write_table(pq.read_table(broken).drop_columns(["seq"]), broken)
    files = sorted(data_files(partition))

    with pytest.raises(CompactionError, match=rf"{broken}: column 'seq' is missing"):
        compact_run(layout, CAMPAIGN, RUN)
    assert sorted(data_files(partition)) == files


def test_a_chunk_written_again_after_compaction_is_not_counted_twice(layout):
    partition = layout.run_events(CAMPAIGN, RUN)
    again = pq.read_table(partition / "agent-c-000002.parquet")
    compact_run(layout, CAMPAIGN, RUN)
    before = seen(partition)
    pq.write_table(again, partition / "agent-c-000002.parquet")

    compact_run(layout, CAMPAIGN, RUN)

    assert [f.name for f in data_files(partition)] == [COMPACTED_NAME]
    assert seen(partition) == before


def stored_run(controller, state: RunState = RunState.DONE) -> tuple[str, str]:
    """A campaign of one run in ``state``, in the controller's database."""
    campaign_id = controller.engine.create_campaign(parse_spec({"name": "compact"}))
    with controller.sessions() as s:
        run = s.query(RunRow).filter_by(campaign_id=campaign_id).one()
        run.state = state
        s.commit()
        return campaign_id, run.id


def test_late_chunk_after_compaction_is_stored_once_and_folded_in(controller):
    campaign_id, run_id = stored_run(controller)
    layout = controller.layout
    rng = random.Random(3)
    upload = {seq: ResultChunk(run_id=run_id, agent_id="agent-b", seq=seq,
                               columns=event_columns(rng, 1, seq),
                               constants={"agent_id": "agent-b", "clock_source": "kernel",
                                          "clock_offset_ns": 0,
                                          "clock_offset_uncertainty_ns": 1})
              for seq in range(3)}
    assert controller.chunks.store(upload[0]) and controller.chunks.store(upload[1])
    compact_run(layout, campaign_id, run_id)
    partition = layout.run_events(campaign_id, run_id)
    expected = sum(len(upload[seq].columns["kind"]) for seq in range(3))

    assert controller.chunks.store(upload[2])          # late: after the run was sealed
    assert not controller.chunks.store(upload[1])      # a retry of a folded chunk: a no-op

    assert [f.name for f in data_files(partition)] == [COMPACTED_NAME]
    assert read(partition).num_rows == expected
    assert compacted_chunks(partition / COMPACTED_NAME) == {
        f"agent-b-{seq:06d}.parquet" for seq in range(3)}


def test_restarted_controller_finishes_a_compaction_killed_half_way(controller):
    campaign_id, run_id = stored_run(controller, RunState.FAILED)
    layout = controller.layout
    rng = random.Random(5)
    for seq in range(3):
        write_event_chunk(layout, campaign_id, run_id, "agent-a", seq,
                          event_columns(rng, 0, seq),
                          {"agent_id": "agent-a", "clock_source": "user", "clock_offset_ns": 0,
                           "clock_offset_uncertainty_ns": 1})
    partition = layout.run_events(campaign_id, run_id)
    before = seen(partition)
    done = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(layout.root), campaign_id,
                           run_id, "swapped", "with"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -9, done.stderr
    assert EVENTS.stage(layout, campaign_id, run_id).exists()

    controller.engine.recover()

    assert not EVENTS.stage(layout, campaign_id, run_id).exists()
    assert [f.name for f in data_files(partition)] == [COMPACTED_NAME]
    assert seen(partition) == before


def test_mqttbed_compact_compacts_an_old_campaigns_ended_runs(controller, capsys):
    campaign_id, run_id = stored_run(controller)
    layout = controller.layout
    rng = random.Random(9)
    for seq in range(2):
        write_event_chunk(layout, campaign_id, run_id, "agent-a", seq,
                          event_columns(rng, 0, seq),
                          {"agent_id": "agent-a", "clock_source": "user", "clock_offset_ns": 0,
                           "clock_offset_uncertainty_ns": 1})
    partition = layout.run_events(campaign_id, run_id)
    before = seen(partition)

    assert main(["compact", campaign_id, "--data-dir", str(layout.root)]) == 0

    out = capsys.readouterr().out
    assert f"{run_id}: events: 2 files, {before[0]} rows -> 1 file" in out
    assert [f.name for f in data_files(partition)] == [COMPACTED_NAME]
    assert seen(partition) == before
    with pytest.raises(SystemExit, match="mqttbed compact: no campaign 'c0nothere0000'"):
        main(["compact", "c0nothere0000", "--data-dir", str(layout.root)])


def test_spark_reads_each_row_once_mid_compaction_and_after(layout, spark):
    from pyspark.sql import functions as F

    from mqttbed.analytics.datasets import EVENTS_DDL, read_runs

    partition = layout.run_events(CAMPAIGN, RUN)
    rows = read(partition).num_rows

    def spark_rows() -> tuple[int, int]:
        by_run = read_runs(spark, layout.events, CAMPAIGN, [RUN], EVENTS_DDL).count()
        whole = spark.read.schema(EVENTS_DDL).parquet(str(layout.events))
        return by_run, whole.where(F.col("run_id") == RUN).count()

    kill_compaction_at(layout, "verified")    # a verified file waits in the stage
    assert spark_rows() == (rows, rows)
    compact_run(layout, CAMPAIGN, RUN)
    assert spark_rows() == (rows, rows)
    assert os.listdir(partition) == [COMPACTED_NAME]
