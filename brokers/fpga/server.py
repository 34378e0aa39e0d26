"""The FPGA broker model as a UDP server: one socket, one loop, stats on the way out.

Run it with ``mqttbed broker run fpga --port N`` (or ``python -m
mqttbed.brokers.fpga --port N``). For every packet it records the emulator's measured
latency (datagram received to each copy handed to the kernel, CLOCK_MONOTONIC) beside the
modelled hardware latency (:mod:`.timing`). On SIGTERM or SIGINT it writes its counters,
table occupancy and latency statistics as JSON to ``--stats-file`` and exits 0; SIGUSR1
writes the same file without stopping. ``--ready-file`` receives the bound address once
the socket is bound (``--port 0`` picks a free port), which is how the ``fpga`` backend
learns where the model listens without racing for a port.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mqttbed.brokers.fpga.model import MALFORMED, UNSUPPORTED, BrokerModel
from mqttbed.brokers.fpga.tables import DEFAULT_PROBE_WINDOW, PAPER_DEPTH_WORDS, TopicTables
from mqttbed.brokers.fpga.timing import PipelineTiming
from mqttbed.core.clock import monotonic_ns

logger = logging.getLogger("mqttbed.fpga-model")

MAX_DATAGRAM = 65_535
LATENCY_SAMPLES_KEPT = 200_000
# How stale the live byte counters (--io-file) may be: a quarter of the default sampling
# interval of the backend's resource sampler.
IO_FILE_INTERVAL_S = 0.05
RECEIVE_BUFFER_BYTES = 4 << 20
STATS_FORMAT = 1


class LatencyLog:
    """Per-packet latencies (ns) of one kind, the most recent ``keep`` of them."""

    FIELDS = ("measured_first_copy", "measured_last_copy", "measured_spread",
              "modelled_first_copy", "modelled_last_copy", "modelled_spread", "copies")

    def __init__(self, keep: int = LATENCY_SAMPLES_KEPT):
        self.packets = 0
        self._columns: dict[str, deque[float]] = {f: deque(maxlen=keep) for f in self.FIELDS}

    def add(self, measured_first: int, measured_last: int, modelled: Sequence[float]) -> None:
        self.packets += 1
        row = (measured_first, measured_last, measured_last - measured_first,
               modelled[0], modelled[-1], modelled[-1] - modelled[0], len(modelled))
        for name, value in zip(self.FIELDS, row, strict=True):
            self._columns[name].append(value)

    def values(self) -> dict[str, list[float]]:
        """The kept per-packet values, per field, oldest first."""
        return {name: list(values) for name, values in self._columns.items()}

    def summary(self) -> dict[str, Any]:
        return {"packets": self.packets,
                "samples": len(self._columns["copies"]),
                **{name: describe_values(values) for name, values in self._columns.items()}}


def describe_values(values: deque[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    count = len(ordered)
    return {"mean": sum(ordered) / count, "p50": ordered[count // 2],
            "p99": ordered[min(count - 1, (count * 99) // 100)], "max": ordered[-1]}


class FpgaModelServer:
    """Serves one BrokerModel on one UDP socket until asked to stop."""

    def __init__(self, model: BrokerModel, host: str = "127.0.0.1", port: int = 0,
                 timing: PipelineTiming | None = None):
        self.model = model
        self.timing = timing or PipelineTiming()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        self.sock.bind((host, port))
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self.latency: dict[str, LatencyLog] = {}
        self.counters = {"datagrams_in": 0, "bytes_in": 0, "datagrams_out": 0,
                         "bytes_out": 0, "send_errors": 0, "receive_errors": 0,
                         "internal_errors": 0}
        self.started_ns = monotonic_ns()
        self.started_at = time.time()

    def serve(self, should_stop: Callable[[], bool], poll_s: float = 0.1,
              on_tick: Callable[[], None] = lambda: None) -> None:
        """Receive and answer datagrams until ``should_stop()`` is true.

        ``on_tick`` runs after every wake-up (a batch of datagrams, or ``poll_s`` idle).
        """
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            while not should_stop():
                if selector.select(poll_s):
                    self.drain()
                on_tick()

    def io_counters(self) -> dict[str, int]:
        """UDP payload bytes in and out so far (what a resource sampler cannot see)."""
        return {"bytes_in": self.counters["bytes_in"], "bytes_out": self.counters["bytes_out"]}

    def drain(self) -> None:
        """Answer every datagram already waiting (each wake-up, and once more at stop)."""
        sock, counters = self.sock, self.counters
        while True:
            try:
                datagram, source = sock.recvfrom(MAX_DATAGRAM)
            except BlockingIOError:
                return
            except OSError as exc:           # e.g. a queued ICMP error; never fatal
                counters["receive_errors"] += 1
                logger.debug("receive error: %s", exc)
                return
            t_received = monotonic_ns()
            counters["datagrams_in"] += 1
            counters["bytes_in"] += len(datagram)
            try:
                self._answer(datagram, source, t_received)
            except Exception:  # noqa: BLE001 - the model drops a datagram, it never dies
                counters["internal_errors"] += 1
                logger.exception("internal error on a datagram from %s", source)

    def _answer(self, datagram: bytes, source: tuple[str, int], t_received: int) -> None:
        outcome = self.model.handle(datagram, source)
        packet = outcome.packet
        if packet is None or not outcome.destinations:
            if outcome.kind in (MALFORMED, UNSUPPORTED):
                logger.debug("dropped datagram from %s: %s", source, outcome.reason)
            return
        sock, counters = self.sock, self.counters
        t_first = 0
        sent = 0
        for destination in outcome.destinations:
            try:
                sock.sendto(packet, destination.address)
                sent += 1
            except OSError:
                counters["send_errors"] += 1
            if not t_first:
                t_first = monotonic_ns()
        t_last = monotonic_ns()
        counters["datagrams_out"] += sent
        counters["bytes_out"] += sent * len(packet)
        # The modelled timing is computed after the sends, so it costs the emulator nothing.
        if outcome.kind == "publish":
            modelled = self.timing.copy_send_ns([d.name_index for d in outcome.destinations],
                                                len(packet))
        else:
            modelled = [self.timing.reply_ns()]
        log = self.latency.get(outcome.kind)
        if log is None:
            log = self.latency[outcome.kind] = LatencyLog()
        log.add(t_first - t_received, t_last - t_received, modelled)

    def counters_snapshot(self) -> dict[str, Any]:
        """Return counters, table occupancy, latencies and the timing model, as JSON-able data."""
        return {
            "format": STATS_FORMAT,
            "model": "fpga-model",
            "pid": os.getpid(),
            "address": f"{self.address[0]}:{self.address[1]}",
            "started_at": self.started_at,
            "uptime_s": (monotonic_ns() - self.started_ns) / 1e9,
            "counters": {**self.counters, **dict(self.model.counters)},
            "malformed_reasons": dict(self.model.malformed_reasons.most_common(20)),
            "tables": self.model.tables.occupancy(),
            "latency_ns": {kind: log.summary() for kind, log in self.latency.items()},
            "timing_model": self.timing.describe().model_dump(),
        }

    def records(self) -> dict[str, Any]:
        """Per packet kind: the packets counted and the kept per-packet values."""
        return {kind: {"packets": log.packets, "values": log.values()}
                for kind, log in self.latency.items()}

    def close(self) -> None:
        self.sock.close()


def write_json_atomically(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` through a temporary file, so readers never see half."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document, indent=2))
    os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqttbed broker run fpga",
        description="Behavioural model of the FPGA MQTT broker (MQTT 3.1.1 over UDP, QoS 0).")
    parser.add_argument("--host", default="127.0.0.1", help="IPv4 address to bind "
                        "(the hardware's Subscriber Table holds IPv4 destinations only)")
    parser.add_argument("--port", type=int, required=True, help="UDP port; 0 picks a free one")
    parser.add_argument("--stats-file", type=Path,
                        help="write counters and latencies here on SIGTERM/SIGINT/SIGUSR1")
    parser.add_argument("--records-file", type=Path,
                        help="write the kept per-packet latencies here when stopping")
    parser.add_argument("--io-file", type=Path,
                        help="keep {bytes_in, bytes_out} here, rewritten at most every "
                             f"{IO_FILE_INTERVAL_S * 1000:.0f} ms while they change")
    parser.add_argument("--ready-file", type=Path,
                        help="write {host, port, pid} here once the socket is bound")
    parser.add_argument("--topic-table-depth", type=int, default=PAPER_DEPTH_WORDS)
    parser.add_argument("--subscriber-table-depth", type=int, default=PAPER_DEPTH_WORDS)
    parser.add_argument("--probe-window", type=int, default=DEFAULT_PROBE_WINDOW,
                        help="words a key may sit from its home word (see tables.py)")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the model until SIGTERM/SIGINT; return the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        tables = TopicTables(args.topic_table_depth, args.subscriber_table_depth,
                             args.probe_window)
        server = FpgaModelServer(BrokerModel(tables), args.host, args.port)
    except (ValueError, OSError) as exc:
        print(f"fpga-model: cannot start: {exc}", file=sys.stderr)
        return 2
    stopping = False

    def dump_counters() -> None:
        if args.stats_file is not None:
            write_json_atomically(args.stats_file, server.counters_snapshot())

    def on_stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGUSR1, lambda _s, _f: dump_counters())
    host, port = server.address
    if args.ready_file is not None:
        write_json_atomically(args.ready_file, {"host": host, "port": port, "pid": os.getpid()})
    print(f"fpga-model listening on udp://{host}:{port} (pid {os.getpid()})", flush=True)
    io_written: dict[str, Any] = {"at": 0.0, "counters": None}

    def write_io(force: bool = False) -> None:
        now = time.monotonic()
        counters = server.io_counters()
        if args.io_file is None or counters == io_written["counters"] or (
                not force and now - io_written["at"] < IO_FILE_INTERVAL_S):
            return
        write_json_atomically(args.io_file, counters)
        io_written.update(at=now, counters=counters)

    write_io(force=True)
    try:
        server.serve(lambda: stopping, poll_s=IO_FILE_INTERVAL_S, on_tick=write_io)
        server.drain()  # what arrived before the stop signal is answered and counted
    finally:
        write_io(force=True)
        dump_counters()
        if args.records_file is not None:
            write_json_atomically(args.records_file, server.records())
        server.close()
    print(f"fpga-model stopped: {server.counters['datagrams_in']} datagrams in, "
          f"{server.counters['datagrams_out']} out, "
          f"{server.model.counters['dropped_malformed']} malformed dropped", flush=True)
    return 0
