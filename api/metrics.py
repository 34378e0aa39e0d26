"""``GET /metrics``: the controller's live figures for Prometheus to scrape.

Behind a user token like every other route (a Prometheus scrape job sends it as a bearer
token: ``docs/how-to/prometheus.md``). The figures come from the controller's own
Prometheus collector registry (:mod:`mqttbed.controller.prometheus`), read at each scrape.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mqttbed.api.deps import ControllerDep, UserDep

router = APIRouter(tags=["metrics"], dependencies=[UserDep])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                             "description": "the Prometheus text exposition format"}})
def metrics(controller: ControllerDep) -> Response:
    """Live figures of the recent runs (deliveries, loss, latency and send-lag histograms,
    broker CPU and memory) and of the controller (queue, runs by state, analysis time),
    in the Prometheus text format."""
    return Response(generate_latest(controller.metrics), media_type=CONTENT_TYPE_LATEST)
