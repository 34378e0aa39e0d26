"""Works the campaign queue in the background: each queued campaign through its lifecycle."""

from __future__ import annotations

import logging
import threading

from mqttbed.controller.controller import Controller
from mqttbed.controller.db import CampaignRow
from mqttbed.controller.states import CampaignStatus

log = logging.getLogger("mqttbed.worker")


class CampaignWorker:
    """One thread that runs queued campaigns in the order they were queued."""

    def __init__(self, controller: Controller, poll_s: float = 0.5):
        self._controller = controller
        self._poll_s = poll_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="campaign-worker", daemon=True)
        self.current: str | None = None

    def start(self) -> None:
        self._thread.start()

    def interrupt(self, reason: str = "controller stopped") -> None:
        """Begin stopping without waiting (safe in a signal handler): the running run is
        interrupted at once (``RunEngine.shutdown``), no other run or campaign starts."""
        self._controller.engine.shutdown(reason)
        self._stop.set()
        self._wake.set()

    def stop(self, timeout_s: float = 20.0, reason: str = "controller stopped") -> None:
        """Interrupt the running run, wait until all it started is torn down, and stop.

        The interrupted run is retried and its campaign requeued by the next controller
        on the data dir (``RunEngine.recover``); tearing down takes seconds (agents and
        broker get SIGTERM, SIGKILL after 5 s), ``timeout_s`` only bounds a hung teardown.
        """
        self.interrupt(reason)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def enqueue(self, campaign_id: str) -> None:
        """Queue a campaign; it starts when the campaigns queued before it have ended."""
        self._controller.engine.set_campaign_status(campaign_id, CampaignStatus.QUEUED)
        self._wake.set()

    def _next_queued(self) -> str | None:
        with self._controller.sessions() as s:
            row = (s.query(CampaignRow).filter_by(status=CampaignStatus.QUEUED)
                   .order_by(CampaignRow.updated_at, CampaignRow.id).first())
            return row.id if row else None

    def _loop(self) -> None:
        while not self._stop.is_set():
            campaign_id = self._next_queued()
            if campaign_id is None:
                self._wake.wait(self._poll_s)
                self._wake.clear()
                continue
            self.current = campaign_id
            try:
                self._controller.run_campaign(campaign_id)
            except Exception as exc:  # noqa: BLE001 - the campaign fails, the worker goes on
                log.exception("campaign %s failed", campaign_id)
                self._controller.engine.set_campaign_status(
                    campaign_id, CampaignStatus.FAILED, f"{type(exc).__name__}: {exc}")
            finally:
                self.current = None
