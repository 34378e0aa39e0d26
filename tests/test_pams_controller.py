"""The PAMS controller (Fig. 5) on packet sequences, writing to an in-memory switch."""

from __future__ import annotations

from mqttbed.brokers.p4.controller import PacketIn, PamsController, parse_frame
from mqttbed.brokers.p4.tables import Subscriber, SwitchTables, TopicIdType, TopicKey
from mqttbed.core import mqttsn

BROKER = ("10.77.0.1", 10000)
BROKER_MAC = "02:00:00:00:00:01"
ALICE, BOB = ("10.77.0.3", 20000), ("10.77.0.4", 20001)
MACS = {ALICE: "02:00:00:00:00:0a", BOB: "02:00:00:00:00:0b"}
PORTS = {"02:00:00:00:00:0a": 3, "02:00:00:00:00:0b": 4}


class MemoryTables:
    """A switch's topic table as a dict, with every write logged."""

    def __init__(self) -> None:
        self.entries: dict[TopicKey, list[Subscriber]] = {}
        self.log: list[tuple[str, TopicKey]] = []

    def add_subscriber(self, key: TopicKey, subscriber: Subscriber) -> None:
        self.entries.setdefault(key, []).append(subscriber)
        self.log.append(("add", key))

    def remove_subscriber(self, key: TopicKey, subscriber: Subscriber) -> None:
        self.entries[key].remove(subscriber)
        self.log.append(("remove", key))

    def clear_topic(self, key: TopicKey) -> None:
        self.entries.pop(key, None)
        self.log.append(("clear", key))

    def counters(self) -> dict[str, int]:
        return {}

    def ips(self, key: TopicKey) -> list[str]:
        return sorted(s.ip for s in self.entries.get(key, []))


def sub(client, entry_port=None) -> Subscriber:
    return Subscriber(mac=MACS[client], ip=client[0], port=client[1],
                      switch_port=entry_port or PORTS[MACS[client]])


def make() -> tuple[PamsController, MemoryTables]:
    tables = MemoryTables()
    assert isinstance(tables, SwitchTables)
    return PamsController(tables, BROKER, PORTS), tables


def from_client(controller, client, packet) -> None:
    controller.handle(PacketIn(client, BROKER, MACS[client], BROKER_MAC, mqttsn.encode(packet)))


def from_broker(controller, client, packet) -> None:
    controller.handle(PacketIn(BROKER, client, BROKER_MAC, MACS[client], mqttsn.encode(packet)))


def subscribed(controller, client, topic, msg_id, topic_id, *, rc=mqttsn.ReturnCode.ACCEPTED,
               id_type=mqttsn.TopicIdType.NORMAL) -> None:
    from_client(controller, client, mqttsn.Subscribe(msg_id, topic, id_type))
    from_broker(controller, client, mqttsn.Suback(topic_id, msg_id, rc))


AB = TopicKey(TopicIdType.NORMAL, 0x0011)


def test_an_accepted_subscribe_by_name_adds_the_client_to_its_topic_id():
    controller, tables = make()
    subscribed(controller, ALICE, "a/b", 1, 0x0011)
    subscribed(controller, BOB, "a/b", 7, 0x0011)
    assert tables.entries == {AB: [sub(ALICE), sub(BOB)]}


def test_a_rejected_subscribe_and_a_suback_for_another_message_id_change_nothing():
    controller, tables = make()
    subscribed(controller, ALICE, "a/b", 1, 0x0011, rc=mqttsn.ReturnCode.CONGESTION)
    from_client(controller, BOB, mqttsn.Subscribe(5, "a/b", mqttsn.TopicIdType.NORMAL))
    from_broker(controller, BOB, mqttsn.Suback(0x0011, 6, mqttsn.ReturnCode.ACCEPTED))
    from_broker(controller, ALICE, mqttsn.Suback(0x0011, 1, mqttsn.ReturnCode.ACCEPTED))
    assert tables.entries == {}
    assert controller.events["subscribe rejected"] == 1
    assert controller.events["suback without subscribe"] == 2


def test_short_names_and_predefined_ids_are_their_own_keys():
    controller, tables = make()
    subscribed(controller, ALICE, "ab", 1, 0x0000, id_type=mqttsn.TopicIdType.SHORT_NAME)
    subscribed(controller, BOB, 0x0042, 2, 0x0042, id_type=mqttsn.TopicIdType.PREDEFINED)
    assert tables.entries == {
        TopicKey(TopicIdType.SHORT_NAME, int.from_bytes(b"ab", "big")): [sub(ALICE)],
        TopicKey(TopicIdType.PREDEFINED, 0x0042): [sub(BOB)]}


def test_a_wildcard_disables_matching_entries_until_the_broker_registers_the_topic():
    controller, tables = make()
    subscribed(controller, ALICE, "a/b", 1, 0x0011)
    subscribed(controller, BOB, "a/#", 2, 0x0000)
    assert tables.entries == {}  # a/b now goes through the broker, which REGISTERs it with BOB
    from_broker(controller, BOB, mqttsn.Register(0x0011, 9, "a/b"))
    assert tables.ips(AB) == [ALICE[0], BOB[0]]
    subscribed(controller, ALICE, "x/y", 3, 0x0022)  # does not match a/#: stays enabled
    assert tables.ips(TopicKey(TopicIdType.NORMAL, 0x0022)) == [ALICE[0]]


def test_unsubscribing_the_wildcard_enables_what_it_held_back():
    controller, tables = make()
    subscribed(controller, ALICE, "a/b", 1, 0x0011)
    subscribed(controller, BOB, "a/+", 2, 0x0000)
    assert tables.entries == {}
    from_client(controller, BOB, mqttsn.Unsubscribe(3, "a/+", mqttsn.TopicIdType.NORMAL))
    assert tables.ips(AB) == [ALICE[0]]


def test_unsubscribe_and_disconnect_remove_the_client():
    controller, tables = make()
    subscribed(controller, ALICE, "a/b", 1, 0x0011)
    subscribed(controller, BOB, "a/b", 2, 0x0011)
    from_client(controller, ALICE, mqttsn.Unsubscribe(3, "a/b", mqttsn.TopicIdType.NORMAL))
    assert tables.ips(AB) == [BOB[0]]
    from_client(controller, BOB, mqttsn.Disconnect())
    assert tables.entries == {}
    assert tables.log[-1] == ("clear", AB)


def test_garbage_is_counted_not_fatal():
    controller, tables = make()
    controller.handle(PacketIn(ALICE, BROKER, MACS[ALICE], BROKER_MAC, b"\x05\x12\x00"))
    controller.handle_frame(b"\x00" * 20)
    assert controller.events["undecodable"] == 1 and controller.events["not udp"] == 1
    assert tables.entries == {}


def test_a_frame_from_the_cpu_port_parses_to_its_datagram():
    payload = mqttsn.encode(mqttsn.Subscribe(1, "a/b", mqttsn.TopicIdType.NORMAL))
    frame = (bytes.fromhex("020000000001" "02000000000a" "0800")
             + bytes([0x45, 0, 0, 28 + len(payload), 0, 0, 0, 0, 64, 17, 0, 0,
                      10, 77, 0, 3, 10, 77, 0, 1])
             + (20000).to_bytes(2, "big") + (10000).to_bytes(2, "big")
             + (8 + len(payload)).to_bytes(2, "big") + b"\0\0" + payload)
    assert parse_frame(frame) == PacketIn(ALICE, BROKER, MACS[ALICE], BROKER_MAC, payload)


def test_a_subscriber_whose_mac_the_wiring_does_not_know_is_left_to_the_broker():
    # Regression (found by tests/test_fuzz_codecs.py): a KeyError ended the controller.
    controller, tables = make()
    stranger, mac = ("10.77.0.9", 20009), "02:00:00:00:00:99"
    controller.handle(PacketIn(stranger, BROKER, mac, BROKER_MAC, mqttsn.encode(
        mqttsn.Subscribe(3, "a/b", mqttsn.TopicIdType.NORMAL))))
    controller.handle(PacketIn(BROKER, stranger, BROKER_MAC, mac, mqttsn.encode(
        mqttsn.Suback(0x0011, 3, mqttsn.ReturnCode.ACCEPTED))))
    assert controller.events["subscriber behind an unknown port"] == 1
    assert tables.entries == {}
    subscribed(controller, ALICE, "a/b", 1, 0x0011)  # the others are still accelerated
    assert tables.ips(AB) == [ALICE[0]]
