"""Latency floor: mqttbed's measurement path against plain paho clients, same broker setup.

1 publisher -> 10 subscribers at 100 Hz through Mosquitto on loopback. Prints p50/p99
latency and per-message arrival spread (max - min over subscribers) for
  - mqttbed: the real campaign path (agent processes, selector loop, chunked upload),
  - paho + TCP_NODELAY: one process, one paho network thread per client,
  - paho without TCP_NODELAY: the same, as paho ships (Nagle on),
each as a ratio to "paho + TCP_NODELAY", measured in this one script.

    .venv/bin/python bench/latency_floor.py [--messages 500] [--rate-hz 100]

Nagle only delays a small write while an earlier one is unacknowledged, so its cost
shows at rates where publishes follow each other faster than the peer ACKs them.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pyarrow.compute as pc
import pyarrow.dataset as ds

from mqttbed.brokers.mosquitto import MosquittoBackend, Options
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.controller import create_controller
from mqttbed.core.clock import monotonic_ns, sleep_until_ns
from mqttbed.core.events import decode_payload, encode_payload
from mqttbed.core.host import LocalHost
from mqttbed.core.settings import Settings

SUBSCRIBERS = 10
WARMUP = 20


def summarize(latency_ns: np.ndarray, spread_ns: np.ndarray) -> dict[str, float]:
    return {"lat_p50": np.percentile(latency_ns, 50) / 1e3,
            "lat_p99": np.percentile(latency_ns, 99) / 1e3,
            "spread_p50": np.percentile(spread_ns, 50) / 1e3,
            "spread_p99": np.percentile(spread_ns, 99) / 1e3,
            "n": float(len(latency_ns))}


def spreads(seq: np.ndarray, t_recv: np.ndarray) -> np.ndarray:
    order = np.argsort(seq, kind="stable")
    seq, t_recv = seq[order], t_recv[order]
    bounds = np.flatnonzero(np.diff(seq)) + 1
    groups = np.split(t_recv, bounds)
    return np.array([g.max() - g.min() for g in groups if len(g) == SUBSCRIBERS])


def measure_mqttbed(messages: int, rate_hz: float) -> dict[str, float]:
    spec = parse_spec({"name": "latency-floor",
                       "workload": {"publishers": 1, "subscribers": SUBSCRIBERS,
                                    "rate_hz": rate_hz, "messages": messages,
                                    "warmup_messages": WARMUP}})
    with tempfile.TemporaryDirectory() as tmp, \
            create_controller(Settings(data_dir=Path(tmp))) as ctl:
        campaign_id = ctl.engine.create_campaign(spec)
        status = ctl.engine.run_campaign(campaign_id)
        if status != "done":
            raise SystemExit(f"mqttbed run {status}")
        table = ds.dataset(ctl.layout.events, partitioning="hive").to_table(
            filter=(pc.field("kind") == "delivery") & ~pc.field("warmup"))
    t_recv = table["t_recv_ns"].to_numpy()
    latency = t_recv - table["t_pub_ns"].to_numpy()
    return summarize(latency, spreads(table["seq"].to_numpy(), t_recv))


def measure_plain_paho(messages: int, rate_hz: float, nodelay: bool) -> dict[str, float]:
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(), LocalHost())
    received: list[tuple[int, int, int]] = []  # (seq, t_pub, t_recv)
    lock = threading.Lock()
    subscribed = threading.Semaphore(0)

    def on_message(_c, _u, msg):
        t_recv = monotonic_ns()
        seq, _, t_pub, _ = decode_payload(msg.payload)
        with lock:
            received.append((seq, t_pub, t_recv))

    def make(client_id: str) -> mqtt.Client:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        if nodelay:
            client.on_socket_open = lambda _c, _u, sock: sock.setsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client

    clients = []
    try:
        for i in range(SUBSCRIBERS):
            sub = make(f"plain-sub-{i}")
            sub.on_message = on_message
            sub.on_subscribe = lambda *_: subscribed.release()
            sub.on_connect = lambda c, *_: c.subscribe("bench/plain", 0)
            sub.connect(endpoint.host, endpoint.port)
            sub.loop_start()
            clients.append(sub)
        for _ in range(SUBSCRIBERS):
            if not subscribed.acquire(timeout=10):
                raise SystemExit("plain paho subscribers did not get their SUBACK")
        pub = make("plain-pub")
        pub.connect(endpoint.host, endpoint.port)
        pub.loop_start()
        clients.append(pub)
        time.sleep(0.3)
        start = monotonic_ns() + 100_000_000
        for k in range(messages):
            due = start + int(k * 1e9 / rate_hz)
            sleep_until_ns(due)
            pub.publish("bench/plain", encode_payload(k, 0, monotonic_ns(), due, 64), qos=0)
        time.sleep(1.0)
    finally:
        for client in clients:
            client.loop_stop()
            client.disconnect()
        backend.teardown()
    data = np.array([r for r in received if r[0] >= WARMUP], dtype=np.int64)
    return summarize(data[:, 2] - data[:, 1], spreads(data[:, 0], data[:, 2]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--rate-hz", type=float, default=100.0)
    args = parser.parse_args()
    results = {
        "paho + TCP_NODELAY (baseline)": measure_plain_paho(args.messages, args.rate_hz, True),
        "paho, Nagle on": measure_plain_paho(args.messages, args.rate_hz, False),
        "mqttbed agents": measure_mqttbed(args.messages, args.rate_hz),
    }
    base = results["paho + TCP_NODELAY (baseline)"]
    print(f"\n1 publisher -> {SUBSCRIBERS} subscribers, {args.rate_hz:g} Hz, "
          f"{args.messages} messages ({WARMUP} warm-up), Mosquitto on loopback, "
          f"{sys.platform}\n")
    ratio_keys = ("lat_p50", "lat_p99", "spread_p50", "spread_p99")
    header = (f"{'client':32} {'lat p50 µs':>11} {'lat p99 µs':>11} {'spread p50':>11} "
              f"{'spread p99':>11} {'deliveries':>10}   "
              f"ratios to baseline (lat p50, lat p99, spread p50, spread p99)")
    print(header)
    for name, r in results.items():
        ratios = ", ".join(f"x{r[k] / base[k]:.2f}" if base[k] else "n/a" for k in ratio_keys)
        print(f"{name:32} {r['lat_p50']:11.1f} {r['lat_p99']:11.1f} {r['spread_p50']:11.1f} "
              f"{r['spread_p99']:11.1f} {int(r['n']):10d}   {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
