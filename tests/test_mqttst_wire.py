"""MQTT-ST node internals byte for byte: MQTT 5 framing, origin marks, duplicate suppression."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mqttbed.brokers.mqttst import mqtt5
from mqttbed.brokers.mqttst.capability import capability, cpu_mhz, memory_mib
from mqttbed.brokers.mqttst.forwarding import DedupeWindow, mark, origin_of, unmark
from mqttbed.brokers.mqttst.mqtt5 import (
    Ack,
    ConnAck,
    Connect,
    FrameBuffer,
    PingReq,
    Property,
    Publish,
    decode,
    encode,
)
from mqttbed.core.mqtt_codec import MalformedPacket, PacketType

CLIENT_PROPERTIES = ((Property.CONTENT_TYPE, "text/plain"),
                     (Property.USER_PROPERTY, ("sensor", "s1")),
                     (Property.MESSAGE_EXPIRY, 60), (Property.TOPIC_ALIAS, 3))


def roundtrip(packet: mqtt5.Packet) -> mqtt5.Packet:
    [(first, body)] = FrameBuffer().feed(encode(packet))
    return decode(first, body)


@pytest.mark.parametrize("packet", [
    Publish("a/b", b"x" * 300, 2, True, False, 7, CLIENT_PROPERTIES),
    Publish("a", b"", 0),
    Connect("mqttst/127.0.0.1:1883", 10, bridge=True),
    ConnAck(0, properties=((Property.RECEIVE_MAXIMUM, 20),
                           (Property.USER_PROPERTY, ("mqttst-id", "127.0.0.1:1884")))),
    Ack(PacketType.PUBREC, 9), Ack(PacketType.PUBREL, 9), Ack(PacketType.PUBCOMP, 9, 0x92),
    PingReq(b"\x01" * 40), PingReq(),
])
def test_packets_round_trip(packet):
    assert roundtrip(packet) == packet


def test_the_bridge_marker_is_the_top_bit_of_the_protocol_level():
    raw = encode(Connect("n", 10, bridge=True))
    assert raw[2:8] == b"\x00\x04MQTT" and raw[8] == 0x85
    assert encode(Connect("n", 10))[8] == 0x05


def test_a_plain_pingreq_is_two_bytes_and_a_bpdu_one_carries_its_payload():
    assert encode(PingReq()) == b"\xc0\x00"
    assert encode(PingReq(b"\xaa" * 40)) == b"\xc0\x28" + b"\xaa" * 40


def test_frames_are_cut_from_a_stream_arriving_byte_by_byte():
    stream = b"".join(encode(p) for p in (
        PingReq(b"z" * 200), Publish("t", b"p" * 20000, 1, packet_id=1), mqtt5.PingResp()))
    frames, buffer = [], FrameBuffer()
    for byte in stream:
        frames += buffer.feed(bytes((byte,)))
    assert [decode(*frame) for frame in frames] == [
        PingReq(b"z" * 200), Publish("t", b"p" * 20000, 1, packet_id=1), mqtt5.PingResp()]


@pytest.mark.parametrize(("stream", "why"), [
    (b"\xc0\xff\xff\xff\xff\x01", "four bytes"),
    (b"\x30\xff\xff\xff\x7f", "limit"),
])
def test_a_broken_stream_is_refused(stream, why):
    with pytest.raises(MalformedPacket, match=why):
        FrameBuffer(max_packet_bytes=1 << 20).feed(stream)


@pytest.mark.parametrize(("first", "body", "why"), [
    (0x30, b"\x00\x01a\x02\x7f\x00", "unknown"),               # property id 0x7f
    (0x30, b"\x00\x01a\x09", "exceeds"),                       # property length past the end
    (0x30, b"\x00\x01#\x00", "wildcard"),
    (0x36, b"\x00\x01a\x00\x01\x00", "QoS 3"),
    (0xC1, b"", "reserved"),
    (0xF0, b"", "not one a node handles"),                               # AUTH
    (0x10, b"\x00\x04MQTX\x85\x02\x00\x0a\x00\x00\x00", "protocol name"),
])
def test_malformed_packets_are_refused_naming_the_rule(first, body, why):
    with pytest.raises(MalformedPacket, match=why):
        decode(first, body)


def test_marks_carry_origin_sequence_and_qos_and_come_off_again():
    published = Publish("a/b", b"hello", 1, True, False, 12, CLIENT_PROPERTIES)
    on_link = mark(published, "127.0.0.1:1883/ab12", 42)
    assert on_link.qos == 2 and on_link.retain and on_link.packet_id is None
    assert (Property.TOPIC_ALIAS, 3) not in on_link.properties   # one connection only
    origin = origin_of(roundtrip(replace(on_link, packet_id=5)))
    assert origin is not None and (origin.broker, origin.sequence, origin.qos) == \
        ("127.0.0.1:1883/ab12", 42, 1)
    injected = unmark(on_link, origin)
    assert (injected.qos, injected.retain, injected.payload) == (1, True, b"hello")
    assert list(mqtt5.user_properties(injected.properties)) == [("sensor", "s1")]
    assert (Property.CONTENT_TYPE, "text/plain") in injected.properties


@pytest.mark.parametrize("markers", [
    (), (("mqttst-origin", "x"), ("mqttst-seq", "1")),
    (("mqttst-origin", "x"), ("mqttst-seq", "one"), ("mqttst-qos", "1")),
    (("mqttst-origin", "x"), ("mqttst-seq", "1"), ("mqttst-qos", "3")),
])
def test_messages_without_valid_marks_have_no_origin(markers):
    properties = tuple((Property.USER_PROPERTY, pair) for pair in markers)
    assert origin_of(Publish("t", b"", 2, packet_id=1, properties=properties)) is None


def test_dedupe_window_sees_each_origin_sequence_once():
    window = DedupeWindow(window=4, max_origins=2)
    assert window.first_time("a", 1) and not window.first_time("a", 1)
    assert window.first_time("a", 3) and window.first_time("a", 2)   # late but in the window
    assert window.first_time("b", 1)                                 # sequences are per origin
    for seq in range(4, 20):
        assert window.first_time("a", seq)
    assert not window.first_time("a", 10)     # older than the window: taken as seen
    assert window.first_time("c", 1)          # a third origin evicts the least recent (b)
    assert window.first_time("b", 1)


def test_capability_reads_this_machine_and_weighs_it():
    assert cpu_mhz() > 0 and memory_mib() > 0
    assert capability(1.0, 0.0) == cpu_mhz() and capability(0.0, 2.0) == 2 * memory_mib()
    with pytest.raises(ValueError, match="alpha"):
        capability(float("nan"), 1.0)
