"""A whole controller in one process: database, agent gateway over HTTP, run engine."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType

from mqttbed.controller.db import AgentRow, database_url, open_database, utcnow
from mqttbed.controller.embedded import BackgroundServer
from mqttbed.controller.engine import EngineContext, RunEngine, RunUpdate
from mqttbed.controller.gateway import ChunkStore, agent_app, agent_router
from mqttbed.controller.registry import AgentRecord, AgentRegistry
from mqttbed.controller.storage import DataLayout
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import LocalHost
from mqttbed.core.settings import Settings


class EmbeddedController:
    """Context manager: opens the database, serves agents on loopback, owns a RunEngine."""

    def __init__(self, settings: Settings, listeners: list[Callable[[RunUpdate], None]] = ()):
        self.settings = settings
        self.layout = DataLayout(settings.data_dir)
        self.layout.root.mkdir(parents=True, exist_ok=True)
        self.sessions = open_database(settings.database_url or database_url(self.layout.root))
        self.registry = AgentRegistry(on_agent_change=self._record_agent)
        token = secrets.token_urlsafe(24)
        chunks = ChunkStore(self.sessions, self.layout, self.registry)
        router = agent_router(self.registry, chunks,
                              lambda given: hmac.compare_digest(given.encode(), token.encode()))
        self.server = BackgroundServer(agent_app(router))
        self.engine = RunEngine(EngineContext(
            sessions=self.sessions, layout=self.layout, registry=self.registry, host=LocalHost(),
            controller_url=self.server.url, agent_token=token, listeners=list(listeners)))

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

    def __enter__(self) -> EmbeddedController:
        self.server.start()
        self.engine.recover()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.server.stop()
        self.sessions.kw["bind"].dispose()
