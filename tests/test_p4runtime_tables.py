"""P4Runtime writes for pams.p4, checked field by field against its P4Info (no switch here)."""

from __future__ import annotations

import pytest

from mqttbed.brokers.p4.p4runtime import P4RuntimeTables, encode
from mqttbed.brokers.p4.tables import Subscriber, SwitchTables, TopicIdType, TopicKey

TOPIC = TopicKey(TopicIdType.NORMAL, 0x0101)
ALICE = Subscriber(mac="02:00:00:00:00:0a", ip="10.77.0.3", port=20000, switch_port=3)
BOB = Subscriber(mac="02:00:00:00:00:0b", ip="10.77.0.4", port=20001, switch_port=4)

TOPIC_TABLE, SUBSCRIBER_REWRITE, BROKER_CONFIG = 33554434, 33554436, 33554433
ACCELERATE, REWRITE, SET_BROKER = 16777219, 16777222, 16777218
INSERT, MODIFY, DELETE = 1, 2, 3
PRE = "packet_replication_engine_entry"


@pytest.fixture
def written() -> list:
    return []


@pytest.fixture
def switch(written) -> P4RuntimeTables:
    return P4RuntimeTables(written.append, device_id=7, election_id=42)


def kinds(request) -> list[tuple[int, str]]:
    return [(u.type, u.entity.WhichOneof("entity")) for u in request.updates]


def test_it_is_a_switch_tables(switch):
    assert isinstance(switch, SwitchTables)


def test_first_subscriber_inserts_its_rewrite_the_topic_group_and_the_table_entry(switch, written):
    switch.add_subscriber(TOPIC, ALICE)
    [request] = written
    assert request.device_id == 7 and request.election_id.low == 42
    assert kinds(request) == [(INSERT, "table_entry"), (INSERT, PRE),
                              (INSERT, "table_entry")]
    rewrite, group, topic = (u.entity for u in request.updates)

    entry = rewrite.table_entry
    assert entry.table_id == SUBSCRIBER_REWRITE
    assert [(m.field_id, m.exact.value) for m in entry.match] == [(1, b"\x01")]  # rid 1
    assert entry.action.action.action_id == REWRITE
    assert [(p.param_id, p.value) for p in entry.action.action.params] == [
        (1, bytes.fromhex("02000000000a")), (2, bytes([10, 77, 0, 3])), (3, b"\x4e\x20")]

    mcast = group.packet_replication_engine_entry.multicast_group_entry
    assert mcast.multicast_group_id == 1
    assert [(r.egress_port, r.instance) for r in mcast.replicas] == [(3, 1)]

    entry = topic.table_entry
    assert entry.table_id == TOPIC_TABLE
    assert [(m.field_id, m.exact.value) for m in entry.match] == [(1, b"\x00"), (2, b"\x01\x01")]
    assert entry.action.action.action_id == ACCELERATE
    assert [(p.param_id, p.value) for p in entry.action.action.params] == [(1, b"\x01")]


def test_second_subscriber_modifies_the_group_and_last_removal_deletes_everything(switch,
                                                                                  written):
    switch.add_subscriber(TOPIC, ALICE)
    switch.add_subscriber(TOPIC, BOB)
    switch.add_subscriber(TOPIC, BOB)  # already there: nothing written
    assert len(written) == 2
    assert kinds(written[1]) == [(INSERT, "table_entry"),
                                 (MODIFY, PRE)]
    mcast = written[1].updates[1].entity.packet_replication_engine_entry.multicast_group_entry
    assert [(r.egress_port, r.instance) for r in mcast.replicas] == [(3, 1), (4, 2)]

    switch.remove_subscriber(TOPIC, ALICE)
    assert kinds(written[2]) == [(MODIFY, PRE),
                                 (DELETE, "table_entry")]
    switch.remove_subscriber(TOPIC, BOB)
    assert kinds(written[3]) == [(DELETE, "table_entry"), (DELETE, PRE),
                                 (DELETE, "table_entry")]
    assert written[3].updates[0].entity.table_entry.table_id == TOPIC_TABLE
    assert written[3].updates[2].entity.table_entry.table_id == SUBSCRIBER_REWRITE
    assert switch.groups == {} and switch.rids == {}


def test_a_subscriber_in_two_topics_keeps_its_rewrite_until_it_leaves_both(switch, written):
    other = TopicKey(TopicIdType.SHORT_NAME, int.from_bytes(b"ab", "big"))
    switch.add_subscriber(TOPIC, ALICE)
    switch.add_subscriber(other, ALICE)
    assert kinds(written[1]) == [(INSERT, PRE),
                                 (INSERT, "table_entry")]
    assert written[1].updates[1].entity.table_entry.match[0].exact.value == b"\x02"
    switch.clear_topic(TOPIC)
    assert kinds(written[2]) == [(DELETE, "table_entry"), (DELETE, PRE)]
    switch.clear_topic(other)
    assert kinds(written[3])[-1] == (DELETE, "table_entry")


def test_broker_config_is_the_default_action_of_broker_config(switch, written):
    switch.configure_broker("10.77.0.1", 10000, "02:00:00:00:00:01", accelerate=True)
    entry = written[0].updates[0].entity.table_entry
    assert written[0].updates[0].type == MODIFY
    assert entry.table_id == BROKER_CONFIG and entry.is_default_action
    assert entry.action.action.action_id == SET_BROKER
    assert [(p.param_id, p.value) for p in entry.action.action.params] == [
        (1, bytes([10, 77, 0, 1])), (2, b"\x27\x10"), (3, b"\x02\x00\x00\x00\x00\x01"),
        (4, b"\x01")]


def test_values_are_shortest_big_endian_bytestrings_and_must_fit():
    assert encode(0, 16) == b"\x00"
    assert encode(0x0101, 16) == b"\x01\x01"
    assert encode(3, 2) == b"\x03"
    with pytest.raises(ValueError, match="does not fit"):
        encode(4, 2)
