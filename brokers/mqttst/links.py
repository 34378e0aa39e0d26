"""A link between two MQTT-ST nodes (paper §II.C.1-2, §II.C.5): MQTT 5 framing over TCP.

The node that dials sends a CONNECT whose protocol level byte has its most significant
bit set (the paper's bridge marker; Mosquitto's own bridges set the same bit with
``try_private``) and its broker id as client id; the other answers CONNACK, with its own
id as a user property so the dialer knows it reached the broker it meant. From then on:

- **BPDUs** ride on PINGREQ (:mod:`.bpdu`), both ways: each end pings every keep-alive
  and on every change of its tree state. Each PINGREQ is answered by a plain PINGRESP,
  and the time from PINGREQ sent to PINGRESP received (CLOCK_MONOTONIC) is the RTT
  sample that feeds the link's cost (smoothed like TCP's SRTT, gain 1/8).
- **Publications** cross as QoS 2 PUBLISH with the full PUBREC/PUBREL/PUBCOMP
  handshake, up to ``window`` in flight.

One TCP connection carries both directions; the paper's connect-back (a second
connection the other way, to port 1883) is not made. Silence for 1.5 keep-alives ends
the link like a socket error does.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

from mqttbed.brokers.mqttst import mqtt5
from mqttbed.brokers.mqttst.mqtt5 import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Property,
    Publish,
)
from mqttbed.brokers.mqttst.session import MqttConnection, logger
from mqttbed.brokers.mqttst.tree import BrokerId

ID_PROPERTY = "mqttst-id"
CLIENT_ID_PREFIX = "mqttst/"
LINK_WINDOW = 1024          # QoS 2 publications in flight per link direction
RTT_GAIN = 1 / 8            # RFC 6298's alpha
SILENCE_KEEPALIVES = 1.5    # MQTT's keep-alive grace (section 3.1.2.10)


class LinkOwner(Protocol):
    """What a link reports to, and asks of, its node."""

    me: BrokerId
    keepalive_s: float

    def admit(self, link: Link, peer: BrokerId) -> tuple[int, str]:
        """The CONNACK reason code for ``peer`` dialing in (0: welcome), and why."""
        ...

    def link_refused(self, client_id: str, reason_code: int, why: str) -> None: ...

    def link_up(self, link: Link) -> None: ...

    def link_down(self, link: Link, reason: str) -> None: ...

    def on_pingreq(self, link: Link, payload: bytes) -> None: ...

    def on_rtt(self, link: Link) -> None: ...

    def on_link_publish(self, link: Link, message: Publish) -> None: ...

    def count_signalling(self, sent: int, received: int) -> None: ...

    def count_protocol_error(self, link: Link, reason: str) -> None: ...


def client_id_of(broker: BrokerId) -> str:
    return f"{CLIENT_ID_PREFIX}{broker}"


class Link(MqttConnection):
    """One TCP link to a neighbour node, dialed (``dialed`` is the peer) or accepted."""

    def __init__(self, node: LinkOwner, dialed: BrokerId | None = None,
                 window: int = LINK_WINDOW):
        super().__init__(window)
        self.node = node
        self.dialed = dialed
        self.peer: BrokerId | None = dialed
        self.established = False
        self.rtt_us: float | None = None
        self.last_sent = time.monotonic()
        self._pings_sent_ns: deque[int] = deque()
        self._connect_sent_ns = 0

    def __repr__(self) -> str:
        state = "" if self.established else " (handshake)"
        return f"<Link to {self.peer or 'an unknown peer'}{state}>"

    # -- signalling ---------------------------------------------------------------------

    def send_signalling(self, packet: Packet) -> None:
        data = mqtt5.encode(packet)
        self.node.count_signalling(len(data), 0)
        self.last_sent = time.monotonic()
        self.send(data)

    def send_bpdu(self, payload: bytes) -> None:
        """Send a PINGREQ carrying ``payload`` and time it until its PINGRESP."""
        self._pings_sent_ns.append(time.monotonic_ns())
        self.send_signalling(PingReq(payload))

    def silent_for(self) -> float:
        return time.monotonic() - self.last_heard

    def _rtt_sample(self, sent_ns: int) -> None:
        sample = (time.monotonic_ns() - sent_ns) / 1000.0
        self.rtt_us = sample if self.rtt_us is None else \
            self.rtt_us + RTT_GAIN * (sample - self.rtt_us)

    # -- the handshake ------------------------------------------------------------------

    def on_ready(self) -> None:
        if self.dialed is not None:
            self._connect_sent_ns = time.monotonic_ns()
            self.send_signalling(Connect(client_id_of(self.node.me),
                                         max(1, round(self.node.keepalive_s)), bridge=True))

    def _answer_connect(self, connect: Connect) -> None:
        peer: BrokerId | None = None
        if not connect.bridge:
            reason, why = mqtt5.NOT_AUTHORIZED, "no bridge bit: a client, not a node"
        elif connect.protocol_level != mqtt5.PROTOCOL_LEVEL:
            reason, why = mqtt5.UNSUPPORTED_PROTOCOL_VERSION, \
                f"protocol level {connect.protocol_level}, links speak 5"
        else:
            try:
                if not connect.client_id.startswith(CLIENT_ID_PREFIX):
                    raise ValueError(connect.client_id)
                peer = BrokerId.parse(connect.client_id.removeprefix(CLIENT_ID_PREFIX))
            except ValueError:
                reason, why = mqtt5.CLIENT_ID_NOT_VALID, \
                    f"client id is not {CLIENT_ID_PREFIX}ADDRESS:PORT"
        if peer is not None:
            reason, why = self.node.admit(self, peer)
        self.send_signalling(ConnAck(reason, properties=(
            (Property.USER_PROPERTY, (ID_PROPERTY, str(self.node.me))),)))
        if reason != mqtt5.SUCCESS:
            self.node.link_refused(connect.client_id, reason, why)
            self.close(f"refused {connect.client_id!r}: {why}", disconnect=False)
            return
        self.peer = peer
        self._established()

    def _take_connack(self, connack: ConnAck) -> None:
        said = dict(mqtt5.user_properties(connack.properties)).get(ID_PROPERTY)
        if connack.reason_code != mqtt5.SUCCESS:
            self.close(f"{self.dialed} refused the link: reason {connack.reason_code:#x}",
                       disconnect=False)
        elif said != str(self.dialed):
            self.abort(f"dialed {self.dialed}, but {said!r} answered")
        else:
            self._rtt_sample(self._connect_sent_ns)
            self._established()

    def _established(self) -> None:
        self.established = True
        self.node.link_up(self)

    # -- packets ------------------------------------------------------------------------

    def on_packet(self, packet: Packet, size: int) -> None:
        if not isinstance(packet, Publish):
            self.node.count_signalling(0, size)
        if not self.established:
            if isinstance(packet, Connect) and self.dialed is None:
                self._answer_connect(packet)
            elif isinstance(packet, ConnAck) and self.dialed is not None:
                self._take_connack(packet)
            else:
                self.protocol_error(f"{type(packet).__name__} before the link handshake ended")
            return
        match packet:
            case Publish():
                if packet.qos != 2:
                    self.protocol_error(f"QoS {packet.qos} PUBLISH on a link (forwarding is "
                                        "QoS 2)")
                elif self.accept_publish(packet):
                    self.node.on_link_publish(self, packet)
            case PingReq():
                self.send_signalling(PingResp())
                self.node.on_pingreq(self, packet.payload)
            case PingResp():
                if self._pings_sent_ns:
                    self._rtt_sample(self._pings_sent_ns.popleft())
                    self.node.on_rtt(self)
            case Disconnect():
                self.close(f"{self.peer} disconnected (reason {packet.reason_code:#x})",
                           disconnect=False)
            case _:
                self.protocol_error(f"{type(packet).__name__} on an established link")

    def protocol_error(self, reason: str) -> None:
        self.node.count_protocol_error(self, reason)
        self.abort(reason)

    def on_lost(self, reason: str) -> None:
        logger.info("link to %s ended: %s", self.peer or "an unknown peer", reason)
        self.node.link_down(self, reason)
