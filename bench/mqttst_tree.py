"""MQTT-ST on this machine: convergence, re-convergence after a root kill, one hop's latency.

    .venv/bin/python bench/mqttst_tree.py [--brokers 3] [--repeat 5] [--messages 1000]

- **convergence**: from the start of the nodes (the Mosquittos already listen) to the
  last node's last change of root or roles, as the nodes stamp it (CLOCK_MONOTONIC),
  on a full mesh with the capabilities left to /proc (ties on one machine: lowest port).
- **re-convergence**: from the SIGKILL of the root's node and Mosquitto to the last
  live node's last change, then the restored root rejoining is not timed.
- **hop latency**: a paho publisher at broker 0 of a two-broker chain, one paho
  subscriber at broker 0 and one at broker 1, QoS 0 and QoS 1 at 200 Hz; the send time
  travels in the payload (CLOCK_MONOTONIC), so ``remote - local`` per message is what
  the tree adds: node 0 receives from Mosquitto 0, forwards as QoS 2 over the link,
  node 1 injects into Mosquitto 1, which delivers.
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt

from mqttbed.brokers.mqttst.cluster import Cluster, TreeOptions, free_port_range
from mqttbed.brokers.mqttst.signalling import measure_frame_sizes, pingreq_sizes
from mqttbed.core.clock import monotonic_ns, sleep_until_ns

WARMUP = 20


def convergence(brokers: int, repeat: int, workdir: Path) -> tuple[list[float], list[float]]:
    """(first convergence ms, re-convergence after a root kill ms) per repetition."""
    first, again = [], []
    for attempt in range(repeat):
        cluster = Cluster(brokers, free_port_range(brokers), "full-mesh",
                          TreeOptions(keepalive_s=10.0), workdir / f"c{attempt}")
        try:
            cluster.start()
            started_ns = min(state["started_at_ns"] for state in _wait_states(cluster))
            root = cluster.wait_converged(30)
            first.append((cluster.converged_at_ns() - started_ns) / 1e6)
            killed_ns = cluster.kill(root)
            cluster.wait_converged(30)
            again.append((cluster.converged_at_ns() - killed_ns) / 1e6)
        finally:
            cluster.stop()
    return first, again


def _wait_states(cluster: Cluster) -> list[dict]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = cluster.states()
        states = [state for state in found if state is not None]
        if len(states) == len(found):
            return states
        time.sleep(0.02)
    raise TimeoutError("nodes wrote no stats")


def hop_latency(messages: int, qos: int, workdir: Path) -> dict[str, np.ndarray]:
    """Per-message latency (ns) at the publisher's broker and one hop away."""
    cluster = Cluster(2, free_port_range(2), "chain", TreeOptions(keepalive_s=10.0), workdir)
    received: dict[str, dict[int, int]] = {"local": {}, "remote": {}}
    clients = []
    try:
        cluster.start()
        cluster.wait_converged(30)
        ready = threading.Barrier(3)
        for name, (host, port) in zip(("local", "remote"), cluster.endpoints(), strict=True):
            def on_message(_c, _u, msg, name=name):
                seq, sent_ns = struct.unpack("!QQ", msg.payload[:16])
                received[name][seq] = monotonic_ns() - sent_ns

            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
            client.on_message = on_message
            client.on_connect = lambda c, *_a: (c.subscribe("bench/#", qos), None)
            client.on_subscribe = lambda *_a: ready.wait()
            client.connect(host, port)
            client.socket().setsockopt(6, 1, 1)   # TCP_NODELAY
            client.loop_start()
            clients.append(client)
        ready.wait(timeout=10)
        publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        publisher.connect(*cluster.endpoints()[0])
        publisher.socket().setsockopt(6, 1, 1)
        publisher.loop_start()
        clients.append(publisher)
        next_ns = monotonic_ns()
        for seq in range(messages + WARMUP):
            next_ns += 5_000_000
            sleep_until_ns(next_ns)
            publisher.publish("bench/hop", struct.pack("!QQ", seq, monotonic_ns()) + b"x" * 48,
                              qos=qos)
        time.sleep(1.0)
    finally:
        for client in clients:
            client.loop_stop()
            client.disconnect()
        cluster.stop()
    both = [seq for seq in received["local"] if seq >= WARMUP and seq in received["remote"]]
    return {name: np.array([received[name][seq] for seq in both]) for name in received}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--messages", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mqttst-bench-") as tmp:
        workdir = Path(tmp)
        print(f"PINGREQ sizes (MQTT level): {pingreq_sizes()}")
        print(f"PINGREQ frames on lo: {measure_frame_sizes()}")
        first, again = convergence(args.brokers, args.repeat, workdir)
        for name, values in (("convergence", first), ("re-convergence after root kill", again)):
            print(f"{name}, {args.brokers} brokers full mesh, {args.repeat} runs: "
                  f"median {np.median(values):.1f} ms, min {min(values):.1f}, "
                  f"max {max(values):.1f}")
        for qos in (0, 1):
            lat = hop_latency(args.messages, qos, workdir / f"hop{qos}")
            hop = lat["remote"] - lat["local"]
            local, remote = lat["local"] / 1e3, lat["remote"] / 1e3
            print(f"QoS {qos}, {len(hop)} messages: local p50 {np.median(local):.0f} us, "
                  f"one hop away p50 {np.median(remote):.0f} us "
                  f"(p99 {np.percentile(remote, 99):.0f}); the hop adds p50 "
                  f"{np.median(hop) / 1e3:.0f} us, mean {hop.mean() / 1e3:.0f} us")


if __name__ == "__main__":
    main()
