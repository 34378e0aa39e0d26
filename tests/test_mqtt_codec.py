"""The MQTT 3.1.1 codec: the standard's byte examples, round trips, paho interop, rejections."""

from __future__ import annotations

import socket
import threading

import paho.mqtt.client as mqtt
import pytest

from mqttbed.core.mqtt_codec import (
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    PacketIdAck,
    PacketType,
    PingReq,
    PingResp,
    Publish,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
    decode,
    decode_remaining_length,
    encode,
    encode_publish,
    encode_remaining_length,
)

pytestmark = pytest.mark.timeout(20)

# Table 2.4 of the standard: remaining length and its encoding, at each byte-count boundary.
REMAINING_LENGTHS = [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"), (2_097_151, b"\xff\xff\x7f"),
    (2_097_152, b"\x80\x80\x80\x01"), (268_435_455, b"\xff\xff\xff\x7f"),
]


@pytest.mark.parametrize("length, encoded", REMAINING_LENGTHS)
def test_remaining_length_encodes_as_table_2_4_of_the_standard(length, encoded):
    assert encode_remaining_length(length) == encoded
    assert decode_remaining_length(b"\x30" + encoded) == (length, 1 + len(encoded))


def test_remaining_length_past_four_bytes_is_malformed():
    with pytest.raises(MalformedPacket, match="four bytes"):
        decode_remaining_length(b"\x30\xff\xff\xff\xff\x01")
    with pytest.raises(ValueError):
        encode_remaining_length(268_435_456)


def test_connect_variable_header_matches_the_standards_example():
    # 3.1.2.10: protocol name "MQTT", level 4, flags 0xCE (user, password, will QoS 1,
    # will, clean session), keep alive 10.
    packet = Connect("c", keepalive_s=10, clean_session=True, will=Will("w", b"m", qos=1),
                     username="u", password=b"p")
    raw = encode(packet)
    assert raw[2:12] == bytes([0x00, 0x04, 0x4D, 0x51, 0x54, 0x54, 0x04, 0xCE, 0x00, 0x0A])
    assert decode(raw) == packet


def test_a_large_publish_uses_a_multi_byte_remaining_length():
    payload = bytes(range(256)) * 80                     # 20,480 bytes
    raw = encode_publish("big/topic", payload)
    assert raw[1:4] == encode_remaining_length(len(raw) - 4)
    assert decode(raw) == Publish("big/topic", payload)


@pytest.mark.parametrize("packet", [
    Connect("sensor-1", keepalive_s=30),
    Connect("", keepalive_s=0, clean_session=True, username="only-user"),
    ConnAck(0), ConnAck(5, session_present=True),
    Publish("topic1/topic2/humid", b"\x00\x01 payload"),
    Publish("a/b", b"x", qos=1, retain=True, dup=True, packet_id=7),
    Publish("a", b"", qos=2, packet_id=65_535),
    Subscribe(1, (("topic1/#", 0), ("a/b", 2))),
    SubAck(1, (0, 0x80, 2)),
    Unsubscribe(9, ("topic1/#", "x")),
    UnsubAck(9),
    PacketIdAck(PacketType.PUBACK, 3), PacketIdAck(PacketType.PUBREL, 4),
    PingReq(), PingResp(), Disconnect(),
])
def test_every_packet_round_trips_through_its_bytes(packet):
    assert decode(encode(packet)) == packet


@pytest.mark.parametrize("datagram, rule", [
    (b"", "cannot hold a fixed header"),
    (b"\x00\x00", "reserved"),                            # packet type 0
    (b"\xf0\x00", "reserved"),                            # packet type 15
    (b"\xc1\x00", "flags"),                               # PINGREQ with a flag bit
    (b"\x80\x05\x00\x01\x00\x01a", "flags"),              # SUBSCRIBE without 0b0010
    (b"\xc0\x01\x00", "unexpected trailing"),             # PINGREQ with a body
    (b"\xc0\x00\x00", "does not match"),                  # two packets' worth of bytes
    (b"\x30\x05\x00\x03a", "does not match"),             # cut short
    (b"\x36\x05\x00\x01a\x00\x01", "QoS 3"),
    (b"\x38\x03\x00\x01a", "DUP set on QoS 0"),
    (b"\x30\x03\x00\x01#", "wildcard"),
    (b"\x30\x03\x00\x01+", "wildcard"),
    (b"\x30\x02\x00\x00", "empty"),
    (b"\x30\x03\x00\x01\x00", r"U\+0000"),
    (b"\x30\x04\x00\x02\xc3\x28", "UTF-8"),
    (b"\x32\x03\x00\x01a", "needs 2 bytes"),              # QoS 1 without packet id
    (b"\x82\x06\x00\x00\x00\x01a\x00", "identifier is 0"),
    (b"\x82\x02\x00\x01", "without a topic filter"),
    (b"\x82\x06\x00\x01\x00\x01a\x03", "requested QoS"),
    (b"\xa2\x02\x00\x01", "without a topic filter"),
    (b"\x90\x03\x00\x01\x05", "return codes"),
    (b"\x20\x02\x02\x00", "reserved flags"),
    (b"\x10\x0d\x00\x04MQTT\x04\x03\x00\x0a\x00\x01c", "reserved flag"),
    (b"\x10\x0d\x00\x04MQTT\x04\x08\x00\x0a\x00\x01c", "without the will flag"),
    (b"\x10\x0d\x00\x04MQTT\x04\x40\x00\x0a\x00\x01c", "password without user name"),
])
def test_a_datagram_breaking_a_rule_is_malformed_and_says_which(datagram, rule):
    with pytest.raises(MalformedPacket, match=rule):
        decode(datagram)


class _CaptureBroker:
    """A TCP listener that hands back each MQTT packet paho writes, framed by its header."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None
        self._buffer = b""

    def accept(self) -> None:
        self.listener.settimeout(5)
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(5)

    def next_packet(self) -> bytes:
        assert self.conn is not None
        while True:
            if len(self._buffer) >= 2:
                try:
                    length, start = decode_remaining_length(self._buffer)
                except MalformedPacket:
                    length, start = 1 << 30, 0     # header not complete yet
                if start and len(self._buffer) >= start + length:
                    packet, self._buffer = (self._buffer[:start + length],
                                            self._buffer[start + length:])
                    return packet
            chunk = self.conn.recv(65_536)
            assert chunk, "paho closed the connection"
            self._buffer += chunk

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


def test_paho_and_the_codec_understand_each_others_bytes():
    """paho (an independent MQTT 3.1.1 implementation) writes what decode reads, and back."""
    broker = _CaptureBroker()
    got: dict[str, object] = {}
    events = {name: threading.Event() for name in ("connect", "subscribe", "message")}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="interop",
                         protocol=mqtt.MQTTv311, clean_session=True)
    client.on_connect = lambda *_a: events["connect"].set()
    client.on_subscribe = lambda _c, _u, mid, codes, _p: (got.setdefault("suback", codes),
                                                           events["subscribe"].set())
    client.on_message = lambda _c, _u, msg: (got.setdefault("message", msg),
                                             events["message"].set())
    try:
        client.connect("127.0.0.1", broker.port, keepalive=17)
        client.loop_start()
        broker.accept()
        assert decode(broker.next_packet()) == Connect("interop", keepalive_s=17)
        broker.conn.sendall(encode(ConnAck(0)))
        assert events["connect"].wait(5)

        _, mid = client.subscribe([("topic1/#", 0), ("a/b", 1)])
        subscribe = decode(broker.next_packet())
        assert subscribe == Subscribe(mid, (("topic1/#", 0), ("a/b", 1)))
        broker.conn.sendall(encode(SubAck(mid, (0, 0x80))))
        assert events["subscribe"].wait(5)
        assert [code.is_failure for code in got["suback"]] == [False, True]

        client.publish("topic1/topic2/humid", b"21.5", qos=0)
        assert decode(broker.next_packet()) == Publish("topic1/topic2/humid", b"21.5")
        broker.conn.sendall(encode_publish("topic1/x", b"\x00\xff"))
        assert events["message"].wait(5)
        assert (got["message"].topic, got["message"].payload) == ("topic1/x", b"\x00\xff")

        _, mid = client.unsubscribe("topic1/#")
        assert decode(broker.next_packet()) == Unsubscribe(mid, ("topic1/#",))
        client.disconnect()
        assert decode(broker.next_packet()) == Disconnect()
    finally:
        client.loop_stop()
        broker.close()
