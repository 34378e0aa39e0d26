"""The instrument side of SCPI, for simulators: header matching, an error queue, a TCP server.

A simulator subclasses :class:`ScpiInstrument`, registers handlers under headers written in
the programming guide's notation (``:TIMebase[:MAIN]:SCALe``, ``:CHANnel<n>:DISPlay``) and
hands :meth:`ScpiInstrument.execute_line` to a :class:`ScpiTcpServer`. As on an instrument:

- headers match in short or long form, any case, ``[...]`` nodes are optional and ``<n>``
  is a numeric suffix (1 when left out);
- one line may hold several commands separated by ``;``; a header without a leading colon
  continues the previous one's path (``:TRIG:EDG:SOUR CHAN1;LEV 1.5``); the replies of
  the queries in one line go back as one line, joined by ``;``;
- a command the instrument does not know, or a bad parameter, is ignored and queues an
  error (``-113,"Undefined header"``) that ``:SYSTem:ERRor?`` returns; a query that fails
  sends no reply. Nothing a client sends stops the server.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import socket
import threading
from collections.abc import Callable

from mqttbed.instruments.scope.controls import scpi_short_form

logger = logging.getLogger(__name__)

# (arguments, numeric suffixes of the header) -> reply text for a query, None for a command
Handler = Callable[[list[str], list[int]], "str | None"]

ERROR_QUEUE_LENGTH = 20
MAX_LINE_BYTES = 64 * 1024


class ScpiError(Exception):
    """A standard SCPI error (IEEE 488.2 / SCPI-99 codes), queued for ``:SYSTem:ERRor?``."""

    def __init__(self, code: int, message: str):
        super().__init__(f'{code},"{message}"')
        self.code = code
        self.message = message


def header_regex(template: str) -> re.Pattern[str]:
    """A regex matching the headers ``template`` (guide notation) accepts, upper case."""
    pieces = []
    for optional, node in re.findall(r"(\[?):?([^:\[\]]+)\]?", template):
        if node.startswith("*"):
            pieces.append(re.escape(node.upper()))
            continue
        suffix = ""
        if node.endswith("<n>"):
            node, suffix = node[:-3], r"(\d*)"
        forms = sorted({node.upper(), scpi_short_form(node)}, key=len, reverse=True)
        piece = ":(?:" + "|".join(map(re.escape, forms)) + ")" + suffix
        pieces.append(f"(?:{piece})?" if optional else piece)
    return re.compile("".join(pieces))


class ScpiInstrument:
    """Dispatch of program messages to handlers, with an error queue; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._handlers: list[tuple[re.Pattern[str], bool, Handler]] = []
        self._errors: collections.deque[ScpiError] = collections.deque()
        self.on(":SYSTem:ERRor[:NEXT]", self._next_error, query=True)
        self.on("*CLS", self._clear_status)

    def on(self, template: str, handler: Handler, *, query: bool = False) -> None:
        """Run ``handler`` for ``template`` (its query form if ``query``)."""
        self._handlers.append((header_regex(template), query, handler))

    def queue_error(self, code: int, message: str) -> None:
        """Queue an error; a full queue ends in -350 "Queue overflow", as SCPI-99 says."""
        with self.lock:
            if len(self._errors) >= ERROR_QUEUE_LENGTH:
                self._errors[-1] = ScpiError(-350, "Queue overflow")
                return
            self._errors.append(ScpiError(code, message))

    def execute_line(self, line: str) -> str | None:
        """Execute one line of program messages; return the reply line, if any."""
        replies: list[str] = []
        path = ""
        with self.lock:
            for unit in _split_units(line):
                header, _, rest = unit.partition(" ")
                header = header.strip().upper()
                if not header:
                    continue
                if not header.startswith((":", "*")):
                    header = path + ":" + header
                if not header.startswith("*"):
                    path = header.rsplit(":", 1)[0]
                arguments = [a.strip() for a in rest.split(",")] if rest.strip() else []
                try:
                    reply = self._dispatch(header, arguments)
                except ScpiError as error:
                    self.queue_error(error.code, error.message)
                    continue
                except Exception:
                    logger.exception("simulated instrument failed on %r", unit)
                    self.queue_error(-300, "Device-specific error")
                    continue
                if reply is not None:
                    replies.append(reply)
        return ";".join(replies) if replies else None

    def _dispatch(self, header: str, arguments: list[str]) -> str | None:
        is_query = header.endswith("?")
        bare = header[:-1] if is_query else header
        for pattern, query, handler in self._handlers:
            match = pattern.fullmatch(bare)
            if match and query == is_query:
                suffixes = [int(group or "1") for group in match.groups() if group is not None]
                return handler(arguments, suffixes)
        raise ScpiError(-113, "Undefined header")

    def _next_error(self, arguments: list[str], suffixes: list[int]) -> str:
        if not self._errors:
            return '0,"No error"'
        error = self._errors.popleft()
        return f'{error.code},"{error.message}"'

    def _clear_status(self, arguments: list[str], suffixes: list[int]) -> None:
        self._errors.clear()


def _split_units(line: str) -> list[str]:
    """Split a line at the semicolons outside quoted strings."""
    units: list[str] = []
    current: list[str] = []
    quote = ""
    for char in line:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == ";":
            units.append("".join(current))
            current = []
            continue
        current.append(char)
    units.append("".join(current))
    return [unit.strip() for unit in units]


class ScpiTcpServer:
    """Newline-terminated SCPI over TCP (a LAN instrument's raw socket), one thread per
    client."""

    def __init__(self, execute: Callable[[str], str | None], host: str = "127.0.0.1",
                 port: int = 0):
        self._execute = execute
        self._listener = socket.create_server((host, port))
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._stopping = threading.Event()
        self._silent = threading.Event()  # a hung instrument: reads, never answers
        self._lock = threading.Lock()
        self._clients: dict[socket.socket, threading.Thread] = {}
        self._acceptor = threading.Thread(target=self._accept, daemon=True,
                                          name=f"scpi-accept-{self.port}")

    def start(self) -> None:
        """Start accepting clients."""
        self._acceptor.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, disconnect every client, and join the threads."""
        self._stopping.set()
        _shutdown(self._listener)
        self._listener.close()
        if self._acceptor.is_alive():
            self._acceptor.join(timeout_s)
        with self._lock:
            clients = dict(self._clients)
        for connection, thread in clients.items():
            _shutdown(connection)
            thread.join(timeout_s)

    def stop_answering(self) -> None:
        """Behave like a hung instrument: keep every connection open, ignore what comes in."""
        self._silent.set()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(connection,), daemon=True,
                                      name=f"scpi-client-{self.port}")
            with self._lock:
                if self._stopping.is_set():
                    connection.close()
                    return
                self._clients[connection] = thread
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        buffer = b""
        try:
            while not self._stopping.is_set():
                data = connection.recv(4096)
                if not data:
                    return
                buffer += data
                if b"\n" not in buffer and len(buffer) > MAX_LINE_BYTES:
                    buffer += b"\n"  # an endless line is executed (and rejected) as is
                *lines, buffer = buffer.split(b"\n")
                if self._silent.is_set():
                    continue
                for raw in lines:
                    reply = self._execute(raw.decode("utf-8", "replace").strip("\r\x00 \t"))
                    if reply is not None:
                        connection.sendall(reply.encode() + b"\n")
        except OSError:
            return
        finally:
            connection.close()
            with self._lock:
                self._clients.pop(connection, None)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
