"""Cost of the PAMS switch: per packet in the kernel, per table update from Python.

Builds a switch namespace with broker, publisher and three subscriber namespaces and
measures, each over the same N datagrams (100-byte MQTT-SN PUBLISH, QoS 0, sent one at
a time and read before the next, so no queueing):
  - one-way latency publisher -> broker over the bridge with no program attached,
  - the same with the PAMS program attached but the topic not in the table (pass path),
  - publisher -> each subscriber with the topic accelerated to 1 and to 3 subscribers
    (latency to the last copy),
  - the program's own run time per packet on each path (bpftool run_time_ns / run_cnt,
    with kernel.bpf_stats_enabled=1 for the duration, restored afterwards),
  - one topic_table update through the bpf() syscall (EbpfTables.add/remove), and
    through a bpftool process for comparison.
Timestamps are CLOCK_MONOTONIC in this one process (send, then blocking receive).

    .venv/bin/python bench/pams_switch.py [--messages 2000]
"""

from __future__ import annotations

import argparse
import socket
import struct
import time
from pathlib import Path

import numpy as np

from mqttbed.brokers.p4.dataplane import EbpfSwitch
from mqttbed.brokers.p4.tables import (
    EbpfTables,
    Subscriber,
    TopicIdType,
    TopicKey,
    topic_entry_bytes,
    topic_key_bytes,
)
from mqttbed.network.commands import bpftool
from mqttbed.network.netns import socket_in
from mqttbed.network.topology import Topology

BROKER_PORT, SUBSCRIBER_PORT = 10000, 20000
TOPIC = TopicKey(TopicIdType.NORMAL, 0x0101)
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


def publish_100b(seq: int) -> bytes:
    """A 100-byte MQTT-SN PUBLISH (1-byte length, QoS 0, normal topic id 0x0101)."""
    body = struct.pack("!BHH", 0, TOPIC.topic_id, 0) + seq.to_bytes(4, "big").ljust(93, b".")
    return struct.pack("!BB", len(body) + 2, 0x0C) + body


def bound(topology: Topology, host: str, port: int) -> socket.socket:
    sock = socket_in(topology.hosts[host].netns)
    sock.bind((topology.hosts[host].address, port))
    sock.settimeout(2)
    return sock


def one_way_us(sender: socket.socket, receivers: list[socket.socket],
               destination: tuple[str, int], messages: int) -> np.ndarray:
    """Send-to-last-arrival times of ``messages`` datagrams, one at a time, in µs."""
    samples = []
    for seq in range(messages):
        start = time.monotonic_ns()
        sender.sendto(publish_100b(seq), destination)
        for receiver in receivers:
            receiver.recv(2048)
        samples.append((time.monotonic_ns() - start) / 1000)
    return np.array(samples)


def describe(name: str, samples_us: np.ndarray) -> None:
    print(f"{name:44s} p50 {np.percentile(samples_us, 50):7.1f} µs   "
          f"p99 {np.percentile(samples_us, 99):7.1f} µs   mean {samples_us.mean():7.1f} µs")


def subscriber(topology: Topology, name: str) -> Subscriber:
    host = topology.hosts[name]
    return Subscriber(mac=host.mac, ip=host.address, port=SUBSCRIBER_PORT,
                      switch_port=host.port_ifindex)


def update_cost_us(tables: EbpfTables, topology: Topology, rounds: int) -> float:
    """Mean time of one topic_table write (an add or a remove) through bpf()."""
    entry = subscriber(topology, "s3")
    key = TopicKey(TopicIdType.PREDEFINED, 7)
    start = time.perf_counter_ns()
    for _ in range(rounds):
        tables.add_subscriber(key, entry)
        tables.remove_subscriber(key, entry)
    return (time.perf_counter_ns() - start) / (2 * rounds) / 1000


def bpftool_update_us(switch: EbpfSwitch, rounds: int) -> float:
    """Mean time of one topic_table write by `bpftool map update` (the alternative to bpf())."""
    key = topic_key_bytes(TopicKey(TopicIdType.PREDEFINED, 8))
    value = topic_entry_bytes([])
    argv = ["map", "update", "pinned", str(switch.pins / "maps" / "topic_table"),
            "key", "hex", *(f"{b:02x}" for b in key), "value", "hex",
            *(f"{b:02x}" for b in value)]
    start = time.perf_counter_ns()
    for _ in range(rounds):
        bpftool(*argv)
    return (time.perf_counter_ns() - start) / rounds / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args()
    was_enabled = STATS_SYSCTL.read_text().strip()
    with Topology(["broker", "pub", "s1", "s2", "s3"]) as topology:
        broker = bound(topology, "broker", BROKER_PORT)
        publisher = bound(topology, "pub", 0)
        subs = [bound(topology, name, SUBSCRIBER_PORT) for name in ("s1", "s2", "s3")]
        to_broker = (topology.hosts["broker"].address, BROKER_PORT)
        describe("bridge only, pub -> broker", one_way_us(publisher, [broker], to_broker,
                                                          args.messages))
        switch = EbpfSwitch(topology)
        tables = switch.load()
        switch.configure(topology.hosts["broker"], BROKER_PORT)
        STATS_SYSCTL.write_text("1")
        try:
            phases = [("PAMS attached, not in table, pub -> broker", [broker], []),
                      ("PAMS accelerated, 1 subscriber", subs[:1], ["s1"]),
                      ("PAMS accelerated, 3 subscribers (last copy)", subs, ["s2", "s3"])]
            for name, receivers, added in phases:
                for host in added:
                    tables.add_subscriber(TOPIC, subscriber(topology, host))
                before = switch.run_stats()["pams_ingress"]
                describe(name, one_way_us(publisher, receivers, to_broker, args.messages))
                after = switch.run_stats()["pams_ingress"]
                runs = after["run_cnt"] - before["run_cnt"]
                per_packet = (after["run_time_ns"] - before["run_time_ns"]) / max(1, runs)
                print(f"{'':44s} pams_ingress {per_packet:6.0f} ns per packet ({runs} runs)")
        finally:
            STATS_SYSCTL.write_text(was_enabled)
        print(f"topic_table update through bpf(): {update_cost_us(tables, topology, 5000):.1f} µs"
              " each")
        print(f"the same through a bpftool process:   {bpftool_update_us(switch, 20):.0f} µs each")
        print(tables.counters())
        tables.close()
        for sock in [broker, publisher, *subs]:
            sock.close()


if __name__ == "__main__":
    main()
