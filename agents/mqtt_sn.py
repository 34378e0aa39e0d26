"""An MQTT-SN 1.2 client over UDP, for endpoints whose transport is ``mqtt-sn-udp``.

It drives its socket like :class:`~mqttbed.agents.mqtt_udp.UdpMqttClient` (one socket
per client, its address the client's identity, control packets resent until
acknowledged) and speaks MQTT-SN over it. MQTT-SN publishes by topic id, so a publisher
REGISTERs its topic right after CONNACK and reports itself connected only once the
REGACK gave it the id: by the time a run starts, each PUBLISH is one ``send`` call.
A subscriber subscribes by name; the SUBACK's topic id names the topic, or, for a
wildcard filter (id 0x0000), the gateway REGISTERs each matching topic before its first
PUBLISH and the client answers REGACK and remembers the id.

QoS 0 and 1 are sent as asked (QoS 1 counts the PUBACK like a TCP client's); QoS -1
needs a pre-defined id or a short name and no connection, which a run never uses.

The native engine makes the same protocol choices in C (``agents/native/src/sn_flows.c``)
and runs mqtt-sn-udp clients by default; this client is the lean fallback where the
engine cannot run (``mqtt_client`` "lean", or the reason in the generator report). One
difference: a malformed datagram fails this client, while the engine drops and counts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mqttbed.agents.mqtt_udp import UdpMqttClient
from mqttbed.core.mqttsn import (
    Connack,
    Connect,
    Disconnect,
    MqttSnError,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Regack,
    Register,
    ReturnCode,
    Suback,
    Subscribe,
    TopicIdType,
    Unsuback,
    Unsubscribe,
    decode,
    encode,
    short_name_of,
)


@dataclass(frozen=True)
class SnMessage:
    """A received PUBLISH with its topic resolved to a name (what the session records)."""

    topic: str
    payload: bytes
    qos: int


class MqttSnClient(UdpMqttClient):
    """One MQTT-SN client on its own UDP socket, driven by the caller's selector loop."""

    codec_error = MqttSnError
    ping_datagram = encode(Pingreq())
    disconnect_datagram = encode(Disconnect())

    def __init__(self, client_id: str, *, publish_topic: str | None = None,
                 on_puback: Callable[[], None] | None = None, **callbacks: object):
        # The base's keywords, passed through as they are (mypy cannot check keywords given
        # as a dict); on_message among them takes an SnMessage here, not the base's Publish.
        super().__init__(client_id, **callbacks)  # type: ignore[arg-type]  # (above)
        self._publish_topic = publish_topic
        self._on_puback = on_puback
        self._publish_id: int | None = None
        self._names: dict[int, str] = {}          # normal topic id -> name
        self._subscribing: dict[int, str] = {}    # SUBSCRIBE msg id -> filter

    def connect(self, host: str, port: int, keepalive: int = 60) -> None:
        """Open the socket and send CONNECT (resent until CONNACK; a publisher then REGISTERs)."""
        self._open(host, port, keepalive)
        self._send_control("connect", encode(Connect(self.client_id, keepalive)))

    def subscribe(self, topic: str, qos: int = 0) -> tuple[int, int]:
        """SUBSCRIBE by name (resent until SUBACK); return (0, msg id)."""
        msg_id = self._new_packet_id()
        self._subscribing[msg_id] = topic
        self._send_control(msg_id, encode(Subscribe(msg_id, topic, TopicIdType.NORMAL, qos)))
        return 0, msg_id

    def unsubscribe(self, topic: str) -> tuple[int, int]:
        """UNSUBSCRIBE by name (resent until UNSUBACK); return (0, msg id)."""
        msg_id = self._new_packet_id()
        self._send_control(msg_id, encode(Unsubscribe(msg_id, topic, TopicIdType.NORMAL)))
        return 0, msg_id

    def publish(self, topic: str, payload: bytes, qos: int = 0) -> None:
        """Send one PUBLISH on the registered topic."""
        if topic != self._publish_topic or self._publish_id is None:
            raise ValueError(f"{self.client_id}: topic {topic!r} is not registered "
                             f"(registered: {self._publish_topic!r})")
        msg_id = self._new_packet_id() if qos > 0 else 0
        self._send(encode(Publish(self._publish_id, msg_id, payload, qos)))

    # -- receiving ----------------------------------------------------------------------

    def _receive(self, datagram: bytes) -> None:
        packet = decode(datagram)
        if type(packet) is Publish:
            self._deliver(packet)
        else:
            self._handle_sn_control(packet)

    def _deliver(self, packet: Publish) -> None:
        if packet.topic_id_type == TopicIdType.SHORT_NAME:
            name: str | None = short_name_of(packet.topic_id)
        else:
            name = self._names.get(packet.topic_id)
        if name is None:
            self._on_failure(f"PUBLISH on unknown topic id {packet.topic_id:#06x} "
                             f"({packet.topic_id_type.name}) from broker {self._peer()}")
            return
        self._on_message(  # this client's on_message takes an SnMessage, not the base's Publish
            SnMessage(name, packet.data, max(packet.qos, 0)))  # type: ignore[arg-type]  # (above)

    def _handle_sn_control(self, packet: object) -> None:
        match packet:
            case Connack():
                if self._pending.pop("connect", None) is not None:
                    self._connected(packet.return_code)
            case Regack() if self._pending.pop("register", None) is not None:
                if packet.return_code == ReturnCode.ACCEPTED:
                    self._publish_id = packet.topic_id
                    self._names[packet.topic_id] = self._publish_topic or ""
                self._on_connack(packet.return_code)
            case Register():
                self._names[packet.topic_id] = packet.topic_name
                self._send(encode(Regack(packet.topic_id, packet.msg_id, ReturnCode.ACCEPTED)))
            case Suback() if self._pending.pop(packet.msg_id, None) is not None:
                topic = self._subscribing.pop(packet.msg_id, "")
                if packet.topic_id and packet.return_code == ReturnCode.ACCEPTED:
                    self._names[packet.topic_id] = topic
                self._on_suback((0x80 if packet.return_code else 0,))
            case Unsuback() if self._pending.pop(packet.msg_id, None) is not None:
                if self._on_unsuback:
                    self._on_unsuback(packet.msg_id)
            case Puback() if packet.return_code != ReturnCode.ACCEPTED:
                self._on_failure(f"PUBACK refused topic id {packet.topic_id:#06x}: "
                                 f"{ReturnCode(packet.return_code).name}")
            case Puback():
                if self._on_puback:
                    self._on_puback()
            case Pingresp():
                self.pings_answered += 1
            case Disconnect():
                self._on_failure(f"broker {self._peer()} ended the session (DISCONNECT)")
            case Connack() | Regack() | Suback() | Unsuback():
                pass   # the answer to a resent copy
            case _:
                self._on_failure(f"unexpected {type(packet).__name__} from broker {self._peer()}")

    def _connected(self, return_code: int) -> None:
        """CONNACK: a subscriber is connected; a publisher registers its topic first."""
        self.connack_code = return_code
        if return_code or self._publish_topic is None:
            self._on_connack(return_code)
            return
        msg_id = self._new_packet_id()
        self._send_control("register", encode(Register(0, msg_id, self._publish_topic)))
