"""A scripted transport for byte-level protocol tests: expected command -> canned reply.

``ScriptedTransport([("*IDN?", "RIGOL ..."), (":SINGle", None)])`` accepts exactly those
commands in that order; an entry with a reply must arrive as a query, one with ``None`` as
a write. Anything else fails at once with both texts in the message. ``forever`` is an
entry answered as often as it is asked once the script is used up (a scope that keeps
saying WAIT).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class ScriptMismatch(AssertionError):
    """The driver sent something other than the next scripted command."""


class ScriptedTransport:
    """A fake instrument connection that checks every command against a script."""

    def __init__(self, script: Iterable[tuple[str, str | None]], *,
                 forever: tuple[str, str | None] | None = None):
        self._script = deque(script)
        self._forever = forever
        self.sent: list[str] = []
        self.closed = False

    def write(self, command: str) -> int:
        """Accept a command without a reply."""
        self._expect(command, is_query=False)
        return len(command)

    def query(self, command: str) -> str:
        """Accept a query and return its canned reply."""
        reply = self._expect(command, is_query=True)
        assert reply is not None
        return reply

    def close(self) -> None:
        """Mark the transport closed."""
        self.closed = True

    @property
    def remaining(self) -> list[tuple[str, str | None]]:
        """Scripted entries not yet sent."""
        return list(self._script)

    def _expect(self, command: str, *, is_query: bool) -> str | None:
        if self.closed:
            raise ScriptMismatch(f"{command!r} sent after close()")
        wire = command.encode("ascii")  # an instrument reads bytes; non-ASCII fails here
        self.sent.append(command)
        if self._script:
            expected, reply = self._script.popleft()
        elif self._forever is not None:
            expected, reply = self._forever
        else:
            raise ScriptMismatch(f"{command!r} sent after the end of the script")
        kind = "query" if is_query else "write"
        if wire != expected.encode("ascii") or (reply is not None) != is_query:
            wanted = "query" if reply is not None else "write"
            raise ScriptMismatch(f"sent {kind} {command!r}, script expected {wanted}"
                                 f" {expected!r}")
        return reply
