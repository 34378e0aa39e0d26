"""Compacting a run: its many chunk files become one sorted, verified Parquet file.

Agents upload a run's events in chunks, each its own file (``storage.write_event_chunk``),
so everything acknowledged is on disk at once. When the run has ended (done, failed or
interrupted: every agent stopped), each of its partition directories (events, GPIO
edges) is rewritten as one file, ``run.parquet``, sorted by message identity, in row
groups of :data:`ROW_GROUP_ROWS`.

Readers list the partition directory (Spark, pyarrow, DuckDB) and must see each row once
at every moment; a crash anywhere must lose nothing. So the new file is built in a
staging directory outside the dataset and swapped in whole, under the run's lock:

1. settle what an earlier, killed compaction left (see below);
2. read the inputs (the chunks, and the compacted file when a late chunk came after it),
   counting rows and summing one hash per row (:func:`row_checksum`);
3. write the sorted rows to ``<stage>/new/run.parquet.tmp``, fsync, read it back and
   check its row count and checksum, rename it to ``run.parquet``, fsync the directory;
4. exchange ``<stage>/new`` and the partition directory in one
   ``renameat2(RENAME_EXCHANGE)``: readers see all the chunks or the verified file,
   never both, never neither;
5. remove the stage (which now holds the chunks).

Settling: the partition directory is always complete (chunks before 4, the verified file
after), so whatever a stage holds is garbage and is removed, except on a filesystem
without RENAME_EXCHANGE, where step 4 is two renames (partition to ``<stage>/old``, then
``<stage>/new`` to the partition) and a crash between them leaves no partition: the
verified ``new`` (or, without one, ``old``) is put back first. Settling runs whenever
the lock is taken, so a chunk upload after such a crash lands in the right place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqttbed.controller.row_checksum import row_checksum
from mqttbed.controller.storage import DataLayout, edges_schema
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.errors import MqttbedError
from mqttbed.core.events import OPTIONAL_EVENT_COLUMNS, arrow_schema
from mqttbed.core.names import check_name

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("mqttbed.compaction")

COMPACTED_NAME = "run.parquet"   # a chunk is always <agent>-<NNNNNN>.parquet: no clash
# Rows per row group. Spark splits a Parquet file between tasks only at row-group
# boundaries, and its vectorised reader pays per column chunk (a seek, a page header, a
# dictionary): 1 Mi sorted event rows encode to about 6 MB (bench/compaction.py: 2.02 M
# rows in 12.2 MB), so one group is a fair task's worth, well under
# spark.sql.files.maxPartitionBytes (128 MB, which then packs several runs' groups into
# one task), and the writer holds at most one group's pages in memory. Smaller groups
# would only add per-chunk overhead (a quickstart run of thousands of rows is one group
# anyway); a 10 M-row run still gives ten groups for ten tasks.
ROW_GROUP_ROWS = 1 << 20
MANIFEST_KEY = b"mqttbed.compaction"
STAGE_DIR = ".compaction"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class CompactionError(MqttbedError):
    """A run's files could not be compacted; its chunks are left as they were."""


@dataclass(frozen=True)
class RunDataset:
    """One dataset of per-run chunk files that compacts into a single file per run."""

    name: str
    root: Callable[[DataLayout], Path]
    schema: Callable[[], pa.Schema]
    sort_keys: tuple[str, ...]
    optional_columns: frozenset[str] = frozenset()

    def partition(self, layout: DataLayout, campaign_id: str, run_id: str) -> Path:
        """The run's hive partition directory in this dataset."""
        return (self.root(layout) / f"campaign_id={check_name(campaign_id, 'campaign id')}"
                / f"run_id={check_name(run_id, 'run id')}")

    def stage(self, layout: DataLayout, campaign_id: str, run_id: str) -> Path:
        """Where a compaction of the run builds its file: in the dataset's own directory
        (one filesystem, so it can be renamed into place) under a name every reader skips
        (Spark, pyarrow and DuckDB's partition paths all pass over ``.compaction``)."""
        partition = self.partition(layout, campaign_id, run_id)
        return self.root(layout) / STAGE_DIR / partition.parent.name / partition.name


# Events sort by message identity (publisher, seq, then receiver): every pass that follows
# groups or joins on it (delivery counts, latency per delivery, spread per message).
EVENTS = RunDataset("events", lambda layout: layout.events, arrow_schema,
                    ("publisher", "seq", "receiver", "kind"), OPTIONAL_EVENT_COLUMNS)
GPIO_EDGES = RunDataset("gpio_edges", lambda layout: layout.gpio_edges, edges_schema,
                        ("agent_id", "pin", "t_ns"))
DATASETS: tuple[RunDataset, ...] = (EVENTS, GPIO_EDGES)


@dataclass(frozen=True)
class Compaction:
    """What compacting one dataset of one run did."""

    dataset: str
    run_id: str
    inputs: int          # files read (chunks, plus an earlier compacted file)
    rows: int
    bytes_written: int
    checksum: int
    seconds: float


Checkpoint = Callable[[str], None]   # called with each step's name (tests kill there)


# -- the run's lock -----------------------------------------------------------------------


@contextlib.contextmanager
def run_lock(layout: DataLayout, campaign_id: str, run_id: str) -> Iterator[None]:
    """Hold the run's lock (between threads and processes), its partitions settled.

    Chunk uploads and compactions of one run take it in turn, so a chunk never lands in
    a directory being swapped away.
    """
    path = (layout.compaction / "locks" / check_name(campaign_id, "campaign id")
            / f"{check_name(run_id, 'run id')}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)   # flock: one per open file, threads included
        try:
            for dataset in DATASETS:
                _settle(dataset.partition(layout, campaign_id, run_id),
                        dataset.stage(layout, campaign_id, run_id))
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _settle(partition: Path, stage: Path) -> None:
    """Finish or undo what a killed compaction left in ``stage``; the partition stays whole."""
    if not stage.exists():
        return
    if not partition.exists():
        # Killed between the two renames of the fallback swap: the verified file, if the
        # first rename happened after it was verified (it always was), else the chunks.
        new, old = stage / "new", stage / "old"
        if (new / COMPACTED_NAME).exists():
            os.rename(new, partition)
        elif old.exists():
            os.rename(old, partition)
        _fsync_dir(partition.parent)
    shutil.rmtree(stage)
    _fsync_dir(stage.parent)


def leftover_runs(layout: DataLayout) -> list[tuple[str, str]]:
    """(campaign id, run id) of every run a killed compaction left a stage of."""
    found = set()
    for dataset in DATASETS:
        for stage in (dataset.root(layout) / STAGE_DIR).glob("campaign_id=*/run_id=*"):
            found.add((stage.parent.name.removeprefix("campaign_id="),
                       stage.name.removeprefix("run_id=")))
    return sorted(found)


# -- compacting -------------------------------------------------------------------------


def compact_run(layout: DataLayout, campaign_id: str, run_id: str, *,
                checkpoint: Checkpoint | None = None) -> list[Compaction]:
    """Compact every dataset of one ended run; return what was done (nothing: empty).

    Safe to call again at any time: an already compacted run is left alone, a late chunk
    is folded into the compacted file, a half-done compaction is finished.
    """
    done = []
    with run_lock(layout, campaign_id, run_id):
        for dataset in DATASETS:
            result = _compact(layout, dataset, campaign_id, run_id, checkpoint)
            if result is not None:
                done.append(result)
    return done


def is_compacted(partition: Path) -> bool:
    """Whether the partition holds a compacted file (maybe beside late chunks)."""
    return (partition / COMPACTED_NAME).exists()


def data_files(partition: Path) -> list[Path]:
    """The files a reader of ``partition`` reads (Spark skips names starting . or _)."""
    if not partition.is_dir():
        return []
    return sorted(f for f in partition.glob("*.parquet") if not f.name.startswith((".", "_")))


def _compact(layout: DataLayout, dataset: RunDataset, campaign_id: str, run_id: str,
             checkpoint: Checkpoint | None) -> Compaction | None:
    import pyarrow as pa

    started = monotonic_ns()
    partition = dataset.partition(layout, campaign_id, run_id)
    files = data_files(partition)
    if not files or [f.name for f in files] == [COMPACTED_NAME]:
        return None   # nothing stored, or compacted already
    step = checkpoint or (lambda _name: None)
    folded = compacted_chunks(partition / COMPACTED_NAME)   # chunk names already in that file
    schema = dataset.schema()
    tables, names = [], []
    try:
        for path in files:
            if path.name != COMPACTED_NAME and path.name in folded:
                # A chunk written again after it was folded in: its rows are there already.
                log.warning("%s: chunk %s is in %s already; dropped", partition, path.name,
                            COMPACTED_NAME)
                continue
            tables.append(_conform(_read(path), schema, dataset, path))
            names.append(path.name)
        rows = pa.concat_tables(tables) if tables else schema.empty_table()
    except (OSError, pa.ArrowException) as exc:
        raise CompactionError(f"run {run_id}: {dataset.name}: cannot read its chunks: "
                              f"{exc}") from exc
    expected = row_checksum(rows)
    chunk_names = sorted((folded | set(names)) - {COMPACTED_NAME})
    stage = dataset.stage(layout, campaign_id, run_id)
    built = stage / "new"
    try:
        built.mkdir(parents=True)
        written = _write_verified(rows, dataset, built, expected, chunk_names, step)
        step("verified")
        _swap(built, partition, stage / "old", step)
        step("swapped")
    except BaseException:
        # Before the swap the partition is untouched; after it, the stage holds the old
        # chunks. Either way the stage is garbage (settled again if this is a kill).
        if partition.exists():
            shutil.rmtree(stage, ignore_errors=True)
        raise
    shutil.rmtree(stage)
    _fsync_dir(stage.parent)
    step("cleaned")
    return Compaction(dataset.name, run_id, len(names), rows.num_rows, written, expected,
                      (monotonic_ns() - started) / 1e9)


def _read(path: Path) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(path)


def _conform(table: pa.Table, schema: pa.Schema, dataset: RunDataset, path: Path) -> pa.Table:
    """``table`` in ``schema``'s column order and types; optional columns a chunk of an
    older writer lacks are null."""
    import pyarrow as pa

    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table[field.name].cast(field.type))
        elif field.name in dataset.optional_columns:
            columns.append(pa.nulls(table.num_rows, field.type))
        else:
            raise CompactionError(f"{path}: column {field.name!r} is missing "
                                  f"(a {dataset.name} file has {', '.join(schema.names)})")
    return pa.Table.from_arrays(columns, schema=schema)


def compacted_chunks(path: Path) -> set[str]:
    """The names of the chunks a compacted file holds the rows of (none: no such file)."""
    import pyarrow.parquet as pq

    if not path.exists():
        return set()
    metadata = pq.read_schema(path).metadata or {}
    return set(json.loads(metadata.get(MANIFEST_KEY, b"{}")).get("chunks", []))


def _write_verified(rows: pa.Table, dataset: RunDataset, directory: Path, expected: int,
                    chunk_names: list[str], step: Checkpoint) -> int:
    """Write ``rows`` sorted to ``directory/run.parquet`` through a temporary name, check
    what is on disk against ``expected``; return its size in bytes."""
    import pyarrow.parquet as pq

    ordered = rows.sort_by([(key, "ascending") for key in dataset.sort_keys])
    manifest = {"rows": rows.num_rows, "checksum": f"{expected:016x}", "chunks": chunk_names}
    ordered = ordered.replace_schema_metadata({MANIFEST_KEY: json.dumps(manifest)})
    tmp = directory / f"{COMPACTED_NAME}.tmp"
    with open(tmp, "wb") as sink:
        pq.write_table(ordered, sink, row_group_size=ROW_GROUP_ROWS)
        step("written")
        sink.flush()
        os.fsync(sink.fileno())
    step("synced")
    on_disk = pq.ParquetFile(tmp)
    count = on_disk.metadata.num_rows
    checksum = 0
    for group in range(on_disk.num_row_groups):
        checksum = (checksum + row_checksum(on_disk.read_row_group(group))) % (1 << 64)
    if count != rows.num_rows or checksum != expected:
        raise CompactionError(f"{tmp}: read back {count} rows, checksum {checksum:016x}; "
                              f"the chunks hold {rows.num_rows}, checksum {expected:016x}")
    size = tmp.stat().st_size
    os.rename(tmp, directory / COMPACTED_NAME)
    _fsync_dir(directory)
    return size


def _swap(built: Path, partition: Path, old: Path, step: Checkpoint) -> None:
    """Put ``built`` where ``partition`` is, atomically where the filesystem can."""
    if exchange_paths(built, partition):
        _fsync_dir(partition.parent)
        _fsync_dir(built.parent)
        return
    # No atomic exchange here: two renames; _settle repairs a crash between them.
    os.rename(partition, old)
    _fsync_dir(partition.parent)
    step("half-swapped")
    os.rename(built, partition)
    _fsync_dir(partition.parent)
    _fsync_dir(old.parent)


def exchange_paths(first: Path, second: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    filesystem or the C library cannot (the caller then takes two renames)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
                 _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(second))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compaction_summary(results: list[Compaction]) -> dict[str, Any]:
    """A run's compactions as a log line's fields."""
    return {r.dataset: {"files": r.inputs, "rows": r.rows, "s": round(r.seconds, 3)}
            for r in results}
