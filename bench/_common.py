"""What every bench script shares: the machine's load, the closing JSON line, a served
controller, paho baselines. Not a test helper: benches measure, tests check."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mqttbed.core.clock import monotonic_ns, sleep_until_ns
from mqttbed.core.events import decode_payload, encode_payload
from mqttbed.core.run_record import RunRecord, run_record

ROOT = Path(__file__).resolve().parent.parent


def load_average() -> float:
    """The 1-minute load average (the machine is shared: every figure is printed with it)."""
    return round(os.getloadavg()[0], 2)


def machine() -> str:
    return f"{platform.node()} {os.cpu_count()} cores {platform.machine()} {platform.release()}"


def emit(bench: str, baseline: str | None, ratios: dict[str, float | None],
         figures: dict[str, Any]) -> None:
    """Print the closing line every bench ends with (``make bench`` tabulates it)."""
    print(json.dumps({"bench": bench, "baseline": baseline,
                      "ratios": {k: None if v is None else round(v, 4) for k, v in ratios.items()},
                      "figures": {**figures, "load_average": load_average()}},
                     separators=(",", ":")), flush=True)


def ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def pct(values: np.ndarray, q: float) -> float | None:
    return None if len(values) == 0 else float(np.percentile(values, q))


def paho_fanout(endpoint: Any, subscribers: int, messages: int, rate_hz: float,
                warmup: int, nodelay: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Plain paho in one process (a network thread per client): 1 publisher -> N
    subscribers; returns (latency ns per delivery, spread ns per fully delivered message)."""
    import paho.mqtt.client as mqtt

    received: list[tuple[int, int, int]] = []
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
        for i in range(subscribers):
            sub = make(f"plain-sub-{i}")
            sub.on_message = on_message
            sub.on_subscribe = lambda *_: subscribed.release()
            sub.on_connect = lambda c, *_: c.subscribe("bench/plain", 0)
            sub.connect(endpoint.host, endpoint.port)
            sub.loop_start()
            clients.append(sub)
        for _ in range(subscribers):
            if not subscribed.acquire(timeout=30):
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
    data = np.array([r for r in received if r[0] >= warmup], dtype=np.int64).reshape(-1, 3)
    return data[:, 2] - data[:, 1], spreads(data[:, 0], data[:, 2], subscribers)


def spreads(seq: np.ndarray, t_recv: np.ndarray, subscribers: int) -> np.ndarray:
    """max - min arrival per message delivered to every subscriber."""
    if len(seq) == 0:
        return np.array([], dtype=np.int64)
    order = np.argsort(seq, kind="stable")
    seq, t_recv = seq[order], t_recv[order]
    groups = np.split(t_recv, np.flatnonzero(np.diff(seq)) + 1)
    return np.array([g.max() - g.min() for g in groups if len(g) == subscribers])


def run_campaign(spec_data: dict[str, Any]) -> tuple[Any, RunRecord, float]:
    """Run one campaign through an embedded controller (no analysis); return (deliveries
    table without warm-up, the run's record, wall seconds)."""
    import tempfile

    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from mqttbed.campaigns.spec import parse_spec
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.db import RunRow
    from mqttbed.core.settings import Settings

    spec = parse_spec(spec_data)
    with tempfile.TemporaryDirectory() as tmp, \
            create_controller(Settings(data_dir=Path(tmp))) as ctl:
        campaign_id = ctl.engine.create_campaign(spec)
        started = time.monotonic()
        status = ctl.engine.run_campaign(campaign_id)
        wall = time.monotonic() - started
        with ctl.sessions() as s:
            run = s.query(RunRow).filter_by(campaign_id=campaign_id).first()
            record, reason = run_record(run.run_metadata, run.id), run.reason
        if status != "done":
            raise SystemExit(f"mqttbed run {status}: {reason}")
        table = ds.dataset(ctl.layout.events, partitioning="hive").to_table(
            filter=(pc.field("kind") == "delivery") & ~pc.field("warmup"))
    return table, record, wall


@contextmanager
def served_controller(data_dir: Path, port: int):
    """``mqttbed serve`` on loopback with a fresh user token; yields (base URL, token, proc)."""
    cli = str(Path(sys.executable).with_name("mqttbed"))
    token = subprocess.run([cli, "token", "create", "--name", "bench", "--data-dir",
                            str(data_dir)], capture_output=True, text=True, check=True
                           ).stdout.strip().split()[-1]
    log = open(data_dir / "serve.log", "wb")
    proc = subprocess.Popen([cli, "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--data-dir", str(data_dir)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/api/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"mqttbed serve did not come up; see {data_dir}/serve.log")
            time.sleep(0.2)
        yield url, token, proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
