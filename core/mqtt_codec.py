"""MQTT 3.1.1 control packets as bytes and back, shared by the UDP transport and the FPGA model.

Over UDP (the FPGA broker's transport) one datagram carries exactly one MQTT packet, so
:func:`decode` takes a whole datagram and refuses anything left over or missing. Every
rule of the 3.1.1 standard that can be checked on one packet is checked (fixed-header
flags, remaining length of at most four bytes, UTF-8 strings without U+0000, packet
identifiers, wildcard-free topic names), and a violation raises :class:`MalformedPacket`
naming the rule, so a receiver can drop and count the datagram instead of crashing.

Section numbers in messages refer to the OASIS MQTT Version 3.1.1 standard.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

MAX_REMAINING_LENGTH = 268_435_455   # four bytes of 7 bits, section 2.2.3
PROTOCOL_NAME = "MQTT"
PROTOCOL_LEVEL = 4                   # 3.1.1
SUBACK_FAILURE = 0x80

_U16 = struct.Struct("!H")


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14


class ConnackCode(IntEnum):
    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


class MalformedPacket(ValueError):
    """A datagram is not exactly one well-formed MQTT 3.1.1 packet; the message says why."""


# -- packets ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    message: bytes
    qos: int = 0
    retain: bool = False


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    keepalive_s: int = 60
    clean_session: bool = True
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    protocol_name: str = PROTOCOL_NAME
    protocol_level: int = PROTOCOL_LEVEL


@dataclass(frozen=True, slots=True)
class ConnAck:
    return_code: int = ConnackCode.ACCEPTED
    session_present: bool = False


@dataclass(frozen=True, slots=True)
class Publish:
    """A PUBLISH; ``topic``, ``payload`` and ``qos`` read like paho's MQTTMessage."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None


@dataclass(frozen=True, slots=True)
class PacketIdAck:
    """PUBACK, PUBREC, PUBREL or PUBCOMP (QoS 1/2 flow; the FPGA broker has none)."""

    packet_type: PacketType
    packet_id: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    filters: tuple[tuple[str, int], ...]   # (topic filter, requested QoS)


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    return_codes: tuple[int, ...]          # granted QoS 0-2, or 0x80 for a refusal


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UnsubAck:
    packet_id: int


@dataclass(frozen=True, slots=True)
class PingReq:
    pass


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    pass


Packet = (Connect | ConnAck | Publish | PacketIdAck | Subscribe | SubAck | Unsubscribe
          | UnsubAck | PingReq | PingResp | Disconnect)


# -- encoding ---------------------------------------------------------------------------


def encode_remaining_length(length: int) -> bytes:
    """Return the variable-length encoding of ``length`` (1 to 4 bytes, section 2.2.3)."""
    if not 0 <= length <= MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {length} is outside 0..{MAX_REMAINING_LENGTH}")
    out = bytearray()
    while True:
        byte, length = length % 128, length // 128
        out.append(byte | 0x80 if length else byte)
        if not length:
            return bytes(out)


def encode_string(text: str) -> bytes:
    """A UTF-8 string field: two length bytes, then the text (section 1.5.3)."""
    raw = text.encode("utf-8")
    return encode_binary(raw)


def encode_binary(raw: bytes) -> bytes:
    """A binary field: two length bytes, then ``raw`` (section 1.5.6)."""
    if len(raw) > 0xFFFF:
        raise ValueError(f"field of {len(raw)} bytes exceeds the 65535-byte limit")
    return _U16.pack(len(raw)) + raw


def encode_packet(first_byte: int, body: bytes) -> bytes:
    """A whole packet: ``first_byte``, the remaining length, then ``body``."""
    return bytes((first_byte,)) + encode_remaining_length(len(body)) + body


def _check_packet_id(packet_id: int) -> None:
    if not 1 <= packet_id <= 0xFFFF:
        raise ValueError(f"packet identifier {packet_id} is outside 1..65535 (section 2.3.1)")


def encode_publish(topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                   dup: bool = False, packet_id: int | None = None) -> bytes:
    """Return a PUBLISH packet (the hot path of both the model and the UDP client)."""
    if qos not in (0, 1, 2):
        raise ValueError(f"QoS {qos} is not 0, 1 or 2")
    first = (PacketType.PUBLISH << 4) | (dup << 3) | (qos << 1) | retain
    variable = encode_string(topic)
    if qos:
        if packet_id is None:
            raise ValueError("a QoS 1/2 PUBLISH needs a packet identifier")
        _check_packet_id(packet_id)
        variable += _U16.pack(packet_id)
    return encode_packet(first, variable + payload)


def connect_flags_and_payload(packet: Connect, will_properties: bytes = b"") -> tuple[int, bytes]:
    """A CONNECT's flags byte and its payload (client id, will, user name, password), the
    same in MQTT 3.1.1 and 5 but for the will's properties, which MQTT 5 puts before its
    topic (``will_properties``: their encoded length and bytes)."""
    flags = packet.clean_session << 1
    payload = encode_string(packet.client_id)
    if packet.will is not None:
        flags |= 0x04 | (packet.will.qos << 3) | (packet.will.retain << 5)
        payload += (will_properties + encode_string(packet.will.topic)
                    + encode_binary(packet.will.message))
    if packet.username is not None:
        flags |= 0x80
        payload += encode_string(packet.username)
    if packet.password is not None:
        # MQTT 5 allows a password without a user name (section 3.1.2.9), 3.1.1 does not:
        # the caller's packet decides
        flags |= 0x40
        payload += encode_binary(packet.password)
    return flags, payload


def encode(packet: Packet) -> bytes:
    """Return the bytes of ``packet``."""
    match packet:
        case Publish():
            return encode_publish(packet.topic, packet.payload, packet.qos, packet.retain,
                                  packet.dup, packet.packet_id)
        case Connect():
            flags, payload = connect_flags_and_payload(packet)
            variable = (encode_string(packet.protocol_name) + bytes((packet.protocol_level, flags))
                        + _U16.pack(packet.keepalive_s))
            return encode_packet(PacketType.CONNECT << 4, variable + payload)
        case ConnAck():
            return encode_packet(PacketType.CONNACK << 4,
                           bytes((int(packet.session_present), packet.return_code)))
        case PacketIdAck():
            flags = 0x02 if packet.packet_type == PacketType.PUBREL else 0
            return encode_packet((packet.packet_type << 4) | flags, _U16.pack(packet.packet_id))
        case Subscribe():
            _check_packet_id(packet.packet_id)
            if not packet.filters:
                raise ValueError("a SUBSCRIBE needs at least one topic filter (section 3.8.3)")
            body = _U16.pack(packet.packet_id) + b"".join(
                encode_string(topic) + bytes((qos,)) for topic, qos in packet.filters)
            return encode_packet((PacketType.SUBSCRIBE << 4) | 0x02, body)
        case SubAck():
            return encode_packet(PacketType.SUBACK << 4,
                           _U16.pack(packet.packet_id) + bytes(packet.return_codes))
        case Unsubscribe():
            _check_packet_id(packet.packet_id)
            if not packet.filters:
                raise ValueError("an UNSUBSCRIBE needs at least one topic filter (section 3.10.3)")
            body = _U16.pack(packet.packet_id) + b"".join(encode_string(t) for t in packet.filters)
            return encode_packet((PacketType.UNSUBSCRIBE << 4) | 0x02, body)
        case UnsubAck():
            return encode_packet(PacketType.UNSUBACK << 4, _U16.pack(packet.packet_id))
        case PingReq():
            return bytes((PacketType.PINGREQ << 4, 0))
        case PingResp():
            return bytes((PacketType.PINGRESP << 4, 0))
        case Disconnect():
            return bytes((PacketType.DISCONNECT << 4, 0))
    raise TypeError(f"not an MQTT packet: {packet!r}")


# -- decoding ---------------------------------------------------------------------------


class FieldReader:
    """Reads MQTT fields from the variable header and payload of one packet.

    Every read past ``end`` raises :class:`MalformedPacket` naming the field, so a
    decoder built on it (this module's, the MQTT 5 one of :mod:`mqttbed.brokers.mqttst`)
    never indexes out of a packet.
    """

    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes, pos: int, end: int):
        self.data, self.pos, self.end = data, pos, end

    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, count: int, what: str) -> bytes:
        if count > self.end - self.pos:
            raise MalformedPacket(f"{what} needs {count} bytes, {self.end - self.pos} left")
        chunk = self.data[self.pos:self.pos + count]
        self.pos += count
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return _U16.unpack(self.take(2, what))[0]

    def binary(self, what: str) -> bytes:
        return self.take(self.u16(f"{what} length"), what)

    def string(self, what: str) -> str:
        raw = self.binary(what)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket(f"{what} is not valid UTF-8 (section 1.5.3)") from None
        if "\x00" in text:
            raise MalformedPacket(f"{what} contains U+0000 (section 1.5.3)")
        return text

    def packet_id(self, what: str) -> int:
        packet_id = self.u16(f"{what} packet identifier")
        if packet_id == 0:
            raise MalformedPacket(f"{what} packet identifier is 0 (section 2.3.1)")
        return packet_id

    def done(self, what: str) -> None:
        if self.pos != self.end:
            raise MalformedPacket(f"{what} has {self.end - self.pos} unexpected trailing bytes")


def decode_remaining_length(data: bytes | bytearray, pos: int = 1) -> tuple[int, int]:
    """Return (remaining length, offset of the variable header) read at ``data[pos:]``."""
    value, multiplier = 0, 1
    for count in range(4):
        if pos + count >= len(data):
            raise MalformedPacket("remaining length is cut off")
        byte = data[pos + count]
        value += (byte & 0x7F) * multiplier
        if not byte & 0x80:
            return value, pos + count + 1
        multiplier *= 128
    raise MalformedPacket("remaining length runs past four bytes (section 2.2.3)")


_FIXED_FLAGS = {PacketType.PUBREL: 0x02, PacketType.SUBSCRIBE: 0x02,
                PacketType.UNSUBSCRIBE: 0x02}


def decode(datagram: bytes) -> Packet:
    """Decode one datagram holding exactly one MQTT 3.1.1 packet; raise MalformedPacket."""
    if len(datagram) < 2:
        raise MalformedPacket(f"{len(datagram)} bytes cannot hold a fixed header")
    kind, flags = _packet_type(datagram[0]), datagram[0] & 0x0F
    length, start = decode_remaining_length(datagram)
    if start + length != len(datagram):
        raise MalformedPacket(f"remaining length {length} does not match the "
                              f"{len(datagram) - start} bytes after the fixed header")
    return _decode_fields(kind, flags, FieldReader(datagram, start, len(datagram)))


def decode_body(first: int, body: bytes) -> Packet:
    """Decode one packet cut from a TCP stream: its first byte and the ``body`` after the
    remaining length (what :class:`~mqttbed.brokers.mqttst.mqtt5.FrameBuffer` yields)."""
    return _decode_fields(_packet_type(first), first & 0x0F, FieldReader(body, 0, len(body)))


def _packet_type(first: int) -> PacketType:
    try:
        return PacketType(first >> 4)
    except ValueError:
        raise MalformedPacket(f"packet type {first >> 4} is reserved (section 2.2.1)") from None


def _decode_fields(kind: PacketType, flags: int, reader: FieldReader) -> Packet:
    if kind != PacketType.PUBLISH and flags != _FIXED_FLAGS.get(kind, 0):
        raise MalformedPacket(f"{kind.name} fixed-header flags {flags:#x} are reserved "
                              f"(section 2.2.2)")
    packet = _DECODERS[kind](reader, flags)
    reader.done(kind.name)
    return packet


def _decode_publish(r: FieldReader, flags: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH QoS 3 is not allowed (section 3.3.1.2)")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH DUP set on QoS 0 (section 3.3.1.1)")
    topic = r.string("PUBLISH topic name")
    if not topic:
        raise MalformedPacket("PUBLISH topic name is empty (section 4.7.3)")
    if "+" in topic or "#" in topic:
        raise MalformedPacket(f"PUBLISH topic name {topic!r} has a wildcard (section 3.3.2.1)")
    packet_id = r.packet_id("PUBLISH") if qos else None
    payload = r.take(r.remaining(), "PUBLISH payload")
    return Publish(topic, payload, qos, bool(flags & 0x01), dup, packet_id)


def _decode_connect(r: FieldReader, _flags: int) -> Connect:
    protocol_name = r.string("CONNECT protocol name")
    protocol_level = r.u8("CONNECT protocol level")
    connect_flags = r.u8("CONNECT flags")
    if connect_flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag is set (section 3.1.2.3)")
    keepalive = r.u16("CONNECT keep alive")
    client_id = r.string("CONNECT client identifier")
    will = None
    will_qos, will_retain = (connect_flags >> 3) & 0x03, bool(connect_flags & 0x20)
    if connect_flags & 0x04:
        if will_qos == 3:
            raise MalformedPacket("CONNECT will QoS 3 (section 3.1.2.6)")
        will = Will(r.string("CONNECT will topic"), r.binary("CONNECT will message"),
                    will_qos, will_retain)
    elif will_qos or will_retain:
        raise MalformedPacket("CONNECT will QoS/retain set without the will flag "
                              "(section 3.1.2.6)")
    username = r.string("CONNECT user name") if connect_flags & 0x80 else None
    if connect_flags & 0x40:
        if username is None:
            raise MalformedPacket("CONNECT password without user name (section 3.1.2.9)")
        password = r.binary("CONNECT password")
    else:
        password = None
    return Connect(client_id, keepalive, bool(connect_flags & 0x02), will, username, password,
                   protocol_name, protocol_level)


def _decode_connack(r: FieldReader, _flags: int) -> ConnAck:
    ack_flags = r.u8("CONNACK flags")
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags are set (section 3.2.2.1)")
    return ConnAck(r.u8("CONNACK return code"), bool(ack_flags))


def _decode_ack(kind: PacketType) -> Callable[[FieldReader, int], PacketIdAck]:
    def decode_ack(r: FieldReader, _flags: int) -> PacketIdAck:
        return PacketIdAck(kind, r.packet_id(kind.name))
    return decode_ack


def _decode_subscribe(r: FieldReader, _flags: int) -> Subscribe:
    packet_id = r.packet_id("SUBSCRIBE")
    filters = []
    while r.remaining():
        topic = r.string("SUBSCRIBE topic filter")
        qos = r.u8("SUBSCRIBE requested QoS")
        if qos > 2:
            raise MalformedPacket(f"SUBSCRIBE requested QoS byte {qos:#x} (section 3.8.3.1)")
        filters.append((topic, qos))
    if not filters:
        raise MalformedPacket("SUBSCRIBE without a topic filter (section 3.8.3)")
    return Subscribe(packet_id, tuple(filters))


def _decode_suback(r: FieldReader, _flags: int) -> SubAck:
    packet_id = r.packet_id("SUBACK")
    codes = tuple(r.take(r.remaining(), "SUBACK return codes"))
    if not codes or any(code not in (0, 1, 2, SUBACK_FAILURE) for code in codes):
        raise MalformedPacket(f"SUBACK return codes {list(codes)} (section 3.9.3)")
    return SubAck(packet_id, codes)


def _decode_unsubscribe(r: FieldReader, _flags: int) -> Unsubscribe:
    packet_id = r.packet_id("UNSUBSCRIBE")
    filters = []
    while r.remaining():
        filters.append(r.string("UNSUBSCRIBE topic filter"))
    if not filters:
        raise MalformedPacket("UNSUBSCRIBE without a topic filter (section 3.10.3)")
    return Unsubscribe(packet_id, tuple(filters))


def _decode_unsuback(r: FieldReader, _flags: int) -> UnsubAck:
    return UnsubAck(r.packet_id("UNSUBACK"))


_DECODERS: dict[PacketType, Callable[[FieldReader, int], Packet]] = {
    PacketType.CONNECT: _decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBLISH: _decode_publish,
    PacketType.PUBACK: _decode_ack(PacketType.PUBACK),
    PacketType.PUBREC: _decode_ack(PacketType.PUBREC),
    PacketType.PUBREL: _decode_ack(PacketType.PUBREL),
    PacketType.PUBCOMP: _decode_ack(PacketType.PUBCOMP),
    PacketType.SUBSCRIBE: _decode_subscribe,
    PacketType.SUBACK: _decode_suback,
    PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    PacketType.UNSUBACK: _decode_unsuback,
    PacketType.PINGREQ: lambda _r, _f: PingReq(),
    PacketType.PINGRESP: lambda _r, _f: PingResp(),
    PacketType.DISCONNECT: lambda _r, _f: Disconnect(),
}
