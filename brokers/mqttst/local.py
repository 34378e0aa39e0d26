"""A node's client connection to its own Mosquitto: everything local clients publish, in.

The node subscribes ``#`` at QoS 2 with three MQTT 5 subscription options:

- **no local**: what the node itself publishes (messages from other brokers it injects)
  never comes back to it, so it cannot forward them again;
- **retain as published**: a retained publication keeps its retain flag on the way to
  the node, so the other brokers store it too;
- **retain handling 2**: no retained messages at subscribe time: they were forwarded
  when they were published.

``#`` matches no ``$``-topic (MQTT 5 section 4.7.2), so ``$SYS`` never reaches the node.
Messages arrive at the QoS they were published with (the subscription's QoS 2 is the
ceiling), which is the QoS they are injected with at every other broker. Injection uses
the window Mosquitto grants in its CONNACK (Receive Maximum).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from mqttbed.brokers.mqttst import mqtt5
from mqttbed.brokers.mqttst.mqtt5 import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    Property,
    Publish,
    SubAck,
    Subscribe,
)
from mqttbed.brokers.mqttst.session import MqttConnection

SUBSCRIPTION_OPTIONS = (2 | mqtt5.NO_LOCAL | mqtt5.RETAIN_AS_PUBLISHED
                        | mqtt5.RETAIN_HANDLING_NEVER)
LOCAL_KEEPALIVE_S = 30
RECEIVE_MAXIMUM = 65_535


class LocalClient(MqttConnection):
    """The node as an MQTT 5 client of its local Mosquitto."""

    def __init__(self, client_id: str, on_message: Callable[[Publish], None],
                 on_lost: Callable[[str], None]):
        super().__init__(window=1)   # until the CONNACK says how many Mosquitto takes
        self.client_id = client_id
        self._on_message = on_message
        self._on_lost = on_lost
        self.subscribed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last_ping = time.monotonic()

    def on_ready(self) -> None:
        self.send(mqtt5.encode(Connect(self.client_id, LOCAL_KEEPALIVE_S, properties=(
            (Property.RECEIVE_MAXIMUM, RECEIVE_MAXIMUM),))))

    def on_packet(self, packet: Packet, size: int) -> None:
        match packet:
            case Publish():
                if self.accept_publish(packet):
                    self._on_message(packet)
            case ConnAck():
                if packet.reason_code != mqtt5.SUCCESS:
                    self._fail(f"Mosquitto refused the node: CONNACK reason "
                               f"{packet.reason_code:#x}")
                    return
                self.window = mqtt5.property_value(packet.properties, Property.RECEIVE_MAXIMUM,
                                                   RECEIVE_MAXIMUM)
                self.send(mqtt5.encode(Subscribe(1, (("#", SUBSCRIPTION_OPTIONS),))))
            case SubAck():
                if not packet.reason_codes or packet.reason_codes[0] > 2:
                    self._fail(f"Mosquitto refused the subscription to '#': {packet}")
                elif not self.subscribed.done():
                    self.subscribed.set_result(None)
            case Disconnect():
                self.abort(f"Mosquitto disconnected the node: reason {packet.reason_code:#x}")

    def keep_alive(self) -> None:
        """Send a PINGREQ when half the keep-alive has passed (called from the node's tick)."""
        now = time.monotonic()
        if now - self._last_ping >= LOCAL_KEEPALIVE_S / 2:
            self._last_ping = now
            self.send(mqtt5.encode(PingReq()))

    def on_lost(self, reason: str) -> None:
        if not self.subscribed.done():
            self.subscribed.set_exception(ConnectionError(reason))
        self._on_lost(reason)

    def _fail(self, reason: str) -> None:
        if not self.subscribed.done():
            self.subscribed.set_exception(ConnectionError(reason))
        self.abort(reason)


async def connect_local(host: str, port: int, client_id: str,
                        on_message: Callable[[Publish], None], on_lost: Callable[[str], None],
                        timeout_s: float) -> LocalClient:
    """Connect to Mosquitto at ``host:port`` and subscribe, retrying until ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last_error: Exception | None = None
    while loop.time() < deadline:
        client: LocalClient | None = None
        try:
            _, connected = await asyncio.wait_for(loop.create_connection(
                lambda: LocalClient(client_id, on_message, on_lost), host, port),
                max(0.1, deadline - loop.time()))
            client = connected
            await asyncio.wait_for(connected.subscribed, max(0.1, deadline - loop.time()))
            return connected
        except (OSError, ConnectionError, TimeoutError) as exc:
            last_error = exc
            if client is not None:
                client.abort(f"not subscribed: {exc}")
            await asyncio.sleep(0.05)
    raise ConnectionError(f"no Mosquitto to subscribe to at {host}:{port} within "
                          f"{timeout_s:.1f} s: {last_error}")
