"""The FPGA broker's tables and behaviour, byte for byte, with the paper's examples (seed 000)."""

from __future__ import annotations

import pytest

from mqttbed.brokers.fpga.model import BrokerModel
from mqttbed.brokers.fpga.tables import (
    TOMBSTONE,
    BoundedHashTable,
    TopicTables,
    filter_refusal,
    rewritten_names,
)
from mqttbed.brokers.fpga.timing import PipelineTiming
from mqttbed.core.mqtt_codec import (
    ConnAck,
    Connect,
    Disconnect,
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
    encode,
    encode_publish,
)

pytestmark = pytest.mark.timeout(30)

A, B, C, D = (("10.0.0.1", 5001), ("10.0.0.2", 5002), ("10.0.0.3", 5003), ("10.0.0.4", 5004))


def subscriber_entry(tables: TopicTables, topic_filter: str, subscriber_id: int):
    return tables.subscribers.get(topic_filter.encode() + b"\x00"
                                  + subscriber_id.to_bytes(2, "big"))


def subscribe(model: BrokerModel, source, *filters: str, packet_id: int = 1) -> tuple[int, ...]:
    outcome = model.handle(encode(Subscribe(packet_id, tuple((f, 0) for f in filters))), source)
    assert outcome.addresses == [source]
    suback = decode(outcome.packet)
    assert isinstance(suback, SubAck) and suback.packet_id == packet_id
    return suback.return_codes


def test_fourth_subscriber_of_a_topic_gets_id_4_as_in_figure_1():
    tables = TopicTables()
    for address in (A, B, C):
        assert tables.subscribe("topic1/topic2/humid", address)
    assert tables.topics.get(b"topic1/topic2/humid") == 3
    assert tables.subscribe("topic1/topic2/humid", D)
    assert tables.topics.get(b"topic1/topic2/humid") == 4
    assert [subscriber_entry(tables, "topic1/topic2/humid", i) for i in (1, 2, 3, 4)] == [
        A, B, C, D]


def test_publish_is_looked_up_under_the_topic_and_each_rewritten_prefix():
    assert rewritten_names("topic1/topic2/humid") == [
        "topic1/topic2/humid", "topic1/topic2/#", "topic1/#"]
    assert rewritten_names("topic1/humid") == ["topic1/humid", "topic1/#"]
    assert rewritten_names("flat") == ["flat"]


def test_publish_reaches_exact_and_multi_level_wildcard_subscribers_in_lookup_order():
    model = BrokerModel()
    assert subscribe(model, A, "topic1/#") == (0,)
    assert subscribe(model, B, "topic1/topic2/humid") == (0,)
    assert subscribe(model, C, "topic1/topic2/#") == (0,)
    assert subscribe(model, D, "topic1/topic2/temp", "other/#") == (0, 0)
    outcome = model.handle(encode_publish("topic1/topic2/humid", b"55 %", retain=True), D)
    assert outcome.addresses == [B, C, A]
    assert [d.name_index for d in outcome.destinations] == [0, 1, 2]
    # one QoS 0 copy with the retain flag cleared (MQTT 3.1.1, 3.3.1.3)
    assert decode(outcome.packet) == Publish("topic1/topic2/humid", b"55 %")
    assert model.counters["retain_ignored"] == 1
    assert model.handle(encode_publish("topic1/x", b""), D).addresses == [A]
    assert model.handle(encode_publish("topic9/x", b""), D).addresses == []


@pytest.mark.parametrize("topic_filter", ["a/+/c", "+", "#", "a/#/c", "a#", ""])
def test_filters_the_rewriter_can_never_match_are_refused_with_0x80(topic_filter):
    assert filter_refusal(topic_filter) is not None
    model = BrokerModel()
    assert subscribe(model, A, topic_filter, "ok/#") == (0x80, 0)
    assert model.counters["subscribe_refused"] == 1


def test_a_full_table_refuses_the_next_subscription_with_suback_0x80():
    # 16 words, any word reachable: exactly 16 subscriptions fit.
    model = BrokerModel(TopicTables(topic_depth=16, subscriber_depth=16, probe_window=16))
    codes = [subscribe(model, A, f"room/{n}", packet_id=n + 1)[0] for n in range(17)]
    assert codes == [0] * 16 + [0x80]
    occupancy = model.tables.occupancy()
    assert occupancy["subscriber_table"]["used_words"] == 16
    assert occupancy["topic_table"]["used_words"] == 16
    assert model.counters["subscribe_refused"] == 1
    # what was refused is not half-stored: publishing to it reaches nobody
    assert model.handle(encode_publish("room/16", b"x"), B).addresses == []
    assert model.handle(encode_publish("room/15", b"x"), B).addresses == [A]


def test_the_12_bit_topic_count_caps_a_filter_at_4095_subscribers():
    tables = TopicTables(count_bits=12)
    for port in range(1, 4096):
        assert tables.subscribe("busy", ("10.0.0.1", port))
    assert not tables.subscribe("busy", ("10.0.0.1", 4096))
    assert tables.topics.get(b"busy") == 4095


def test_paper_depth_tables_refuse_only_a_key_whose_probe_window_is_full():
    table = BoundedHashTable(depth=65_536, probe_window=8, seed=0)
    stored = 0
    while table.put(f"topic/{stored}".encode(), stored):
        stored += 1
    refused = f"topic/{stored}".encode()
    assert 0 < table.used == stored <= 65_536
    assert not table.has_room_for(refused)
    assert all(table.get(f"topic/{n}".encode()) == n for n in range(0, stored, 997))


def test_resubscribing_the_same_filter_from_the_same_address_does_not_add_a_second_entry():
    model = BrokerModel()
    assert subscribe(model, A, "t/x") == (0,)
    assert subscribe(model, A, "t/x", packet_id=2) == (0,)
    assert model.tables.topics.get(b"t/x") == 1
    assert model.handle(encode_publish("t/x", b"once"), B).addresses == [A]


def test_unsubscribe_tombstones_the_entry_and_a_later_subscriber_reuses_it():
    model = BrokerModel()
    for address in (A, B, C):
        subscribe(model, address, "t/x")
    outcome = model.handle(encode(Unsubscribe(5, ("t/x",))), B)
    assert decode(outcome.packet) == UnsubAck(5) and outcome.addresses == [B]
    assert subscriber_entry(model.tables, "t/x", 2) == TOMBSTONE
    assert model.tables.topics.get(b"t/x") == 3          # IDs stay dense
    assert model.handle(encode_publish("t/x", b"m"), D).addresses == [A, C]
    subscribe(model, D, "t/x")                           # takes the tombstoned ID 2
    assert subscriber_entry(model.tables, "t/x", 2) == D
    assert model.tables.topics.get(b"t/x") == 3
    assert model.handle(encode_publish("t/x", b"m"), A).addresses == [A, D, C]


def test_unsubscribing_the_last_ids_frees_their_words_and_finally_the_topic():
    model = BrokerModel()
    for address in (A, B, C):
        subscribe(model, address, "t/x")
    model.handle(encode(Unsubscribe(1, ("t/x",))), B)
    model.handle(encode(Unsubscribe(2, ("t/x",))), C)    # frees ID 3, then tombstoned ID 2
    assert model.tables.topics.get(b"t/x") == 1
    assert model.tables.occupancy()["subscriber_table"]["used_words"] == 1
    assert model.tables.tombstones == 0
    model.handle(encode(Unsubscribe(3, ("t/x",))), A)
    assert model.tables.topics.get(b"t/x") is None
    assert model.tables.occupancy()["subscriber_table"]["used_words"] == 0


def test_unsubscribe_of_a_filter_never_held_still_gets_unsuback():
    model = BrokerModel()
    outcome = model.handle(encode(Unsubscribe(8, ("nothing/#",))), A)
    assert decode(outcome.packet) == UnsubAck(8)
    assert model.counters["unsubscribe_unknown"] == 1


def test_disconnect_removes_every_subscription_of_that_address():
    model = BrokerModel()
    subscribe(model, A, "t/x", "t/#")
    subscribe(model, B, "t/x")
    assert model.handle(encode(Disconnect()), A).addresses == []
    assert model.handle(encode_publish("t/x", b"m"), C).addresses == [B]


def test_connect_is_accepted_with_will_ignored_and_a_wrong_level_refused():
    model = BrokerModel()
    accepted = model.handle(encode(Connect("c", will=Will("last/words", b"bye"))), A)
    assert decode(accepted.packet) == ConnAck(0) and accepted.addresses == [A]
    assert model.counters["will_ignored"] == 1
    refused = model.handle(encode(Connect("c", protocol_level=3, protocol_name="MQIsdp")), A)
    assert decode(refused.packet) == ConnAck(1)
    assert decode(model.handle(encode(PingReq()), A).packet) == PingResp()


def test_qos_1_publish_is_forwarded_at_qos_0_without_puback():
    model = BrokerModel()
    subscribe(model, A, "t/x")
    outcome = model.handle(encode_publish("t/x", b"m", qos=1, packet_id=4), B)
    assert outcome.addresses == [A] and decode(outcome.packet) == Publish("t/x", b"m")
    assert model.counters["publish_qos_downgraded"] == 1


def test_packets_only_a_client_receives_are_dropped_and_counted():
    model = BrokerModel()
    for packet in (ConnAck(0), SubAck(1, (0,)), PacketIdAck(PacketType.PUBACK, 1)):
        assert model.handle(encode(packet), A).packet is None
    assert model.counters["dropped_unsupported"] == 3


def test_modelled_latency_is_799_ns_then_one_line_frame_per_copy():
    timing = PipelineTiming()
    assert timing.lookup_ns == 30.0 and timing.reply_ns() == 799.2
    # 76-byte PUBLISH: 14+20+8+76+4 = 122-byte frame, +20 preamble and gap, at 10 Gbit/s
    assert timing.wire_ns(76) == pytest.approx(113.6)
    assert timing.wire_ns(1) == pytest.approx(67.2)                  # 64-byte minimum frame
    sends = timing.copy_send_ns([0] * 100, 76)
    assert sends[0] == pytest.approx(799.2)
    assert sends[-1] == pytest.approx(799.2 + 99 * 113.6)
    # no subscriber of the topic itself: the first copy waits for the rewritten name's lookup
    assert timing.copy_send_ns([2], 76) == [pytest.approx(819.2)]
