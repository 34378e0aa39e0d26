"""The MQTT-SN gateway as a UDP server: one socket, one selector loop, counters in a file.

Run it with ``mqttbed broker run mqtt-sn --port N`` (or ``python -m
mqttbed.brokers.mqttsn --port N``). A plain non-blocking socket in a selector loop,
not asyncio: at 1 kHz to tens of subscribers every microsecond per datagram shows in
the latency, and the loop has nothing else to wait for. Every second, and on SIGTERM
or SIGINT (then it exits 0), it writes its counters as JSON to ``--stats-file``
(through a temporary file and a rename, so a reader never sees half of it).
``--ready-file`` receives the bound address, which is how the ``mqtt-sn`` backend
learns where the gateway listens when it asked for ``--port 0``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mqttbed.brokers.fpga.server import write_json_atomically
from mqttbed.brokers.mqttsn.gateway import Address, Gateway
from mqttbed.core.clock import monotonic_ns

logger = logging.getLogger("mqttbed.mqtt-sn")

MAX_DATAGRAM = 65_535
RECEIVE_BUFFER_BYTES = 4 << 20
TICK_S = 0.1
STATS_INTERVAL_S = 1.0
STATS_FORMAT = 1


class GatewayServer:
    """Serves one Gateway on one UDP socket until asked to stop."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 predefined: dict[int, str] | None = None):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        self.sock.bind((host, port))
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self.gateway = Gateway(self._sendto, predefined)
        self.receive_errors = 0
        self.internal_errors = 0
        self.started_at = time.time()

    def _sendto(self, datagram: bytes, address: Address) -> None:
        try:
            self.sock.sendto(datagram, address)
        except OSError as exc:   # a full buffer or an ICMP error queued for that peer
            self.gateway.counters.send_errors += 1
            logger.debug("send to %s failed: %s", address, exc)

    def serve(self, should_stop: Callable[[], bool],
              on_tick: Callable[[], None] = lambda: None) -> None:
        """Answer datagrams until ``should_stop()``; tick the gateway every ``TICK_S``."""
        next_tick = time.monotonic() + TICK_S
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            while not should_stop():
                if selector.select(max(0.0, next_tick - time.monotonic())):
                    self.drain()
                if time.monotonic() >= next_tick:
                    self.gateway.tick(monotonic_ns())
                    on_tick()
                    next_tick = time.monotonic() + TICK_S

    def drain(self) -> None:
        """Answer every datagram already waiting."""
        while True:
            try:
                datagram, source = self.sock.recvfrom(MAX_DATAGRAM)
            except BlockingIOError:
                return
            except OSError as exc:   # e.g. an ICMP port unreachable from a gone client
                self.receive_errors += 1
                logger.debug("receive error: %s", exc)
                return
            try:
                self.gateway.handle(datagram, source, monotonic_ns())
            except Exception:  # noqa: BLE001 - a bug drops one datagram, never the gateway
                self.internal_errors += 1
                self.gateway.counters.drop("internal error", source)
                logger.exception("internal error on a datagram from %s", source)

    def counters_snapshot(self) -> dict[str, Any]:
        """Counters, sessions and topics, as JSON-able data."""
        return {
            "format": STATS_FORMAT,
            "broker": "mqtt-sn",
            "pid": os.getpid(),
            "address": f"{self.address[0]}:{self.address[1]}",
            "started_at": self.started_at,
            "written_at": time.time(),
            **self.gateway.counters.as_dict(),
            "receive_errors": self.receive_errors,
            "internal_errors": self.internal_errors,
            "sessions": len(self.gateway.sessions),
            "topics": self.gateway.topic_count(),
            "predefined": {str(k): v for k, v in self.gateway.predefined.items()},
        }

    def close(self) -> None:
        self.sock.close()


def predefined_topic(text: str) -> tuple[int, str]:
    """Parse ``ID=NAME`` (``--predefined``): a topic id 1..65534 and a name."""
    topic_id, sep, name = text.partition("=")
    try:
        value = int(topic_id, 0)
    except ValueError:
        value = -1
    if not sep or not name or not 1 <= value <= 0xFFFE:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ID=NAME with ID in 1..65534, "
                                         "e.g. 1=sensors/temp")
    return value, name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqttbed broker run mqtt-sn",
        description="MQTT-SN 1.2 gateway/broker over UDP (QoS -1, 0, 1; see "
                    "mqttbed.brokers.mqttsn.gateway for what it implements).")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, required=True, help="UDP port; 0 picks a free one")
    parser.add_argument("--stats-file", type=Path,
                        help=f"write counters here every {STATS_INTERVAL_S:.0f} s and on exit")
    parser.add_argument("--ready-file", type=Path,
                        help="write {host, port, pid} here once the socket is bound")
    parser.add_argument("--predefined", type=predefined_topic, action="append", default=[],
                        metavar="ID=NAME", help="a pre-defined topic id (repeatable)")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gateway until SIGTERM/SIGINT; return the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        server = GatewayServer(args.host, args.port, dict(args.predefined))
    except (ValueError, OSError) as exc:
        print(f"mqtt-sn: cannot start: {exc}", file=sys.stderr)
        return 2
    stopping = False
    written_at = 0.0

    def dump_counters(force: bool = False) -> None:
        nonlocal written_at
        if args.stats_file is None or (
                not force and time.monotonic() - written_at < STATS_INTERVAL_S):
            return
        write_json_atomically(args.stats_file, server.counters_snapshot())
        written_at = time.monotonic()

    def on_stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    host, port = server.address
    if args.ready_file is not None:
        write_json_atomically(args.ready_file, {"host": host, "port": port, "pid": os.getpid()})
    print(f"mqtt-sn gateway listening on udp://{host}:{port} (pid {os.getpid()})", flush=True)
    dump_counters(force=True)
    try:
        server.serve(lambda: stopping, on_tick=dump_counters)
        server.drain()   # what arrived before the stop signal is answered and counted
    finally:
        dump_counters(force=True)
        server.close()
    counters = server.gateway.counters
    print(f"mqtt-sn gateway stopped: {counters.received} datagrams in, {counters.sent} out, "
          f"{counters.dropped} dropped", flush=True)
    return 0
