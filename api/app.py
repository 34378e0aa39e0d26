"""The controller as a web service: REST API, agent API, web pages, campaign worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import mqttbed
from mqttbed.api import campaigns, metrics, simulations, system, web
from mqttbed.controller.body_limit import BodyLimit
from mqttbed.controller.controller import Controller, create_controller
from mqttbed.controller.worker import CampaignWorker
from mqttbed.core.settings import Settings


def create_app(controller: Controller | Settings, controller_url: str | None = None, *,
               run_campaigns: bool = True) -> FastAPI:
    """Build the app over ``controller``, or over one ``create_controller`` builds from
    settings; the app starts it and its campaign worker while it is served, and stops them.

    A controller given here must have been created with the ``controller_url`` the app is
    served at: the app serves its agent routes. Built from settings, ``controller_url``
    says where (default: the lab address on port 8000, as ``mqttbed serve`` listens by
    default). Without ``run_campaigns`` started campaigns stay queued (API tests that must
    not run brokers).
    """
    if isinstance(controller, Settings):
        settings = controller
        controller = create_controller(
            settings, controller_url=controller_url or f"http://{settings.lab_address}:8000")
    worker = CampaignWorker(controller)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        controller.start()
        if run_campaigns:
            worker.start()
        try:
            yield
        finally:
            if run_campaigns:
                worker.stop()
            controller.stop()

    app = FastAPI(title="mqttbed", version=mqttbed.__version__, lifespan=lifespan,
                  description="Testbed orchestration and measurement for MQTT-family brokers. "
                              "Every /api/v1 route but /health needs a user token "
                              "(Authorization: Bearer ...); /agent/v1 routes need an agent "
                              "token.")
    app.state.controller, app.state.worker = controller, worker
    app.include_router(system.public)
    app.include_router(system.router)
    app.include_router(campaigns.router)
    app.include_router(simulations.router)
    app.include_router(metrics.router)
    app.include_router(controller.agent_router())
    app.include_router(web.router)
    app.add_middleware(BodyLimit)
    return app
