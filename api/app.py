"""The controller as a web service: REST API, agent gateway, web pages, campaign worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import mqttbed
from mqttbed.api import campaigns, system, web
from mqttbed.controller.core import ControllerCore
from mqttbed.controller.worker import CampaignWorker
from mqttbed.core.settings import Settings


def create_app(settings: Settings, controller_url: str | None = None, *,
               run_campaigns: bool = True) -> FastAPI:
    """Build the app over a new ControllerCore; the campaign worker runs while it is served.

    ``controller_url`` is where the agents this controller spawns reach it (default: the
    lab address on port 8000, as ``mqttbed serve`` listens by default). Without
    ``run_campaigns`` started campaigns stay queued (API tests that must not run brokers).
    """
    core = ControllerCore(settings, controller_url or f"http://{settings.lab_address}:8000")
    worker = CampaignWorker(core, settings.spark_master)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        core.engine.recover()
        if run_campaigns:
            worker.start()
        try:
            yield
        finally:
            if run_campaigns:
                worker.stop()
            core.close()

    app = FastAPI(title="mqttbed", version=mqttbed.__version__, lifespan=lifespan,
                  description="Testbed orchestration and measurement for MQTT-family brokers. "
                              "Every /api/v1 route but /health needs a user token "
                              "(Authorization: Bearer ...); /agent/v1 routes need an agent "
                              "token.")
    app.state.core, app.state.worker = core, worker
    app.include_router(system.public)
    app.include_router(system.router)
    app.include_router(campaigns.router)
    app.include_router(core.agent_router())
    app.include_router(web.router)
    return app
