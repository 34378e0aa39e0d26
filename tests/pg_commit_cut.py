"""A TCP proxy in front of PostgreSQL that can lose the answer to a COMMIT.

The one database fault a retry cannot see through: the server commits a transaction and
the connection dies before its answer reaches the client, which then cannot tell whether
its work was applied. The proxy forwards every connection byte for byte and reads the
client's side as the PostgreSQL frontend/backend protocol (version 3: the untyped
SSLRequest, GSSENCRequest and StartupMessage first, then messages of a type byte and a
length that counts itself). Once :meth:`CommitCutter.arm` was called, the next simple-query
``COMMIT`` a client sends is forwarded to the server; the first bytes the server sends
back after it (its CommandComplete) are dropped, and both sockets are closed.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from mqttbed.core.mqtt_stream import read_exactly

SSL_REQUEST, GSSENC_REQUEST = 80877103, 80877104


class _Link:
    """One client connection and its server connection."""

    def __init__(self, client: socket.socket, server: socket.socket, cutter: CommitCutter):
        self.client, self.server, self.cutter = client, server, cutter
        self.commit_sent = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def client_to_server(self) -> None:
        try:
            while True:  # the untyped opening messages
                head = read_exactly(self.client, 8)
                length, code = struct.unpack("!ii", head)
                self.server.sendall(head + read_exactly(self.client, length - 8))
                if code not in (SSL_REQUEST, GSSENC_REQUEST):
                    break   # the StartupMessage: typed messages from here on
            while True:
                head = read_exactly(self.client, 5)
                kind, length = head[:1], struct.unpack("!i", head[1:])[0]
                body = read_exactly(self.client, length - 4)
                if kind == b"Q" and body.rstrip(b"\0").strip().upper() == b"COMMIT" \
                        and self.cutter.take_armed():
                    self.commit_sent.set()   # before the server can answer it
                self.server.sendall(head + body)
        except OSError:   # StreamClosed among them: the client went away
            return
        finally:
            self.close()

    def server_to_client(self) -> None:
        try:
            while data := self.server.recv(65536):
                if self.commit_sent.is_set():   # the answer to the cut COMMIT
                    self.cutter.cuts += 1
                    return
                self.client.sendall(data)
        except OSError:
            return
        finally:
            self.close()


class CommitCutter:
    """The proxy to the server at ``host:port``; clients connect to 127.0.0.1:``self.port``."""

    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cuts = 0
        self._armed = 0
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        threading.Thread(target=self._accept, daemon=True, name="pg-commit-cut").start()

    def arm(self, commits: int = 1) -> None:
        """Lose the answer of the next ``commits`` COMMITs."""
        with self._lock:
            self._armed += commits

    def take_armed(self) -> bool:
        with self._lock:
            if self._armed == 0:
                return False
            self._armed -= 1
            return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return   # closed
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            link = _Link(client, server, self)
            self._links.append(link)
            for pump in (link.client_to_server, link.server_to_client):
                threading.Thread(target=pump, daemon=True, name="pg-commit-cut-pump").start()

    def close(self) -> None:
        # shutdown() wakes the blocked accept(); a close() alone from this thread leaves the
        # socket listening until accept() returns, i.e. one more connection is taken
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for link in self._links:
            link.close()
