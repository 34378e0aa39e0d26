"""Issue 41's connection-storm figures: one agent process holds 20,000 connections to
Mosquitto, opened at >= 2,000/s over plain TCP, with Mosquitto, not the engine, the limit;
over TLS, the handshake rate against a C client doing the same handshakes.

Plain TCP: one managed Mosquitto (no max_connections; the backend raises its file limit),
one storm (agents/connect_storm.py on the native engine) of ``--clients`` clients at
``--rate`` connects/s, every connection held ``--hold`` s. The figures: connects accepted,
the rate achieved against the one asked, the storm's schedule lag, and the CPU seconds of
this process (the engine and its Python driver) against Mosquitto's over the storm (psutil,
the connecting phase only), as a ratio: the broker should be the one that works. The
clients are capped at what the file limit lets both processes hold (the hard
RLIMIT_NOFILE less the agent's margin), and the cap is printed.

TLS: a storm of ``--tls-clients`` all at once on a TLS listener (TLS 1.3 as negotiated,
the run's throwaway CA verified): handshakes per second, TLS done of the last minus the
first connect(); against ``openssl s_time -new`` (OpenSSL's C client, one full handshake
after the other, the same CA verified) on the same listener for ``--tls-seconds``.

    .venv/bin/python bench/connect_storm.py [--clients 20000] [--rate 2500] [--hold 2]
        [--tls-clients 2000] [--tls-seconds 5]
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, ratio  # noqa: E402

from mqttbed.agents.connect_storm import NOFILE_MARGIN, ConnectStormSession  # noqa: E402
from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options  # noqa: E402
from mqttbed.core.backends import BrokerAccess  # noqa: E402
from mqttbed.core.broker_access import ListenerTransport  # noqa: E402
from mqttbed.core.clock import monotonic_ns  # noqa: E402
from mqttbed.core.host import LocalHost, raise_nofile_limit  # noqa: E402
from mqttbed.core.protocol import Endpoint, StormOutcomes, StormPlan  # noqa: E402


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def storm(endpoint: Endpoint, clients: int, rate_hz: float | None, hold_s: float,
          broker: psutil.Process) -> tuple[StormOutcomes, dict[str, float]]:
    """One storm; its outcomes and the CPU seconds each side spent on it (connects,
    the hold, the leaving)."""
    plan = StormPlan(client_id_prefix="bench-", first=0, step=1, count=clients,
                     total=clients, rate_hz=rate_hz, hold_s=hold_s, connect_timeout_s=20)
    session = ConnectStormSession(endpoint, plan)
    me = psutil.Process()
    start = monotonic_ns() + 200_000_000
    engine_before, broker_before = cpu_s(me), cpu_s(broker)
    held: dict[str, float] = {}
    try:
        session.run(start, start + int((clients / (rate_hz or 1e9) + 60 + hold_s) * 1e9),
                    abort=lambda: False)
    finally:
        session.close()
    outcomes = session.outcomes()
    held["engine_cpu_s"] = cpu_s(me) - engine_before
    held["broker_cpu_s"] = cpu_s(broker) - broker_before
    return outcomes, held


def achieved(outcomes: StormOutcomes, rate_hz: float | None) -> float | None:
    """Accepted connects over (last CONNACK - first intended + one period), per s."""
    done = [i + c for i, c, o in zip(outcomes.intended_ns, outcomes.connack_ns,
                                     outcomes.outcome, strict=True)
            if o == "connected" and c is not None]
    if not done:
        return None
    span = max(done) - min(outcomes.intended_ns) + (1e9 / rate_hz if rate_hz else 0)
    return len(done) / (span / 1e9)


def quantile(values: list[int], q: float) -> float | None:
    values = sorted(values)
    return None if not values else values[min(len(values) - 1, int(q * (len(values) - 1)))] / 1e3


def mosquitto(transport: ListenerTransport) -> tuple[MosquittoBackend, Endpoint]:
    backend = MosquittoBackend()
    backend.configure_access(BrokerAccess(transport=transport, protocol="3.1.1"))
    return backend, backend.deploy(Options(), LocalHost())


def openssl_handshakes_per_s(endpoint: Endpoint, seconds: int) -> tuple[float, str]:
    """Full TLS handshakes per second of ``openssl s_time -new`` (one after the other)."""
    assert endpoint.tls is not None and endpoint.tls.ca_pem is not None
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as ca:
        ca.write(endpoint.tls.ca_pem)
        ca.flush()
        out = subprocess.run(["openssl", "s_time", "-connect",
                              f"{endpoint.host}:{endpoint.port}", "-new", "-CAfile", ca.name,
                              "-verify", "2", "-time", str(seconds)],
                             capture_output=True, text=True, timeout=seconds + 30).stdout
    found = re.search(r"(\d+) connections in ([\d.]+)s", out) or re.search(
        r"(\d+) connections in (\d+) real seconds", out)
    if found is None:
        raise RuntimeError(f"openssl s_time said: {out[-500:]}")
    return int(found.group(1)) / float(found.group(2)), found.group(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=2500.0)
    parser.add_argument("--hold", type=float, default=2.0)
    parser.add_argument("--tls-clients", type=int, default=2000)
    parser.add_argument("--tls-seconds", type=int, default=5)
    args = parser.parse_args()
    raise_nofile_limit()   # Mosquitto, started from here, inherits it
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    clients = min(args.clients, hard - NOFILE_MARGIN)
    figures: dict[str, Any] = {"clients_requested": args.clients, "clients": clients,
                               "nofile_hard": hard, "rate_requested": args.rate}

    backend, endpoint = mosquitto(ListenerTransport.TCP)
    try:
        broker = psutil.Process(backend.deployment().pid)
        outcomes, cpu = storm(endpoint, clients, args.rate, args.hold, broker)
    finally:
        backend.teardown()
    counts = Counter(outcomes.outcome)
    figures.update({
        "connected": counts["connected"],
        "failed": {why: n for why, n in counts.items() if why != "connected"},
        "held_to_the_end": sum(o == "connected" and e is None
                               for o, e in zip(outcomes.outcome, outcomes.ended_ns, strict=True)),
        "rate_achieved": achieved(outcomes, args.rate),
        "connect_lag_p99_us": quantile([c for c in outcomes.connect_ns if c is not None], 0.99),
        "connack_from_intended_p50_us": quantile(
            [c for c in outcomes.connack_ns if c is not None], 0.5),
        "connack_from_intended_p99_us": quantile(
            [c for c in outcomes.connack_ns if c is not None], 0.99),
        **cpu})
    print(f"tcp: {figures}", flush=True)

    backend, endpoint = mosquitto(ListenerTransport.TLS)
    try:
        broker = psutil.Process(backend.deployment().pid)
        tls, tls_cpu = storm(endpoint, args.tls_clients, None, 0.0, broker)
        baseline, said = openssl_handshakes_per_s(endpoint, args.tls_seconds)
    finally:
        backend.teardown()
    starts = [i + c for i, c in zip(tls.intended_ns, tls.connect_ns, strict=True) if c is not None]
    dones = [i + t for i, t in zip(tls.intended_ns, tls.tls_ns, strict=True) if t is not None]
    engine_rate = len(dones) / ((max(dones) - min(starts)) / 1e9) if dones else None
    figures.update({"tls_clients": args.tls_clients,
                    "tls_connected": tls.outcome.count("connected"),
                    "tls_handshakes_per_s": engine_rate, "openssl_s_time_per_s": baseline,
                    "openssl_s_time": said, "tls_engine_cpu_s": tls_cpu["engine_cpu_s"],
                    "tls_broker_cpu_s": tls_cpu["broker_cpu_s"]})
    emit("connect_storm", "openssl s_time -new (TLS); Mosquitto's CPU (TCP)", {
        "rate_achieved_over_requested": ratio(figures["rate_achieved"], args.rate),
        "engine_cpu_over_broker_cpu": ratio(cpu["engine_cpu_s"], cpu["broker_cpu_s"]),
        "tls_handshakes_over_openssl": ratio(engine_rate, baseline)}, figures)


if __name__ == "__main__":
    main()
