"""P3, QoS 0 publish capacity of one agent process (100-byte payloads), against a paho loop.

Both sides publish as fast as they can for ``--seconds`` to one Mosquitto on loopback,
with nobody subscribed (the broker receives, parses and drops: the cheapest work per
message it has), each in a process of its own:
  - paho (the baseline): one client, its network thread running (``loop_start``), the
    main thread calling ``publish()`` in a loop with mqttbed's payload built per message;
  - mqttbed: the agent's MqttSession with ``--publishers`` open-loop publishers at a rate
    no loop can keep (it sends as fast as it can, in batches of 64 per socket write),
    each publish timestamped, its payload built and its event recorded, as in a run.
Messages per second are what the publishing process sent over its window. CPU of the
publishing process and of Mosquitto over the window (psutil) shows which saturates
first; messages per CPU-second of the publishing process tell the clients' costs apart
on a machine whose cores are shared. Target: >= 2.5x, Mosquitto saturating first.

    .venv/bin/python bench/publish_capacity.py [--seconds 5] [--publishers 10]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, load_average, ratio  # noqa: E402

from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options  # noqa: E402
from mqttbed.core.host import LocalHost  # noqa: E402

PAYLOAD_BYTES = 100


def paho_publisher(host: str, port: int, seconds: float, out: mp.Queue) -> None:
    import paho.mqtt.client as mqtt

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cap-paho")
    client.connect(host, port)
    client.loop_start()
    time.sleep(0.3)
    figures = paho_publish_loop(client, seconds)
    client.loop_stop()
    client.disconnect()
    out.put(figures)


def paho_publish_loop(client: Any, seconds: float) -> dict[str, float]:
    """QoS 0 ``publish()`` calls from this thread for ``seconds``, mqttbed's payload built
    per message, on a connected paho client whose network thread runs: what was sent in
    how long, and this process's CPU over it."""
    from mqttbed.core.clock import monotonic_ns
    from mqttbed.core.events import encode_payload

    sent, start = 0, monotonic_ns()
    end = start + int(seconds * 1e9)
    cpu0 = time.process_time()
    while (now := monotonic_ns()) < end:
        client.publish("cap/paho", encode_payload(sent, 0, now, now, PAYLOAD_BYTES), qos=0)
        sent += 1
    elapsed = (monotonic_ns() - start) / 1e9
    cpu = time.process_time() - cpu0
    return {"sent": sent, "seconds": elapsed, "cpu_percent": 100 * cpu / elapsed}


def timed_publishers(host: str, port: int, seconds: float, publishers: int, rate: float,
                     **session_options: Any) -> tuple[Any, dict]:
    """``publishers`` QoS 0 publishers of one session at ``rate`` each for ``seconds``:
    the session (closed) and its figures (sent, seconds, cpu_percent)."""
    from mqttbed.agents.gpio import VirtualGpio
    from mqttbed.agents.mqtt_session import MqttSession
    from mqttbed.core.clock import monotonic_ns
    from mqttbed.core.protocol import ClientAssignment, Endpoint, Role, Transport

    clients = [ClientAssignment(client_id=f"pub-{i}", role=Role.PUBLISHER, topic=f"cap/{i}",
                                qos=0, gpio_pin=2 + i, publisher_index=i,
                                payload_bytes=PAYLOAD_BYTES, rate_hz=rate,
                                messages=int(rate * seconds))
               for i in range(publishers)]
    endpoint = Endpoint(host=host, port=port, transport=Transport.MQTT_TCP)
    session_options.setdefault("gpio", VirtualGpio())
    session = MqttSession(endpoint, clients, **session_options)
    session.connect(timeout_s=10)
    start = monotonic_ns() + 50_000_000
    cpu0 = time.process_time()
    session.run(start, start + int(seconds * 1e9), abort=lambda: False)
    elapsed = (monotonic_ns() - start) / 1e9
    cpu = time.process_time() - cpu0
    sent, _ = session.counts()
    session.close()
    return session, {"sent": sent, "seconds": elapsed, "cpu_percent": 100 * cpu / elapsed}


def mqttbed_publisher(host: str, port: int, seconds: float, publishers: int, client: str,
                      out: mp.Queue) -> None:
    sys.setswitchinterval(0.0005)   # as the agent process sets it
    events: list = []
    # record: what the uploader's record() does, a list append
    _, figures = timed_publishers(host, port, seconds, publishers, 1_000_000.0,
                                  record=events.append, mqtt_client=client)
    out.put(figures | {"events_recorded": len(events)})


def measure(name: str, target, args: tuple, seconds: float) -> dict:
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(), LocalHost())
    try:
        broker = psutil.Process(backend.deployment().pid)
        out: mp.Queue = mp.Queue()
        proc = mp.get_context("spawn").Process(target=target,
                                               args=(endpoint.host, endpoint.port, seconds,
                                                     *args, out))
        proc.start()
        time.sleep(1.0)   # connected and publishing
        broker.cpu_percent(None)
        load = load_average()
        time.sleep(max(seconds - 1.5, 0.5))
        broker_cpu = broker.cpu_percent(None)
        result = out.get(timeout=seconds + 60)
        proc.join(30)
    finally:
        backend.teardown()
    result.update(name=name, msgs_per_s=result["sent"] / result["seconds"],
                  msgs_per_cpu_s=result["sent"] / result["seconds"]
                  / max(result["cpu_percent"] / 100, 1e-9),
                  broker_cpu_percent=broker_cpu, load_average=load)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--publishers", type=int, default=10)
    args = parser.parse_args()
    mp.set_start_method("spawn", force=True)
    results = [
        measure("paho publish() loop (baseline)", paho_publisher, (), args.seconds),
        measure("mqttbed agent, lean client", mqttbed_publisher, (args.publishers, "lean"),
                args.seconds),
        measure("mqttbed agent, paho client", mqttbed_publisher, (args.publishers, "paho"),
                args.seconds),
    ]
    base = results[0]["msgs_per_s"]
    print(f"QoS 0, {PAYLOAD_BYTES} B, {args.seconds:g} s, nobody subscribed; "
          f"CPU % of one core")
    base_cpu = results[0]["msgs_per_cpu_s"]
    print(f"{'publisher':32} {'msgs/s':>9} {'ratio':>6} {'msgs/CPU-s':>10} {'ratio':>6} "
          f"{'publisher CPU':>13} {'mosquitto CPU':>13} {'load':>5}")
    for r in results:
        print(f"{r['name']:32} {r['msgs_per_s']:9.0f} {r['msgs_per_s'] / base:6.2f} "
              f"{r['msgs_per_cpu_s']:10.0f} {r['msgs_per_cpu_s'] / base_cpu:6.2f} "
              f"{r['cpu_percent']:13.0f} {r['broker_cpu_percent']:13.0f} "
              f"{r['load_average']:5.1f}")
    emit("P3 publish capacity", "paho publish() loop, one process",
         {"msgs_per_s": ratio(results[1]["msgs_per_s"], base),
          "msgs_per_cpu_s": ratio(results[1]["msgs_per_cpu_s"], base_cpu)},
         {r["name"]: {k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()
                      if k != "name"} for r in results} | {"target": 2.5})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
