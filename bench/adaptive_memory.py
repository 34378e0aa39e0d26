"""Lazy vs eager allocation in the adaptive broker: held payload bytes and RSS (seed 003, Fig. 10).

    .venv/bin/python bench/adaptive_memory.py [--subscribers 20] [--messages 10] [--mb 1]

The paper's broker memory rose to about 200 MB without lazy allocation when the
downstream link congested, and stayed near 50 MB with it (about 75 % saved). Here, per
allocation mode, the ``adaptive`` backend is deployed (a subprocess, its RSS sampled
every 0.1 s like every backend's) and ``--subscribers`` subscribers of ``msg/#`` hold
``--messages`` messages of ``--mb`` MB each, in two ways:

- **withheld**: conservative policy, each subscriber answers RTT queries 0.6 s late
  (RTT > threshold_l 0.5 s), so every large message is withheld for every subscriber;
- **stalled**: policy none (FCFS), each subscriber stops reading its socket (a 4 KB
  receive buffer), so what the kernel's send buffer cannot take waits in the broker.

Then the subscribers recover and everything is delivered. Printed per mode and scenario:
the exact peak of held payload bytes (the broker's ledger), RSS before publishing and at
its peak, and the eager/lazy ratios.
"""

from __future__ import annotations

import argparse
import socket
import time

from mqttbed.brokers.adaptive.backend import AdaptiveBackend, Options
from mqttbed.brokers.adaptive.shaped_client import ShapedSubscribers
from mqttbed.core.host import LocalHost
from mqttbed.core.mqtt_codec import ConnAck, Connect, encode, encode_publish

MB = 1 << 20
CONGESTED_DELAY_S = 0.6


def run(scenario: str, lazy: bool, subscribers: int, messages: int, size: int) -> dict:
    """One deploy: hold ``messages`` for every subscriber, release, deliver; the figures."""
    policy = "conservative" if scenario == "withheld" else "none"
    backend = AdaptiveBackend()
    endpoint = backend.deploy(Options(policy=policy, lazy_allocation=lazy,
                                      rtt_query_period_s=0.25, rtt_query_bytes=100,
                                      starvation_s=120, stats_interval_s=0.1), LocalHost())
    shaped = ShapedSubscribers(endpoint.host, endpoint.port)
    try:
        subs = [shaped.connect(f"edge{n}", [("msg/#", 0)], CONGESTED_DELAY_S,
                               receive_buffer_bytes=4096 if scenario == "stalled" else None)
                for n in range(subscribers)]
        if scenario == "withheld":
            assert shaped.wait_for(lambda: all(s.queries_answered for s in subs), 10)
        else:
            for sub in subs:
                shaped.set_reading(sub, False)
        time.sleep(0.5)
        rss_before = max(s.rss_bytes for s in backend.resource_samples()[-3:])
        with socket.create_connection((endpoint.host, endpoint.port)) as publisher:
            publisher.sendall(encode(Connect("bench-publisher")))
            assert publisher.recv(4) == encode(ConnAck())
            for n in range(messages):
                publisher.sendall(encode_publish("msg/large", bytes([n]) * size))
            time.sleep(1.5)   # held: let the sampler see it
            for sub in subs:
                sub.query_delay_s = 0.0
                shaped.set_reading(sub, True)
            delivered = shaped.wait_for(
                lambda: all(len(s.messages()) == messages for s in subs), 60)
    finally:
        shaped.close()
        backend.teardown()
    stats = backend.broker_stats or {}
    return {"held_peak": stats.get("held_payload_bytes_peak", 0),
            "rss_before": rss_before,
            "rss_peak": max(s.rss_bytes for s in backend.resource_samples()),
            "delivered": delivered, "copies": stats.get("payload_copies_made", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=20)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--mb", type=float, default=1.0, help="message size in MB")
    parser.add_argument("--scenarios", nargs="+", default=["withheld", "stalled"],
                        choices=["withheld", "stalled"])
    args = parser.parse_args()
    size = int(args.mb * MB)
    print(f"{args.subscribers} subscribers x {args.messages} messages of {args.mb:g} MB")
    print(f"{'scenario':9} {'mode':6} {'held peak MB':>12} {'RSS before MB':>13} "
          f"{'RSS peak MB':>11} {'copies':>6} delivered")
    for scenario in args.scenarios:
        results = {}
        for lazy in (False, True):
            mode = "lazy" if lazy else "eager"
            r = results[mode] = run(scenario, lazy, args.subscribers, args.messages, size)
            print(f"{scenario:9} {mode:6} {r['held_peak'] / MB:12.1f} "
                  f"{r['rss_before'] / MB:13.1f} {r['rss_peak'] / MB:11.1f} {r['copies']:6d} "
                  f"{r['delivered']}")
        eager, lazy_r = results["eager"], results["lazy"]
        print(f"{scenario:9} eager/lazy: held peak {eager['held_peak'] / lazy_r['held_peak']:.1f}x,"
              f" RSS peak {eager['rss_peak'] / lazy_r['rss_peak']:.1f}x "
              f"(lazy saves {100 * (1 - lazy_r['rss_peak'] / eager['rss_peak']):.0f} % of RSS; "
              f"paper: 200 -> 50 MB, 75 %)")


if __name__ == "__main__":
    main()
