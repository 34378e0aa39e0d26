"""The adaptive broker as a TCP server: ``mqttbed broker run adaptive --port N [--policy ...]``.

One asyncio loop serves every connection (:class:`~.session.ClientSession`), sends the RTT
queries every ``--rtt-query-period-s``, and every ``--sample-interval-s`` drops silent
clients and samples the held payload bytes. Every ``--stats-interval-s`` it writes its
counters to ``--stats-file``, every :data:`RECORDS_INTERVAL_S` its samples (RTTs, withheld
durations, held bytes over time) to ``--records-file``, and both on SIGTERM or SIGINT
(then it exits 0), each through a temporary file and a rename. ``--ready-file``
receives the bound address, which is how the ``adaptive`` backend learns the port it got
with ``--port 0``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mqttbed.brokers.adaptive.broker import POLICIES, AdaptiveBroker, BrokerConfig
from mqttbed.brokers.adaptive.session import ClientSession
from mqttbed.brokers.fpga.server import write_json_atomically

logger = logging.getLogger("mqttbed.adaptive")

STATS_FORMAT = 1
RECORDS_INTERVAL_S = 5.0   # the samples grow over a run: rewritten less often than counters
_DEFAULTS = BrokerConfig()


class BrokerServer:
    """The broker, its listening socket and its periodic tasks."""

    def __init__(self, config: BrokerConfig, stats_file: Path | None = None,
                 records_file: Path | None = None, sample_interval_s: float = 0.2,
                 stats_interval_s: float = 1.0):
        self.broker = AdaptiveBroker(config)
        self.stats_file, self.records_file = stats_file, records_file
        self.sample_interval_s, self.stats_interval_s = sample_interval_s, stats_interval_s
        self.address: tuple[str, int] | None = None
        self.started_at = time.time()

    async def serve(self, host: str, port: int, ready_file: Path | None,
                    stop: asyncio.Event) -> None:
        """Listen on ``host:port`` and serve until ``stop`` is set."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: ClientSession(self.broker), host, port,
                                          reuse_address=True)
        self.address = server.sockets[0].getsockname()[:2]
        if ready_file is not None:
            write_json_atomically(ready_file, {"host": self.address[0], "port": self.address[1],
                                               "pid": os.getpid()})
        print(f"adaptive broker listening on tcp://{self.address[0]}:{self.address[1]} "
              f"(pid {os.getpid()}, policy {self.broker.config.policy}, lazy allocation "
              f"{self.broker.config.lazy_allocation})", flush=True)
        tasks = [asyncio.create_task(self._every(self.broker.config.rtt_query_period_s,
                                                 self.broker.query_round)),
                 asyncio.create_task(self._every(self.sample_interval_s,
                                                 self.broker.housekeeping)),
                 asyncio.create_task(self._every(self.stats_interval_s, self.write_counters)),
                 asyncio.create_task(self._every(max(RECORDS_INTERVAL_S, self.stats_interval_s),
                                                 self.write_records))]
        self.write_counters()
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            server.close()
            for session in list(self.broker.connections):
                session.abort()
            await asyncio.sleep(0)   # let connection_lost run: the queues are dropped
            self.write_counters()
            self.write_records()

    @staticmethod
    async def _every(period_s: float, action: Callable[[], None]) -> None:
        """Run ``action`` every ``period_s`` on a fixed schedule (no drift)."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += period_s
            await asyncio.sleep(max(0.0, due - loop.time()))
            try:
                action()
            except Exception:   # a bug in one round must not end the broker
                logger.exception("periodic %s failed", getattr(action, "__name__", action))

    def write_counters(self) -> None:
        """Write the counters (atomically)."""
        if self.stats_file is not None:
            write_json_atomically(self.stats_file, {
                "format": STATS_FORMAT, "broker": "adaptive", "pid": os.getpid(),
                "address": None if self.address is None else
                f"{self.address[0]}:{self.address[1]}",
                "started_at": self.started_at, "written_at": time.time(),
                **self.broker.counters_snapshot()})

    def write_records(self) -> None:
        """Write the samples (atomically)."""
        if self.records_file is not None:
            write_json_atomically(self.records_file, self.broker.records())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqttbed broker run adaptive",
        description="MQTT 3.1.1 broker with the cloud-edge paper's size-aware withholding of "
                    "large messages (RTT queries, three policies, starvation timer) and lazy "
                    "allocation; see mqttbed.brokers.adaptive.")
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to bind")
    add("--port", type=int, required=True, help="TCP port; 0 picks a free one")
    add("--policy", choices=POLICIES, default=_DEFAULTS.policy,
        help="none: first come, first served (the baseline)")
    add("--threshold-bytes", type=int, default=_DEFAULTS.threshold_bytes,
        help="payloads above this are large (threshold_s)")
    add("--threshold-l-s", type=float, default=_DEFAULTS.threshold_l_s,
        help="RTT of the uncongested link (threshold_l)")
    add("--starvation-s", type=float, default=_DEFAULTS.starvation_s,
        help="starvation timer D (conservative, probabilistic)")
    add("--rtt-query-period-s", type=float, default=_DEFAULTS.rtt_query_period_s,
        help="TQ: seconds between RTT queries")
    add("--rtt-query-bytes", type=int, default=_DEFAULTS.rtt_query_bytes)
    add("--rtt-query-timeout-s", type=float, default=_DEFAULTS.rtt_query_timeout_s)
    add("--congestion-rate-per-s", type=float, default=_DEFAULTS.congestion_rate_per_s,
        help="lambda of the probabilistic policy")
    add("--latency-scale", type=float, default=_DEFAULTS.latency_scale,
        help="a large message's latency over the query's (scales L_now and threshold_l)")
    add("--eager-allocation", action="store_true",
        help="copy each message per subscriber on arrival (the paper's baseline broker)")
    add("--query-subscribers", choices=("all", "opted_in"), default=_DEFAULTS.query_subscribers)
    add("--max-queued-messages", type=int, default=_DEFAULTS.max_queued_messages)
    add("--max-packet-bytes", type=int, default=_DEFAULTS.max_packet_bytes)
    add("--write-buffer-bytes", type=int, default=_DEFAULTS.write_buffer_bytes)
    add("--sample-interval-s", type=float, default=0.2,
        help="seconds between samples of the held bytes (and keep-alive checks)")
    add("--stats-interval-s", type=float, default=1.0)
    add("--stats-file", type=Path, help="counters as JSON, rewritten periodically and on exit")
    add("--records-file", type=Path, help="RTTs, withheld durations, held bytes over time")
    add("--ready-file", type=Path, help="write {host, port, pid} here once listening")
    add("--log-level", default="WARNING")
    return parser


def config_of(args: argparse.Namespace) -> BrokerConfig:
    """The broker configuration the parsed command line asks for."""
    return BrokerConfig(
        policy=args.policy, threshold_bytes=args.threshold_bytes,
        threshold_l_s=args.threshold_l_s, starvation_s=args.starvation_s,
        rtt_query_period_s=args.rtt_query_period_s, rtt_query_bytes=args.rtt_query_bytes,
        rtt_query_timeout_s=args.rtt_query_timeout_s,
        congestion_rate_per_s=args.congestion_rate_per_s, latency_scale=args.latency_scale,
        lazy_allocation=not args.eager_allocation, query_subscribers=args.query_subscribers,
        max_queued_messages=args.max_queued_messages, max_packet_bytes=args.max_packet_bytes,
        write_buffer_bytes=args.write_buffer_bytes)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the broker until SIGTERM/SIGINT; return the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = config_of(args)
    except ValueError as exc:
        print(f"adaptive: bad option: {exc}", file=sys.stderr)
        return 2
    server = BrokerServer(config, args.stats_file, args.records_file, args.sample_interval_s,
                          args.stats_interval_s)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await server.serve(args.host, args.port, args.ready_file, stop)

    try:
        asyncio.run(run())
    except OSError as exc:
        print(f"adaptive: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(Exception):
        counters = server.broker.counters_snapshot()
        print(f"adaptive broker stopped: {counters['publishes_received']} publishes in, "
              f"{counters['large_withheld']} large deliveries withheld, "
              f"{counters['rtt_queries_answered']}/{counters['rtt_queries_sent']} RTT queries "
              f"answered", flush=True)
    return 0
