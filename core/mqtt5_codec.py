"""MQTT 5 as mqttbed's own small clients of a broker speak it: CONNECT, CONNACK, SUBSCRIBE,
DISCONNECT, and every packet a broker sends a client.

For the readiness probe and the ``$SYS`` sampler when a run speaks MQTT 5
(``workload.protocol: "5"``); the 3.1.1 codec (:mod:`mqttbed.core.mqtt_codec`) is left as
it is and its field reader and packet classes are reused: a broker's PUBLISH, SUBACK and
acknowledgements decode into the 3.1.1 classes (their properties checked, then dropped),
so code that reads a 3.1.1 session reads an MQTT 5 one unchanged. CONNACK and DISCONNECT
carry what 3.1.1 has no room for: a reason code named as the standard names it
(``0x86 Bad User Name or Password``) and the server's reason string.

Section numbers refer to the OASIS MQTT Version 5.0 standard.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from mqttbed.core.mqtt_codec import (
    Connect,
    FieldReader,
    MalformedPacket,
    PacketIdAck,
    PacketType,
    PingResp,
    Publish,
    SubAck,
    UnsubAck,
    connect_flags_and_payload,
    encode_packet,
    encode_remaining_length,
    encode_string,
)

PROTOCOL_LEVEL = 5
SUCCESS = 0x00
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")

# Reason codes and their names (section 2.4, table 2-6), as a user reads them in an error.
REASON_NAMES: dict[int, str] = {
    0x00: "Success", 0x01: "Granted QoS 1", 0x02: "Granted QoS 2",
    0x04: "Disconnect with Will Message", 0x10: "No matching subscribers",
    0x11: "No subscription existed", 0x18: "Continue authentication",
    0x19: "Re-authenticate", 0x80: "Unspecified error", 0x81: "Malformed Packet",
    0x82: "Protocol Error", 0x83: "Implementation specific error",
    0x84: "Unsupported Protocol Version", 0x85: "Client Identifier not valid",
    0x86: "Bad User Name or Password", 0x87: "Not authorized", 0x88: "Server unavailable",
    0x89: "Server busy", 0x8A: "Banned", 0x8B: "Server shutting down",
    0x8C: "Bad authentication method", 0x8D: "Keep Alive timeout",
    0x8E: "Session taken over", 0x8F: "Topic Filter invalid", 0x90: "Topic Name invalid",
    0x91: "Packet Identifier in use", 0x92: "Packet Identifier not found",
    0x93: "Receive Maximum exceeded", 0x94: "Topic Alias invalid", 0x95: "Packet too large",
    0x96: "Message rate too high", 0x97: "Quota exceeded", 0x98: "Administrative action",
    0x99: "Payload format invalid", 0x9A: "Retain not supported",
    0x9B: "QoS not supported", 0x9C: "Use another server", 0x9D: "Server moved",
    0x9E: "Shared Subscriptions not supported", 0x9F: "Connection rate exceeded",
    0xA0: "Maximum connect time", 0xA1: "Subscription Identifiers not supported",
    0xA2: "Wildcard Subscriptions not supported",
}

REASON_STRING = 0x1F
# Each property's identifier and the type of its value (section 2.2.2.2, table 2-4).
_BYTE, _U16_T, _U32_T, _VARINT, _UTF8, _BINARY, _PAIR = range(7)
_PROPERTY_TYPES: dict[int, int] = {
    0x01: _BYTE, 0x02: _U32_T, 0x03: _UTF8, 0x08: _UTF8, 0x09: _BINARY, 0x0B: _VARINT,
    0x11: _U32_T, 0x12: _UTF8, 0x13: _U16_T, 0x15: _UTF8, 0x16: _BINARY, 0x17: _BYTE,
    0x18: _U32_T, 0x19: _BYTE, 0x1A: _UTF8, 0x1C: _UTF8, 0x1F: _UTF8, 0x21: _U16_T,
    0x22: _U16_T, 0x23: _U16_T, 0x24: _BYTE, 0x25: _BYTE, 0x26: _PAIR, 0x27: _U32_T,
    0x28: _BYTE, 0x29: _BYTE, 0x2A: _BYTE,
}

PropertyValue = int | str | bytes | tuple[str, str]
Properties = tuple[tuple[int, PropertyValue], ...]


def describe_reason(code: int) -> str:
    """A reason code with its name: ``0x87 Not authorized`` (section 2.4)."""
    return f"{code:#04x} {REASON_NAMES.get(code, 'reserved, not an MQTT 5 reason code')}"


@dataclass(frozen=True, slots=True)
class ConnAck5:
    """An MQTT 5 CONNACK: a reason code below 0x80 accepts the connection."""

    reason_code: int = SUCCESS
    session_present: bool = False
    properties: Properties = ()

    @property
    def accepted(self) -> bool:
        return self.reason_code < 0x80

    @property
    def reason_string(self) -> str | None:
        """The server's own words for its answer, if it gave any (property 0x1F)."""
        return property_text(self.properties, REASON_STRING)


@dataclass(frozen=True, slots=True)
class Disconnect5:
    """An MQTT 5 DISCONNECT, from either side (section 3.14)."""

    reason_code: int = SUCCESS
    properties: Properties = ()

    @property
    def reason_string(self) -> str | None:
        return property_text(self.properties, REASON_STRING)


Packet5 = ConnAck5 | Disconnect5 | Publish | PacketIdAck | SubAck | UnsubAck | PingResp


def property_text(properties: Properties, ident: int) -> str | None:
    """The first value of the text property ``ident``, or None."""
    for key, value in properties:
        if key == ident and isinstance(value, str):
            return value
    return None


# -- encoding ---------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """A variable byte integer (section 1.5.5): what the remaining length is made of."""
    return encode_remaining_length(value)


def encode_connect(packet: Connect) -> bytes:
    """An MQTT 5 CONNECT of ``packet``'s fields (no properties; ``clean_session`` is Clean
    Start; a will goes without will properties)."""
    flags, payload = connect_flags_and_payload(packet, will_properties=encode_varint(0))
    variable = (encode_string("MQTT") + bytes((PROTOCOL_LEVEL, flags))
                + _U16.pack(packet.keepalive_s) + encode_varint(0))
    return encode_packet(PacketType.CONNECT << 4, variable + payload)


def encode_subscribe(packet_id: int, filters: tuple[tuple[str, int], ...]) -> bytes:
    """An MQTT 5 SUBSCRIBE of ``(filter, maximum QoS)`` pairs, other options 0."""
    if not 1 <= packet_id <= 0xFFFF:
        raise ValueError(f"packet identifier {packet_id} is outside 1..65535 (section 2.2.1)")
    if not filters:
        raise ValueError("a SUBSCRIBE needs at least one topic filter (section 3.8.3)")
    body = _U16.pack(packet_id) + encode_varint(0) + b"".join(
        encode_string(topic) + bytes((qos,)) for topic, qos in filters)
    return encode_packet((PacketType.SUBSCRIBE << 4) | 0x02, body)


def encode_disconnect(reason_code: int = SUCCESS) -> bytes:
    """An MQTT 5 DISCONNECT with ``reason_code`` and no properties."""
    if reason_code == SUCCESS:
        return bytes((PacketType.DISCONNECT << 4, 0))   # section 3.14.2.1: 0 may be left out
    return encode_packet(PacketType.DISCONNECT << 4, bytes((reason_code,)) + encode_varint(0))


def encode_connack(packet: ConnAck5) -> bytes:
    """An MQTT 5 CONNACK without properties (what a test's broker stand-in answers)."""
    return encode_packet(PacketType.CONNACK << 4,
                         bytes((int(packet.session_present), packet.reason_code, 0)))


# -- decoding ---------------------------------------------------------------------------


def read_varint(r: FieldReader, what: str) -> int:
    """A variable byte integer of at most four bytes (section 1.5.5)."""
    value, multiplier = 0, 1
    for _ in range(4):
        byte = r.u8(what)
        value += (byte & 0x7F) * multiplier
        if not byte & 0x80:
            return value
        multiplier *= 128
    raise MalformedPacket(f"{what} runs past four bytes (section 1.5.5)")


def decode_properties(r: FieldReader, what: str) -> Properties:
    """The property length and the properties after it, each value of its type."""
    length = read_varint(r, f"{what} property length")
    if length > r.remaining():
        raise MalformedPacket(f"{what} property length {length} exceeds the "
                              f"{r.remaining()} bytes left")
    inner = FieldReader(r.data, r.pos, r.pos + length)
    r.pos += length
    found: list[tuple[int, PropertyValue]] = []
    while inner.remaining():
        ident = read_varint(inner, f"{what} property identifier")
        kind = _PROPERTY_TYPES.get(ident)
        label = f"{what} property {ident:#04x}"
        value: PropertyValue
        if kind is None:
            raise MalformedPacket(f"{label} is not an MQTT 5 property (section 2.2.2.2)")
        if kind == _BYTE:
            value = inner.u8(label)
        elif kind == _U16_T:
            value = inner.u16(label)
        elif kind == _U32_T:
            value = _U32.unpack(inner.take(4, label))[0]
        elif kind == _VARINT:
            value = read_varint(inner, label)
        elif kind == _UTF8:
            value = inner.string(label)
        elif kind == _BINARY:
            value = inner.binary(label)
        else:
            value = (inner.string(f"{label} name"), inner.string(f"{label} value"))
        found.append((ident, value))
    return tuple(found)


def decode_body(first: int, body: bytes) -> Packet5:
    """Decode one packet a broker sent an MQTT 5 client: its first byte and the ``body``
    after the remaining length. Raises MalformedPacket naming the field and the rule."""
    try:
        kind = PacketType(first >> 4)
    except ValueError:
        if first >> 4 == 15:
            raise MalformedPacket("AUTH (extended authentication) is not spoken by mqttbed's "
                                  "own clients (section 4.12)") from None
        raise MalformedPacket(f"packet type {first >> 4} is reserved (section 2.1.2)") from None
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise MalformedPacket(f"a server does not send {kind.name} (section 2.1.2)")
    flags = first & 0x0F
    expected = 0x02 if kind == PacketType.PUBREL else 0
    if kind != PacketType.PUBLISH and flags != expected:
        raise MalformedPacket(f"{kind.name} fixed-header flags {flags:#x} are reserved "
                              "(section 2.1.3)")
    reader = FieldReader(body, 0, len(body))
    packet = decoder(reader, flags, kind)
    reader.done(kind.name)
    return packet


def _decode_connack(r: FieldReader, _flags: int, _kind: PacketType) -> ConnAck5:
    ack_flags = r.u8("CONNACK flags")
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags are set (section 3.2.2.1)")
    code = r.u8("CONNACK reason code")
    return ConnAck5(code, bool(ack_flags), decode_properties(r, "CONNACK"))


def _decode_publish(r: FieldReader, flags: int, _kind: PacketType) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH QoS 3 is not allowed (section 3.3.1.2)")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH DUP set on QoS 0 (section 3.3.1.1)")
    topic = r.string("PUBLISH topic name")
    if "+" in topic or "#" in topic:
        raise MalformedPacket(f"PUBLISH topic name {topic!r} has a wildcard (section 3.3.2.1)")
    packet_id = r.packet_id("PUBLISH") if qos else None
    decode_properties(r, "PUBLISH")
    if not topic:
        # an empty name with a Topic Alias: mqttbed's clients allow no aliases (CONNECT
        # leaves Topic Alias Maximum at 0, section 3.1.2.11.5)
        raise MalformedPacket("PUBLISH topic name is empty, and this client allows no topic "
                              "alias (section 3.3.2.3.4)")
    return Publish(topic, r.take(r.remaining(), "PUBLISH payload"), qos, bool(flags & 0x01),
                   dup, packet_id)


def _decode_ack(r: FieldReader, _flags: int, kind: PacketType) -> PacketIdAck:
    packet_id = r.packet_id(kind.name)
    if r.remaining():   # a reason code, then properties, may follow (section 3.4.2.1)
        r.u8(f"{kind.name} reason code")
        if r.remaining():
            decode_properties(r, kind.name)
    return PacketIdAck(kind, packet_id)


def _decode_suback(r: FieldReader, _flags: int, kind: PacketType) -> SubAck:
    packet_id = r.packet_id(kind.name)
    decode_properties(r, kind.name)
    codes = tuple(r.take(r.remaining(), f"{kind.name} reason codes"))
    if not codes:
        raise MalformedPacket(f"{kind.name} without a reason code (section 3.9.3)")
    return SubAck(packet_id, codes)


def _decode_unsuback(r: FieldReader, flags: int, kind: PacketType) -> UnsubAck:
    return UnsubAck(_decode_suback(r, flags, kind).packet_id)


def _decode_disconnect(r: FieldReader, _flags: int, _kind: PacketType) -> Disconnect5:
    if not r.remaining():
        return Disconnect5()
    code = r.u8("DISCONNECT reason code")
    properties = decode_properties(r, "DISCONNECT") if r.remaining() else ()
    return Disconnect5(code, properties)


def _decode_pingresp(_r: FieldReader, _flags: int, _kind: PacketType) -> PingResp:
    return PingResp()


_DECODERS: dict[PacketType, Callable[[FieldReader, int, PacketType], Packet5]] = {
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBLISH: _decode_publish,
    PacketType.PUBACK: _decode_ack,
    PacketType.PUBREC: _decode_ack,
    PacketType.PUBREL: _decode_ack,
    PacketType.PUBCOMP: _decode_ack,
    PacketType.SUBACK: _decode_suback,
    PacketType.UNSUBACK: _decode_unsuback,
    PacketType.PINGRESP: _decode_pingresp,
    PacketType.DISCONNECT: _decode_disconnect,
}
