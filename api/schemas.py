"""What the REST API returns: one public schema family per resource."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class Progress(BaseModel):
    runs_total: int
    runs_done: int
    runs_failed: int          # failed or interrupted
    runs_finished: int        # done + failed + interrupted
    fraction: float


class RunPublic(BaseModel):
    id: str
    ordinal: int
    point_index: int
    repetition: int
    attempt: int = 0  # 1, 2 ...: the retry of an attempt its controller interrupted
    params: dict[str, Any]
    state: str
    reason: str | None
    started_at: datetime | None
    ended_at: datetime | None


class CampaignSummary(BaseModel):
    id: str
    name: str
    status: str
    reason: str | None
    created_at: datetime
    updated_at: datetime
    progress: Progress
    stats_ready: bool


class CampaignPublic(CampaignSummary):
    spec: dict[str, Any]
    runs: list[RunPublic]


class AgentPublic(BaseModel):
    id: str
    name: str
    hostname: str
    pid: int
    state: str
    registered_at: datetime
    last_heartbeat: datetime | None


class BackendPublic(BaseModel):
    name: str
    available: bool                   # deployable here with default options
    unavailable_reason: str | None    # what is missing (and how to install it) if not
    options_schema: dict[str, Any]


class Health(BaseModel):
    status: str
    version: str


class StatsPending(BaseModel):
    """The answer of ``GET /campaigns/{id}/stats`` while the statistics are on their way."""

    campaign_id: str
    status: str               # queued, running or analysing
    retry_after_s: int        # also in the Retry-After header
    detail: str
