"""Who is calling: a presented token checked against the store, and wrong tokens limited
per address.

An address that presents ``max_failures`` wrong tokens (unknown, expired or revoked)
within ``window_s`` gets 429 with ``Retry-After`` on every route that takes a token until
the oldest of those failures leaves the window, whatever it presents meanwhile: a
guesser learns nothing from its next guess being right. A request without any token is
no failure (a browser on its way to the login page). Addresses are the TCP peers the
server sees; behind a reverse proxy every client shares the proxy's.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import HTTPException, status

from mqttbed.controller.tokens import TokenRole


@dataclass(frozen=True)
class Caller:
    """The outcome of one token check: the role, or why there is none."""

    role: TokenRole | None
    problem: str | None = None   # None with no role: no token was presented


class AuthFailureLimit:
    """At most ``max_failures`` wrong tokens per address within ``window_s`` seconds."""

    def __init__(self, max_failures: int = 10, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.max_failures = max_failures
        self.window_s = window_s
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def retry_after_s(self, address: str) -> int | None:
        """Whole seconds until ``address`` may try again, or None if it may now."""
        with self._lock:
            failures = self._recent(address)
            if len(failures) < self.max_failures:
                return None
            return max(1, math.ceil(failures[0] + self.window_s - self._clock()))

    def record_failure(self, address: str) -> None:
        with self._lock:
            self._recent(address).append(self._clock())
            if len(self._failures) > 10_000:  # forget addresses whose failures have aged out
                for other in [a for a in self._failures if not self._recent(a)]:
                    del self._failures[other]

    def _recent(self, address: str) -> deque[float]:
        failures = self._failures.setdefault(address, deque())
        horizon = self._clock() - self.window_s
        while failures and failures[0] <= horizon:
            failures.popleft()
        return failures


def throttled(address: str, retry_after_s: int, limit: AuthFailureLimit) -> HTTPException:
    """The 429 an address gets once it has presented too many wrong tokens."""
    return HTTPException(
        status.HTTP_429_TOO_MANY_REQUESTS,
        f"{limit.max_failures} wrong tokens from {address} within {limit.window_s:.0f} s; "
        f"try again in {retry_after_s} s with a valid token",
        headers={"Retry-After": str(retry_after_s)})
