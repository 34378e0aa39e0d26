"""What each third-party preset delivers over MQTT 3.1.1, and how long it takes to answer.

Each installed preset (brokers/command/presets.py) is deployed by the command backend as a
campaign would, then probed with paho-mqtt on loopback: QoS 0/1/2 (granted and delivered),
retained messages, ``+`` and ``#``, ``$SYS`` topics, a ladder of payload sizes, and an
exact count of 1,000 messages per QoS level. Prints a table and the closing JSON line;
brokers/thirdparty-notes.md holds the figures it gave.

    .venv/bin/python bench/thirdparty_capabilities.py [--presets rabbitmq nats] [--starts 3]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from mqttbed.brokers.command import presets
from mqttbed.brokers.command.backend import CommandBackend
from mqttbed.core.host import LocalHost

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, machine  # noqa: E402

MIB = 1024 * 1024
PAYLOAD_LADDER = (1024, MIB, 16 * MIB, 48 * MIB, 64 * MIB, 128 * MIB, 128 * MIB + 1024,
                  255 * MIB)
# The program each preset needs (rabbitmq's argv[0] is the shell that launches it).
PROGRAMS = {"rabbitmq": "/usr/lib/rabbitmq/bin/rabbitmq-server", "nats": "nats-server",
            "amqtt": str(Path(sys.executable).parent / "amqtt")}
WAIT_S = 10.0


@dataclass
class Probe:
    """One paho client: what it received, what its SUBACKs granted, how it disconnected."""

    port: int
    client_id: str
    received: list[mqtt.MQTTMessage] = field(default_factory=list)
    granted: list[int] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._subacked = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                                  protocol=mqtt.MQTTv311)
        self.client.max_inflight_messages_set(100)
        self.client.on_message = lambda _c, _u, message: self.received.append(message)
        self.client.on_subscribe = self._on_subscribe
        self.client.on_disconnect = lambda _c, _u, _f, code, _p: self.disconnects.append(
            str(code))
        self.client.connect("127.0.0.1", self.port)
        self.client.loop_start()

    def _on_subscribe(self, _client: Any, _userdata: Any, _mid: int, codes: list[Any],
                      _properties: Any) -> None:
        self.granted = [code.value for code in codes]
        self._subacked.set()

    def subscribe(self, topic: str, qos: int) -> list[int]:
        """Subscribe and return the granted QoS (128 = refused); [] without a SUBACK."""
        self._subacked.clear()
        self.client.subscribe(topic, qos)
        return self.granted if self._subacked.wait(WAIT_S) else []

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool = False) -> bool:
        """Publish; True once the broker acknowledged it (at once for QoS 0)."""
        info = self.client.publish(topic, payload, qos, retain=retain)
        try:
            info.wait_for_publish(WAIT_S)
        except (RuntimeError, ValueError):
            return False
        return info.is_published()

    def wait_for(self, count: int, timeout_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def probe_qos2(port: int) -> str:
    sub, pub = Probe(port, "q2-sub"), Probe(port, "q2-pub")
    granted = sub.subscribe("caps/qos2", 2)
    acked = pub.publish("caps/qos2", b"two", 2)
    sub.wait_for(1, 3.0)
    delivered = [message.qos for message in sub.received]
    sub.close()
    pub.close()
    return (f"granted {granted}, publish {'completed' if acked else 'not completed'}, "
            f"delivered at QoS {delivered}, publisher disconnects {len(pub.disconnects) - 1}")


def probe_retained(port: int) -> bool:
    pub = Probe(port, "ret-pub")
    pub.publish("caps/retained", b"kept", 1, retain=True)
    late = Probe(port, "ret-sub")
    late.subscribe("caps/retained", 1)
    late.wait_for(1, 3.0)
    kept = [(m.payload, m.retain) for m in late.received] == [(b"kept", True)]
    pub.publish("caps/retained", b"", 1, retain=True)   # clear it
    late.close()
    pub.close()
    return kept


def probe_wildcards(port: int) -> list[str]:
    sub, pub = Probe(port, "wild-sub"), Probe(port, "wild-pub")
    sub.subscribe("caps/+/c", 1)
    sub.subscribe("capsx/#", 1)
    for topic in ("caps/b/c", "caps/b/d", "caps/c", "capsx", "capsx/y", "capsx/y/z"):
        pub.publish(topic, b"w", 1)
    sub.wait_for(4, 3.0)
    sub.close()
    pub.close()
    return sorted(message.topic for message in sub.received)


def probe_sys(port: int) -> int:
    sub = Probe(port, "sys-sub")
    sub.subscribe("$SYS/#", 0)
    sub.wait_for(1, WAIT_S)
    sub.close()
    return len(sub.received)


def probe_payloads(port: int, sizes: tuple[int, ...]) -> dict[int, str]:
    """Each size through one subscriber until the first that fails."""
    outcome: dict[int, str] = {}
    for size in sizes:
        sub, pub = Probe(port, f"big-sub-{size}"), Probe(port, f"big-pub-{size}")
        sub.subscribe("caps/big", 1)
        acked = pub.publish("caps/big", b"z" * size, 1)
        sub.wait_for(1)
        arrived = [len(message.payload) for message in sub.received] == [size]
        sub.close()
        pub.close()
        outcome[size] = ("delivered" if arrived and acked else
                         f"arrived={arrived} puback={acked} "
                         f"subscriber disconnects={sub.disconnects}")
        if not (arrived and acked):
            break
    return outcome


def exact_count(port: int, qos: int, count: int = 1000) -> str:
    sub, pub = Probe(port, f"count-sub-{qos}"), Probe(port, f"count-pub-{qos}")
    sub.subscribe("caps/count", qos)
    for number in range(count):
        pub.publish("caps/count", number.to_bytes(4, "big"), qos)
    sub.wait_for(count)
    time.sleep(0.2)   # a late duplicate would show up now
    sub.close()
    pub.close()
    seen = Counter(int.from_bytes(m.payload, "big") for m in sub.received)
    return f"{len(seen)}/{count} distinct, {sum(seen.values()) - len(seen)} duplicates"


def measure(name: str, starts: int, sizes: tuple[int, ...]) -> dict[str, Any]:
    """Deploy ``name`` ``starts`` times for its startup time; probe it on the first start."""
    figures: dict[str, Any] = {"ready_s": [], "stop_s": []}
    for start in range(starts):
        backend = CommandBackend()
        endpoint = backend.deploy({"preset": name, "sys_topics": False}, LocalHost())
        try:
            record = backend.deployment()
            figures["ready_s"].append(round(record.ready_after_s or 0.0, 2))
            figures["version"] = record.version
            if start == 0:
                port = endpoint.port
                figures |= {"qos0": exact_count(port, 0), "qos1": exact_count(port, 1),
                            "qos2": probe_qos2(port), "retained": probe_retained(port),
                            "wildcards": probe_wildcards(port), "sys_messages": probe_sys(port),
                            "payloads": probe_payloads(port, sizes)}
        finally:
            stopping = time.monotonic()
            backend.teardown()
            figures["stop_s"].append(round(time.monotonic() - stopping, 2))
            figures["exit_code"] = backend.deployment().exit_code
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=presets.preset_names())
    parser.add_argument("--starts", type=int, default=3, help="deploys per preset")
    parser.add_argument("--max-payload-mib", type=float, default=255.0)
    args = parser.parse_args()
    sizes = tuple(size for size in PAYLOAD_LADDER if size <= args.max_payload_mib * MIB)
    results: dict[str, Any] = {}
    for name in args.presets:
        if shutil.which(PROGRAMS[name]) is None:
            print(f"== {name}: {PROGRAMS[name]} not installed, skipped")
            continue
        results[name] = measure(name, args.starts, sizes)
        print(f"== {name}")
        for key, value in results[name].items():
            print(f"  {key}: {value}")
    print(f"machine: {machine()}")
    emit("thirdparty_capabilities", None, {}, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
