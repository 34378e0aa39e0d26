"""Streams a run's events to the controller in idempotent chunks.

Events are uploaded while the run goes on (every ``interval_s`` or ``chunk_events``
rows), so an agent that dies mid-run loses only what it had not sent yet. A chunk is
identified by (run, agent, seq) and is retried until acknowledged: sending it twice
stores it once.

The native engine's drains arrive as binary batches (:mod:`mqttbed.core.binary_chunk`:
the engine's column buffers, never a Python object per event) and go as binary chunks,
numbered in the same sequence as the JSON chunks of events recorded one by one or as
lists (the lean Python client); a chunk's rows are split on ``chunk_events`` by slicing
the buffers. GPIO edges ride with the first chunk of each flush: as the binary chunk's
edge columns (the GPIO log's buffers, never lists) when that chunk is binary, as lists in
a JSON chunk.

Retries: a post that gets no answer (the network to the controller cut, the controller
busy) or a passing server error is sent again with exponential backoff for up to
``retry_for_s``; an answer that says retrying cannot help (a 4xx, or 507: the controller
cannot store it) ends the uploads at once. Events not uploaded by then are counted
(``buffered``), so whoever ends the run can say how many were lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from mqttbed.agents.mqtt_session import RawEvent
from mqttbed.core.binary_chunk import CONTENT_TYPE, BinaryBatch, EdgeBuffers, encode_chunk
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import ResultChunk

# a RawEvent's fields, in order; then what only the native engine's column batches carry
# (null for the rest: not recorded, which reads as not retained)
_ROW_COLUMNS = ("kind", "publisher", "seq", "receiver", "topic", "payload_bytes", "qos",
                "warmup", "t_intended_ns", "t_pub_ns", "t_recv_ns", "clock_source",
                "t_recv_user_ns")
_RAW_COLUMNS = (*_ROW_COLUMNS, "retain")


class ChunkUploader:
    """Buffers raw events and posts them as numbered chunks from a background thread."""

    def __init__(self, http: httpx.Client, *, run_id: str, agent_id: str,
                 static_columns: dict[str, Any], chunk_events: int, interval_s: float,
                 retry_for_s: float = 60.0, request_timeout_s: float = 5.0,
                 edges: Callable[[], EdgeBuffers] | None = None):
        self._http = http
        self._run_id = run_id
        self._agent_id = agent_id
        self._static = static_columns
        self._chunk_events = chunk_events
        self._interval_s = interval_s
        self._retry_for_s = retry_for_s
        self._request_timeout_s = request_timeout_s
        self._edges = edges or EdgeBuffers   # the GPIO log's edges; default: none
        self._buffer: list[RawEvent] = []
        self._batches: list[dict[str, list[Any]]] = []  # events recorded as whole columns
        self._binary: list[BinaryBatch] = []            # events recorded as column buffers
        self._buffer_lock = threading.Lock()  # for a swap or a re-queue (record() needs none)
        self._flush_lock = threading.Lock()   # one flush at a time keeps chunk seqs in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="uploader", daemon=True)
        self.chunks_sent = 0
        self.retries = 0                # posts sent again after a failed attempt
        self._close_failed = False
        self.error: str | None = None   # set once uploads have failed for good

    def record(self, event: RawEvent) -> None:
        """Buffer one event (called from the MQTT loop thread; must stay cheap).

        No lock: list.append is atomic, and a flush swaps the buffer in one store, so an
        event appended meanwhile lands in the list that flush sends."""
        self._buffer.append(event)

    def record_columns(self, columns: dict[str, list[Any]]) -> None:
        """Buffer many events given as columns (the native engine's drains): one list per
        raw column, all of one length. No per-event work; list.append is atomic."""
        self._batches.append(columns)

    def record_binary(self, batch: BinaryBatch) -> None:
        """Buffer many events given as column buffers (the native engine's drains); they
        go as binary chunks. No per-event work; list.append is atomic."""
        self._binary.append(batch)

    def start(self) -> None:
        self._thread.start()

    @property
    def buffered(self) -> int:
        """Events recorded but not yet acknowledged by the controller."""
        with self._buffer_lock:
            return (len(self._buffer) + sum(len(b["kind"]) for b in self._batches)
                    + sum(b.rows for b in self._binary))

    def close(self) -> int:
        """Flush everything left and stop; return the number of chunks sent.

        Raises RuntimeError if the controller cannot be reached (the events stay buffered);
        once a close has failed, closing again raises at once (one retry budget per close).
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._close_failed:
            raise RuntimeError(self.error)
        try:
            self._flush()
        except RuntimeError:
            self._close_failed = True
            raise
        return self.chunks_sent

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._flush()
            except RuntimeError:
                return  # ``error`` says why; the runner aborts the run on it

    def update_constants(self, columns: dict[str, Any]) -> None:
        """Set columns for the events recorded from now on; those before keep the old ones."""
        with self._flush_lock:
            try:
                self._flush_locked()
            finally:
                self._static = {**self._static, **columns}

    def _flush(self) -> None:
        with self._flush_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        # Send what is buffered now, not what keeps arriving meanwhile: a flush that chased
        # the live buffer would post a stream of tiny chunks for the whole run.
        with self._buffer_lock:
            pending, self._buffer = self._buffer, []
            batches, self._batches = self._batches, []
            binary, self._binary = self._binary, []
        all_columns = _merge(pending, batches)
        total = len(all_columns[0])
        # GPIO edges ride with the first chunk of a flush; a flush without events still
        # sends them, since the virtual scope waits for every line's edges.
        edges_until = monotonic_ns()
        edges = self._edges()
        # a flush of no binary rows sends its edges in a JSON chunk (of no events if need be)
        json_rows = max(total, 1 if edges.rows and not any(b.rows for b in binary) else 0)
        try:
            # lists only when a JSON chunk carries them (the first of this flush)
            self._post_lists(all_columns, json_rows,
                             edges.as_lists() if edges.rows and json_rows else None,
                             edges_until)
        except RuntimeError:
            with self._buffer_lock:  # the binary batches wait behind the unsent lists
                self._binary[:0] = binary
            raise
        self._post_binary(binary, None if json_rows or not edges.rows else edges,
                          edges_until)

    def _post_lists(self, all_columns: list[list[Any]], rows: int,
                    edges: dict[str, list[int]] | None, edges_until: int) -> None:
        """Post ``rows`` events recorded as rows or lists as JSON chunks (edges with the
        first); on a failure re-queue the unsent ones, in order, and raise."""
        for start in range(0, rows, self._chunk_events):
            columns = [c[start:start + self._chunk_events] for c in all_columns]
            edge_columns = edges if start == 0 else None
            # Built unvalidated: the controller validates it, and this machine measures.
            chunk = ResultChunk.model_construct(
                run_id=self._run_id, agent_id=self._agent_id, seq=self.chunks_sent,
                columns=dict(zip(_RAW_COLUMNS, columns, strict=True)),
                constants=self._static, edges=edge_columns,
                edges_until_ns=edges_until if edge_columns else None)
            try:
                self._post(chunk.seq, chunk.run_id, chunk.model_dump_json(),
                           "application/json", "chunks")
            except RuntimeError:
                with self._buffer_lock:  # keep the unsent events, in order
                    self._batches[:0] = [dict(zip(_RAW_COLUMNS, (c[start:] for c in all_columns),
                                                  strict=True))]
                raise
            self.chunks_sent += 1

    def _post_binary(self, batches: list[BinaryBatch], edges: EdgeBuffers | None,
                     edges_until: int) -> None:
        """Post ``batches`` as binary chunks of up to ``chunk_events`` rows (edges with the
        first); on a failure re-queue the unsent rows, in order, and raise."""
        chunks = split_batches(batches, self._chunk_events)
        for number, chunk in enumerate(chunks):
            edge_columns = edges if number == 0 else None
            body = encode_chunk(run_id=self._run_id, agent_id=self._agent_id,
                                seq=self.chunks_sent, batches=chunk, constants=self._static,
                                edges=edge_columns,
                                edges_until_ns=edges_until if edge_columns else None)
            try:
                self._post(self.chunks_sent, self._run_id, body, CONTENT_TYPE,
                           "binary-chunks")
            except RuntimeError:
                with self._buffer_lock:  # keep the unsent events, in order
                    self._binary[:0] = [batch for rest in chunks[number:] for batch in rest]
                raise
            self.chunks_sent += 1

    def _post(self, seq: int, run_id: str, body: str | bytes, content_type: str,
              route: str) -> None:
        # pydantic's serializer writes the very bytes json.dumps of the fields wrote here
        # before, at under half the CPU (bench/chunk_upload.py: 0.48x, 3.8 -> 1.9 ms per
        # 5,000 events); at P4's 100,000 events/s an agent spent ~8 % of a core on json.dumps
        give_up_at = time.monotonic() + self._retry_for_s
        attempt = 0
        while True:
            try:
                response = self._http.post(f"/agent/v1/runs/{run_id}/{route}", content=body,
                                           headers={"content-type": content_type},
                                           timeout=self._request_timeout_s)
            except httpx.TransportError as exc:  # no answer: the network or the controller
                problem = f"{type(exc).__name__}: {exc or 'no answer'}"
            else:
                if response.is_success:
                    return
                problem = f"HTTP {response.status_code}: {_detail(response)}"
                if response.status_code < 500 or response.status_code == 507:
                    self.error = f"chunk {seq} upload refused: {problem}"
                    raise RuntimeError(self.error)
            delay = min(0.1 * 2 ** attempt, 1.0)
            if time.monotonic() + delay > give_up_at:
                self.error = (f"chunk {seq} upload failed for {self._retry_for_s:.0f} s "
                              f"({attempt + 1} attempts): {problem}")
                raise RuntimeError(self.error)
            time.sleep(delay)
            attempt += 1
            self.retries += 1


def _merge(rows: list[RawEvent], batches: list[dict[str, list[Any]]]) -> list[list[Any]]:
    """Events recorded one by one and as columns, as one list per raw column."""
    columns = [list(c) for c in zip(*rows, strict=True)] or [[] for _ in _ROW_COLUMNS]
    columns.append([None] * len(rows))   # retain: rows do not record it
    for batch in batches:
        size = len(batch["kind"])
        for column, name in zip(columns, _RAW_COLUMNS, strict=True):
            column.extend(batch[name] if name in batch else [None] * size)
    return columns


def split_batches(batches: list[BinaryBatch], limit: int) -> list[list[BinaryBatch]]:
    """``batches`` in order as chunks of at most ``limit`` rows, a batch sliced where a
    chunk ends (views on its buffers, no copy)."""
    chunks: list[list[BinaryBatch]] = []
    current: list[BinaryBatch] = []
    room = limit
    for batch in batches:
        start = 0
        while start < batch.rows:
            take = min(room, batch.rows - start)
            current.append(batch if take == batch.rows else batch.sliced(start, start + take))
            start += take
            room -= take
            if room == 0:
                chunks.append(current)
                current, room = [], limit
    if current:
        chunks.append(current)
    return chunks


def _detail(response: httpx.Response) -> str:
    """The controller's ``detail`` of an error answer, else the start of its body."""
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
