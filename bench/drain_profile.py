"""The native session's drain: CPU per event it spends turning the engine's tables into the
uploader's batches and the GPIO log's edges (issue 27), and what the uploader's edge
hand-off then costs.

One agent process: ``--publishers`` QoS 0 open-loop publishers of one native session at a
rate no loop keeps, for ``--seconds``, to one Mosquitto on loopback, nobody subscribed,
on VirtualGpio lines (one edge per publish), its drains recorded as binary batches (what
the uploader takes). cProfile runs over the whole session; the figure is the cumulative
time of ``NativeSession._drain`` over the events it drained, with its callees (the event
tables, the GPIO edges) beside it. On a shared machine this is the stable figure:
msgs/s and CPU % move with the other work, the CPU a drain takes per event does not.
Afterwards the uploader's side of the edges is timed without the profiler: the GPIO log's
edges as the uploader's callable hands them over (``GpioLines.edge_buffers`` where there
is one, else ``edge_columns``), and as lists (``edge_columns``, the JSON chunk's form).

    .venv/bin/python bench/drain_profile.py [--seconds 3] [--publishers 10] [--runs 2]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, load_average  # noqa: E402
from publish_capacity import timed_publishers  # noqa: E402

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options  # noqa: E402
from mqttbed.core.host import LocalHost  # noqa: E402


def profile_once(host: str, port: int, seconds: float, publishers: int) -> dict[str, Any]:
    """One profiled run: the drain's CPU per event and its callees' shares."""
    from mqttbed.agents.gpio import VirtualGpio

    batches: list = []
    gpio = VirtualGpio()
    profiler = cProfile.Profile()
    profiler.enable()
    session, figures = timed_publishers(host, port, seconds, publishers, 10_000_000.0,
                                        gpio=gpio, record=lambda _e: None,
                                        record_binary=batches.append)
    profiler.disable()
    assert session.native, session.generator_report().mqtt_client_reason
    events = sum(batch.rows for batch in batches)
    raw: dict = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    drain = next(key for key in raw if key[2] == "_drain"
                 and key[0].endswith("native_session.py"))
    drain_s = raw[drain][3]
    callees = {f"{Path(key[0]).name}:{key[2]}": round(callers[drain][3], 4)
               for key, (_cc, _nc, _tt, _ct, callers) in raw.items() if drain in callers}
    # the uploader's side, unprofiled: hand the recorded edges over as the uploader does
    cpu0 = time.process_time()
    # (edge_columns, add_edges: the GPIO log before its edges were kept as bytes; the
    # same script measured both sides of that change)
    take = getattr(gpio, "edge_buffers", None) or gpio.edge_columns
    handed = take()
    hand_s = time.process_time() - cpu0
    edges = (len(handed[0]) if isinstance(handed, tuple) else handed.rows)
    return {"events": events, "edges": edges, "msgs_per_s": round(figures["sent"]
                                                                  / figures["seconds"]),
            "drain_s": round(drain_s, 4),
            "drain_ns_per_event": round(1e9 * drain_s / max(events, 1), 1),
            "drain_callees_s": dict(sorted(callees.items(), key=lambda kv: -kv[1])[:6]),
            "edge_handoff_ns_per_edge": round(1e9 * hand_s / max(edges, 1), 1),
            "load_average": load_average()}


def lists_cost(publishers: int, edges: int) -> float:
    """ns per edge of ``edge_columns`` (lists, a JSON chunk's form) over native edges."""
    from array import array

    from mqttbed.agents.gpio import VirtualGpio

    gpio = VirtualGpio()
    pins = array("i", [2 + i % publishers for i in range(edges)])
    times = array("q", range(edges))
    levels = array("B", [i % 2 for i in range(edges)])
    if hasattr(gpio, "add_edge_buffers"):
        gpio.add_edge_buffers(pins.tobytes(), times.tobytes(), levels.tobytes())
    else:
        gpio.add_edges(pins.tolist(), times.tolist(), levels.tolist())
    cpu0 = time.process_time()
    gpio.edge_columns()
    return round(1e9 * (time.process_time() - cpu0) / max(edges, 1), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--publishers", type=int, default=10)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(), LocalHost())
    try:
        runs = [profile_once(endpoint.host, endpoint.port, args.seconds, args.publishers)
                for _ in range(args.runs)]
    finally:
        backend.teardown()
    for run in runs:
        run["edges_as_lists_ns_per_edge"] = lists_cost(args.publishers, run["edges"])
        print(f"{run['events']:9d} events {run['msgs_per_s']:9d} msgs/s  drain "
              f"{run['drain_s']:.3f} s = {run['drain_ns_per_event']:6.1f} ns/event  edge "
              f"hand-off {run['edge_handoff_ns_per_edge']:6.1f} ns/edge (as lists "
              f"{run['edges_as_lists_ns_per_edge']:.1f})  load {run['load_average']}")
        print("   drain's callees (s):", run["drain_callees_s"])
    emit("native drain CPU per event (issue 27)", None, {}, {"runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
