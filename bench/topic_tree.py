"""Topic trees (issue 41): the engine's per-message cost against the tree's size K.

A publisher of the native engine spreads its messages over a tree of K topics
(``workload.topic_tree``: levels x fan-out under its topic, message k to topic k mod K), a
subscriber in the same process holds ``#`` under it, through one Mosquitto on loopback.
The figure is instructions per message (valgrind --tool=callgrind, the stable CPU figure
on a shared machine) of the publisher side and of the subscriber side, each the
difference of a ``--small`` and a ``--large`` run over the difference in messages
(bench/native_engine.py's P3b method: start-up, connection and close cancel out).

The baseline is the single topic the engine publishes to without a tree (K = 1). K runs
to 100,000; with ``--large`` messages fewer than K, every message of the large run goes to
a topic not seen before, the worst case: the publisher formats each name, the subscriber
interns each one. Target: the per-message cost does not grow with K (ratios ~1).

    .venv/bin/python bench/topic_tree.py [--small 2000] [--large 12000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, ratio  # noqa: E402
from native_engine import per_message  # noqa: E402

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options  # noqa: E402
from mqttbed.core.host import LocalHost  # noqa: E402
from mqttbed.core.protocol import Endpoint  # noqa: E402

# K = fanout ** levels: (levels, fanout)
TREES = {10: (1, 10), 1_000: (3, 10), 100_000: (5, 10)}


def sides(small: int, large: int, tree: str, endpoint: Endpoint) -> dict[str, float]:
    publisher = per_message("native", "publisher", small, large, endpoint, tree=tree)
    both = per_message("native", "both", small, large, endpoint, tree=tree)
    for run in (*publisher["counts"], *both["counts"]):
        print(f"  counts {tree or 'one topic'}: {run}", flush=True)
    return {"publisher": publisher["instructions_per_message"],
            "subscriber": both["instructions_per_message"]
            - publisher["instructions_per_message"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2000, help="messages, short run")
    parser.add_argument("--large", type=int, default=12000, help="messages, long run")
    args = parser.parse_args()
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(max_queued_messages=0), LocalHost())
    try:
        figures = {"one topic": sides(args.small, args.large, "", endpoint)}
        print(f"K=1: {figures['one topic']}", flush=True)
        for k, (levels, fanout) in TREES.items():
            figures[f"K={k}"] = sides(args.small, args.large, f"{levels},{fanout}", endpoint)
            print(f"K={k}: {figures[f'K={k}']}", flush=True)
    finally:
        backend.teardown()
    base = figures["one topic"]
    ratios = {f"{side} {name}": ratio(values[side], base[side])
              for name, values in figures.items() if name != "one topic"
              for side in ("publisher", "subscriber")}
    emit("topic_tree", "the engine on one topic (K = 1), instructions per message", ratios,
         {"instructions_per_message": figures, "small": args.small, "large": args.large})
    return 0


if __name__ == "__main__":
    sys.exit(main())
