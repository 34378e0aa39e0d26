"""Helpers for the tests of brokers as deployed and of the generic backends: a Mosquitto
(or another server) the test owns, started with a config of its own (TLS listeners, a
password file made by ``mosquitto_passwd``), amqtt's WebSocket listeners, a broker that
refuses every CONNECT, and one small campaign's delivery accounting."""

from __future__ import annotations

import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyarrow.dataset as ds
import pytest

from mqttbed.brokers.certificates import ServerTls, write_server_tls
from mqttbed.brokers.reachability import probe_mqtt_tcp
from mqttbed.core.mqtt_codec import ConnAck, encode
from tests.conftest import eventually

MOSQUITTO = "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = "/usr/bin/mosquitto_passwd"
AMQTT = Path(sys.executable).parent / "amqtt"
SERVER_START_TIMEOUT_S = 10.0
AMQTT_START_TIMEOUT_S = 30.0

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
    with mosquitto_running(directory, [f"listener {port} 127.0.0.1", "allow_anonymous true",
                                       "sys_interval 1", "persistence false"], [port],
                           binary=binary, name="own-mosquitto") as proc:
        assert eventually(lambda: answers_mqtt(port), 5), "the test's Mosquitto did not start"
        yield proc, port


def write_password_file(path: Path, users: Mapping[str, str]) -> Path:
    """A Mosquitto password file for ``users`` (name -> password), made by the real
    ``mosquitto_passwd -b``: a maker independent of mqttbed's own hashing."""
    for n, (user, password) in enumerate(users.items()):
        subprocess.run([MOSQUITTO_PASSWD, *(["-c"] if n == 0 else []), "-b", str(path), user,
                        password], check=True, capture_output=True, timeout=10)
    return path


def tls_lines(tls: ServerTls, *, require_certificate: bool = False) -> list[str]:
    """A Mosquitto listener's lines serving ``tls``'s certificate (its ``cafile``: the CA
    a required client certificate is checked against)."""
    return [f"cafile {tls.ca_file}", f"certfile {tls.cert_file}", f"keyfile {tls.key_file}",
            *(["require_certificate true"] if require_certificate else [])]


@contextmanager
def mosquitto_running(directory: Path, lines: Sequence[str], ports: Sequence[int], *,
                      binary: str = MOSQUITTO, name: str = "mosquitto",
                      env: Mapping[str, str] | None = None
                      ) -> Iterator[subprocess.Popen[bytes]]:
    """A Mosquitto the test starts with the config ``lines`` (written to ``name``.conf in
    ``directory``; ``env`` added to its environment), once it listens on every one of
    ``ports``; stopped at the end.

    Started as root, Mosquitto would become user ``mosquitto``, who cannot read the test's
    private files: it is told to stay root (``user root``)."""
    conf = directory / f"{name}.conf"
    conf.write_text("\n".join([*(["user root"] if os.geteuid() == 0 else []), *lines, ""]))
    with server_running([binary, "-c", str(conf)], ports, directory / f"{name}.out",
                        env=env) as proc:
        yield proc


@contextmanager
def server_running(command: Sequence[str], ports: Sequence[int], output: Path, *,
                   env: Mapping[str, str] | None = None,
                   timeout_s: float = SERVER_START_TIMEOUT_S
                   ) -> Iterator[subprocess.Popen[bytes]]:
    """A server process (a broker) the test starts (``env`` added to its environment),
    once it listens on every one of ``ports``; its output goes to ``output``, named if it
    exits or does not listen within ``timeout_s``. Stopped at the end (terminated, killed
    if it lingers)."""
    with output.open("wb") as out:
        proc = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT,
                                env=None if env is None else {**os.environ, **env})
    try:
        deadline = time.monotonic() + timeout_s
        while not set(ports) <= listening_ports(proc.pid):
            if proc.poll() is not None:
                raise RuntimeError(f"{command[0]} exited ({proc.returncode}) before it listened "
                                   f"on {sorted(ports)}: {output.read_text(errors='replace')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} does not listen on {sorted(ports)} after "
                                   f"{timeout_s:g} s: "
                                   f"{output.read_text(errors='replace')}")
            time.sleep(0.02)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass(frozen=True)
class WebSocketBroker:
    """amqtt with a ws and a wss listener (anonymous), and the CA of its certificate."""

    ca_pem: str
    ws: int
    wss: int


@contextmanager
def amqtt_websockets(directory: Path) -> Iterator[WebSocketBroker]:
    """amqtt serving MQTT over ws and wss (Debian's Mosquitto has no WebSocket), a
    throwaway CA's certificate on the wss one; stopped at the end. Skips the test where
    amqtt (the brokers extra) is not installed."""
    if not AMQTT.exists():
        pytest.skip("needs amqtt (the brokers extra)")
    files = write_server_tls(directory, ["127.0.0.1"])
    ws, wss = free_port(), free_port()
    config = directory / "amqtt.yaml"
    config.write_text(f"""\
listeners:
  default:
    type: ws
    bind: 127.0.0.1:{ws}
  secure:
    type: ws
    bind: 127.0.0.1:{wss}
    ssl: true
    certfile: {files.cert_file}
    keyfile: {files.key_file}
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
""")
    # a Python broker: slower to start than Mosquitto on a loaded machine
    with server_running([str(AMQTT), "-c", str(config)], [ws, wss], directory / "amqtt.log",
                        timeout_s=AMQTT_START_TIMEOUT_S):
        yield WebSocketBroker(files.ca_pem, ws, wss)


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` and its children listen on (none once it is gone)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
        return {c.laddr.port for p in processes for c in p.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN}
    except psutil.Error:
        return set()


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


@contextmanager
def refusing_upgrade(status_line: str = "HTTP/1.1 403 Forbidden") -> Iterator[int]:
    """A TCP server answering every request (a WebSocket upgrade) with ``status_line``
    and no body: its port."""

    class Refuse(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while self.rfile.readline() not in (b"\r\n", b""):
                pass   # the request's headers, up to the blank line
            self.wfile.write(f"{status_line}\r\nContent-Length: 0\r\n"
                             "Connection: close\r\n\r\n".encode("latin-1"))

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Refuse) as server:
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.server_address[1]
        finally:
            server.shutdown()
            thread.join(2)


def delivery_counts(events_path: Path) -> tuple[int, Counter[str], set[int]]:
    """A run's publishes, deliveries per receiver, and the QoS levels seen (warm-up too)."""
    rows = ds.dataset(events_path, format="parquet").to_table().to_pylist()
    published = sum(r["kind"] == "publish" for r in rows)
    received = Counter(r["receiver"] for r in rows if r["kind"] == "delivery")
    return published, received, {r["qos"] for r in rows if r["kind"] != "subscribe"}
