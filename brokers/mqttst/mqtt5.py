"""The MQTT 5 packets an MQTT-ST node speaks, over a TCP stream, on the shared codec.

A node talks MQTT 5 twice: as a client of its local Mosquitto (it needs the ``no_local``
subscription option and user properties, both MQTT 5 only) and on its links to other
nodes, which use the same framing with the bridge marker in the CONNECT. Only the
packets and properties those two conversations use are here; fields are read with the
3.1.1 codec's :class:`~mqttbed.core.mqtt_codec.FieldReader` and framed with its
remaining-length helpers, and every violation raises
:class:`~mqttbed.core.mqtt_codec.MalformedPacket` naming the field.

Section numbers refer to the OASIS MQTT Version 5.0 standard.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum

from mqttbed.core.mqtt_codec import (
    FieldReader,
    MalformedPacket,
    PacketType,
    decode_remaining_length,
    encode_binary,
    encode_packet,
    encode_remaining_length,
    encode_string,
)

PROTOCOL_LEVEL = 5
BRIDGE_BIT = 0x80           # set in the protocol level byte by a node dialing a node
MAX_PACKET_BYTES = 1 << 20  # what one packet on a link or from Mosquitto may take

# SUBSCRIBE options byte (section 3.8.3.1)
NO_LOCAL = 0x04
RETAIN_AS_PUBLISHED = 0x08
RETAIN_HANDLING_NEVER = 0x20

# Reason codes used here (section 2.4)
SUCCESS = 0x00
CLIENT_ID_NOT_VALID = 0x85
NOT_AUTHORIZED = 0x87
UNSUPPORTED_PROTOCOL_VERSION = 0x84

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


class Property(IntEnum):
    """Property identifiers (section 2.2.2.2)."""

    PAYLOAD_FORMAT = 0x01
    MESSAGE_EXPIRY = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_ID = 0x0B
    SESSION_EXPIRY = 0x11
    ASSIGNED_CLIENT_ID = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTH_METHOD = 0x15
    AUTH_DATA = 0x16
    REQUEST_PROBLEM_INFO = 0x17
    WILL_DELAY = 0x18
    REQUEST_RESPONSE_INFO = 0x19
    RESPONSE_INFO = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_AVAILABLE = 0x28
    SUBSCRIPTION_ID_AVAILABLE = 0x29
    SHARED_AVAILABLE = 0x2A


_BYTE, _U16_T, _U32_T, _VARINT, _STRING, _BINARY, _PAIR = range(7)
_PROPERTY_TYPES = {
    Property.PAYLOAD_FORMAT: _BYTE, Property.MESSAGE_EXPIRY: _U32_T,
    Property.CONTENT_TYPE: _STRING, Property.RESPONSE_TOPIC: _STRING,
    Property.CORRELATION_DATA: _BINARY, Property.SUBSCRIPTION_ID: _VARINT,
    Property.SESSION_EXPIRY: _U32_T, Property.ASSIGNED_CLIENT_ID: _STRING,
    Property.SERVER_KEEP_ALIVE: _U16_T, Property.AUTH_METHOD: _STRING,
    Property.AUTH_DATA: _BINARY, Property.REQUEST_PROBLEM_INFO: _BYTE,
    Property.WILL_DELAY: _U32_T, Property.REQUEST_RESPONSE_INFO: _BYTE,
    Property.RESPONSE_INFO: _STRING, Property.SERVER_REFERENCE: _STRING,
    Property.REASON_STRING: _STRING, Property.RECEIVE_MAXIMUM: _U16_T,
    Property.TOPIC_ALIAS_MAXIMUM: _U16_T, Property.TOPIC_ALIAS: _U16_T,
    Property.MAXIMUM_QOS: _BYTE, Property.RETAIN_AVAILABLE: _BYTE,
    Property.USER_PROPERTY: _PAIR, Property.MAXIMUM_PACKET_SIZE: _U32_T,
    Property.WILDCARD_AVAILABLE: _BYTE, Property.SUBSCRIPTION_ID_AVAILABLE: _BYTE,
    Property.SHARED_AVAILABLE: _BYTE,
}

PropertyValue = int | str | bytes | tuple[str, str]
Properties = tuple[tuple[int, PropertyValue], ...]   # in order; user properties repeat


# -- packets ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    keepalive_s: int = 60
    bridge: bool = False            # the MQTT-ST marker: MSB of the protocol level
    clean_start: bool = True
    properties: Properties = ()
    protocol_level: int = PROTOCOL_LEVEL


@dataclass(frozen=True, slots=True)
class ConnAck:
    reason_code: int = SUCCESS
    session_present: bool = False
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class Ack:
    """PUBACK, PUBREC, PUBREL or PUBCOMP."""

    packet_type: PacketType
    packet_id: int
    reason_code: int = SUCCESS


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    filters: tuple[tuple[str, int], ...]   # (topic filter, options byte)


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    reason_codes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PingReq:
    """A PINGREQ; MQTT-ST appends its BPDU as ``payload`` (empty for a plain one)."""

    payload: bytes = b""


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = SUCCESS


Packet = Connect | ConnAck | Publish | Ack | Subscribe | SubAck | PingReq | PingResp | Disconnect


# -- properties -------------------------------------------------------------------------


def encode_properties(properties: Properties) -> bytes:
    """The property length and the properties (section 2.2.2)."""
    body = bytearray()
    for ident, value in properties:
        kind = _PROPERTY_TYPES[Property(ident)]
        body += encode_remaining_length(ident)
        if kind == _BYTE and isinstance(value, int):
            body.append(value)
        elif kind == _U16_T and isinstance(value, int):
            body += _U16.pack(value)
        elif kind == _U32_T and isinstance(value, int):
            body += _U32.pack(value)
        elif kind == _VARINT and isinstance(value, int):
            body += encode_remaining_length(value)
        elif kind == _STRING and isinstance(value, str):
            body += encode_string(value)
        elif kind == _BINARY and isinstance(value, bytes):
            body += encode_binary(value)
        elif kind == _PAIR and isinstance(value, tuple):
            name, text = value
            body += encode_string(name) + encode_string(text)
        else:
            raise ValueError(f"property {Property(ident).name} cannot hold {value!r}")
    return encode_remaining_length(len(body)) + bytes(body)


def _read_varint(r: FieldReader, what: str) -> int:
    value, r.pos = decode_remaining_length(r.data, r.pos)
    if r.pos > r.end:
        raise MalformedPacket(f"{what} runs past the packet")
    return value


def decode_properties(r: FieldReader, what: str) -> Properties:
    """Read a property length and the properties it covers; refuse unknown identifiers."""
    length = _read_varint(r, f"{what} property length")
    if length > r.remaining():
        raise MalformedPacket(f"{what} property length {length} exceeds the "
                              f"{r.remaining()} bytes left")
    end, outer_end = r.pos + length, r.end
    r.end = end
    found: list[tuple[int, PropertyValue]] = []
    try:
        while r.remaining():
            ident = _read_varint(r, f"{what} property identifier")
            try:
                kind = _PROPERTY_TYPES[Property(ident)]
            except ValueError:
                raise MalformedPacket(f"{what} property identifier {ident:#x} is unknown "
                                      "(section 2.2.2.2)") from None
            value: PropertyValue
            if kind == _BYTE:
                value = r.u8(f"{what} property {ident:#x}")
            elif kind == _U16_T:
                value = r.u16(f"{what} property {ident:#x}")
            elif kind == _U32_T:
                value = _U32.unpack(r.take(4, f"{what} property {ident:#x}"))[0]
            elif kind == _VARINT:
                value = _read_varint(r, f"{what} property {ident:#x}")
            elif kind == _STRING:
                value = r.string(f"{what} property {ident:#x}")
            elif kind == _BINARY:
                value = r.binary(f"{what} property {ident:#x}")
            else:
                value = (r.string(f"{what} user property name"),
                         r.string(f"{what} user property value"))
            found.append((ident, value))
    finally:
        r.end = outer_end
    return tuple(found)


def property_value(properties: Properties, ident: Property, default: int) -> int:
    """The first value of integer property ``ident``, or ``default``."""
    for found, value in properties:
        if found == ident and isinstance(value, int):
            return value
    return default


def user_properties(properties: Properties) -> Iterator[tuple[str, str]]:
    """The (name, value) user properties, in order."""
    for ident, value in properties:
        if ident == Property.USER_PROPERTY and isinstance(value, tuple):
            yield value


# -- encoding ---------------------------------------------------------------------------


def encode_publish(p: Publish, packet_id: int | None = None) -> bytes:
    """A PUBLISH with ``packet_id`` (or the packet's own) for QoS 1 and 2."""
    packet_id = p.packet_id if packet_id is None else packet_id
    first = (PacketType.PUBLISH << 4) | (p.dup << 3) | (p.qos << 1) | p.retain
    variable = encode_string(p.topic)
    if p.qos:
        if packet_id is None:
            raise ValueError("a QoS 1/2 PUBLISH needs a packet identifier")
        variable += _U16.pack(packet_id)
    return encode_packet(first, variable + encode_properties(p.properties) + p.payload)


def encode(packet: Packet) -> bytes:
    """The bytes of ``packet``."""
    match packet:
        case Publish():
            return encode_publish(packet)
        case Ack():
            flags = 0x02 if packet.packet_type == PacketType.PUBREL else 0
            body = _U16.pack(packet.packet_id)
            if packet.reason_code != SUCCESS:  # section 3.4.2.1: may be left out on success
                body += bytes((packet.reason_code, 0))
            return encode_packet((packet.packet_type << 4) | flags, body)
        case PingReq():
            return encode_packet(PacketType.PINGREQ << 4, packet.payload)
        case PingResp():
            return bytes((PacketType.PINGRESP << 4, 0))
        case Connect():
            level = packet.protocol_level | (BRIDGE_BIT if packet.bridge else 0)
            variable = (encode_string("MQTT") + bytes((level, packet.clean_start << 1))
                        + _U16.pack(packet.keepalive_s) + encode_properties(packet.properties))
            return encode_packet(PacketType.CONNECT << 4,
                                 variable + encode_string(packet.client_id))
        case ConnAck():
            return encode_packet(PacketType.CONNACK << 4,
                                 bytes((packet.session_present, packet.reason_code))
                                 + encode_properties(packet.properties))
        case Subscribe():
            body = _U16.pack(packet.packet_id) + encode_properties(()) + b"".join(
                encode_string(topic) + bytes((options,)) for topic, options in packet.filters)
            return encode_packet((PacketType.SUBSCRIBE << 4) | 0x02, body)
        case SubAck():
            return encode_packet(PacketType.SUBACK << 4, _U16.pack(packet.packet_id)
                                 + encode_properties(()) + bytes(packet.reason_codes))
        case Disconnect():
            return encode_packet(PacketType.DISCONNECT << 4,
                                 b"" if packet.reason_code == SUCCESS
                                 else bytes((packet.reason_code, 0)))
    raise TypeError(f"not an MQTT 5 packet this module encodes: {packet!r}")


# -- stream framing and decoding --------------------------------------------------------


@dataclass
class FrameBuffer:
    """Cuts a TCP byte stream into whole packets: ``(first byte, body)`` pairs."""

    max_packet_bytes: int = MAX_PACKET_BYTES
    _data: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        """Add ``chunk``; return the packets now complete. Raises MalformedPacket."""
        self._data += chunk
        packets, data, pos = [], self._data, 0
        while len(data) - pos >= 2:
            if not _length_complete(data, pos + 1):
                break
            length, start = decode_remaining_length(data, pos + 1)
            if length > self.max_packet_bytes:
                raise MalformedPacket(f"packet of {length} bytes exceeds the "
                                      f"{self.max_packet_bytes}-byte limit")
            if start + length > len(data):
                break
            packets.append((data[pos], bytes(data[start:start + length])))
            pos = start + length
        if pos:
            del data[:pos]
        return packets


def _length_complete(data: bytearray, pos: int) -> bool:
    """Whether the remaining length at ``data[pos:]`` has all its bytes (or is malformed)."""
    for index in range(pos, min(pos + 4, len(data))):
        if not data[index] & 0x80:
            return True
    return len(data) - pos >= 4   # four continuation bytes: decoding will refuse it


def decode(first: int, body: bytes) -> Packet:
    """Decode one packet from its first byte and body; raise MalformedPacket."""
    try:
        kind = PacketType(first >> 4)
    except ValueError:
        raise MalformedPacket(f"packet type {first >> 4} is not one a node handles") from None
    flags = first & 0x0F
    expected_flags = 0x02 if kind in (PacketType.PUBREL, PacketType.SUBSCRIBE) else 0
    if kind != PacketType.PUBLISH and flags != expected_flags:
        raise MalformedPacket(f"{kind.name} fixed-header flags {flags:#x} are reserved "
                              "(section 2.1.3)")
    r = FieldReader(body, 0, len(body))
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise MalformedPacket(f"{kind.name} is not a packet a node accepts")
    packet = decoder(r, flags, kind)
    r.done(kind.name)
    return packet


def _decode_publish(r: FieldReader, flags: int, _kind: PacketType) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH QoS 3 is not allowed (section 3.3.1.2)")
    topic = r.string("PUBLISH topic name")
    if not topic or "+" in topic or "#" in topic:
        raise MalformedPacket(f"PUBLISH topic name {topic!r} is empty or has a wildcard "
                              "(section 3.3.2.1)")
    packet_id = r.packet_id("PUBLISH") if qos else None
    properties = decode_properties(r, "PUBLISH")
    return Publish(topic, r.take(r.remaining(), "PUBLISH payload"), qos, bool(flags & 0x01),
                   bool(flags & 0x08), packet_id, properties)


def _decode_ack(r: FieldReader, _flags: int, kind: PacketType) -> Ack:
    packet_id = r.packet_id(kind.name)
    reason = r.u8(f"{kind.name} reason code") if r.remaining() else SUCCESS
    if r.remaining():
        decode_properties(r, kind.name)
    return Ack(kind, packet_id, reason)


def _decode_connect(r: FieldReader, _flags: int, _kind: PacketType) -> Connect:
    name = r.string("CONNECT protocol name")
    if name != "MQTT":
        raise MalformedPacket(f"CONNECT protocol name {name!r} is not 'MQTT' (section 3.1.2.1)")
    level = r.u8("CONNECT protocol level")
    connect_flags = r.u8("CONNECT flags")
    if connect_flags & 0xFD:
        raise MalformedPacket(f"CONNECT flags {connect_flags:#x}: a node takes no will, "
                              "user name or password")
    keepalive = r.u16("CONNECT keep alive")
    properties = decode_properties(r, "CONNECT")
    client_id = r.string("CONNECT client identifier")
    return Connect(client_id, keepalive, bool(level & BRIDGE_BIT), bool(connect_flags & 0x02),
                   properties, level & ~BRIDGE_BIT)


def _decode_connack(r: FieldReader, _flags: int, _kind: PacketType) -> ConnAck:
    ack_flags = r.u8("CONNACK flags")
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags are set (section 3.2.2.1)")
    reason = r.u8("CONNACK reason code")
    properties = decode_properties(r, "CONNACK") if r.remaining() else ()
    return ConnAck(reason, bool(ack_flags), properties)


def _decode_suback(r: FieldReader, _flags: int, _kind: PacketType) -> SubAck:
    packet_id = r.packet_id("SUBACK")
    decode_properties(r, "SUBACK")
    return SubAck(packet_id, tuple(r.take(r.remaining(), "SUBACK reason codes")))


def _decode_disconnect(r: FieldReader, _flags: int, _kind: PacketType) -> Disconnect:
    reason = r.u8("DISCONNECT reason code") if r.remaining() else SUCCESS
    if r.remaining():
        decode_properties(r, "DISCONNECT")
    return Disconnect(reason)


_DECODERS: dict[PacketType, Callable[[FieldReader, int, PacketType], Packet]] = {
    PacketType.PUBLISH: _decode_publish,
    PacketType.PUBACK: _decode_ack,
    PacketType.PUBREC: _decode_ack,
    PacketType.PUBREL: _decode_ack,
    PacketType.PUBCOMP: _decode_ack,
    PacketType.CONNECT: _decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.SUBACK: _decode_suback,
    PacketType.PINGREQ: lambda r, _f, _k: PingReq(r.take(r.remaining(), "PINGREQ payload")),
    PacketType.PINGRESP: lambda _r, _f, _k: PingResp(),
    PacketType.DISCONNECT: _decode_disconnect,
}
