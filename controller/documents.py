"""What a controller tells its listeners as campaigns go: small typed documents.

As bluesky's run engine emits start, event and stop documents, the controller emits one
document per fact: a run changed state (:class:`RunUpdate`), a campaign changed status
(:class:`CampaignUpdate`), a campaign's statistics were written (:class:`ResultsReady`).
Each fact is in the database (or on disk) before its document goes out, so a listener
learns what happened, never what is about to. Listeners are whatever wants to follow
along (the CLI's progress display, a test's log); the engine knows none of them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqttbed.analytics.results import CampaignStats
from mqttbed.controller.states import CampaignStatus, RunState

log = logging.getLogger("mqttbed.documents")


@dataclass(frozen=True)
class RunUpdate:
    """A run changed state (with the reason, for failed and interrupted)."""

    campaign_id: str
    run_id: str
    ordinal: int
    total: int
    params: dict[str, Any]
    repetition: int
    state: RunState
    reason: str | None = None


@dataclass(frozen=True)
class CampaignUpdate:
    """A campaign changed status (with the reason, e.g. "1 of 6 runs did not finish")."""

    campaign_id: str
    status: CampaignStatus
    reason: str | None = None


@dataclass(frozen=True)
class ResultsReady:
    """A campaign's statistics are written; its final status follows."""

    campaign_id: str
    stats_path: Path      # stats.json
    parquet_path: Path    # stats.parquet
    stats: CampaignStats  # the results document, as written to stats.json


Document = RunUpdate | CampaignUpdate | ResultsReady
Listener = Callable[[Document], None]


class DocumentStream:
    """Hands every document to every listener, in the order they subscribed."""

    def __init__(self, listeners: Iterable[Listener] = ()):
        self._listeners: tuple[Listener, ...] = tuple(listeners)
        self._lock = threading.Lock()

    def subscribe(self, listener: Listener) -> None:
        """Add ``listener``; it receives the documents emitted from now on."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def emit(self, document: Document) -> None:
        """Give ``document`` to each listener.

        A listener that raises is logged and passed over: the fact is already stored, and
        a display that breaks must not fail a measurement.
        """
        for listener in self._listeners:
            try:
                listener(document)
            except Exception:  # noqa: BLE001 - see the docstring
                log.exception("listener %r failed on %r", listener, document)
