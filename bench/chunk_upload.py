"""Event chunks on the agent: CPU to encode one upload, pydantic's serializer against the
``json.dumps`` of the chunk's fields it replaced (the baseline, run in this script).

A chunk as the native session builds it under P4 (per-publisher topics, 1,000 publishers):
5,000 deliveries, 13 columns, nanosecond stamps. Both encodings must give the same bytes
(checked; the bench fails otherwise). CPU seconds per chunk are the minimum over
``--rounds`` rounds of ``--repeat`` encodes each (``time.process_time``: this VM exposes no
instruction counter to ``perf stat``), and events per CPU-second follow from them.

    .venv/bin/python bench/chunk_upload.py [--events 5000] [--rounds 7] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mqttbed.core.protocol import PROTOCOL_VERSION, ResultChunk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, ratio  # noqa: E402

T0_NS = 1_795_000_000_000_000_000


def p4_chunk(events: int) -> ResultChunk:
    """Deliveries of publisher i on topic scale/t/i to subscriber i, 10 ms apart."""
    publishers = [i % 1000 for i in range(events)]
    sent = [T0_NS + i * 10_000 for i in range(events)]
    columns = {
        "kind": ["delivery"] * events, "publisher": [f"pub-{p}" for p in publishers],
        "seq": [i // 1000 for i in range(events)], "receiver": [f"sub-{p}" for p in publishers],
        "topic": [f"scale/t/{p}" for p in publishers], "payload_bytes": [64] * events,
        "qos": [0] * events, "warmup": [False] * events,
        "t_intended_ns": [t - 3_000 for t in sent], "t_pub_ns": sent,
        "t_recv_ns": [t + 91_000 for t in sent], "clock_source": ["kernel"] * events,
        "t_recv_user_ns": [t + 96_000 for t in sent]}
    return ResultChunk.model_construct(
        run_id="c0000000000000-r0000", agent_id="agent-1", seq=7, columns=columns,
        constants={"agent_id": "agent-1", "clock_offset_ns": 0,
                   "clock_offset_uncertainty_ns": 120},
        edges=None, edges_until_ns=None)


def cpu_per_call(encode: Callable[[], object], rounds: int, repeat: int) -> float:
    """The least CPU seconds one call took, over ``rounds`` rounds of ``repeat`` calls."""
    encode()
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(repeat):
            encode()
        best = min(best, (time.process_time() - started) / repeat)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000, help="rows per chunk (the agents' "
                                                                 "default chunk_events)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    chunk = p4_chunk(args.events)

    def baseline() -> str:   # what agents/uploader.py sent before
        return json.dumps({**vars(chunk), "protocol_version": PROTOCOL_VERSION},
                          separators=(",", ":"))

    def serializer() -> str:  # what it sends now
        return chunk.model_dump_json()

    body = serializer()
    same = baseline() == body
    base_s = cpu_per_call(baseline, args.rounds, args.repeat)
    new_s = cpu_per_call(serializer, args.rounds, args.repeat)
    print(f"{args.events} events, {len(body):,} bytes; identical bytes: {same}")
    print(f"  json.dumps          {base_s * 1e3:8.3f} ms CPU   {args.events / base_s:12,.0f} "
          f"events/CPU-s")
    print(f"  model_dump_json     {new_s * 1e3:8.3f} ms CPU   {args.events / new_s:12,.0f} "
          f"events/CPU-s")
    emit("chunk upload encode", "json.dumps of the chunk's fields",
         {"cpu_per_chunk": ratio(new_s, base_s)},
         {"events": args.events, "bytes": len(body), "identical_bytes": same,
          "baseline_ms": round(base_s * 1e3, 3), "serializer_ms": round(new_s * 1e3, 3),
          "target_met": same and new_s < base_s})
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
