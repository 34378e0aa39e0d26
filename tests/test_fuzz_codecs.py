"""Fuzzed parsers of every wire format mqttbed speaks in Python: the MQTT 3.1.1 codec,
the FPGA broker model, the MQTT-SN gateway, the PAMS switch controller, and the MQTT-ST
nodes' MQTT 5 framing and BPDUs.

Each takes mutated valid packets and noise (tests/fuzzing.py: bounded and derandomized
in CI, ``make fuzz`` for a longer random run) and must answer every input without an
exception of its own; what a decoder accepts must survive a round trip; what the
gateway sends must be MQTT-SN its own codec reads. (The MQTT-SN codec alone:
tests/test_mqttsn_codec.py; the C broker: tests/test_fuzz_forkpipe_parser.py; the REST
API: tests/test_api_schema.py.)
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mqttbed.brokers.fpga.model import BrokerModel
from mqttbed.brokers.fpga.tables import TopicTables
from mqttbed.brokers.mqttsn.gateway import Gateway
from mqttbed.brokers.mqttst import mqtt5
from mqttbed.brokers.mqttst.bpdu import Bpdu, MalformedBpdu, decode_bpdu, encode_bpdu
from mqttbed.brokers.mqttst.tree import BrokerId
from mqttbed.brokers.p4.controller import PacketIn, PamsController, parse_frame
from mqttbed.core import mqtt_codec, mqttsn
from mqttbed.core.mqtt_codec import (
    Connect,
    MalformedPacket,
    PacketIdAck,
    PacketType,
    PingReq,
    Publish,
    Subscribe,
    Unsubscribe,
    Will,
)
from tests.fuzzing import FUZZ, datagrams
from tests.test_pams_controller import BROKER, BROKER_MAC, MemoryTables

MQTT_SEEDS = [mqtt_codec.encode(p) for p in (
    Connect("fuzz", keepalive_s=5), Connect("w", will=Will("w/t", b"bye", qos=1),
                                            username="u", password=b"p"),
    Subscribe(1, (("f/+/c", 0), ("f/#", 1))), Unsubscribe(2, ("f/#",)),
    Publish("f/g", b"abc"), Publish("f/q", b"q", qos=2, packet_id=5),
    PacketIdAck(PacketType.PUBREL, 5), PingReq(), mqtt_codec.Disconnect())]
SN_SEEDS = [mqttsn.encode(p) for p in (
    mqttsn.Connect("fuzz", 30), mqttsn.Register(0, 1, "f/z"),
    mqttsn.Regack(1, 2, mqttsn.ReturnCode.ACCEPTED),
    mqttsn.Subscribe(3, "f/#", mqttsn.TopicIdType.NORMAL),
    mqttsn.Subscribe(4, "ab", mqttsn.TopicIdType.SHORT_NAME),
    mqttsn.Suback(1, 3, mqttsn.ReturnCode.ACCEPTED), mqttsn.Suback(0, 4, 0),
    mqttsn.Publish(1, 0, b"x" * 20), mqttsn.Publish(1, 5, b"q1", qos=1),
    mqttsn.Unsubscribe(6, "f/#", mqttsn.TopicIdType.NORMAL), mqttsn.Pingreq(),
    mqttsn.Disconnect())]
SOURCES = st.sampled_from([("10.0.0.1", 1000), ("10.0.0.2", 1001), ("10.0.0.3", 1002)])


@FUZZ
@given(datagrams(MQTT_SEEDS))
def test_the_mqtt_codec_reads_a_packet_or_says_what_is_malformed(datagram):
    try:
        packet = mqtt_codec.decode(datagram)
    except MalformedPacket:
        return
    assert mqtt_codec.decode(mqtt_codec.encode(packet)) == packet


@FUZZ
@given(st.lists(datagrams(MQTT_SEEDS), max_size=6))
def test_a_tcp_stream_is_cut_and_each_packet_read_as_the_adaptive_broker_reads_it(chunks):
    frames = mqtt5.FrameBuffer(max_packet_bytes=4096)  # the adaptive broker's framing
    for chunk in chunks:
        try:
            packets = frames.feed(chunk)
        except MalformedPacket:
            return
        for first, body in packets:
            try:
                packet = mqtt_codec.decode_body(first, body)
            except MalformedPacket:
                continue
            assert mqtt_codec.decode(mqtt_codec.encode(packet)) == packet


@FUZZ
@given(st.lists(st.tuples(SOURCES, datagrams(MQTT_SEEDS)), max_size=25))
def test_the_fpga_model_answers_every_datagram_and_counts_each(traffic):
    model = BrokerModel(TopicTables(topic_depth=64, subscriber_depth=64, probe_window=8))
    for source, datagram in traffic:
        outcome = model.handle(datagram, source)
        if outcome.packet is not None:  # what it sends is MQTT that the codec reads
            mqtt_codec.decode(outcome.packet)
    assert sum(model.counters.values()) >= len(traffic)


@FUZZ
@given(st.lists(st.tuples(SOURCES, datagrams(SN_SEEDS), st.integers(0, 10**9)), max_size=25))
def test_the_mqttsn_gateway_answers_every_datagram_with_mqttsn_it_can_read(traffic):
    sent: list[bytes] = []
    gateway = Gateway(lambda data, _address: sent.append(data), predefined={5: "pre/five"})
    now = 0
    for source, datagram, step_ns in traffic:
        now += step_ns
        gateway.handle(datagram, source, now)
        gateway.tick(now)
    for data in sent:
        mqttsn.decode(data)  # the gateway never sends what MQTT-SN readers refuse


CLIENTS = st.sampled_from([("10.77.0.3", 20000), ("10.77.0.4", 20001)])
MACS = st.sampled_from(["02:00:00:00:00:0a", "02:00:00:00:00:0b", "02:00:00:00:00:99"])


@FUZZ
@given(st.lists(st.tuples(CLIENTS, MACS, st.booleans(), datagrams(SN_SEEDS)), max_size=25))
def test_the_pams_controller_takes_any_packet_in_and_keeps_the_table_as_it_wants(traffic):
    tables = MemoryTables()
    controller = PamsController(tables, BROKER,
                                {"02:00:00:00:00:0a": 3, "02:00:00:00:00:0b": 4})
    for client, mac, from_broker, payload in traffic:
        src, dst, src_mac, dst_mac = ((BROKER, client, BROKER_MAC, mac) if from_broker
                                      else (client, BROKER, mac, BROKER_MAC))
        controller.handle(PacketIn(src, dst, src_mac, dst_mac, payload))
        assert {k: set(v) for k, v in tables.entries.items() if v} == controller.wanted()


@FUZZ
@given(st.binary(max_size=80))
def test_any_frame_from_the_cpu_port_is_a_packet_in_or_none(frame):
    packet_in = parse_frame(b"\x00" * 12 + b"\x08\x00\x45" + frame)
    assert packet_in is None or isinstance(packet_in.payload, bytes)
    assert parse_frame(frame) is None or len(frame) >= 42


MQTT5_SEEDS = [mqtt5.encode(p) for p in (
    mqtt5.Connect("mqttst/127.0.0.1:1883", 10, bridge=True),
    mqtt5.ConnAck(0, properties=((mqtt5.Property.RECEIVE_MAXIMUM, 20),
                                 (mqtt5.Property.USER_PROPERTY, ("mqttst-id", "10.0.0.2:1884")))),
    mqtt5.Publish("a/b", b"x" * 40, 2, True, False, 7,
                  ((mqtt5.Property.CONTENT_TYPE, "text/plain"), (mqtt5.Property.TOPIC_ALIAS, 3))),
    mqtt5.Ack(PacketType.PUBREL, 9), mqtt5.Subscribe(3, (("a/#", 0x06),)),
    mqtt5.PingReq(b"\x01" * 40), mqtt5.PingReq(), mqtt5.Disconnect())]
BPDU_SEEDS = [encode_bpdu(Bpdu(BrokerId("10.0.0.2", 1884), 2.5, BrokerId("10.0.0.1", 1883), 4.0,
                               1200, 3, topology_change=flag)) for flag in (False, True)]


@FUZZ
@given(st.lists(datagrams(MQTT5_SEEDS), max_size=6))
def test_an_mqttst_node_frames_any_stream_and_decodes_or_refuses_each_packet(chunks):
    frames = mqtt5.FrameBuffer(max_packet_bytes=4096)
    for chunk in chunks:
        try:
            packets = frames.feed(chunk)
        except MalformedPacket:
            return  # a node closes that link
        for first, body in packets:
            try:
                packet = mqtt5.decode(first, body)
            except MalformedPacket:
                continue
            [(again_first, again_body)] = mqtt5.FrameBuffer().feed(mqtt5.encode(packet))
            assert mqtt5.decode(again_first, again_body) == packet


@FUZZ
@given(datagrams(BPDU_SEEDS))
def test_a_bpdu_decodes_and_encodes_back_or_is_refused_with_a_counter_reason(payload):
    try:
        bpdu = decode_bpdu(payload)
    except MalformedBpdu as exc:
        assert exc.reason and " " not in exc.reason.strip("_")
        return
    assert decode_bpdu(encode_bpdu(bpdu)) == bpdu
