"""Helpers for the generic backends' tests: a Mosquitto the test owns, a broker that
refuses every CONNECT, and one small campaign's delivery accounting."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.dataset as ds

from mqttbed.brokers.reachability import probe_mqtt_tcp
from mqttbed.core.mqtt_codec import ConnAck, encode
from tests.conftest import eventually

MOSQUITTO = "/usr/sbin/mosquitto"

# The config a command template renders: every placeholder the backend fills.
MOSQUITTO_TEMPLATE = """\
# rendered by mqttbed's command backend into {config}
listener {port} 127.0.0.1
allow_anonymous true
persistence false
sys_interval 1
log_dest file {dir}/mosquitto.log
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers_mqtt(port: int) -> bool:
    try:
        probe_mqtt_tcp("127.0.0.1", port, 0.5)
    except Exception:  # noqa: BLE001 - not yet: keep polling
        return False
    return True


@contextmanager
def own_mosquitto(directory: Path, binary: str = MOSQUITTO
                  ) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A Mosquitto this test starts and stops itself (never mqttbed): process and port."""
    port = free_port()
    conf = directory / "own-mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nsys_interval 1\n"
                    "persistence false\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert eventually(lambda: answers_mqtt(port), 5), "the test's Mosquitto did not start"
        yield proc, port
    finally:
        proc.kill()
        proc.wait(5)


@contextmanager
def refusing_broker(return_code: int) -> Iterator[int]:
    """A TCP server answering every CONNECT with a CONNACK of ``return_code``: its port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                conn.recv(1024)    # the CONNECT (small: one segment)
                conn.sendall(encode(ConnAck(return_code)))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        server.close()


def delivery_counts(events_path: Path) -> tuple[int, Counter[str], set[int]]:
    """A run's publishes, deliveries per receiver, and the QoS levels seen (warm-up too)."""
    rows = ds.dataset(events_path, format="parquet").to_table().to_pylist()
    published = sum(r["kind"] == "publish" for r in rows)
    received = Counter(r["receiver"] for r in rows if r["kind"] == "delivery")
    return published, received, {r["qos"] for r in rows if r["kind"] != "subscribe"}
