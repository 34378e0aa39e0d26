"""A whole controller in one process: database, agent gateway over HTTP, run engine."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from types import TracebackType

from mqttbed.controller.db import database_url, open_database
from mqttbed.controller.embedded import BackgroundServer
from mqttbed.controller.engine import EngineContext, RunEngine, RunUpdate
from mqttbed.controller.gateway import ChunkStore, agent_app, agent_router
from mqttbed.controller.registry import AgentRegistry
from mqttbed.controller.storage import DataLayout
from mqttbed.core.host import LocalHost
from mqttbed.core.settings import Settings


class EmbeddedController:
    """Context manager: opens the database, serves agents on loopback, owns a RunEngine."""

    def __init__(self, settings: Settings, listeners: list[Callable[[RunUpdate], None]] = ()):
        self.settings = settings
        self.layout = DataLayout(settings.data_dir)
        self.layout.root.mkdir(parents=True, exist_ok=True)
        self.sessions = open_database(settings.database_url or database_url(self.layout.root))
        self.registry = AgentRegistry()
        token = secrets.token_urlsafe(24)
        chunks = ChunkStore(self.sessions, self.layout, self.registry)
        router = agent_router(self.registry, chunks,
                              lambda given: hmac.compare_digest(given.encode(), token.encode()))
        self.server = BackgroundServer(agent_app(router))
        self.engine = RunEngine(EngineContext(
            sessions=self.sessions, layout=self.layout, registry=self.registry, host=LocalHost(),
            controller_url=self.server.url, agent_token=token, listeners=list(listeners)))

    def __enter__(self) -> EmbeddedController:
        self.server.start()
        self.engine.recover()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.server.stop()
        self.sessions.kw["bind"].dispose()
