"""Request bodies within a size per route family: 413 beyond it, before it is all read.

A campaign spec is a few kB; an agent's event chunk a few MB. Without a limit one request
can make the server buffer gigabytes (Starlette reads a body whole before a handler sees
it). A declared ``Content-Length`` over the limit is refused at once; a body that streams
past it (chunked, or lying about its length) is refused when it gets there.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_BODY_BYTES = (1 << 20) + 4096      # a spec up to bounded_yaml.MAX_BYTES, a login form
AGENT_BODY_BYTES = 64 << 20            # an event chunk (5,000 events) with its GPIO edges


def body_limit_for(path: str) -> int:
    """The largest body a route under ``path`` takes."""
    return AGENT_BODY_BYTES if path.startswith("/agent/") else API_BODY_BYTES


class BodyLimit:
    """ASGI middleware: 413 for a body larger than ``body_limit_for`` its path."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit_for(scope["path"])
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or len(declared) > 15
                                     or int(declared) > limit):
            await _refuse(send, limit, declared[:20].decode("latin-1"))
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException passes FastAPI's body parsing untouched (others
                    # become a 400 there); the exception middleware answers it.
                    raise HTTPException(413, _detail(limit, f"more than {limit:,}"))
            return message

        await self.app(scope, limited_receive, send)


def _detail(limit: int, size: str) -> str:
    return (f"request body of {size} bytes; this route takes at most {limit:,} "
            "(a campaign spec at most 1 MiB)")


async def _refuse(send: Send, limit: int, declared: str) -> None:
    body = json.dumps({"detail": _detail(limit, declared)}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
