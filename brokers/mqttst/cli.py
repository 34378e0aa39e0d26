"""``mqttbed broker run mqtt-st``: an MQTT-ST cluster in the foreground, until Ctrl-C or SIGTERM.

Starts K brokers on ports P..P+K-1 (:class:`.cluster.Cluster`), prints one line
``converged root=<i>`` on standard output once the tree is built, and another each time
it is rebuilt around a different root or epoch (after a broker is killed by hand, say).
Everything else (where the brokers listen, a broker that died) goes to standard error.
SIGTERM or SIGINT stops every process it started and removes its files.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mqttbed.brokers.mqttst.capability import DEFAULT_ALPHA, DEFAULT_BETA
from mqttbed.brokers.mqttst.cluster import TOPOLOGIES, Cluster, TreeOptions
from mqttbed.core.errors import BackendError

WATCH_INTERVAL_S = 0.1


def _capability(text: str) -> tuple[int, float]:
    index, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError(text)
        return int(index), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected I=C, e.g. 2=5000 (broker 2 "
                                         "gets capability 5000)") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqttbed broker run mqtt-st",
        description="K Mosquitto brokers joined by MQTT-ST tree nodes (a spanning tree, "
                    "Longo et al.); prints 'converged root=<i>' once the tree is built.")
    parser.add_argument("--brokers", type=int, required=True, help="how many brokers (K)")
    parser.add_argument("--port", type=int, required=True,
                        help="client port of broker 0; broker i listens on PORT+i")
    parser.add_argument("--address", default="127.0.0.1", help="address every broker binds")
    parser.add_argument("--topology", default="full-mesh",
                        help=f"{', '.join(TOPOLOGIES)}, or links like 0-1,1-2")
    parser.add_argument("--keepalive", type=float, default=10.0,
                        help="seconds between periodic BPDUs (default 10, the paper's)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help=f"C weight per CPU MHz (default {DEFAULT_ALPHA})")
    parser.add_argument("--beta", type=float, default=DEFAULT_BETA,
                        help=f"C weight per MiB of RAM (default {DEFAULT_BETA})")
    parser.add_argument("--capability", type=_capability, action="append", default=[],
                        metavar="I=C", help="broker I's capability (repeatable)")
    parser.add_argument("--reconnect", type=float, default=1.0,
                        help="seconds between attempts to relink a lost neighbour")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the first tree")
    parser.add_argument("--workdir", type=Path, help="keep the brokers' files here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cluster until SIGTERM/SIGINT; return the exit code."""
    args = build_parser().parse_args(argv)
    try:
        options = TreeOptions(keepalive_s=args.keepalive, alpha=args.alpha, beta=args.beta,
                              capabilities=dict(args.capability) or None,
                              reconnect_s=args.reconnect)
        cluster = Cluster(args.brokers, args.port, args.topology, options, args.workdir,
                          args.address)
    except ValueError as exc:
        print(f"mqtt-st: {exc}", file=sys.stderr)
        return 2
    stopping = False

    def on_stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    try:
        cluster.start()
        last = args.port + args.brokers - 1
        print(f"mqtt-st: {args.brokers} brokers on {args.address}:{args.port}..{last} "
              f"({args.topology}); waiting for the tree", file=sys.stderr, flush=True)
        root = cluster.wait_converged(args.timeout)
        print(f"converged root={root}", flush=True)
        _watch(cluster, root, lambda: stopping)
    except BackendError as exc:
        print(f"mqtt-st: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
    print("mqtt-st: stopped", file=sys.stderr, flush=True)
    return 0


def _watch(cluster: Cluster, root: int, should_stop: Callable[[], bool]) -> None:
    """Print a line per rebuilt tree (a new root or epoch) and each broken broker, once."""
    printed = (root, _epochs(cluster))
    reported: set[str] = set()
    while not should_stop():
        time.sleep(WATCH_INTERVAL_S)
        if (broken := cluster.health()) is not None and broken not in reported:
            reported.add(broken)
            print(f"mqtt-st: {broken}", file=sys.stderr, flush=True)
        now = cluster.converged_root()
        if now is not None and (now, _epochs(cluster)) != printed:
            printed = (now, _epochs(cluster))
            print(f"converged root={now}", flush=True)


def _epochs(cluster: Cluster) -> frozenset[int]:
    return frozenset(state["epoch"] for state in cluster.states() if state is not None)
