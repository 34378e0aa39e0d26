"""One controller's parts, without any HTTP server: database, registry, chunk store, engine.

``mqttbed run`` wraps it with an agent-only HTTP server on loopback; ``mqttbed serve``
wraps it with the full REST API and web pages.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from datetime import timedelta

from fastapi import APIRouter

from mqttbed.controller.db import AgentRow, database_url, open_database, utcnow
from mqttbed.controller.engine import EngineContext, RunEngine, RunUpdate
from mqttbed.controller.gateway import ChunkStore, agent_router
from mqttbed.controller.registry import AgentRecord, AgentRegistry
from mqttbed.controller.storage import DataLayout
from mqttbed.controller.tokens import TokenRole, resolve_token
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import LocalHost
from mqttbed.core.settings import Settings


class ControllerCore:
    """Everything a controller keeps, reachable by agents at ``controller_url``."""

    def __init__(self, settings: Settings, controller_url: str,
                 listeners: list[Callable[[RunUpdate], None]] = ()):
        self.settings = settings
        self.layout = DataLayout(settings.data_dir)
        self.layout.root.mkdir(parents=True, exist_ok=True)
        self.sessions = open_database(settings.database_url or database_url(self.layout.root))
        self.registry = AgentRegistry(on_agent_change=self._record_agent)
        self.chunks = ChunkStore(self.sessions, self.layout, self.registry)
        # The agents this controller spawns itself get a token that lives as long as it does.
        self._local_agent_token = secrets.token_urlsafe(32)
        self.engine = RunEngine(EngineContext(
            sessions=self.sessions, layout=self.layout, registry=self.registry,
            host=LocalHost(settings.lab_address),
            controller_url=controller_url, agent_token=self._local_agent_token,
            listeners=list(listeners)))

    def token_role(self, token: str) -> TokenRole | None:
        """The role of ``token``: a stored token's, AGENT for local agents, else None."""
        if hmac.compare_digest(token.encode(), self._local_agent_token.encode()):
            return TokenRole.AGENT
        found = resolve_token(self.sessions, token)
        return found[1] if found else None

    def agent_router(self) -> APIRouter:
        """The ``/agent/v1`` routes, open to agent tokens only."""
        return agent_router(self.registry, self.chunks, self.token_role)

    def _record_agent(self, record: AgentRecord) -> None:
        """Keep the agents table in step with registrations, losses and departures."""
        with self.sessions() as s:
            row = s.get(AgentRow, record.agent_id)
            if row is None:
                hello = record.hello
                row = AgentRow(id=record.agent_id, name=hello.name, hostname=hello.hostname,
                               pid=hello.pid, info=hello.model_dump(mode="json"))
                s.add(row)
            row.state = record.state
            row.last_heartbeat = utcnow() - timedelta(
                seconds=(monotonic_ns() - record.last_seen_ns) / 1e9)
            s.commit()

    def close(self) -> None:
        self.sessions.kw["bind"].dispose()
