"""``/api/v1`` resources about the installation: health, agents, backends."""

from __future__ import annotations

from fastapi import APIRouter

import mqttbed
from mqttbed.api.deps import ControllerDep, UserDep
from mqttbed.api.schemas import AgentPublic, BackendPublic, Health
from mqttbed.controller.analysis import results_type
from mqttbed.controller.db import AgentRow
from mqttbed.core.backends import backend_names, options_model, unavailable_reason

public = APIRouter(prefix="/api/v1", tags=["system"])
router = APIRouter(prefix="/api/v1", tags=["system"], dependencies=[UserDep])


@public.get("/health")
def health() -> Health:
    """Liveness; needs no token."""
    return Health(status="ok", version=mqttbed.__version__)


@router.get("/agents")
def list_agents(controller: ControllerDep) -> list[AgentPublic]:
    """Registered agents: host, state (idle, busy, lost, gone) and last heartbeat."""
    with controller.sessions() as s:
        rows = s.query(AgentRow).order_by(AgentRow.registered_at.desc()).all()
    live = {record.agent_id: record for record in controller.agent_registry.agents()}
    return [AgentPublic(id=r.id, name=r.name, hostname=r.hostname, pid=r.pid,
                        state=live[r.id].state if r.id in live else r.state,
                        registered_at=r.registered_at, last_heartbeat=r.last_heartbeat)
            for r in rows]


@router.get("/backends")
def list_backends() -> list[BackendPublic]:
    """Every broker backend, whether it can be deployed here (and why not), and the JSON
    schema of its options."""
    answer = []
    for name in backend_names():
        reason = unavailable_reason(name)
        answer.append(BackendPublic(name=name, available=reason is None,
                                    unavailable_reason=reason,
                                    options_schema=options_model(name).model_json_schema()))
    return answer


@router.get("/schemas/stats")
def stats_schema() -> dict[str, object]:
    """The JSON schema of a campaign's results document (``GET …/{id}/stats``, stats.json),
    with the sections of every backend this controller knows."""
    return results_type().model_json_schema()
