"""Clients nobody here wrote (mosquitto_pub/sub, paho-mqtt) work through the fork/pipe broker."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest

from tests.test_forkpipe_protocol import Deployed, assert_clean_teardown, deploy, eventually

# integration: the C broker, mosquitto_pub/sub
pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

needs_mosquitto_clients = pytest.mark.skipif(
    shutil.which("mosquitto_sub") is None or shutil.which("mosquitto_pub") is None,
    reason="mosquitto-clients is not installed (make install adds it)")


@pytest.fixture(params=["release", "sanitized"])
def broker(request) -> Iterator[Deployed]:
    deployed = deploy(request.param == "sanitized")
    try:
        yield deployed
    finally:
        assert_clean_teardown(deployed)


def mosquitto_pub(broker: Deployed, topic: str, message: str, *extra: str) -> None:
    subprocess.run(["mosquitto_pub", "-V", "mqttv311", "-h", broker.endpoint.host,
                    "-p", str(broker.endpoint.port), "-t", topic, "-m", message, *extra],
                   check=True, timeout=10, capture_output=True)


@needs_mosquitto_clients
def test_mosquitto_sub_gets_what_mosquitto_pub_sends_on_multi_level_topics(broker):
    sub = subprocess.Popen(
        ["mosquitto_sub", "-V", "mqttv311", "-h", broker.endpoint.host,
         "-p", str(broker.endpoint.port), "-v", "-C", "4", "-W", "20",
         "-t", "plant/+/line 2/#", "-t", "exact/a/b/c/d"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert eventually(lambda: len(broker.pipes()) == 2, timeout_s=10), sub.stderr
        mosquitto_pub(broker, "plant/north/line 2/motor/rpm", "1450")
        mosquitto_pub(broker, "plant/north/line 3/motor/rpm", "not for us")
        mosquitto_pub(broker, "exact/a/b/c/d", "deep", "-q", "1")
        mosquitto_pub(broker, "plant/south/line 2", "parent level", "-q", "2")
        mosquitto_pub(broker, "exact/a/b/c", "too short", "-r")
        mosquitto_pub(broker, "exact/a/b/c/d", "retained, delivered as usual", "-r")
        out, err = sub.communicate(timeout=20)
    finally:
        sub.kill()
        sub.wait()
    assert sub.returncode == 0, err
    # Messages of one publisher, through one subscription process, keep their order;
    # the two subscriptions are two processes, so only the multiset is fixed across them.
    assert sorted(out.splitlines()) == sorted([
        "plant/north/line 2/motor/rpm 1450",
        "exact/a/b/c/d deep",
        "plant/south/line 2 parent level",
        "exact/a/b/c/d retained, delivered as usual",
    ])
    assert eventually(lambda: broker.pipes() == [])


class PahoSubscriber:
    """A paho-mqtt 3.1.1 client on its own network thread, counting what it receives."""

    def __init__(self, broker: Deployed, client_id: str, topic: str, expected: int):
        self.payloads: list[bytes] = []
        self.qos: set[int] = set()
        self.done = threading.Event()
        self._expected = expected
        subscribed = threading.Event()
        self.paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                protocol=mqtt.MQTTv311)
        self.paho.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.paho.on_subscribe = lambda *_: subscribed.set()
        self.paho.on_message = self._on_message
        self.paho.connect(broker.endpoint.host, broker.endpoint.port)
        self.paho.loop_start()
        assert subscribed.wait(5), f"{client_id} got no SUBACK"

    def _on_message(self, _client: mqtt.Client, _userdata: object,
                    message: mqtt.MQTTMessage) -> None:
        self.payloads.append(message.payload)
        self.qos.add(message.qos)
        if len(self.payloads) >= self._expected:
            self.done.set()

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


def test_paho_qos1_publisher_reaches_every_paho_subscriber_in_order_at_qos_0(broker):
    messages = [f"position {i}".encode() for i in range(20)]
    subscribers = [PahoSubscriber(broker, f"truck-watcher-{n}", "fleet/+/position",
                                  len(messages)) for n in range(8)]
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="truck-7",
                            protocol=mqtt.MQTTv311)
    publisher.connect(broker.endpoint.host, broker.endpoint.port)
    publisher.loop_start()
    try:
        infos = [publisher.publish("fleet/truck-7/position", m, qos=1) for m in messages]
        for info in infos:
            info.wait_for_publish(5)
            assert info.is_published(), "no PUBACK for a QoS 1 PUBLISH"
        for subscriber in subscribers:
            assert subscriber.done.wait(10), f"got {len(subscriber.payloads)} of 20"
            assert subscriber.payloads == messages
            assert subscriber.qos == {0}
    finally:
        publisher.disconnect()
        publisher.loop_stop()
        for subscriber in subscribers:
            subscriber.close()
