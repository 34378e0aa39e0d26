"""``/api/v1/campaigns``: define, start, cancel, watch, and take the results away."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from mqttbed.analytics.results_files import StaleResults
from mqttbed.api.deps import ControllerDep, UserDep, WorkerDep
from mqttbed.api.export import build_dataset_zip, stream_deliveries_csv
from mqttbed.api.schemas import CampaignPublic, Progress, RunPublic, StatsPending
from mqttbed.campaigns.spec import check_remote_access_sources, spec_from_bytes
from mqttbed.controller.analysis import load_results
from mqttbed.controller.controller import Controller
from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.engine import latest_attempts
from mqttbed.controller.states import (
    CAMPAIGN_ENDED,
    CAMPAIGN_UNDER_WAY,
    CampaignStatus,
    RunState,
)
from mqttbed.core.errors import SpecError

router = APIRouter(prefix="/api/v1/campaigns", tags=["campaigns"], dependencies=[UserDep])

_SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no campaign with that id"}}


def _progress(runs: list[RunRow]) -> Progress:
    runs = latest_attempts(runs)  # a retried run counts once, by its last attempt
    done = sum(r.state == RunState.DONE for r in runs)
    failed = sum(r.state in (RunState.FAILED, RunState.INTERRUPTED) for r in runs)
    total = len(runs)
    return Progress(runs_total=total, runs_done=done, runs_failed=failed,
                    runs_finished=done + failed,
                    fraction=(done + failed) / total if total else 1.0)


def load_campaign(controller: Controller, campaign_id: str) -> tuple[CampaignRow, list[RunRow]]:
    """The campaign and its runs, or 404."""
    with controller.sessions() as s:
        row = s.get(CampaignRow, campaign_id)
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no campaign {campaign_id!r}")
        runs = s.query(RunRow).filter_by(campaign_id=campaign_id).order_by(RunRow.ordinal).all()
    return row, runs


def _summary(controller: Controller, row: CampaignRow, runs: list[RunRow]) -> dict[str, Any]:
    return {"id": row.id, "name": row.name, "status": row.status, "reason": row.reason,
            "created_at": row.created_at, "updated_at": row.updated_at,
            "progress": _progress(runs),
            "stats_ready": (controller.layout.campaign_dir(row.id) / "stats.json").exists()}


def campaign_public(controller: Controller, campaign_id: str) -> CampaignPublic:
    row, runs = load_campaign(controller, campaign_id)
    return _public(controller, row, runs)


def _public(controller: Controller, row: CampaignRow, runs: list[RunRow]) -> CampaignPublic:
    return CampaignPublic(
        **_summary(controller, row, runs), spec=row.spec,
        runs=[RunPublic(id=r.id, ordinal=r.ordinal, point_index=r.point_index,
                        repetition=r.repetition, attempt=r.attempt, params=r.params,
                        state=r.state, reason=r.reason, started_at=r.started_at,
                        ended_at=r.ended_at)
              for r in sorted(runs, key=lambda r: (r.ordinal, r.attempt))])


@router.post("", status_code=status.HTTP_201_CREATED, openapi_extra=_SPEC_BODY,
             responses={422: {"description": "the spec is invalid; the detail names the "
                                             "field and the bad value"}})
async def create_campaign(request: Request, controller: ControllerDep) -> CampaignPublic:
    """Create a campaign from a spec sent as JSON, or as YAML (``application/yaml``)."""
    try:
        spec = spec_from_bytes(await request.body(), "request body")
        check_remote_access_sources(spec, controller.settings.broker_secrets_dir())
        # what only this controller can check: lab hosts named, cgroups for cpu_limit
        campaign_id = controller.engine.create_campaign(spec)
    except SpecError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    return campaign_public(controller, campaign_id)


@router.get("")
def list_campaigns(controller: ControllerDep) -> list[CampaignPublic]:
    """Every campaign, newest first: spec, status, progress, runs with states and reasons."""
    with controller.sessions() as s:
        rows = s.query(CampaignRow).order_by(CampaignRow.created_at.desc()).all()
        runs = s.query(RunRow).all()
    by_campaign: dict[str, list[RunRow]] = {}
    for run in runs:
        by_campaign.setdefault(run.campaign_id, []).append(run)
    return [_public(controller, row, by_campaign.get(row.id, [])) for row in rows]


@router.get("/{campaign_id}", responses=_NOT_FOUND)
def get_campaign(campaign_id: str, controller: ControllerDep) -> CampaignPublic:
    """One campaign: spec, status, progress, and its runs with states and failure reasons."""
    return campaign_public(controller, campaign_id)


@router.post("/{campaign_id}/start", responses={**_NOT_FOUND, 409: {"description":
                                                                     "already started"}})
def start_campaign(campaign_id: str, controller: ControllerDep,
                   worker: WorkerDep) -> CampaignPublic:
    """Queue the campaign; it runs when the campaigns queued before it have ended."""
    row, _ = load_campaign(controller, campaign_id)
    if row.status != CampaignStatus.CREATED:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"campaign {campaign_id} is {row.status}; only a created campaign "
                            "can be started")
    worker.enqueue(campaign_id)
    return campaign_public(controller, campaign_id)


@router.post("/{campaign_id}/cancel", responses={**_NOT_FOUND, 409: {
    "description": "already ended, or analysing (its runs have ended)"}})
def cancel_campaign(campaign_id: str, controller: ControllerDep) -> CampaignPublic:
    """Cancel: the running run stops cleanly and keeps its events; no further run starts."""
    row, _ = load_campaign(controller, campaign_id)
    if row.status in CAMPAIGN_ENDED:
        raise HTTPException(status.HTTP_409_CONFLICT, f"campaign {campaign_id} already "
                                                      f"ended ({row.status})")
    if row.status == CampaignStatus.ANALYSING:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"campaign {campaign_id} is analysing: its runs have ended and "
                            "its statistics are being computed; nothing is left to cancel")
    controller.engine.cancel(campaign_id)
    return campaign_public(controller, campaign_id)


STATS_RETRY_AFTER_S = 5
_STATS_RESPONSES: dict[int | str, dict[str, Any]] = {
    **_NOT_FOUND,
    200: {"content": {"application/json": {}},
          "description": "the results document (``stats.json``), served whenever it exists, "
                         "whatever the campaign's status; its JSON schema is "
                         "GET /api/v1/schemas/stats"},
    202: {"model": StatsPending,
          "description": "the campaign is queued, running or analysing: the statistics are "
                         "on their way; ask again after Retry-After seconds",
          "headers": {"Retry-After": {"description": "seconds to wait before asking again",
                                      "schema": {"type": "integer"}}}},
    409: {"description": "there will be no statistics unless something changes: the campaign "
                         "was never started (created), it ended without them (e.g. its "
                         "analysis failed), or its results file is of an older schema "
                         "version (mqttbed analyze recomputes it); the detail says which "
                         "and why"},
}


@router.get("/{campaign_id}/stats", response_class=Response, responses=_STATS_RESPONSES)
def campaign_stats(campaign_id: str, controller: ControllerDep) -> Response:
    """The campaign's results (``stats.json``): figures per sweep point and per run."""
    row, _ = load_campaign(controller, campaign_id)
    try:
        # written atomically: whole or absent
        results = load_results(controller.layout, campaign_id)
    except StaleResults as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    if results is not None:
        return Response(results.model_dump_json(), media_type="application/json")
    if row.status in CAMPAIGN_UNDER_WAY:
        pending = StatsPending(
            campaign_id=campaign_id, status=row.status, retry_after_s=STATS_RETRY_AFTER_S,
            detail=f"campaign {campaign_id} is {row.status}; its statistics are computed "
                   "when its runs have ended")
        return JSONResponse(pending.model_dump(), status_code=status.HTTP_202_ACCEPTED,
                            headers={"Retry-After": str(STATS_RETRY_AFTER_S)})
    if row.status == CampaignStatus.CREATED:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"campaign {campaign_id} has not been started (POST "
                            f"/api/v1/campaigns/{campaign_id}/start); its statistics are "
                            "computed when its runs have ended")
    raise HTTPException(status.HTTP_409_CONFLICT,
                        f"campaign {campaign_id} ended ({row.status}) without statistics: "
                        f"{row.reason or 'none were computed'}")


@router.get("/{campaign_id}/dataset", responses={
    **_NOT_FOUND,
    200: {"content": {"application/zip": {}, "text/csv": {}},
          "description": "parquet: a zip of the dataset and manifest.json; csv: one row per "
                         "delivery"}})
def campaign_dataset(campaign_id: str, controller: ControllerDep,
                     format: Annotated[Literal["parquet", "csv"], Query()] = "parquet"
                     ) -> Response:
    """The campaign's data: a zip of its Parquet dataset with a provenance manifest, or
    every delivery as one CSV file (streamed)."""
    load_campaign(controller, campaign_id)
    if format == "csv":
        return StreamingResponse(
            stream_deliveries_csv(controller, campaign_id), media_type="text/csv",
            headers={"content-disposition": f'attachment; filename="{campaign_id}.csv"'})
    path = build_dataset_zip(controller, campaign_id)
    return FileResponse(path, media_type="application/zip", filename=f"{campaign_id}.zip",
                        background=BackgroundTask(path.unlink, missing_ok=True))
