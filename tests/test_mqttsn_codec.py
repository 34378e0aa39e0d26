"""The MQTT-SN 1.2 codec: exact bytes, every message and flag, malformed input, fuzz."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqttbed.core.mqttsn import (
    Connack,
    Connect,
    Disconnect,
    MqttSnError,
    MsgType,
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
    short_name_id,
    short_name_of,
    topic_matches,
)

NORMAL, PREDEFINED, SHORT = TopicIdType.NORMAL, TopicIdType.PREDEFINED, TopicIdType.SHORT_NAME


def test_message_types_and_codes_have_the_specs_values():
    assert (MsgType.CONNECT, MsgType.REGISTER, MsgType.PUBLISH, MsgType.SUBSCRIBE,
            MsgType.PINGREQ, MsgType.DISCONNECT) == (0x04, 0x0A, 0x0C, 0x12, 0x16, 0x18)
    assert list(TopicIdType) == [0, 1, 2] and list(ReturnCode) == [0, 1, 2, 3]


@pytest.mark.parametrize(("packet", "wire"), [
    (Connect("pub-0", 30), bytes([11, 0x04, 0x04, 0x01, 0, 30]) + b"pub-0"),
    (Connect("c", 0, clean_session=False, will=True), bytes([7, 0x04, 0x08, 1, 0, 0]) + b"c"),
    (Connack(ReturnCode.CONGESTION), bytes([3, 0x05, 1])),
    (Register(0, 7, "a/b"), bytes([9, 0x0A, 0, 0, 0, 7]) + b"a/b"),
    (Regack(1, 7, ReturnCode.ACCEPTED), bytes([7, 0x0B, 0, 1, 0, 7, 0])),
    (Publish(1, 0, b"hi"), bytes([9, 0x0C, 0x00, 0, 1, 0, 0]) + b"hi"),
    (Publish(5, 0, b"", qos=-1, topic_id_type=PREDEFINED), bytes([7, 0x0C, 0x61, 0, 5, 0, 0])),
    (Publish(short_name_id("ab"), 9, b"x", qos=1, retain=True, dup=True, topic_id_type=SHORT),
     bytes([8, 0x0C, 0x80 | 0x20 | 0x10 | 0x02]) + b"ab" + bytes([0, 9]) + b"x"),
    (Puback(1, 9, ReturnCode.INVALID_TOPIC_ID), bytes([7, 0x0D, 0, 1, 0, 9, 2])),
    (Subscribe(3, "a/+", NORMAL), bytes([8, 0x12, 0x00, 0, 3]) + b"a/+"),
    (Subscribe(3, 17, PREDEFINED, qos=1, dup=True), bytes([7, 0x12, 0xA1, 0, 3, 0, 17])),
    (Subscribe(3, "ab", SHORT, qos=2), bytes([7, 0x12, 0x42, 0, 3]) + b"ab"),
    (Suback(0, 3, ReturnCode.ACCEPTED, qos=1), bytes([8, 0x13, 0x20, 0, 0, 0, 3, 0])),
    (Unsubscribe(4, "a/#", NORMAL), bytes([8, 0x14, 0x00, 0, 4]) + b"a/#"),
    (Unsubscribe(4, 17, PREDEFINED), bytes([7, 0x14, 0x01, 0, 4, 0, 17])),
    (Unsuback(4), bytes([4, 0x15, 0, 4])),
    (Pingreq(), bytes([2, 0x16])),
    (Pingreq("sub-1"), bytes([7, 0x16]) + b"sub-1"),
    (Pingresp(), bytes([2, 0x17])),
    (Disconnect(), bytes([2, 0x18])),
    (Disconnect(60), bytes([4, 0x18, 0, 60])),
])
def test_each_message_encodes_to_the_specs_bytes_and_back(packet, wire):
    assert encode(packet) == wire
    assert decode(wire) == packet


def test_every_publish_flag_combination_round_trips():
    for qos, retain, dup, id_type in itertools.product((-1, 0, 1, 2), (False, True),
                                                      (False, True), TopicIdType):
        if qos == -1 and id_type == NORMAL:
            continue
        topic_id = short_name_id("zz") if id_type == SHORT else 0x1234
        packet = Publish(topic_id, 1, b"\x00\xff", qos, retain, dup, id_type)
        assert decode(encode(packet)) == packet


def test_every_subscribe_flag_combination_round_trips():
    topics = {NORMAL: "x/+/y", PREDEFINED: 0xBEEF, SHORT: "s1"}
    for qos, dup, id_type in itertools.product((0, 1, 2), (False, True), TopicIdType):
        packet = Subscribe(65535, topics[id_type], id_type, qos, dup)
        assert decode(encode(packet)) == packet
        unsubscribe = Unsubscribe(1, topics[id_type], id_type)
        assert decode(encode(unsubscribe)) == unsubscribe


def test_long_packets_take_the_three_octet_length_and_short_ones_never_do():
    packet = Publish(1, 0, bytes(300))
    wire = encode(packet)
    assert wire[:3] == b"\x01" + (300 + 7 + 2).to_bytes(2, "big") and wire[3] == 0x0C
    assert decode(wire) == packet
    assert decode(encode(Publish(1, 0, bytes(248))))  # 255 octets: one-octet form
    assert encode(Publish(1, 0, bytes(248)))[0] == 255


def test_short_names_are_carried_in_the_topic_id():
    assert short_name_id("ab") == 0x6162 and short_name_of(0x6162) == "ab"


@pytest.mark.parametrize(("datagram", "message"), [
    (b"", "shorter than a header"),
    (b"\x05", "shorter than a header"),
    (b"\x00\x16", "length field 0"),
    (b"\x03\x16", "length field says 3 octets, the datagram has 2"),
    (b"\x02\x16\x00", "length field says 2 octets, the datagram has 3"),
    (b"\x01\x00\x04\x16", "3-octet length form used for 4 octets"),
    (b"\x01\x01", "truncated"),
    (b"\x02\x03", "reserved message type 0x03"),
    (b"\x02\x11", "reserved message type 0x11"),
    (b"\x02\xff", "reserved message type 0xff"),
    (b"\x02\x00", "ADVERTISE (0x00) is not supported"),
    (b"\x02\x10", "PUBREL (0x10) is not supported"),
    (bytes([7, 0x04, 0x04, 0x02, 0, 30]) + b"c", "protocol id 0x02"),
    (bytes([7, 0x04, 0x84, 0x01, 0, 30]) + b"c", "CONNECT: reserved flag bits set (0x80)"),
    (bytes([6, 0x04, 0x04, 0x01, 0, 30]), "body of 4 octets, at least 5"),
    (bytes([30, 0x04, 0x04, 0x01, 0, 30]) + b"x" * 24, "client id of 24 bytes; at most 23"),
    (bytes([7, 0x04, 0x04, 0x01, 0, 30]) + b"\xff", "client id is not valid UTF-8"),
    (bytes([3, 0x05, 0x04]), "return code 4 is reserved"),
    (bytes([6, 0x0A, 0, 0, 0, 1]), "body of 4 octets, at least 5"),
    (bytes([7, 0x0A, 0, 0, 0, 1, ord("#")]), "REGISTER topic name '#' contains a wildcard"),
    (bytes([8, 0x0A, 0, 0, 0, 1, 0xC3, 0x28]), "REGISTER topic name is not valid UTF-8"),
    (bytes([8, 0x0A, 0, 0, 0, 1, ord("a"), 0]), "contains U+0000"),
    (bytes([7, 0x0C, 0x03, 0, 1, 0, 0]), "PUBLISH: topic id type 0b11 is not allowed"),
    (bytes([7, 0x0C, 0x08, 0, 1, 0, 0]), "PUBLISH: reserved flag bits set (0x08)"),
    (bytes([7, 0x0C, 0x04, 0, 1, 0, 0]), "PUBLISH: reserved flag bits set (0x04)"),
    (bytes([7, 0x0C, 0x60, 0, 1, 0, 0]), "QoS -1 needs a pre-defined topic id or a short"),
    (bytes([7, 0x0C, 0x00, 0, 0, 0, 0]), "PUBLISH: topic id 0x0000 is reserved"),
    (bytes([7, 0x0C, 0x01, 0xFF, 0xFF, 0, 0]), "PUBLISH: topic id 0xffff is reserved"),
    (bytes([7, 0x0C, 0x02, 0xC3, 0xA9, 0, 0]), "two ASCII characters expected"),
    (bytes([6, 0x0C, 0x00, 0, 1, 0]), "body of 4 octets, at least 5"),
    (bytes([7, 0x0D, 0, 1, 0, 1, 9]), "return code 9 is reserved"),
    (bytes([6, 0x12, 0x60, 0, 1, ord("a")]), "SUBSCRIBE: QoS -1 is allowed only in PUBLISH"),
    (bytes([6, 0x12, 0x10, 0, 1, ord("a")]), "SUBSCRIBE: reserved flag bits set (0x10)"),
    (bytes([6, 0x12, 0x03, 0, 1, ord("a")]), "SUBSCRIBE: topic id type 0b11"),
    (bytes([5, 0x12, 0x00, 0, 1]), "empty SUBSCRIBE topic filter"),
    (bytes([7, 0x12, 0x00, 0, 1]) + b"a#", "'a#': a wildcard must fill its level"),
    (bytes([8, 0x12, 0x00, 0, 1]) + b"#/a", "'#' must be the last level"),
    (bytes([8, 0x12, 0x01, 0, 1]) + b"abc", "pre-defined topic id: body of 3 octets, 2"),
    (bytes([8, 0x12, 0x02, 0, 1]) + b"abc", "short topic name b'abc'"),
    (bytes([8, 0x13, 0x01, 0, 1, 0, 1, 0]), "SUBACK: reserved flag bits set (0x01)"),
    (bytes([7, 0x13, 0x00, 0, 1, 0, 1]), "SUBACK: body of 5 octets, 6 expected"),
    (bytes([6, 0x14, 0x20, 0, 1, ord("a")]), "UNSUBSCRIBE: reserved flag bits set (0x20)"),
    (bytes([3, 0x15, 0]), "UNSUBACK: body of 1 octets, 2 expected"),
    (bytes([3, 0x17, 0]), "PINGRESP: body of 1 octets, 0 expected"),
    (bytes([3, 0x18, 0]), "DISCONNECT with a duration: body of 1 octets, 2 expected"),
])
def test_malformed_datagrams_are_refused_saying_what_is_wrong(datagram, message):
    with pytest.raises(MqttSnError) as raised:
        decode(datagram)
    assert message in str(raised.value)


@pytest.mark.parametrize(("packet", "message"), [
    (Connect("", 30), "empty client id"),
    (Connect("c", 70_000), "CONNECT duration 70000 is not a 16-bit"),
    (Publish(1, 0, b"", qos=3), "QoS 3 is not one of"),
    (Publish(1, 0, b"", qos=1.0), "QoS 1.0 is not one of"),
    (Publish(1, -1, b""), "PUBLISH msg id -1"),
    (Register(0, 1, "a/+"), "contains a wildcard"),
    (Subscribe(1, "ab", SHORT, qos=-1), "QoS -1 is not one of (0, 1, 2)"),
    (Subscribe(1, "abc", SHORT), "two ASCII characters expected"),
    (Suback(1, 1, 7), "return code 7 is reserved"),
    (Publish(1, 0, bytes(70_000)), "exceeds 65535"),
    ("not a packet", "not an MQTT-SN packet"),
])
def test_encode_refuses_fields_out_of_range(packet, message):
    with pytest.raises(MqttSnError) as raised:
        encode(packet)
    assert message in str(raised.value)


@pytest.mark.parametrize(("filter_", "name", "matches"), [
    ("a/b", "a/b", True), ("a/b", "a/c", False), ("a/+", "a/b", True),
    ("a/+", "a/b/c", False), ("a/#", "a", True), ("a/#", "a/b/c", True),
    ("#", "a/b", True), ("+/b", "a/b", True), ("+", "", True), ("a/+", "a/", True),
    ("#", "$SYS/x", False), ("+/x", "$SYS/x", False), ("$SYS/#", "$SYS/x", True),
    ("a/b/c", "a/b", False), ("+/+", "/x", True),
])
def test_topic_filters_match_by_mqtt_wildcard_rules(filter_, name, matches):
    assert topic_matches(filter_, name) is matches


# A datagram with a plausible header and type around random bodies reaches the decoders.
_TYPES = st.sampled_from([t.value for t in MsgType] + [0x03, 0x11, 0x19, 0xFF])


@st.composite
def _framed(draw: st.DrawFn) -> bytes:
    body = draw(st.binary(max_size=40))
    msg_type = draw(_TYPES)
    return bytes((len(body) + 2, msg_type)) + body


@settings(max_examples=2000, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=64), _framed()))
def test_decode_returns_a_packet_or_refuses_and_what_it_accepts_encodes_back(datagram):
    try:
        packet = decode(datagram)
    except MqttSnError:
        return
    assert encode(packet) == datagram
