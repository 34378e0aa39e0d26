"""``python -m mqttbed.brokers.mqttst node ...``: run one tree node beside a Mosquitto.

The node writes its counters (:meth:`.node.Node.counters_snapshot`) to ``--stats-file``
atomically, every ``--stats-interval`` while anything changed and once more on the way out;
``--ready-file`` receives ``{pid, link_port}`` once it listens on its link port and is
subscribed at its Mosquitto. SIGTERM or SIGINT stop it (exit 0); losing its Mosquitto
ends it with exit 3; a link port it cannot bind, with exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from mqttbed.brokers.fpga.server import write_json_atomically
from mqttbed.brokers.mqttst.capability import DEFAULT_ALPHA, DEFAULT_BETA, capability
from mqttbed.brokers.mqttst.node import TICK_S, Node, NodeConfig, Peer
from mqttbed.brokers.mqttst.tree import BrokerId

logger = logging.getLogger("mqttbed.mqtt-st")

EXIT_BIND_FAILED = 2
EXIT_LOCAL_LOST = 3


def _broker(text: str) -> BrokerId:
    try:
        return BrokerId.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _peer(text: str) -> Peer:
    try:
        return Peer.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mqttbed.brokers.mqttst node",
        description="An MQTT-ST tree node beside one Mosquitto (see mqttbed.brokers.mqttst.node).")
    parser.add_argument("--local", type=_broker, required=True, metavar="ADDRESS:PORT",
                        help="the Mosquitto this node serves; also its broker id")
    parser.add_argument("--link", required=True, metavar="ADDRESS:PORT",
                        help="where this node listens for links from other nodes")
    parser.add_argument("--peer", type=_peer, action="append", default=[],
                        metavar="ADDRESS:CLIENTPORT@LINKHOST:LINKPORT",
                        help="a neighbour (repeatable); the lower broker id of a pair dials")
    parser.add_argument("--member", type=_broker, action="append", metavar="ADDRESS:PORT",
                        help="a broker of the cluster (repeatable); if given, links and root "
                             "claims from anyone else are refused")
    parser.add_argument("--capability", type=float,
                        help="this broker's C; default alpha*L + beta*M of this machine")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help=f"weight of the CPU MHz in C (default {DEFAULT_ALPHA})")
    parser.add_argument("--beta", type=float, default=DEFAULT_BETA,
                        help=f"weight of the RAM MiB in C (default {DEFAULT_BETA})")
    parser.add_argument("--keepalive", type=_positive, default=10.0,
                        help="seconds between periodic BPDUs (default 10, the paper's)")
    parser.add_argument("--reconnect", type=_positive, default=1.0,
                        help="seconds between attempts to relink a lost neighbour")
    parser.add_argument("--hysteresis", type=float, default=0.2,
                        help="fraction by which a path must improve to move the root link")
    parser.add_argument("--index", type=int, help="this broker's index in its cluster")
    parser.add_argument("--stats-file", type=Path)
    parser.add_argument("--stats-interval", type=_positive, default=0.1)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--startup-timeout", type=_positive, default=10.0)
    parser.add_argument("--log-level", default="INFO")
    return parser


def config_from(args: argparse.Namespace) -> NodeConfig:
    """The NodeConfig the parsed options describe; ValueError names a bad value."""
    link = BrokerId.parse(args.link)
    own = args.capability if args.capability is not None else capability(args.alpha, args.beta)
    return NodeConfig(
        me=args.local, capability=own, local=(args.local.address, args.local.port),
        link=(link.address, link.port), peers=tuple(args.peer),
        members=None if args.member is None else frozenset([*args.member, args.local]),
        keepalive_s=args.keepalive, reconnect_s=args.reconnect, hysteresis=args.hysteresis,
        startup_timeout_s=args.startup_timeout, index=args.index)


async def serve(config: NodeConfig, stats_file: Path | None, stats_interval_s: float,
                ready_file: Path | None) -> int:
    """Run one node until SIGTERM/SIGINT (0) or the loss of its Mosquitto (3)."""
    node = Node(config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        server = await node.start()
    except ConnectionError as exc:   # no Mosquitto to serve
        print(f"mqtt-st node {config.me}: cannot start: {exc}", file=sys.stderr)
        return EXIT_LOCAL_LOST
    except OSError as exc:           # the link port: taken, or not an address of ours
        print(f"mqtt-st node {config.me}: cannot listen on {config.link}: {exc}",
              file=sys.stderr)
        return EXIT_BIND_FAILED
    if ready_file is not None:
        write_json_atomically(ready_file, {"pid": os.getpid(), "link_port": config.link[1]})
    written_version, written_at = -1, 0.0

    def write_counters(force: bool = False) -> None:
        nonlocal written_version, written_at
        now = loop.time()
        if stats_file is None or (not force and (node.version == written_version
                                                 or now - written_at < stats_interval_s)):
            return
        written_version, written_at = node.version, now
        write_json_atomically(stats_file, node.counters_snapshot())

    assert node.fatal is not None
    code = 0
    try:
        while not stop.is_set():
            node.tick()
            write_counters()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK_S)
            if node.fatal.done():
                logger.error("%s: stopping: %s", config.me, node.fatal.result())
                code = EXIT_LOCAL_LOST
                break
    finally:
        node.shut_down()
        server.close()
        await asyncio.sleep(0.01)   # let the DISCONNECTs go out
        write_counters(force=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run a node from the command line; return its exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"mqtt-st node: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(serve(config, args.stats_file, args.stats_interval, args.ready_file))
