"""The native load engine (issue 27): P3 publish capacity, P3b instructions per message.

P3: QoS 0, 100-byte payloads, nobody subscribed, one Mosquitto on loopback; what one
agent process sends per second with the native engine (``--publishers`` open-loop
publishers at a rate no loop keeps, events recorded as in a run: binary batches of the
engine's column buffers, as the uploader takes them; the CPU its thread then spends
encoding them and the GPIO edges into binary chunks is reported per event beside it) against a paho
``publish()`` loop, each in a process of its own (bench/publish_capacity.py's baseline).
CPU of the publishing process and of Mosquitto over the window (psutil) shows which
saturates first. Target: >= 10x, Mosquitto >= 90 % of a core while the engine's process
stays <= 50 %.

P3b: instructions per message (valgrind --tool=callgrind, the stable CPU figure on a
shared machine) of the engine against the lean Python client, publisher side (one
publisher, nobody subscribed) and subscriber side (a publisher and a subscriber in the
process, minus the publisher side). Each figure is the difference between two runs of
``--small`` and ``--large`` messages over the difference in messages, with
instrumentation switched on once the clients are connected: start-up, connection and
close cancel out, and only the run is counted (not the close, not the interpreter's
exit). Target: <= 0.15x the lean client.

P1: latency p50/p99 from the send time to each delivery's receive time (both user space,
CLOCK_MONOTONIC), 1 publisher -> 1 and 10 subscribers at 100 Hz and 1 kHz, QoS 0, through
one Mosquitto: the engine in an agent process against a minimal C client
(bench/c/pingfloor.c: blocking sockets, one ppoll() loop; the floor). Target: p50 <= 1.1x,
p99 <= 1.3x the floor. The engine's kernel-stamped latency is printed beside it. Each point
runs ``--p1-rounds`` times, floor and engine alternately; the ratio is the median of the
rounds' ratios.

    .venv/bin/python bench/native_engine.py [--seconds 5] [--publishers 10] [--skip-p3b]
        [--skip-p1] [--p1-seconds 2] [--p1-rounds 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, ratio  # noqa: E402
from publish_capacity import measure, paho_publisher, timed_publishers  # noqa: E402

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options  # noqa: E402
from mqttbed.core.host import LocalHost  # noqa: E402
from mqttbed.core.protocol import Endpoint  # noqa: E402

PAYLOAD_BYTES = 100
HERE = Path(__file__).resolve()


def native_publisher(host: str, port: int, seconds: float, publishers: int,
                     out: mp.Queue) -> None:
    from mqttbed.agents.gpio import VirtualGpio
    from mqttbed.agents.uploader import split_batches
    from mqttbed.core.binary_chunk import encode_chunk

    batches: list = []
    gpio = VirtualGpio()
    session, figures = timed_publishers(host, port, seconds, publishers, 10_000_000.0,
                                        gpio=gpio, record=lambda _e: None,
                                        record_binary=batches.append)
    assert session.native, session.generator_report().mqtt_client_reason
    # what the uploader's thread then does with them: binary chunks of 5,000 events, the
    # GPIO log's edges (the engine's bytes) with the first
    events = sum(b.rows for b in batches)
    cpu0 = time.process_time()
    edges = gpio.edge_buffers()
    for seq, chunk in enumerate(split_batches(batches, 5000)):
        encode_chunk(run_id="r", agent_id="a", seq=seq, batches=chunk, constants={},
                     edges=None if seq else edges)
    encode_s = time.process_time() - cpu0
    out.put(figures | {"events_recorded": events, "edges_recorded": edges.rows,
                       "chunk_encode_cpu_ns_per_event": round(1e9 * encode_s / max(events, 1),
                                                              1)})


# -- P3b: one measured process under callgrind -----------------------------------------

def measured_process(client: str, side: str, messages: int, endpoint_json: str,
                     protocol: str = "3.1.1", rate_hz: float = 5000.0, tree: str = "") -> None:
    """Connect, say "ready", wait for "go" (instrumentation on), run ``messages``, say
    "ran" and wait (instrumentation off) before closing: connecting, closing and the
    interpreter's exit are not the hot path. ``tree`` ("LEVELS,FANOUT"): the publisher
    spreads its messages over a topic tree, the subscriber holds ``#`` under it."""
    from mqttbed.agents.gpio import VirtualGpio
    from mqttbed.agents.mqtt_session import MqttSession
    from mqttbed.core.clock import monotonic_ns
    from mqttbed.core.protocol import ClientAssignment, PublishedTree, Role

    spread = None
    if tree:
        levels, fanout = (int(n) for n in tree.split(","))
        spread = PublishedTree(levels=levels, fanout=fanout)
    clients = [ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="cg/x", qos=0,
                                gpio_pin=2, payload_bytes=PAYLOAD_BYTES, rate_hz=rate_hz,
                                messages=messages, topic_tree=spread)]
    if side == "both":
        clients.append(ClientAssignment(client_id="sub-0", role=Role.SUBSCRIBER,
                                        topic="cg/x/#" if tree else "cg/x", qos=0,
                                        gpio_pin=3, expected_messages=messages))
    events: list = []
    session = MqttSession(Endpoint.model_validate_json(endpoint_json), clients, VirtualGpio(),
                          events.append, mqtt_client=client, record_columns=events.append,
                          protocol="5" if protocol == "5" else "3.1.1")
    session.connect(timeout_s=60)
    print("ready", flush=True)
    sys.stdin.readline()
    start = monotonic_ns() + 1_000_000
    session.run(start, start + 600_000_000_000, abort=lambda: False)
    print("ran", flush=True)
    sys.stdin.readline()
    counts = session.counts()
    session.close()
    print(json.dumps({"counts": counts}), flush=True)


def callgrind_instructions(client: str, side: str, messages: int, endpoint: Endpoint,
                           protocol: str = "3.1.1", rate_hz: float = 5000.0,
                           calls_of: tuple[str, ...] = (), tree: str = ""
                           ) -> tuple[int, list, dict[str, tuple[int, int]]]:
    """Instructions the measured process ran from "go" to "ran" (its run), its counts, and
    the calls to each function of ``calls_of`` meanwhile with their inclusive instructions;
    the endpoint (with its TLS and WebSocket path, all public) travels as JSON on the
    command line."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out_file}", sys.executable, str(HERE), "--measured",
                client, side, str(messages), endpoint.model_dump_json(), protocol,
                str(rate_hz), tree]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"measured process said {line!r}: {proc.stderr.read()[-2000:]}")
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True,
                       capture_output=True, timeout=120)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if line.strip() != "ran":
            raise RuntimeError(f"measured process said {line!r}: {proc.stderr.read()[-2000:]}")
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True,
                       capture_output=True, timeout=120)
        proc.stdin.write("close\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"measured process failed: {err[-2000:]}")
        counts = json.loads(out.strip().splitlines()[-1])["counts"]
        # "totals:" is the count; the header's "summary:" reads 0 when instrumentation
        # started switched off
        lines = out_file.read_text().splitlines()
        totals = [line for line in lines if line.startswith("totals:")]
        return int(re.split(r"\s+", totals[-1])[1]), counts, calls_to(lines, calls_of)


def calls_to(lines: list[str], names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Calls to each of ``names`` in a callgrind output and their inclusive instructions:
    the ``calls=`` line after each ``cfn=`` naming it, and the cost line after that (names
    are compressed: ``(id) name`` once, ``(id)`` after)."""
    ids: dict[str, str] = {}
    calls = dict.fromkeys(names, (0, 0))
    callee: str | None = None
    lines_iter = iter(lines)
    for line in lines_iter:
        if line.startswith(("fn=", "cfn=")):
            key, _, name = line.split("=", 1)[1].partition(" ")
            if name:
                ids[key] = name
            callee = ids.get(key) if line.startswith("cfn=") else None
        elif line.startswith("calls=") and callee in calls:
            count, inclusive = calls[callee]
            # the next line: the call's position, then its cost (events: Ir alone)
            cost = next(lines_iter).split()[-1]
            calls[callee] = (count + int(line[6:].split()[0]), inclusive + int(cost))
            callee = None
    return calls


def per_message(client: str, side: str, small: int, large: int, endpoint: Endpoint,
                protocol: str = "3.1.1", rate_hz: float = 5000.0,
                calls_of: tuple[str, ...] = (), tree: str = "") -> dict:
    """Instructions (and calls of ``calls_of``) per message: two run lengths differenced
    (start-up and close cancel)."""
    few, few_counts, few_calls = callgrind_instructions(client, side, small, endpoint,
                                                        protocol, rate_hz, calls_of, tree)
    many, many_counts, many_calls = callgrind_instructions(client, side, large, endpoint,
                                                           protocol, rate_hz, calls_of, tree)
    return {"instructions_per_message": (many - few) / (large - small),
            # per message: (calls, their inclusive instructions)
            "calls_per_message": {name: tuple((many_calls[name][i] - few_calls[name][i])
                                              / (large - small) for i in (0, 1))
                                  for name in calls_of},
            "calls": [few_calls, many_calls],
            "counts": [few_counts, many_counts]}


def p3b(small: int, large: int) -> dict:
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(max_queued_messages=0), LocalHost())
    try:
        figures = {}
        for client in ("native", "lean"):
            publisher = per_message(client, "publisher", small, large, endpoint)
            both = per_message(client, "both", small, large, endpoint)
            figures[client] = {
                "publisher": publisher["instructions_per_message"],
                "subscriber": both["instructions_per_message"]
                - publisher["instructions_per_message"],
                "counts": {"publisher": publisher["counts"], "both": both["counts"]}}
        return figures
    finally:
        backend.teardown()


# -- P1: latency against a minimal C client -----------------------------------------------

def build_floor(out_dir: Path) -> Path:
    binary = out_dir / "pingfloor"
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror",
                    "-o", str(binary), str(HERE.parent / "c" / "pingfloor.c")], check=True,
                   capture_output=True, timeout=120)
    return binary


def floor_latency(binary: Path, port: int, subscribers: int, messages: int,
                  rate_hz: float) -> dict:
    done = subprocess.run([str(binary), "127.0.0.1", str(port), str(subscribers), str(messages),
                           str(rate_hz), str(PAYLOAD_BYTES)], capture_output=True, text=True,
                          timeout=300, check=True)
    words = done.stdout.split()
    figures = dict(zip(words[::2], map(int, words[1::2]), strict=True))
    return {"deliveries": figures["deliveries"], "p50_us": figures["p50_ns"] / 1e3,
            "p99_us": figures["p99_ns"] / 1e3}


def engine_latency(port: int, subscribers: int, messages: int, rate_hz: float) -> dict:
    from mqttbed.agents.gpio import VirtualGpio
    from mqttbed.agents.mqtt_session import MqttSession
    from mqttbed.core.clock import monotonic_ns
    from mqttbed.core.protocol import ClientAssignment, Endpoint, Role, Transport

    clients = [ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="p1/t", qos=0,
                                gpio_pin=2, payload_bytes=PAYLOAD_BYTES, rate_hz=rate_hz,
                                messages=messages)]
    clients += [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER, topic="p1/t",
                                 qos=0, gpio_pin=3 + j, expected_messages=messages,
                                 subscribe_rank=j) for j in range(subscribers)]
    batches: list = []
    session = MqttSession(Endpoint(host="127.0.0.1", port=port, transport=Transport.MQTT_TCP),
                          clients, VirtualGpio(), lambda _e: None, record_columns=batches.append)
    assert session.native, session.generator_report().mqtt_client_reason
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + int((messages / rate_hz + 5) * 1e9), abort=lambda: False)
    finally:
        session.close()
    report = session.generator_report()
    user, kernel = [], []
    for batch in batches:
        for kind, t_pub, t_recv, t_user in zip(batch["kind"], batch["t_pub_ns"],
                                               batch["t_recv_ns"], batch["t_recv_user_ns"],
                                               strict=True):
            if kind == "delivery":
                user.append(t_user - t_pub)
                kernel.append(t_recv - t_pub)
    user.sort()
    kernel.sort()

    def at(values: list[int], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] / 1e3 if values else 0.0

    def us(ns: int | None) -> float | None:
        return None if ns is None else ns / 1e3

    return {"deliveries": len(user), "p50_us": at(user, 0.5), "p99_us": at(user, 0.99),
            "kernel_p50_us": at(kernel, 0.5), "kernel_p99_us": at(kernel, 0.99),
            # the run's GPIO edges (virtual lines): edge time - return of the send/receive
            "edge_lag_p99_us": us(report.gpio_edge_lag_p99_ns),
            "edge_lag_max_us": us(report.gpio_edge_lag_max_ns)}


def p1(seconds: float, rounds: int) -> dict:
    """Each point ``rounds`` times, the floor and the engine alternately: a p99 of one 10 s
    run moves by 2x between runs on this shared VM (the floor's own did: 170-500 µs), so
    each round's ratio is taken against the floor measured just before it."""
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(), LocalHost())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            binary = build_floor(Path(tmp))
            points: dict[str, list[dict]] = {}
            for _ in range(rounds):
                for rate in (100.0, 1000.0):
                    for subscribers in (1, 10):
                        messages = int(rate * seconds)
                        floor = floor_latency(binary, endpoint.port, subscribers, messages,
                                              rate)
                        engine = engine_latency(endpoint.port, subscribers, messages, rate)
                        points.setdefault(f"{rate:g}Hz_{subscribers}sub", []).append(
                            {"floor": floor, "engine": engine})
            return points
    finally:
        backend.teardown()


def shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--measured":
        measured_process(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6],
                         float(sys.argv[7]), sys.argv[8] if len(sys.argv) > 8 else "")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--publishers", type=int, default=10)
    parser.add_argument("--small", type=int, default=1000, help="P3b: messages, short run")
    parser.add_argument("--large", type=int, default=5000, help="P3b: messages, long run")
    parser.add_argument("--skip-p3b", action="store_true")
    parser.add_argument("--skip-p1", action="store_true")
    parser.add_argument("--p1-seconds", type=float, default=2.0)
    parser.add_argument("--p1-rounds", type=int, default=3,
                        help="P1: floor and engine alternately, this many times per point")
    args = parser.parse_args()
    mp.set_start_method("spawn", force=True)
    results = [
        measure("paho publish() loop (baseline)", paho_publisher, (), args.seconds),
        measure("mqttbed agent, native engine", native_publisher, (args.publishers,),
                args.seconds),
    ]
    base, engine = results
    print(f"P3: QoS 0, {PAYLOAD_BYTES} B, {args.seconds:g} s, nobody subscribed; "
          f"CPU % of one core")
    print(f"{'publisher':32} {'msgs/s':>9} {'ratio':>6} {'publisher CPU':>13} "
          f"{'mosquitto CPU':>13} {'load':>5}")
    for r in results:
        print(f"{r['name']:32} {r['msgs_per_s']:9.0f} {r['msgs_per_s'] / base['msgs_per_s']:6.2f}"
              f" {r['cpu_percent']:13.0f} {r['broker_cpu_percent']:13.0f} "
              f"{r['load_average']:5.1f}")
    ratios = {"p3_msgs_per_s": ratio(engine["msgs_per_s"], base["msgs_per_s"]),
              "p3_msgs_per_cpu_s": ratio(engine["msgs_per_cpu_s"], base["msgs_per_cpu_s"])}
    figures: dict = {r["name"]: {k: round(v, 1) if isinstance(v, float) else v
                                 for k, v in r.items() if k != "name"} for r in results}
    figures["targets"] = {"p3_msgs_per_s": 10.0, "mosquitto_cpu_percent_min": 90,
                          "engine_cpu_percent_max": 50, "p3b_max": 0.15}
    if not args.skip_p3b:
        if shutil.which("valgrind") is None:
            print("P3b skipped: valgrind is not installed (scripts/system-deps.sh installs it)")
        else:
            instructions = p3b(args.small, args.large)
            print(f"P3b: instructions per message (callgrind, {args.large} - {args.small} "
                  f"messages)")
            for side in ("publisher", "subscriber"):
                ratios[f"p3b_{side}"] = ratio(instructions["native"][side],
                                              instructions["lean"][side])
                print(f"  {side:10} native {instructions['native'][side]:10.0f}   lean "
                      f"{instructions['lean'][side]:10.0f}   ratio "
                      f"{ratios[f'p3b_{side}']:.3f}")
            figures["p3b_instructions_per_message"] = instructions
    if not args.skip_p1:
        points = p1(args.p1_seconds, args.p1_rounds)
        print(f"P1: latency send -> receive (user space), QoS 0; engine vs minimal C client; "
              f"{args.p1_rounds} rounds, the ratio is the median of the rounds' ratios")
        print(f"{'point':14} {'floor p50':>9} {'p99':>8} {'engine p50':>10} {'p99':>8} "
              f"{'ratio p50':>9} {'p99':>6} {'kernel p50':>10} {'p99':>8}   µs")
        for name, measured in points.items():
            for q in ("p50", "p99"):
                each = [x for r in measured
                        if (x := ratio(r["engine"][f"{q}_us"], r["floor"][f"{q}_us"]))
                        is not None]
                ratios[f"p1_{name}_{q}"] = statistics.median(each) if each else None
            for r in measured:
                floor, engine = r["floor"], r["engine"]
                print(f"{name:14} {floor['p50_us']:9.1f} {floor['p99_us']:8.1f} "
                      f"{engine['p50_us']:10.1f} {engine['p99_us']:8.1f} "
                      f"{shown(ratio(engine['p50_us'], floor['p50_us'])):>9} "
                      f"{shown(ratio(engine['p99_us'], floor['p99_us'])):>6} "
                      f"{engine['kernel_p50_us']:10.1f} {engine['kernel_p99_us']:8.1f}")
            print(f"{name + ' median':29} {'':30} {shown(ratios[f'p1_{name}_p50']):>9} "
                  f"{shown(ratios[f'p1_{name}_p99']):>6}")
        lags = [r["engine"]["edge_lag_p99_us"] for m in points.values() for r in m
                if r["engine"]["edge_lag_p99_us"] is not None]
        if lags:
            figures["edge_lag_p99_us"] = {"median": statistics.median(lags), "max": max(lags),
                                          "runs": len(lags),
                                          "runs_at_most_2us": sum(x <= 2 for x in lags)}
            print(f"GPIO edge to send/receive return, p99 per run: median "
                  f"{statistics.median(lags):.2f} µs, max {max(lags):.2f} µs, "
                  f"{sum(x <= 2 for x in lags)} of {len(lags)} runs <= 2 µs (target)")
        figures["p1"] = points
        figures["targets"].update(p1_p50_max=1.1, p1_p99_max=1.3, edge_lag_p99_max_us=2.0)
    figures["pid"] = os.getpid()
    emit("native engine (issue 27)", "paho publish() loop (P3); lean Python client (P3b)",
         ratios, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
