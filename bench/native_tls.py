"""Issue 40's performance figures: the native engine over TLS, beside plain TCP, in one run.

P3 over TLS: QoS 0, 100-byte payloads, nobody subscribed, one Mosquitto on loopback with
a TLS listener (a throwaway CA and server certificate made at each deploy:
brokers/certificates.py). What one agent process sends per second with the native engine
(``--publishers`` open-loop publishers at a rate no loop keeps, events recorded as binary
batches, as in a run) against a paho ``publish()`` loop over TLS (``tls_set_context``
with the context every mqttbed client takes, core/client_tls.py), each in a process of
its own, each on a fresh broker. Both verify the broker against the run's CA; the TLS
version and cipher each negotiated are printed and must be the same. CPU of the
publishing process and of Mosquitto over the window (psutil) shows which saturates first.
The engine over plain TCP runs in the same rounds (what TLS costs the engine and
Mosquitto per message). Each round runs paho, then the engine on TLS, then on TCP; the
ratio is the median of the rounds' ratios. Target: >= 5x; Mosquitto >= 90 % of a core,
the engine <= 50 %.

P3b over TLS: the engine's instructions per message (callgrind, as bench/native_engine.py's
P3b: two run lengths differenced, the run only), publisher and subscriber side, over TLS
and over plain TCP in the same run; ``--extra`` adds wss and MQTT 5 over TLS to both P3
(the engine's rows) and P3b. Stated beside plain: no target.

    .venv/bin/python bench/native_tls.py [--seconds 5] [--publishers 10] [--rounds 2]
        [--small 1000] [--large 5000] [--skip-p3b] [--extra]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, load_average, ratio  # noqa: E402
from native_engine import per_message  # noqa: E402
from publish_capacity import PAYLOAD_BYTES, paho_publish_loop  # noqa: E402

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options  # noqa: E402
from mqttbed.core.backends import BrokerAccess  # noqa: E402
from mqttbed.core.broker_access import ListenerTransport  # noqa: E402
from mqttbed.core.host import LocalHost  # noqa: E402
from mqttbed.core.protocol import Endpoint  # noqa: E402

# a publisher's rate no loop keeps: the engine sends as fast as the socket takes
OPEN_LOOP_HZ = 10_000_000.0


@dataclass(frozen=True)
class Layer:
    """How the clients reach the broker: its listener and the MQTT version."""

    name: str
    transport: ListenerTransport
    protocol: str = "3.1.1"


PLAIN = Layer("tcp", ListenerTransport.TCP)
TLS = Layer("tls", ListenerTransport.TLS)
EXTRA = (Layer("wss", ListenerTransport.WSS), Layer("tls-mqtt5", ListenerTransport.TLS, "5"))


@contextmanager
def mosquitto(layer: Layer, options: Options) -> Iterator[tuple[MosquittoBackend, Endpoint]]:
    """A managed Mosquitto with ``layer``'s listener (fresh CA for TLS), torn down after."""
    backend = MosquittoBackend()
    backend.configure_access(BrokerAccess(transport=layer.transport,
                                          protocol="5" if layer.protocol == "5" else "3.1.1"))
    endpoint = backend.deploy(options, LocalHost())
    try:
        yield backend, endpoint
    finally:
        backend.teardown()


# -- P3: the publishing processes ---------------------------------------------------------

def paho_tls_publisher(endpoint_json: str, protocol: str, seconds: float,
                       out: mp.Queue) -> None:
    """The baseline: one paho client over TLS, network thread running, main thread
    calling ``publish()`` with mqttbed's payload built per message."""
    import paho.mqtt.client as mqtt

    from mqttbed.core.client_tls import ssl_context

    endpoint = Endpoint.model_validate_json(endpoint_json)
    assert endpoint.tls is not None and protocol == "3.1.1"
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cap-paho-tls")
    client.tls_set_context(ssl_context(endpoint.tls, None))
    client.connect(endpoint.host, endpoint.port)
    client.loop_start()
    time.sleep(0.3)
    sock = client.socket()
    # ssl.SSLSocket: what the handshake settled on, printed beside the engine's
    negotiated = f"{sock.version()} {sock.cipher()[0]}"
    out.put("publishing")
    figures = paho_publish_loop(client, seconds)
    client.loop_stop()
    client.disconnect()
    out.put({**figures, "tls": negotiated})


def engine_publisher(endpoint_json: str, protocol: str, seconds: float, publishers: int,
                     out: mp.Queue) -> None:
    """``publishers`` open-loop QoS 0 publishers of one native session for ``seconds``,
    their events kept as binary batches (as an uploader holds a chunk)."""
    from mqttbed.agents.gpio import VirtualGpio
    from mqttbed.agents.native_session import NativeSession
    from mqttbed.core.clock import monotonic_ns
    from mqttbed.core.protocol import ClientAssignment, Role

    endpoint = Endpoint.model_validate_json(endpoint_json)
    clients = [ClientAssignment(client_id=f"pub-{i}", role=Role.PUBLISHER, topic=f"cap/{i}",
                                qos=0, gpio_pin=2 + i, publisher_index=i,
                                payload_bytes=PAYLOAD_BYTES, rate_hz=OPEN_LOOP_HZ,
                                messages=int(OPEN_LOOP_HZ * seconds))
               for i in range(publishers)]
    batches: list = []
    # NativeSession itself (what MqttSession runs for "native"): its tls_sessions() are
    # the measured clients' own negotiated version and cipher
    session = NativeSession(endpoint, clients, VirtualGpio(), lambda _e: None,
                            record_binary=batches.append,
                            protocol="5" if protocol == "5" else "3.1.1")
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 50_000_000
        out.put("publishing")
        cpu0 = time.process_time()
        session.run(start, start + int(seconds * 1e9), abort=lambda: False)
        elapsed = (monotonic_ns() - start) / 1e9
        cpu = time.process_time() - cpu0
        sent, _ = session.counts()
        negotiated = sorted(set(session.tls_sessions().values()))
    finally:
        session.close()
    out.put({"sent": sent, "seconds": elapsed, "cpu_percent": 100 * cpu / elapsed,
             "events_recorded": sum(b.rows for b in batches),
             "tls": " / ".join(negotiated) or None})


def measure(name: str, layer: Layer, target: Any, args: tuple, seconds: float) -> dict:
    """Run ``target`` in a process of its own against a fresh Mosquitto on ``layer``;
    its figures with Mosquitto's CPU over the window and the load average."""
    with mosquitto(layer, Options()) as (backend, endpoint):
        broker = psutil.Process(backend.deployment().pid)
        out: mp.Queue = mp.Queue()
        proc = mp.get_context("spawn").Process(
            target=target, args=(endpoint.model_dump_json(), layer.protocol, seconds, *args,
                                 out))
        proc.start()
        # the window starts once the client is connected and publishing (a spawned
        # interpreter on a loaded machine takes seconds to get there) and ends before it
        # stops
        started = out.get(timeout=120)
        assert started == "publishing", started
        time.sleep(min(0.5, seconds / 10))
        broker.cpu_percent(None)
        reads0, t0 = broker.io_counters().read_count, time.monotonic()
        load = load_average()
        time.sleep(seconds * 0.8 - min(0.5, seconds / 10))
        broker_cpu = broker.cpu_percent(None)
        # read system calls (syscr) per second: how Mosquitto takes in the stream
        broker_reads_per_s = ((broker.io_counters().read_count - reads0)
                              / (time.monotonic() - t0))
        result = out.get(timeout=seconds + 60)
        proc.join(30)
    msgs_per_s = result["sent"] / result["seconds"]
    result.update(name=name, layer=layer.name, msgs_per_s=msgs_per_s,
                  msgs_per_cpu_s=msgs_per_s / max(result["cpu_percent"] / 100, 1e-9),
                  broker_cpu_percent=broker_cpu,
                  broker_cpu_us_per_msg=1e4 * broker_cpu / max(msgs_per_s, 1e-9),
                  broker_reads_per_msg=broker_reads_per_s / max(msgs_per_s, 1e-9),
                  load_average=load)
    return result


def p3(seconds: float, publishers: int, rounds: int, layers: list[Layer]) -> list[list[dict]]:
    """``rounds`` rounds of: paho over TLS, then the engine on each of ``layers``."""
    measured = []
    for _ in range(rounds):
        row = [measure("paho publish() loop, TLS", TLS, paho_tls_publisher, (), seconds)]
        row += [measure(f"native engine, {layer.name}", layer, engine_publisher,
                        (publishers,), seconds) for layer in layers]
        measured.append(row)
    return measured


# -- P3b: instructions per message under callgrind ----------------------------------------

# The engine's TLS entry points (agents/native/src/tls.c): one mqe_tls_write per record
# it sends (a write of several queued messages is one record, up to 16 KiB), SSL_read per
# record it reads; their inclusive instructions are what TLS costs the engine.
TLS_WRITE, TLS_READ, TLS_ABSORB, SSL_READ = ("mqe_tls_write", "mqe_tls_read",
                                             "mqe_tls_absorb", "SSL_read")
TLS_CALLS = (TLS_WRITE, TLS_READ, TLS_ABSORB, SSL_READ)
P3B_RATE_HZ = 5000.0   # as bench/native_engine.py's P3b


def record_costs(runs: list[tuple[tuple[int, int], int]]) -> tuple[float, float]:
    """The instructions of writing one TLS record, and those of each message in it (its
    bytes encrypted), fitted over runs of (records written, their inclusive instructions),
    messages: inclusive = per_record * records + per_message * messages. (0, 0) without
    a record; all per record when the runs' records held the same number of messages."""
    written = [(records, inclusive, messages) for (records, inclusive), messages in runs
               if records > 0]
    if not written:
        return 0.0, 0.0
    shares = [records / messages for records, _, messages in written]
    if max(shares) < 1.5 * min(shares):   # too alike to tell the two costs apart
        records, inclusive, _ = max(written, key=lambda w: w[0] / w[2])
        return inclusive / records, 0.0
    x = np.array([[records, messages] for records, _, messages in written], dtype=float)
    y = np.array([inclusive for _, inclusive, _ in written], dtype=float)
    (per_record, per_message), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(per_record), float(per_message)


def p3b(small: int, large: int, layers: list[Layer]) -> dict[str, dict]:
    """The engine's instructions per message on each layer, publisher and subscriber side
    (a publisher and a subscriber in one process, minus the publisher side), with the TLS
    records written and read per message and what each costs.

    Under valgrind the engine's thread and the Python drain take turns (valgrind runs one
    thread at a time), so the publisher falls behind its schedule and sends the messages
    queued meanwhile in one write, hence one TLS record: from 1 to 60 messages per record
    from run to run, the more the busier the machine. Plain TCP does not care (the write
    is a system call, which callgrind does not count); TLS pays per record. So the
    publisher's TLS figure is given at one record per message (as a paced publisher sends
    outside valgrind): the run's TLS writing (mqe_tls_write's inclusive instructions) taken
    out, and one record's writing put in, its cost fitted over the four runs (a part per
    record, a part per message in it: :func:`record_costs`). The subscriber side is taken
    without the difference between its two runs' TLS writing. Mosquitto sends each PUBLISH
    in a record of its own, so the subscriber reads one record per message."""
    figures: dict[str, dict] = {}
    for layer in layers:
        # max_queued_messages 0: as bench/native_engine.py's P3b
        with mosquitto(layer, Options(max_queued_messages=0)) as (_, endpoint):
            publisher = per_message("native", "publisher", small, large, endpoint,
                                    layer.protocol, P3B_RATE_HZ, TLS_CALLS)
            both = per_message("native", "both", small, large, endpoint, layer.protocol,
                               P3B_RATE_HZ, TLS_CALLS)
        pub, two = publisher["calls_per_message"], both["calls_per_message"]
        record_cost, per_message_cost = record_costs(
            [(calls[TLS_WRITE], messages) for measured in (publisher, both)
             for calls, messages in zip(measured["calls"], (small, large), strict=True)])
        subscriber_raw = (both["instructions_per_message"]
                          - publisher["instructions_per_message"])
        figures[layer.name] = {
            "publisher_measured": publisher["instructions_per_message"],
            "publisher_records_per_message": pub[TLS_WRITE][0],
            "publisher_tls_write_instructions_per_message": pub[TLS_WRITE][1],
            "tls_instructions_per_record_written": record_cost,
            "tls_instructions_per_message_written": per_message_cost,
            # the run's TLS writing taken out, one record per message put in
            "publisher": publisher["instructions_per_message"] - pub[TLS_WRITE][1]
            + (record_cost + per_message_cost if layer.transport.tls else 0.0),
            "subscriber_raw": subscriber_raw,
            # without the difference in the TLS writing of the two runs' publishers
            "subscriber": subscriber_raw - (two[TLS_WRITE][1] - pub[TLS_WRITE][1]),
            "subscriber_records_read_per_message": two[SSL_READ][0] - pub[SSL_READ][0],
            "subscriber_tls_read_instructions_per_message":
                sum(two[name][1] - pub[name][1] for name in (TLS_READ, TLS_ABSORB)),
            "counts": {"publisher": publisher["counts"], "both": both["counts"]}}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--publishers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2,
                        help="P3: paho and the engine alternately, this many times")
    parser.add_argument("--small", type=int, default=1000, help="P3b: messages, short run")
    parser.add_argument("--large", type=int, default=5000, help="P3b: messages, long run")
    parser.add_argument("--skip-p3b", action="store_true")
    parser.add_argument("--extra", action="store_true",
                        help="also wss and MQTT 5 over TLS (the engine's rows)")
    args = parser.parse_args()
    mp.set_start_method("spawn", force=True)
    layers = [TLS, PLAIN, *(EXTRA if args.extra else ())]

    rounds = p3(args.seconds, args.publishers, args.rounds, layers)
    print(f"P3: QoS 0, {PAYLOAD_BYTES} B, {args.seconds:g} s, nobody subscribed; CPU % of "
          f"one core; Mosquitto's CPU (µs) and read system calls per message")
    print(f"{'publisher':28} {'msgs/s':>9} {'ratio':>6} {'publisher CPU':>13} "
          f"{'mosquitto CPU':>13} {'µs/msg':>6} {'reads/msg':>9} {'load':>5}  negotiated")
    each_ratio: dict[str, list[float]] = {}
    for row in rounds:
        base = row[0]
        for r in row:
            shown_ratio = r["msgs_per_s"] / base["msgs_per_s"]
            print(f"{r['name']:28} {r['msgs_per_s']:9.0f} {shown_ratio:6.2f} "
                  f"{r['cpu_percent']:13.0f} {r['broker_cpu_percent']:13.0f} "
                  f"{r['broker_cpu_us_per_msg']:6.2f} {r['broker_reads_per_msg']:9.3f} "
                  f"{r['load_average']:5.1f}  "
                  f"{r['tls'] or '-'}")
        engine = row[1]
        for key in ("msgs_per_s", "msgs_per_cpu_s"):
            value = ratio(engine[key], base[key])
            if value is not None:
                each_ratio.setdefault(f"p3_tls_{key}", []).append(value)
    negotiated = {r["tls"] for row in rounds for r in row[:2]}
    ratios: dict[str, float | None] = {k: statistics.median(v) for k, v in each_ratio.items()}
    tls_rows = [row[1] for row in rounds]
    figures: dict[str, Any] = {
        "p3_rounds": [[{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
                       for r in row] for row in rounds],
        "tls_negotiated": sorted(str(n) for n in negotiated),
        "tls_same_on_both_sides": len(negotiated) == 1,
        "mosquitto_cpu_percent_min": min(r["broker_cpu_percent"] for r in tls_rows),
        "engine_cpu_percent_max": max(r["cpu_percent"] for r in tls_rows),
        "targets": {"p3_tls_msgs_per_s": 5.0, "mosquitto_cpu_percent_min": 90,
                    "engine_cpu_percent_max": 50}}
    print(f"TLS negotiated: {', '.join(figures['tls_negotiated'])}"
          + ("" if figures["tls_same_on_both_sides"] else "  (NOT the same on both sides)"))
    print(f"median ratio over {len(rounds)} round(s): "
          + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))

    if not args.skip_p3b:
        if shutil.which("valgrind") is None:
            print("P3b skipped: valgrind is not installed (scripts/system-deps.sh installs it)")
        else:
            instructions = p3b(args.small, args.large, layers)
            print(f"P3b: the engine's instructions per message (callgrind, {args.large} - "
                  f"{args.small} messages at {P3B_RATE_HZ:g} Hz)")
            print(f"  {'layer':10} {'publisher':>9} {'measured':>9} {'records':>7} "
                  f"{'per record':>10} {'+ per msg':>9} {'subscriber':>10} {'records':>7} "
                  f"{'TLS read':>8}")
            plain = instructions[PLAIN.name]
            for name, m in instructions.items():
                print(f"  {name:10} {m['publisher']:9.0f} {m['publisher_measured']:9.0f} "
                      f"{m['publisher_records_per_message']:7.2f} "
                      f"{m['tls_instructions_per_record_written']:10.0f} "
                      f"{m['tls_instructions_per_message_written']:9.0f} "
                      f"{m['subscriber']:10.0f} {m['subscriber_records_read_per_message']:7.2f}"
                      f" {m['subscriber_tls_read_instructions_per_message']:8.0f}")
                if name != PLAIN.name:
                    for side in ("publisher", "subscriber"):
                        ratios[f"p3b_{name}_{side}_vs_plain"] = ratio(m[side], plain[side])
            print("  publisher: at one TLS record per message; measured: as the run batched "
                  "them (records: TLS records written per message); per record, + per msg: "
                  "the instructions of writing a record and of each message in it (fitted); "
                  "subscriber: records read per message, and the instructions of reading "
                  "them (TLS read)")
            print("  vs plain: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()
                                             if k.startswith("p3b_") and v is not None))
            figures["p3b_instructions_per_message"] = instructions
    emit("native engine over TLS (issue 40)",
         "P3: a paho publish() loop over TLS; P3b: the engine over plain TCP", ratios, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
