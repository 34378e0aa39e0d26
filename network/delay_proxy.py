"""The delay proxy: adds a fixed one-way delay (plus jitter) to each direction of a path.

This kernel has no netem, so delay is added in user space. One proxy process serves one
impaired group: it listens on the root side of the group's management links
(:data:`~mqttbed.network.topology.ROOT_ADDRESS`) and forwards to the broker.

- **Delay is one-way, per direction**: bytes that arrive at time t leave at
  t + delay_ms, upstream (client → broker) and downstream (broker → client) alike, as on
  a link with that propagation delay in both directions. A round trip gains 2 × delay.
- **Jitter** draws each chunk's (TCP) or datagram's (UDP) delay uniformly from
  [delay − jitter, delay + jitter], never below 0, as netem does without a distribution
  table. A TCP stream cannot be reordered, so a chunk never leaves before the one read
  before it: on TCP jitter only ever adds delay (its mean rises above delay_ms). UDP
  datagrams leave in release order and may overtake each other, as with netem.
- Sockets carry TCP_NODELAY, times are CLOCK_MONOTONIC, the timer slack of the process
  is set to 1 ns and, run as root, its nice value to -10. Each release's lateness
  (sent − scheduled, in user space) is kept; on SIGUSR1 the proxy writes its statistics
  to ``--stats-file``, on SIGTERM too, then exits.

Run as ``python -m mqttbed.network.delay_proxy``. The ``--topology`` argument names the
run's topology: :func:`~mqttbed.network.topology.reap` kills every process that carries
it, so a proxy never outlives its run, even when the controller was SIGKILLed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Any

from mqttbed.core.clock import monotonic_ns

CHUNK = 65_536
MAX_DATAGRAM = 65_535
MAX_QUEUED_BYTES = 16 << 20    # per direction: stop reading (TCP backpressure) past this
LATENESS_SAMPLES = 200_000     # kept for the percentiles; older ones are dropped
PR_SET_TIMERSLACK = 29
TCP_INFO_BYTES = 104
TCPI_TOTAL_RETRANS_OFFSET = 100  # after 8 one-byte fields and 23 32-bit ones
PROXY_NICE = -10


class Schedule:
    """Release times: arrival + a delay drawn in [delay − jitter, delay + jitter], ≥ 0."""

    def __init__(self, delay_ms: float, jitter_ms: float, seed: int):
        self.delay_ns = int(delay_ms * 1e6)
        self.jitter_ns = int(jitter_ms * 1e6)
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def release_ns(self, arrived_ns: int) -> int:
        """When something that arrived at ``arrived_ns`` is due to leave."""
        if not self.jitter_ns:
            return arrived_ns + self.delay_ns
        with self._lock:
            extra = self._random.randint(-self.jitter_ns, self.jitter_ns)
        return arrived_ns + max(self.delay_ns + extra, 0)


class Lateness:
    """How late releases left against their schedule: the proxy's own added error."""

    def __init__(self) -> None:
        self._samples: collections.deque[int] = collections.deque(maxlen=LATENESS_SAMPLES)
        self.releases = 0
        self.bytes = 0
        self._lock = threading.Lock()

    def add(self, late_ns: int, size: int) -> None:
        with self._lock:
            self._samples.append(late_ns)
            self.releases += 1
            self.bytes += size

    def summary(self) -> dict[str, Any]:
        """Count, bytes and lateness percentiles in microseconds (None before any release)."""
        with self._lock:
            ordered = sorted(self._samples)

        def pct(q: float) -> float | None:
            return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)] / 1e3, 1) \
                if ordered else None

        return {"releases": self.releases, "bytes": self.bytes, "lateness_p50_us": pct(0.5),
                "lateness_p99_us": pct(0.99), "lateness_max_us": pct(1.0)}


class Retransmits:
    """Segments the kernel sent again towards the clients (TCP_INFO), over all connections.

    What link loss does to a TCP path: a dropped segment is sent again, not lost.
    """

    def __init__(self) -> None:
        self._live: set[socket.socket] = set()
        self._closed = 0
        self._lock = threading.Lock()

    def track(self, sock: socket.socket) -> None:
        with self._lock:
            self._live.add(sock)

    def closing(self, sock: socket.socket) -> None:
        """Keep the count of ``sock``, about to be closed."""
        with self._lock:
            self._live.discard(sock)
            self._closed += _total_retrans(sock)

    def total(self) -> int:
        with self._lock:
            return self._closed + sum(_total_retrans(sock) for sock in self._live)


def _total_retrans(sock: socket.socket) -> int:
    """``tcpi_total_retrans`` of struct tcp_info (linux/tcp.h); 0 once the socket is gone."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    except OSError:
        return 0
    return struct.unpack_from("I", info, TCPI_TOTAL_RETRANS_OFFSET)[0]


def _nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class TcpDirection:
    """One direction of one relayed TCP connection: read, hold until due, write in order."""

    def __init__(self, source: socket.socket, sink: socket.socket, schedule: Schedule,
                 lateness: Lateness):
        self.source, self.sink = source, sink
        self.schedule, self.lateness = schedule, lateness
        self._queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self._queued_bytes = 0
        self._last_release_ns = 0

    def run(self) -> None:
        """Until the source ends and everything read has left; then half-close the sink."""
        open_source = True
        with contextlib.suppress(OSError):
            while open_source or self._queue:
                now = monotonic_ns()
                while self._queue and self._queue[0][0] <= now:
                    self._release(*self._queue.popleft())
                    now = monotonic_ns()
                timeout = (self._queue[0][0] - now) / 1e9 if self._queue else None
                can_read = open_source and self._queued_bytes < MAX_QUEUED_BYTES
                if not can_read:
                    if timeout is not None:
                        select.select([], [], [], timeout)
                    continue
                # select.select sleeps with microsecond resolution (poll/epoll: milliseconds)
                readable, _, _ = select.select([self.source], [], [], timeout)
                if readable:
                    data = self.source.recv(CHUNK)
                    if data:
                        self._hold(data)
                    else:
                        open_source = False
        with contextlib.suppress(OSError):
            self.sink.shutdown(socket.SHUT_WR)

    def _hold(self, data: bytes) -> None:
        # Never before the previous chunk: a byte stream keeps its order whatever the jitter.
        release = max(self.schedule.release_ns(monotonic_ns()), self._last_release_ns)
        self._last_release_ns = release
        self._queue.append((release, data))
        self._queued_bytes += len(data)

    def _release(self, due_ns: int, data: bytes) -> None:
        self.lateness.add(monotonic_ns() - due_ns, len(data))
        self.sink.sendall(data)
        self._queued_bytes -= len(data)


class TcpConnection:
    """One relayed client: its own upstream connection, one thread per direction."""

    def __init__(self, client: socket.socket, server: socket.socket, schedule: Schedule,
                 lateness: Lateness, retransmits: Retransmits):
        self._sockets = (client, server)
        self._retransmits = retransmits
        retransmits.track(client)
        self._running = 2
        self._lock = threading.Lock()
        for source, sink in ((client, server), (server, client)):
            direction = TcpDirection(source, sink, schedule, lateness)
            threading.Thread(target=self._pump, args=(direction,), daemon=True).start()

    def _pump(self, direction: TcpDirection) -> None:
        direction.run()
        with self._lock:
            self._running -= 1
            last = self._running == 0
        if last:
            self._retransmits.closing(self._sockets[0])
            for sock in self._sockets:
                sock.close()


def serve_tcp(listener: socket.socket, upstream: tuple[str, int], schedule: Schedule,
              lateness: Lateness, retransmits: Retransmits) -> None:
    """Accept clients forever, each relayed on its own upstream connection."""
    while True:
        client, _ = listener.accept()
        try:
            server = _nodelay(socket.create_connection(upstream, timeout=5))
            server.settimeout(None)
        except OSError:
            client.close()
            continue
        TcpConnection(_nodelay(client), server, schedule, lateness, retransmits)


class UdpRelay:
    """Datagrams both ways, each released at its own time; one upstream socket per client.

    The broker tells clients apart by source address, so each client address gets its
    own upstream socket (its own source port on the broker's side). One thread waits in
    select.select (microsecond timeouts), which caps a group at about 1,000 clients.
    """

    def __init__(self, listener: socket.socket, upstream: tuple[str, int], schedule: Schedule,
                 lateness: Lateness):
        self.listener, self.upstream = listener, upstream
        self.schedule, self.lateness = schedule, lateness
        self._sessions: dict[tuple[str, int], socket.socket] = {}
        self._client_of: dict[socket.socket, tuple[str, int]] = {}
        self._due: list[tuple[int, int, socket.socket, bytes, tuple[str, int] | None]] = []
        self._order = 0

    def serve(self) -> None:
        """Forever: read what is ready, send what is due."""
        while True:
            now = monotonic_ns()
            while self._due and self._due[0][0] <= now:
                due_ns, _, sock, data, target = heapq.heappop(self._due)
                self.lateness.add(monotonic_ns() - due_ns, len(data))
                with contextlib.suppress(OSError):  # a closed port: the datagram is lost
                    sock.send(data) if target is None else sock.sendto(data, target)
                now = monotonic_ns()
            timeout = (self._due[0][0] - now) / 1e9 if self._due else None
            readable, _, _ = select.select([self.listener, *self._client_of], [], [], timeout)
            for sock in readable:
                self._receive(sock)

    def _receive(self, sock: socket.socket) -> None:
        try:
            data, sender = sock.recvfrom(MAX_DATAGRAM)
        except OSError:
            return  # ICMP port unreachable from the broker: nothing to forward
        if sock is self.listener:
            self._push(data, self._session(sender), None)
        else:
            self._push(data, self.listener, self._client_of[sock])

    def _session(self, client: tuple[str, int]) -> socket.socket:
        if (sock := self._sessions.get(client)) is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.connect(self.upstream)
            self._sessions[client] = sock
            self._client_of[sock] = client
        return sock

    def _push(self, data: bytes, via: socket.socket, target: tuple[str, int] | None) -> None:
        self._order += 1
        heapq.heappush(self._due, (self.schedule.release_ns(monotonic_ns()), self._order, via,
                                   data, target))


def _parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _write_json(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Bind, say where (``--ready-file``), and relay until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m mqttbed.network.delay_proxy",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT, port 0 for any")
    parser.add_argument("--upstream", required=True, help="the broker, HOST:PORT")
    parser.add_argument("--transport", choices=("tcp", "udp"), required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one way, per direction")
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--stats-file", type=Path, required=True)
    parser.add_argument("--topology", required=True, help="the run's topology prefix (reaping)")
    args = parser.parse_args(argv)

    with contextlib.suppress(OSError, AttributeError):  # finer wake-ups where allowed
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    # A link delays packets in the kernel, ahead of any user process: on a busy machine
    # the proxy comes first too (as root), so others' load does not stretch its delay.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, PROXY_NICE)
    schedule = Schedule(args.delay_ms, args.jitter_ms, args.seed)
    lateness = Lateness()
    host, port = _parse_address(args.listen)
    if args.transport == "tcp":
        listener = _nodelay(socket.create_server((host, port), backlog=1024))
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        listener.bind((host, port))

    upstream = _parse_address(args.upstream)
    retransmits = Retransmits() if args.transport == "tcp" else None

    def relay() -> None:
        if retransmits is not None:
            serve_tcp(listener, upstream, schedule, lateness, retransmits)
        else:
            UdpRelay(listener, upstream, schedule, lateness).serve()

    def write_stats(*_: object) -> None:
        _write_json(args.stats_file, {
            "transport": args.transport, "delay_ms": args.delay_ms,
            "jitter_ms": args.jitter_ms, **lateness.summary(),
            "tcp_retransmits_to_clients": None if retransmits is None else retransmits.total()})

    def stop(*_: object) -> None:
        write_stats()
        os._exit(0)

    signal.signal(signal.SIGUSR1, write_stats)
    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=relay, name="relay", daemon=True).start()
    bound = listener.getsockname()
    _write_json(args.ready_file, {"host": bound[0], "port": bound[1], "pid": os.getpid()})
    threading.Event().wait()  # signals arrive on this (the main) thread
    return 0


if __name__ == "__main__":
    sys.exit(main())
