"""Streams a run's events to the controller in idempotent chunks.

Events are uploaded while the run goes on (every ``interval_s`` or ``chunk_events``
rows), so an agent that dies mid-run loses only what it had not sent yet. A chunk is
identified by (run, agent, seq) and is retried until acknowledged: sending it twice
stores it once.

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
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import ResultChunk

_RAW_COLUMNS = ("kind", "publisher", "seq", "receiver", "topic", "payload_bytes", "qos",
                "warmup", "t_intended_ns", "t_pub_ns", "t_recv_ns", "clock_source",
                "t_recv_user_ns")


class ChunkUploader:
    """Buffers raw events and posts them as numbered chunks from a background thread."""

    def __init__(self, http: httpx.Client, *, run_id: str, agent_id: str,
                 static_columns: dict[str, Any], chunk_events: int, interval_s: float,
                 retry_for_s: float = 60.0, request_timeout_s: float = 5.0,
                 edges: Callable[[], tuple[list[int], list[int], list[int]]] | None = None):
        self._http = http
        self._run_id = run_id
        self._agent_id = agent_id
        self._static = static_columns
        self._chunk_events = chunk_events
        self._interval_s = interval_s
        self._retry_for_s = retry_for_s
        self._request_timeout_s = request_timeout_s
        self._edges = edges or (lambda: ([], [], []))
        self._buffer: list[RawEvent] = []
        self._batches: list[dict[str, list[Any]]] = []  # events recorded as whole columns
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

    def start(self) -> None:
        self._thread.start()

    @property
    def buffered(self) -> int:
        """Events recorded but not yet acknowledged by the controller."""
        with self._buffer_lock:
            return len(self._buffer) + sum(len(b["kind"]) for b in self._batches)

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
        all_columns = _merge(pending, batches)
        total = len(all_columns[0])
        # GPIO edges ride with the first chunk of a flush; a flush without events still
        # sends them, since the virtual scope waits for every line's edges.
        edges_until = monotonic_ns()
        pins, times, levels = self._edges()
        for start in range(0, max(total, 1 if pins else 0), self._chunk_events):
            columns = [c[start:start + self._chunk_events] for c in all_columns]
            edge_columns = None
            if start == 0 and pins:
                edge_columns = {"pin": pins, "t_ns": times, "level": levels}
            # Built unvalidated: the controller validates it, and this machine measures.
            chunk = ResultChunk.model_construct(
                run_id=self._run_id, agent_id=self._agent_id, seq=self.chunks_sent,
                columns=dict(zip(_RAW_COLUMNS, columns, strict=True)),
                constants=self._static, edges=edge_columns,
                edges_until_ns=edges_until if edge_columns else None)
            try:
                self._post(chunk)
            except RuntimeError:
                with self._buffer_lock:  # keep the unsent events, in order
                    self._batches[:0] = [dict(zip(_RAW_COLUMNS, (c[start:] for c in all_columns),
                                                  strict=True))]
                raise
            self.chunks_sent += 1

    def _post(self, chunk: ResultChunk) -> None:
        # pydantic's serializer writes the very bytes json.dumps of the fields wrote here
        # before, at under half the CPU (bench/chunk_upload.py: 0.48x, 3.8 -> 1.9 ms per
        # 5,000 events); at P4's 100,000 events/s an agent spent ~8 % of a core on json.dumps
        body = chunk.model_dump_json()
        give_up_at = time.monotonic() + self._retry_for_s
        attempt = 0
        while True:
            try:
                response = self._http.post(f"/agent/v1/runs/{chunk.run_id}/chunks", content=body,
                                           headers={"content-type": "application/json"},
                                           timeout=self._request_timeout_s)
            except httpx.TransportError as exc:  # no answer: the network or the controller
                problem = f"{type(exc).__name__}: {exc or 'no answer'}"
            else:
                if response.is_success:
                    return
                problem = f"HTTP {response.status_code}: {_detail(response)}"
                if response.status_code < 500 or response.status_code == 507:
                    self.error = f"chunk {chunk.seq} upload refused: {problem}"
                    raise RuntimeError(self.error)
            delay = min(0.1 * 2 ** attempt, 1.0)
            if time.monotonic() + delay > give_up_at:
                self.error = (f"chunk {chunk.seq} upload failed for {self._retry_for_s:.0f} s "
                              f"({attempt + 1} attempts): {problem}")
                raise RuntimeError(self.error)
            time.sleep(delay)
            attempt += 1
            self.retries += 1


def _merge(rows: list[RawEvent], batches: list[dict[str, list[Any]]]) -> list[list[Any]]:
    """Events recorded one by one and as columns, as one list per raw column."""
    columns = [list(c) for c in zip(*rows, strict=True)] or [[] for _ in _RAW_COLUMNS]
    for batch in batches:
        for column, name in zip(columns, _RAW_COLUMNS, strict=True):
            column.extend(batch[name])
    return columns


def _detail(response: httpx.Response) -> str:
    """The controller's ``detail`` of an error answer, else the start of its body."""
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
