"""The lean MQTT 3.1.1 TCP client against a real Mosquitto on loopback."""

from __future__ import annotations

import selectors
from collections.abc import Callable, Iterator

import pytest

from mqttbed.agents.mqtt_tcp import TcpMqttClient
from mqttbed.agents.rx_timestamps import RealtimeToMonotonic
from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import Endpoint

pytestmark = pytest.mark.integration  # Mosquitto


@pytest.fixture(scope="module")
def broker() -> Iterator[Endpoint]:
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(), LocalHost())
    yield endpoint
    backend.teardown()


class Probe:
    """One client and everything its callbacks reported."""

    def __init__(self, client_id: str, selector: selectors.BaseSelector,
                 clock: RealtimeToMonotonic | None = None):
        self.connack: list[int] = []
        self.subacks: list[tuple[int, ...]] = []
        self.messages: list[tuple[str, bytes, int, int, int | None]] = []
        self.acked = 0
        self.failures: list[str] = []
        self.conn = TcpMqttClient(
            client_id, on_connack=self.connack.append, on_suback=self.subacks.append,
            on_publish=self._on_publish, on_acked=self._on_acked,
            on_failure=self.failures.append, clock=clock)
        self._selector = selector

    def _on_publish(self, topic, data, start, end, qos, t_user, t_kernel):
        self.messages.append((topic, bytes(data[start:end]), qos, t_user, t_kernel))

    def _on_acked(self):
        self.acked += 1

    def connect(self, broker: Endpoint, keepalive: int = 30) -> None:
        self.conn.connect(broker.host, broker.port, keepalive)
        self._selector.register(self.conn.socket(), selectors.EVENT_READ, self)


def pump_until(selector: selectors.BaseSelector, done: Callable[[], bool],
               timeout_s: float = 10.0, misc: bool = False) -> None:
    deadline = monotonic_ns() + int(timeout_s * 1e9)
    while not done():
        assert monotonic_ns() < deadline, "timed out"
        for key, _ in selector.select(0.02):
            key.data.conn.loop_read()
        for key in list(selector.get_map().values()):
            key.data.conn.flush()
            if misc:
                key.data.conn.loop_misc()


@pytest.fixture
def selector() -> Iterator[selectors.BaseSelector]:
    sel = selectors.DefaultSelector()
    yield sel
    for key in list(sel.get_map().values()):
        key.data.conn.close()
    sel.close()


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_messages_arrive_once_at_their_qos_and_every_flow_completes(broker, selector, qos):
    sub, pub = Probe(f"tcp-sub-{qos}", selector, RealtimeToMonotonic()), Probe(
        f"tcp-pub-{qos}", selector)
    for probe in (sub, pub):
        probe.connect(broker)
    pump_until(selector, lambda: sub.connack == [0] and pub.connack == [0])
    sub.conn.subscribe(f"lean/{qos}", qos)
    pump_until(selector, lambda: sub.subacks == [(qos,)])
    for n in range(5):
        pub.conn.publish(f"lean/{qos}", b"m%d" % n, qos)
    pub.conn.flush()   # five PUBLISHes, one write
    pump_until(selector, lambda: len(sub.messages) == 5 and pub.acked == (5 if qos else 0))
    pump_until(selector, lambda: not sub.conn._awaiting_pubrel and not pub.conn._inflight)
    assert [(t, p, q) for t, p, q, _, _ in sub.messages] == [
        (f"lean/{qos}", b"m%d" % n, qos) for n in range(5)]
    # kernel stamps are on, mapped onto CLOCK_MONOTONIC, and precede the loop's own read
    assert sub.conn.kernel_stamps
    assert all(k is not None and k <= u for _, _, _, u, k in sub.messages)
    assert sub.failures == pub.failures == []


def test_a_large_payload_split_over_many_reads_arrives_whole(broker, selector):
    sub, pub = Probe("tcp-big-sub", selector), Probe("tcp-big-pub", selector)
    for probe in (sub, pub):
        probe.connect(broker)
    pump_until(selector, lambda: sub.connack == [0] and pub.connack == [0])
    sub.conn.subscribe("lean/big", 1)
    pump_until(selector, lambda: sub.subacks == [(1,)])
    payload = bytes(range(256)) * 8192   # 2 MiB, 32 times the receive buffer
    pub.conn.publish("lean/big", payload, 1)
    pub.conn.publish("lean/big", b"after", 1)
    pump_until(selector, lambda: len(sub.messages) == 2 and pub.acked == 2)
    assert sub.messages[0][1] == payload and sub.messages[1][1] == b"after"
    assert sub.conn.reads > 2


def test_keepalive_pings_hold_an_idle_connection(broker, selector):
    probe = Probe("tcp-idle", selector)
    probe.connect(broker, keepalive=1)   # Mosquitto drops it after 1.5 s without a packet
    pump_until(selector, lambda: probe.connack == [0])
    idle_until = monotonic_ns() + 2_500_000_000
    pump_until(selector, lambda: monotonic_ns() > idle_until, misc=True)
    assert probe.failures == [] and probe.conn.pings_answered >= 2
    probe.conn.subscribe("lean/idle", 0)   # and the connection still works
    pump_until(selector, lambda: probe.subacks == [(0,)])


def test_the_broker_closing_the_socket_is_a_failure_naming_it(broker, selector):
    first, second = Probe("tcp-same-id", selector), Probe("tcp-same-id", selector)
    first.connect(broker)
    pump_until(selector, lambda: first.connack == [0])
    second.connect(broker)   # the same client id: Mosquitto closes the first connection
    pump_until(selector, lambda: second.connack == [0] and first.failures)
    assert first.failures == ["broker closed the connection"]
    assert first.conn.dead and second.failures == []
