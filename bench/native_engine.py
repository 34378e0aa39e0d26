"""The native load engine (issue 27): P3 publish capacity, P3b instructions per message.

P3: QoS 0, 100-byte payloads, nobody subscribed, one Mosquitto on loopback; what one
agent process sends per second with the native engine (``--publishers`` open-loop
publishers at a rate no loop keeps, events recorded as in a run: whole columns handed to
a list, as the uploader takes them) against a paho ``publish()`` loop, each in a process
of its own (bench/publish_capacity.py's baseline). CPU of the publishing process and of
Mosquitto over the window (psutil) shows which saturates first. Target: >= 10x, Mosquitto
>= 90 % of a core while the engine's process stays <= 50 %.

P3b: instructions per message (valgrind --tool=callgrind, the stable CPU figure on a
shared machine) of the engine against the lean Python client, publisher side (one
publisher, nobody subscribed) and subscriber side (a publisher and a subscriber in the
process, minus the publisher side). Each figure is the difference between two runs of
``--small`` and ``--large`` messages over the difference in messages, with
instrumentation switched on once the clients are connected: start-up, connection and
close cancel out, and only the run is counted (not the close, not the interpreter's
exit). Target: <= 0.15x the lean client.

    .venv/bin/python bench/native_engine.py [--seconds 5] [--publishers 10] [--skip-p3b]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, ratio  # noqa: E402
from publish_capacity import measure, paho_publisher  # noqa: E402

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options  # noqa: E402
from mqttbed.core.host import LocalHost  # noqa: E402

PAYLOAD_BYTES = 100
HERE = Path(__file__).resolve()


def native_publisher(host: str, port: int, seconds: float, publishers: int,
                     out: mp.Queue) -> None:
    from mqttbed.agents.gpio import VirtualGpio
    from mqttbed.agents.mqtt_session import MqttSession
    from mqttbed.core.clock import monotonic_ns
    from mqttbed.core.protocol import ClientAssignment, Endpoint, Role, Transport

    batches: list = []
    rate = 10_000_000.0
    clients = [ClientAssignment(client_id=f"pub-{i}", role=Role.PUBLISHER, topic=f"cap/{i}",
                                qos=0, gpio_pin=2 + i, publisher_index=i,
                                payload_bytes=PAYLOAD_BYTES, rate_hz=rate,
                                messages=int(rate * seconds))
               for i in range(publishers)]
    endpoint = Endpoint(host=host, port=port, transport=Transport.MQTT_TCP)
    gpio = VirtualGpio()
    session = MqttSession(endpoint, clients, gpio, lambda _e: None,
                          record_columns=batches.append)
    assert session.native, session.generator_report().mqtt_client_reason
    session.connect(timeout_s=10)
    start = monotonic_ns() + 50_000_000
    cpu0 = time.process_time()
    session.run(start, start + int(seconds * 1e9), abort=lambda: False)
    elapsed = (monotonic_ns() - start) / 1e9
    cpu = time.process_time() - cpu0
    sent, _ = session.counts()
    session.close()
    out.put({"sent": sent, "seconds": elapsed, "cpu_percent": 100 * cpu / elapsed,
             "events_recorded": sum(len(b["kind"]) for b in batches),
             "edges_recorded": len(gpio.edges())})


# -- P3b: one measured process under callgrind -----------------------------------------

def measured_process(client: str, side: str, messages: int, port: int) -> None:
    """Connect, say "ready", wait for "go" (instrumentation on), run ``messages``, say
    "ran" and wait (instrumentation off) before closing: connecting, closing and the
    interpreter's exit are not the hot path."""
    from mqttbed.agents.gpio import VirtualGpio
    from mqttbed.agents.mqtt_session import MqttSession
    from mqttbed.core.clock import monotonic_ns
    from mqttbed.core.protocol import ClientAssignment, Endpoint, Role, Transport

    rate = 5000.0
    clients = [ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="cg/x", qos=0,
                                gpio_pin=2, payload_bytes=PAYLOAD_BYTES, rate_hz=rate,
                                messages=messages)]
    if side == "both":
        clients.append(ClientAssignment(client_id="sub-0", role=Role.SUBSCRIBER, topic="cg/x",
                                        qos=0, gpio_pin=3, expected_messages=messages))
    events: list = []
    session = MqttSession(Endpoint(host="127.0.0.1", port=port, transport=Transport.MQTT_TCP),
                          clients, VirtualGpio(), events.append, mqtt_client=client,
                          record_columns=events.append)
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


def callgrind_instructions(client: str, side: str, messages: int, port: int) -> tuple[int, list]:
    """Instructions the measured process ran from "go" to "ran" (its run)."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out_file}", sys.executable, str(HERE), "--measured",
                client, side, str(messages), str(port)]
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
        summary = next(line for line in out_file.read_text().splitlines()
                       if line.startswith(("summary:", "totals:")))
        return int(re.split(r"\s+", summary)[1]), counts


def per_message(client: str, side: str, small: int, large: int, port: int) -> dict:
    few, few_counts = callgrind_instructions(client, side, small, port)
    many, many_counts = callgrind_instructions(client, side, large, port)
    return {"instructions_per_message": (many - few) / (large - small),
            "counts": [few_counts, many_counts]}


def p3b(small: int, large: int) -> dict:
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(max_queued_messages=0), LocalHost())
    try:
        figures = {}
        for client in ("native", "lean"):
            publisher = per_message(client, "publisher", small, large, endpoint.port)
            both = per_message(client, "both", small, large, endpoint.port)
            figures[client] = {
                "publisher": publisher["instructions_per_message"],
                "subscriber": both["instructions_per_message"]
                - publisher["instructions_per_message"],
                "counts": {"publisher": publisher["counts"], "both": both["counts"]}}
        return figures
    finally:
        backend.teardown()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--measured":
        measured_process(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--publishers", type=int, default=10)
    parser.add_argument("--small", type=int, default=1000, help="P3b: messages, short run")
    parser.add_argument("--large", type=int, default=5000, help="P3b: messages, long run")
    parser.add_argument("--skip-p3b", action="store_true")
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
    figures["pid"] = os.getpid()
    emit("native engine (issue 27)", "paho publish() loop (P3); lean Python client (P3b)",
         ratios, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
