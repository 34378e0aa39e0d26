"""An HTTP server on a background thread: the embedded controller of ``mqttbed run``."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0 picks a free port) and listening.

    Binding before the app exists lets the app know its own URL (agents are told it).
    Listening at once means the URL can be printed as soon as it is known: a client that
    connects before the server's loop runs waits in the backlog, not refused.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit TCP_NODELAY on Linux. uvicorn writes a response's
    # headers and body separately; without it every answer waits out the client's
    # delayed ACK (~40 ms), which would pass for network delay in clock probes.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(socket.SOMAXCONN)
    return sock


class BackgroundServer:
    """Serves ``app`` with uvicorn on a thread, on an already bound socket."""

    def __init__(self, app: FastAPI, sock: socket.socket):
        self._sock = sock
        self.host, self.port = sock.getsockname()
        config = uvicorn.Config(app, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]},
                                        name="controller-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"controller HTTP server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5.0)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
