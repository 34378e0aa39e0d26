"""A whole controller in one process for `mqttbed run`, on the lab address (default loopback)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from mqttbed.controller.core import ControllerCore
from mqttbed.controller.embedded import BackgroundServer, bind_socket
from mqttbed.controller.engine import RunUpdate
from mqttbed.controller.gateway import agent_app
from mqttbed.core.settings import Settings


class EmbeddedController(ControllerCore):
    """Context manager: a ControllerCore serving only the agent routes, on a free port."""

    def __init__(self, settings: Settings, listeners: list[Callable[[RunUpdate], None]] = ()):
        sock = bind_socket(settings.lab_address, 0)
        host, port = sock.getsockname()
        super().__init__(settings, f"http://{host}:{port}", listeners)
        self.server = BackgroundServer(agent_app(self.agent_router()), sock)

    def __enter__(self) -> EmbeddedController:
        self.server.start()
        self.engine.recover()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.server.stop()
        self.close()
