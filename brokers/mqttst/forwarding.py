"""Origin marking and duplicate suppression of forwarded publications (paper §II.C.5).

A publication a local client made is forwarded as a QoS 2 PUBLISH carrying three MQTT 5
user properties: the origin (the broker's id and a per-start incarnation, so a restarted
broker's sequence numbers are new), a per-origin sequence number, and the QoS it was
published with. Every other property travels unchanged (content type, message expiry,
the client's own user properties...), except the two that only mean something on one
connection (topic alias, subscription identifier). The receiver drops the three markers
again before it injects the message into its Mosquitto.

The spanning tree alone makes every message reach every broker once; the origin marks
make that hold while the tree is being rebuilt, when two brokers can briefly both
forward on a link, or a message can reach a broker over an old and a new path.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from mqttbed.brokers.mqttst.mqtt5 import Properties, Property, Publish, user_properties

ORIGIN_PROPERTY = "mqttst-origin"
SEQUENCE_PROPERTY = "mqttst-seq"
QOS_PROPERTY = "mqttst-qos"
MARKERS = frozenset({ORIGIN_PROPERTY, SEQUENCE_PROPERTY, QOS_PROPERTY})
_CONNECTION_ONLY = frozenset({Property.TOPIC_ALIAS, Property.SUBSCRIPTION_ID})


@dataclass(frozen=True, slots=True)
class Origin:
    broker: str     # "ADDRESS:PORT/INCARNATION"
    sequence: int
    qos: int


def mark(message: Publish, origin: str, sequence: int) -> Publish:
    """The link PUBLISH (QoS 2) for a message a local client published at ``origin``."""
    kept: Properties = tuple(
        (ident, value) for ident, value in message.properties
        if ident not in _CONNECTION_ONLY and not _is_marker(ident, value))
    markers: Properties = (
        (Property.USER_PROPERTY, (ORIGIN_PROPERTY, origin)),
        (Property.USER_PROPERTY, (SEQUENCE_PROPERTY, str(sequence))),
        (Property.USER_PROPERTY, (QOS_PROPERTY, str(message.qos))))
    return Publish(message.topic, message.payload, 2, message.retain, False, None,
                   kept + markers)


def origin_of(message: Publish) -> Origin | None:
    """The origin marks of a link PUBLISH, or None if any is missing or garbled."""
    found: dict[str, str] = {}
    for name, text in user_properties(message.properties):
        if name in MARKERS:
            found[name] = text
    try:
        sequence, qos = int(found[SEQUENCE_PROPERTY]), int(found[QOS_PROPERTY])
        broker = found[ORIGIN_PROPERTY]
    except (KeyError, ValueError):
        return None
    if sequence < 1 or qos not in (0, 1, 2) or not broker:
        return None
    return Origin(broker, sequence, qos)


def unmark(message: Publish, origin: Origin) -> Publish:
    """The message as its publisher sent it: original QoS and retain, markers removed."""
    properties = tuple((ident, value) for ident, value in message.properties
                       if not _is_marker(ident, value))
    return replace(message, qos=origin.qos, dup=False, packet_id=None, properties=properties)


def _is_marker(ident: int, value: object) -> bool:
    return (ident == Property.USER_PROPERTY and isinstance(value, tuple)
            and value[0] in MARKERS)


class DedupeWindow:
    """Which (origin, sequence) pairs were seen, within a window per origin.

    Per origin it remembers the highest sequence and those seen in the ``window`` below
    it; anything older than that is taken as seen (a message that late is a duplicate
    far more often than a survivor). At most ``max_origins`` origins are kept, the least
    recently heard forgotten first.
    """

    def __init__(self, window: int = 4096, max_origins: int = 1024):
        self.window = window
        self.max_origins = max_origins
        self._origins: OrderedDict[str, tuple[int, set[int]]] = OrderedDict()

    def first_time(self, origin: str, sequence: int) -> bool:
        """Record (origin, sequence); True if it was not seen before."""
        entry = self._origins.get(origin)
        if entry is None:
            self._origins[origin] = (sequence, {sequence})
            if len(self._origins) > self.max_origins:
                self._origins.popitem(last=False)
            return True
        self._origins.move_to_end(origin)
        highest, seen = entry
        if sequence <= highest - self.window or sequence in seen:
            return False
        seen.add(sequence)
        if sequence > highest:
            if len(seen) > 2 * self.window:
                seen = {s for s in seen if s > sequence - self.window}
            self._origins[origin] = (sequence, seen)
        return True
