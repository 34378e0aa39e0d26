"""MQTT-SN 1.2 packets: one datagram in, one typed packet out, and back.

Written from the MQTT-SN 1.2 specification (Stanford-Clark and Truong, IBM, 2013),
sections 5.2-5.4. The codec is strict because the broker and the switch data plane both
trust what it returns: every byte string either decodes to a packet that encodes back
to exactly the same bytes, or raises :class:`MqttSnError` saying what is wrong.
Canonical form is part of that promise: the 3-byte length form is accepted only for
packets longer than 255 octets, and flag bits a message does not use must be zero.

Only the messages a gateway without will and QoS 2 needs are decoded to packets; the
others (ADVERTISE, WILLTOPIC, PUBREC, ...) are recognised by :class:`MsgType` and
refused as unsupported, so a caller can count them apart from garbage.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

PROTOCOL_ID = 0x01
MAX_CLIENT_ID_BYTES = 23   # section 5.3.1
MAX_PACKET_BYTES = 0xFFFF
WILDCARDS = frozenset("+#")


class MqttSnError(ValueError):
    """A datagram (or a packet to encode) that is not valid MQTT-SN 1.2."""


class MsgType(IntEnum):
    """The MsgType octet (section 5.2.2, table 3)."""

    ADVERTISE = 0x00
    SEARCHGW = 0x01
    GWINFO = 0x02
    CONNECT = 0x04
    CONNACK = 0x05
    WILLTOPICREQ = 0x06
    WILLTOPIC = 0x07
    WILLMSGREQ = 0x08
    WILLMSG = 0x09
    REGISTER = 0x0A
    REGACK = 0x0B
    PUBLISH = 0x0C
    PUBACK = 0x0D
    PUBCOMP = 0x0E
    PUBREC = 0x0F
    PUBREL = 0x10
    SUBSCRIBE = 0x12
    SUBACK = 0x13
    UNSUBSCRIBE = 0x14
    UNSUBACK = 0x15
    PINGREQ = 0x16
    PINGRESP = 0x17
    DISCONNECT = 0x18
    WILLTOPICUPD = 0x1A
    WILLTOPICRESP = 0x1B
    WILLMSGUPD = 0x1C
    WILLMSGRESP = 0x1D
    ENCAPSULATED = 0xFE


class TopicIdType(IntEnum):
    """The two low bits of the Flags octet (section 5.3.4); 0b11 is reserved."""

    NORMAL = 0
    PREDEFINED = 1
    SHORT_NAME = 2


class ReturnCode(IntEnum):
    """The ReturnCode octet (section 5.3.10); 0x04-0xFF are reserved."""

    ACCEPTED = 0
    CONGESTION = 1
    INVALID_TOPIC_ID = 2
    NOT_SUPPORTED = 3


_RETURN_CODES = frozenset(code.value for code in ReturnCode)

# Flags octet (section 5.3.4): the bits each message may set; the rest must be zero.
DUP = 0x80
QOS_MASK = 0x60
RETAIN = 0x10
WILL = 0x08
CLEAN_SESSION = 0x04
TOPIC_ID_TYPE_MASK = 0x03
QOS_MINUS_ONE_BITS = 0b11


@dataclass(frozen=True)
class Connect:
    client_id: str
    duration_s: int
    clean_session: bool = True
    will: bool = False


@dataclass(frozen=True)
class Connack:
    return_code: ReturnCode


@dataclass(frozen=True)
class Register:
    topic_id: int
    msg_id: int
    topic_name: str


@dataclass(frozen=True)
class Regack:
    topic_id: int
    msg_id: int
    return_code: ReturnCode


@dataclass(frozen=True)
class Publish:
    """A PUBLISH; with SHORT_NAME, ``topic_id`` holds the name's two bytes (big endian)."""

    topic_id: int
    msg_id: int
    data: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    topic_id_type: TopicIdType = TopicIdType.NORMAL


@dataclass(frozen=True)
class Puback:
    topic_id: int
    msg_id: int
    return_code: ReturnCode


@dataclass(frozen=True)
class Subscribe:
    """A SUBSCRIBE: a name (filter) for NORMAL, an id for PREDEFINED, two chars for SHORT_NAME."""

    msg_id: int
    topic: str | int
    topic_id_type: TopicIdType
    qos: int = 0
    dup: bool = False


@dataclass(frozen=True)
class Suback:
    topic_id: int
    msg_id: int
    return_code: ReturnCode
    qos: int = 0


@dataclass(frozen=True)
class Unsubscribe:
    msg_id: int
    topic: str | int
    topic_id_type: TopicIdType


@dataclass(frozen=True)
class Unsuback:
    msg_id: int


@dataclass(frozen=True)
class Pingreq:
    client_id: str | None = None


@dataclass(frozen=True)
class Pingresp:
    pass


@dataclass(frozen=True)
class Disconnect:
    duration_s: int | None = None


Packet = (Connect | Connack | Register | Regack | Publish | Puback | Subscribe | Suback
          | Unsubscribe | Unsuback | Pingreq | Pingresp | Disconnect)


# -- topics -------------------------------------------------------------------------------


def topic_matches(filter: str, name: str) -> bool:  # noqa: A002 - the spec's own word
    """True if topic ``name`` matches ``filter`` under MQTT's wildcard rules.

    ``+`` matches one level, ``#`` (last) the parent level and everything below it;
    names starting with ``$`` are not matched by a filter starting with a wildcard.
    """
    if name.startswith("$") and filter[:1] in WILDCARDS:
        return False
    filter_levels = filter.split("/")
    name_levels = name.split("/")
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(name_levels) or (level != "+" and level != name_levels[index]):
            return False
    return len(filter_levels) == len(name_levels)


def short_name_id(name: str) -> int:
    """The topic id that carries a two-character short topic name in a PUBLISH."""
    return int.from_bytes(_short_name_bytes(name), "big")


def short_name_of(topic_id: int) -> str:
    """The short topic name a SHORT_NAME PUBLISH carries in ``topic_id``."""
    return _short_name_str(topic_id.to_bytes(2, "big"))


def _check_filter(topic: str) -> None:
    for level in topic.split("/"):
        if WILDCARDS & set(level) and level not in WILDCARDS:
            raise MqttSnError(f"topic filter {topic!r}: a wildcard must fill its level")
    if "#" in topic and not topic.endswith("#"):
        raise MqttSnError(f"topic filter {topic!r}: '#' must be the last level")


def _check_name(topic: str, what: str) -> None:
    if WILDCARDS & set(topic):
        raise MqttSnError(f"{what} {topic!r} contains a wildcard character")


# -- fields -------------------------------------------------------------------------------


def _text(raw: bytes, what: str, max_bytes: int = MAX_PACKET_BYTES) -> str:
    if not raw:
        raise MqttSnError(f"empty {what}")
    if len(raw) > max_bytes:
        raise MqttSnError(f"{what} of {len(raw)} bytes; at most {max_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MqttSnError(f"{what} is not valid UTF-8: {exc.reason} at byte {exc.start}"
                          ) from None
    if "\0" in text:
        raise MqttSnError(f"{what} contains U+0000")
    return text


def _text_bytes(text: object, what: str, max_bytes: int = MAX_PACKET_BYTES) -> bytes:
    if not isinstance(text, str):
        raise MqttSnError(f"{what} must be a str, not {type(text).__name__}")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MqttSnError(f"{what} cannot be UTF-8 encoded: {exc.reason}") from None
    _text(raw, what, max_bytes)
    return raw


def _short_name_bytes(name: object) -> bytes:
    if not isinstance(name, str) or len(name) != 2 or not name.isascii():
        raise MqttSnError(f"short topic name {name!r}: two ASCII characters expected")
    return name.encode("ascii")


def _short_name_str(raw: bytes) -> str:
    if len(raw) != 2 or not raw.isascii():
        raise MqttSnError(f"short topic name {raw!r}: two ASCII characters expected")
    return raw.decode("ascii")


def _u16(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0xFFFF:
        raise MqttSnError(f"{what} {value!r} is not a 16-bit unsigned integer")
    return value


def _return_code(value: object) -> ReturnCode:
    if isinstance(value, int) and not isinstance(value, bool) and value in _RETURN_CODES:
        return ReturnCode(value)
    raise MqttSnError(f"return code {value!r} is reserved or not an integer")


def _topic_id_type(flags: int, allowed: tuple[TopicIdType, ...], message: str) -> TopicIdType:
    bits = flags & TOPIC_ID_TYPE_MASK
    if bits not in [t.value for t in allowed]:
        raise MqttSnError(f"{message}: topic id type {bits:#04b} is not allowed")
    return TopicIdType(bits)


def _check_flags(flags: int, allowed: int, message: str) -> None:
    if flags & ~allowed:
        raise MqttSnError(f"{message}: reserved flag bits set ({flags & ~allowed:#04x})")


def _qos_from_flags(flags: int, message: str, allow_minus_one: bool) -> int:
    bits = (flags & QOS_MASK) >> 5
    if bits == QOS_MINUS_ONE_BITS:
        if not allow_minus_one:
            raise MqttSnError(f"{message}: QoS -1 is allowed only in PUBLISH")
        return -1
    return bits


def _qos_bits(qos: object, allow_minus_one: bool, message: str) -> int:
    allowed = (-1, 0, 1, 2) if allow_minus_one else (0, 1, 2)
    if not isinstance(qos, int) or isinstance(qos, bool) or qos not in allowed:
        raise MqttSnError(f"{message}: QoS {qos!r} is not one of {allowed}")
    return (QOS_MINUS_ONE_BITS if qos == -1 else qos) << 5


# -- decode -------------------------------------------------------------------------------


def _split(datagram: bytes) -> tuple[int, bytes]:
    """Return (MsgType octet, message variable part) after checking the Length field."""
    if not isinstance(datagram, bytes | bytearray | memoryview):
        raise MqttSnError(f"a datagram is bytes, not {type(datagram).__name__}")
    datagram = bytes(datagram)
    if len(datagram) < 2:
        raise MqttSnError(f"datagram of {len(datagram)} bytes is shorter than a header")
    if datagram[0] == 0x01:
        if len(datagram) < 4:
            raise MqttSnError("3-octet length field truncated")
        length = int.from_bytes(datagram[1:3], "big")
        if length < 256:
            raise MqttSnError(f"3-octet length form used for {length} octets; "
                              "it is for packets longer than 255")
        header = 3
    else:
        length, header = datagram[0], 1
        if length < 2:
            raise MqttSnError(f"length field {length} is shorter than a header")
    if length != len(datagram):
        raise MqttSnError(f"length field says {length} octets, the datagram has "
                          f"{len(datagram)}")
    return datagram[header], datagram[header + 1:]


def _need(body: bytes, size: int, message: str, exact: bool = True) -> None:
    if len(body) < size or (exact and len(body) != size):
        want = f"{size}" if exact else f"at least {size}"
        raise MqttSnError(f"{message}: body of {len(body)} octets, {want} expected")


def _decode_connect(body: bytes) -> Connect:
    _need(body, 5, "CONNECT", exact=False)
    flags, protocol_id, duration = body[0], body[1], int.from_bytes(body[2:4], "big")
    _check_flags(flags, WILL | CLEAN_SESSION, "CONNECT")
    if protocol_id != PROTOCOL_ID:
        raise MqttSnError(f"CONNECT: protocol id {protocol_id:#04x}, expected 0x01")
    client_id = _text(body[4:], "client id", MAX_CLIENT_ID_BYTES)
    return Connect(client_id, duration, bool(flags & CLEAN_SESSION), bool(flags & WILL))


def _decode_connack(body: bytes) -> Connack:
    _need(body, 1, "CONNACK")
    return Connack(_return_code(body[0]))


def _decode_register(body: bytes) -> Register:
    _need(body, 5, "REGISTER", exact=False)
    topic_id, msg_id = struct.unpack_from(">HH", body)
    name = _text(body[4:], "REGISTER topic name")
    _check_name(name, "REGISTER topic name")
    return Register(topic_id, msg_id, name)


def _decode_regack(body: bytes) -> Regack:
    _need(body, 5, "REGACK")
    topic_id, msg_id = struct.unpack_from(">HH", body)
    return Regack(topic_id, msg_id, _return_code(body[4]))


def _decode_publish(body: bytes) -> Publish:
    _need(body, 5, "PUBLISH", exact=False)
    flags = body[0]
    _check_flags(flags, DUP | QOS_MASK | RETAIN | TOPIC_ID_TYPE_MASK, "PUBLISH")
    kinds = (TopicIdType.NORMAL, TopicIdType.PREDEFINED, TopicIdType.SHORT_NAME)
    id_type = _topic_id_type(flags, kinds, "PUBLISH")
    qos = _qos_from_flags(flags, "PUBLISH", allow_minus_one=True)
    topic_id, msg_id = struct.unpack_from(">HH", body, 1)
    packet = Publish(topic_id, msg_id, body[5:], qos, bool(flags & RETAIN), bool(flags & DUP),
                     id_type)
    _check_publish(packet)
    return packet


def _check_publish(packet: Publish) -> None:
    if packet.topic_id_type == TopicIdType.SHORT_NAME:
        short_name_of(packet.topic_id)
    elif packet.topic_id in (0x0000, 0xFFFF):
        raise MqttSnError(f"PUBLISH: topic id {packet.topic_id:#06x} is reserved")
    if packet.qos == -1 and packet.topic_id_type == TopicIdType.NORMAL:
        raise MqttSnError("PUBLISH: QoS -1 needs a pre-defined topic id or a short name")


def _decode_puback(body: bytes) -> Puback:
    _need(body, 5, "PUBACK")
    topic_id, msg_id = struct.unpack_from(">HH", body)
    return Puback(topic_id, msg_id, _return_code(body[4]))


def _decode_topic(raw: bytes, id_type: TopicIdType, message: str) -> str | int:
    """The topic of a SUBSCRIBE or UNSUBSCRIBE, by its type."""
    if id_type == TopicIdType.PREDEFINED:
        _need(raw, 2, f"{message} with a pre-defined topic id")
        return int.from_bytes(raw, "big")
    if id_type == TopicIdType.SHORT_NAME:
        return _short_name_str(raw)
    topic = _text(raw, f"{message} topic filter")
    _check_filter(topic)
    return topic


def _decode_subscribe(body: bytes) -> Subscribe:
    _need(body, 3, "SUBSCRIBE", exact=False)
    flags = body[0]
    _check_flags(flags, DUP | QOS_MASK | TOPIC_ID_TYPE_MASK, "SUBSCRIBE")
    kinds = (TopicIdType.NORMAL, TopicIdType.PREDEFINED, TopicIdType.SHORT_NAME)
    id_type = _topic_id_type(flags, kinds, "SUBSCRIBE")
    qos = _qos_from_flags(flags, "SUBSCRIBE", allow_minus_one=False)
    msg_id = int.from_bytes(body[1:3], "big")
    return Subscribe(msg_id, _decode_topic(body[3:], id_type, "SUBSCRIBE"), id_type, qos,
                     bool(flags & DUP))


def _decode_suback(body: bytes) -> Suback:
    _need(body, 6, "SUBACK")
    flags = body[0]
    _check_flags(flags, QOS_MASK, "SUBACK")
    qos = _qos_from_flags(flags, "SUBACK", allow_minus_one=False)
    topic_id, msg_id = struct.unpack_from(">HH", body, 1)
    return Suback(topic_id, msg_id, _return_code(body[5]), qos)


def _decode_unsubscribe(body: bytes) -> Unsubscribe:
    _need(body, 3, "UNSUBSCRIBE", exact=False)
    flags = body[0]
    _check_flags(flags, TOPIC_ID_TYPE_MASK, "UNSUBSCRIBE")
    kinds = (TopicIdType.NORMAL, TopicIdType.PREDEFINED, TopicIdType.SHORT_NAME)
    id_type = _topic_id_type(flags, kinds, "UNSUBSCRIBE")
    msg_id = int.from_bytes(body[1:3], "big")
    return Unsubscribe(msg_id, _decode_topic(body[3:], id_type, "UNSUBSCRIBE"), id_type)


def _decode_unsuback(body: bytes) -> Unsuback:
    _need(body, 2, "UNSUBACK")
    return Unsuback(int.from_bytes(body, "big"))


def _decode_pingreq(body: bytes) -> Pingreq:
    return Pingreq(_text(body, "PINGREQ client id", MAX_CLIENT_ID_BYTES) if body else None)


def _decode_pingresp(body: bytes) -> Pingresp:
    _need(body, 0, "PINGRESP")
    return Pingresp()


def _decode_disconnect(body: bytes) -> Disconnect:
    if not body:
        return Disconnect()
    _need(body, 2, "DISCONNECT with a duration")
    return Disconnect(int.from_bytes(body, "big"))


_DECODERS: dict[MsgType, Callable[[bytes], Packet]] = {
    MsgType.CONNECT: _decode_connect, MsgType.CONNACK: _decode_connack,
    MsgType.REGISTER: _decode_register, MsgType.REGACK: _decode_regack,
    MsgType.PUBLISH: _decode_publish, MsgType.PUBACK: _decode_puback,
    MsgType.SUBSCRIBE: _decode_subscribe, MsgType.SUBACK: _decode_suback,
    MsgType.UNSUBSCRIBE: _decode_unsubscribe, MsgType.UNSUBACK: _decode_unsuback,
    MsgType.PINGREQ: _decode_pingreq, MsgType.PINGRESP: _decode_pingresp,
    MsgType.DISCONNECT: _decode_disconnect,
}


def decode(datagram: bytes) -> Packet:
    """Decode one datagram into its packet; raise MqttSnError saying what is wrong."""
    msg_type, body = _split(datagram)
    try:
        known = MsgType(msg_type)
    except ValueError:
        raise MqttSnError(f"reserved message type {msg_type:#04x}") from None
    decoder = _DECODERS.get(known)
    if decoder is None:
        raise MqttSnError(f"{known.name} ({msg_type:#04x}) is not supported")
    return decoder(body)


# -- encode -------------------------------------------------------------------------------


def _frame(msg_type: MsgType, body: bytes) -> bytes:
    length = len(body) + 2
    if length <= 255:
        return bytes((length, msg_type)) + body
    length += 2
    if length > MAX_PACKET_BYTES:
        raise MqttSnError(f"{msg_type.name} of {length} octets exceeds {MAX_PACKET_BYTES}")
    return b"\x01" + length.to_bytes(2, "big") + bytes((msg_type,)) + body


def _ids(topic_id: int, msg_id: int, what: str) -> bytes:
    return struct.pack(">HH", _u16(topic_id, f"{what} topic id"), _u16(msg_id, f"{what} msg id"))


def _encode_topic(packet: Subscribe | Unsubscribe, message: str) -> bytes:
    id_type = packet.topic_id_type
    if id_type == TopicIdType.PREDEFINED:
        return _u16(packet.topic, f"{message} pre-defined topic id").to_bytes(2, "big")
    if id_type == TopicIdType.SHORT_NAME:
        return _short_name_bytes(packet.topic)
    if id_type != TopicIdType.NORMAL:
        raise MqttSnError(f"{message}: topic id type {id_type!r} is not allowed")
    raw = _text_bytes(packet.topic, f"{message} topic filter")
    _check_filter(raw.decode("utf-8"))  # the topic filter, which _text_bytes found a str
    return raw


def _encode_publish(p: Publish) -> bytes:
    if p.topic_id_type not in tuple(TopicIdType):
        raise MqttSnError(f"PUBLISH: topic id type {p.topic_id_type!r} is not allowed")
    _u16(p.topic_id, "PUBLISH topic id")
    _check_publish(p)
    flags = (_qos_bits(p.qos, True, "PUBLISH") | (DUP if p.dup else 0)
             | (RETAIN if p.retain else 0) | p.topic_id_type)
    return _frame(MsgType.PUBLISH, bytes((flags,)) + _ids(p.topic_id, p.msg_id, "PUBLISH")
                  + bytes(p.data))


def _encode_subscribe(p: Subscribe) -> bytes:
    flags = _qos_bits(p.qos, False, "SUBSCRIBE") | (DUP if p.dup else 0) | p.topic_id_type
    return _frame(MsgType.SUBSCRIBE, bytes((flags,)) + _u16(p.msg_id, "SUBSCRIBE msg id")
                  .to_bytes(2, "big") + _encode_topic(p, "SUBSCRIBE"))


def _encode_unsubscribe(p: Unsubscribe) -> bytes:
    body = _u16(p.msg_id, "UNSUBSCRIBE msg id").to_bytes(2, "big")
    return _frame(MsgType.UNSUBSCRIBE, bytes((p.topic_id_type,)) + body
                  + _encode_topic(p, "UNSUBSCRIBE"))


def _encode_connect(p: Connect) -> bytes:
    flags = (WILL if p.will else 0) | (CLEAN_SESSION if p.clean_session else 0)
    return _frame(MsgType.CONNECT, bytes((flags, PROTOCOL_ID))
                  + _u16(p.duration_s, "CONNECT duration").to_bytes(2, "big")
                  + _text_bytes(p.client_id, "client id", MAX_CLIENT_ID_BYTES))


def _encode_register(p: Register) -> bytes:
    raw = _text_bytes(p.topic_name, "REGISTER topic name")
    _check_name(p.topic_name, "REGISTER topic name")
    return _frame(MsgType.REGISTER, _ids(p.topic_id, p.msg_id, "REGISTER") + raw)


def _encode_suback(p: Suback) -> bytes:
    return _frame(MsgType.SUBACK, bytes((_qos_bits(p.qos, False, "SUBACK"),))
                  + _ids(p.topic_id, p.msg_id, "SUBACK") + bytes((_return_code(p.return_code),)))


def _encode_pingreq(p: Pingreq) -> bytes:
    if p.client_id is None:
        return _frame(MsgType.PINGREQ, b"")
    return _frame(MsgType.PINGREQ, _text_bytes(p.client_id, "PINGREQ client id",
                                               MAX_CLIENT_ID_BYTES))


def _encode_disconnect(p: Disconnect) -> bytes:
    if p.duration_s is None:
        return _frame(MsgType.DISCONNECT, b"")
    return _frame(MsgType.DISCONNECT, _u16(p.duration_s, "DISCONNECT duration")
                  .to_bytes(2, "big"))


def _ack(msg_type: MsgType, p: Regack | Puback) -> bytes:
    return _frame(msg_type, _ids(p.topic_id, p.msg_id, msg_type.name)
                  + bytes((_return_code(p.return_code),)))


def encode(packet: Packet) -> bytes:
    """Encode ``packet`` as one datagram; raise MqttSnError for a field out of range."""
    match packet:
        case Publish():
            return _encode_publish(packet)
        case Connect():
            return _encode_connect(packet)
        case Connack():
            return _frame(MsgType.CONNACK, bytes((_return_code(packet.return_code),)))
        case Register():
            return _encode_register(packet)
        case Regack():
            return _ack(MsgType.REGACK, packet)
        case Puback():
            return _ack(MsgType.PUBACK, packet)
        case Subscribe():
            return _encode_subscribe(packet)
        case Suback():
            return _encode_suback(packet)
        case Unsubscribe():
            return _encode_unsubscribe(packet)
        case Unsuback():
            return _frame(MsgType.UNSUBACK, _u16(packet.msg_id, "UNSUBACK msg id")
                          .to_bytes(2, "big"))
        case Pingreq():
            return _encode_pingreq(packet)
        case Pingresp():
            return _frame(MsgType.PINGRESP, b"")
        case Disconnect():
            return _encode_disconnect(packet)
    raise MqttSnError(f"not an MQTT-SN packet: {type(packet).__name__}")
