"""A TCP relay in the controller's process: how agents inside namespaces reach it.

The controller usually listens on 127.0.0.1, which a process in a host namespace cannot
reach (its loopback is its own). The topology routes :data:`ROOT_ADDRESS` from every
host to the root namespace, so a relay listening there and forwarding each connection
to the controller's own address lets agents in namespaces talk to an unchanged
controller. Bytes only: HTTP, keep-alive and tokens pass through untouched.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from mqttbed.network.topology import ROOT_ADDRESS

CHUNK = 65536


class TcpRelay:
    """Listens on ``listen_host`` (a free port) and forwards every connection to ``target``."""

    def __init__(self, target: tuple[str, int], listen_host: str = ROOT_ADDRESS):
        self.target = target
        self._listener = socket.create_server((listen_host, 0))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="tcp-relay", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            if not self._track(client, upstream):
                return
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _track(self, *sockets: socket.socket) -> bool:
        """Remember ``sockets`` for :meth:`close`; False (and closed) if the relay is."""
        with self._lock:
            if not self._closed:
                self._sockets.update(sockets)
                return True
        for sock in sockets:
            sock.close()
        return False

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy ``source`` to ``sink`` until either end closes; then half-close ``sink``."""
        with contextlib.suppress(OSError):
            while data := source.recv(CHUNK):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stop listening and cut every relayed connection; safe to call twice."""
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, set()
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
