"""Streams a run's events to the controller in idempotent chunks.

Events are uploaded while the run goes on (every ``interval_s`` or ``chunk_events``
rows), so an agent that dies mid-run loses only what it had not sent yet. A chunk is
identified by (run, agent, seq) and is retried until acknowledged: sending it twice
stores it once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from mqttbed.agents.mqtt_session import RawEvent
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import PROTOCOL_VERSION, ResultChunk

_RAW_COLUMNS = ("kind", "publisher", "seq", "receiver", "topic", "payload_bytes", "qos",
                "warmup", "t_intended_ns", "t_pub_ns", "t_recv_ns")


class ChunkUploader:
    """Buffers raw events and posts them as numbered chunks from a background thread."""

    def __init__(self, http: httpx.Client, *, run_id: str, agent_id: str,
                 static_columns: dict[str, Any], chunk_events: int, interval_s: float,
                 attempts: int = 8,
                 edges: Callable[[], list[tuple[int, int, int]]] | None = None):
        self._http = http
        self._run_id = run_id
        self._agent_id = agent_id
        self._static = static_columns
        self._chunk_events = chunk_events
        self._interval_s = interval_s
        self._attempts = attempts
        self._edges = edges or (lambda: [])
        self._buffer: list[RawEvent] = []
        self._buffer_lock = threading.Lock()  # held for an append or a swap, never for I/O
        self._flush_lock = threading.Lock()   # one flush at a time keeps chunk seqs in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="uploader", daemon=True)
        self.chunks_sent = 0
        self.error: str | None = None   # set once uploads have failed for good

    def record(self, event: RawEvent) -> None:
        """Buffer one event (called from the MQTT loop thread; must stay cheap)."""
        with self._buffer_lock:
            self._buffer.append(event)

    def start(self) -> None:
        self._thread.start()

    @property
    def buffered(self) -> int:
        """Events recorded but not yet acknowledged by the controller."""
        with self._buffer_lock:
            return len(self._buffer)

    def close(self) -> int:
        """Flush everything left and stop; return the number of chunks sent.

        Raises RuntimeError if the controller cannot be reached (the events stay buffered).
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._flush()
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
        # GPIO edges ride with the first chunk of a flush; a flush without events still
        # sends them, since the virtual scope waits for every line's edges.
        edges_until = monotonic_ns()
        edges = self._edges()
        for start in range(0, max(len(pending), 1 if edges else 0), self._chunk_events):
            rows = pending[start:start + self._chunk_events]
            columns = [list(c) for c in zip(*rows, strict=True)] or [[] for _ in _RAW_COLUMNS]
            edge_columns = None
            if start == 0 and edges:
                pins, times, levels = (list(c) for c in zip(*edges, strict=True))
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
                    self._buffer[:0] = pending[start:]
                raise
            self.chunks_sent += 1

    def _post(self, chunk: ResultChunk) -> None:
        body = json.dumps({**vars(chunk), "protocol_version": PROTOCOL_VERSION},
                          separators=(",", ":"))
        for attempt in range(self._attempts):
            try:
                response = self._http.post(f"/agent/v1/runs/{chunk.run_id}/chunks", content=body,
                                           headers={"content-type": "application/json"})
                response.raise_for_status()
                return
            except httpx.HTTPError as exc:
                self.error = f"chunk {chunk.seq} upload failed: {exc}"
                time.sleep(min(0.1 * 2 ** attempt, 2.0))
        raise RuntimeError(self.error)
