"""The PAMS controller (Fig. 5 of the paper): control messages in, switch table writes out.

The switch copies SUBSCRIBE, UNSUBSCRIBE, SUBACK, REGISTER and DISCONNECT to the CPU
port. From them the controller keeps the paper's tuples

- <short name, {subscribers}> and <pre-defined id, {subscribers}> from a SUBSCRIBE by
  short name or id and its accepted SUBACK,
- <topic id, topic name, {subscribers}> from a SUBSCRIBE by name and a SUBACK with a
  topic id,
- <wildcard filter, {subscribers}> from a SUBSCRIBE by name answered with topic id 0x0000,

pairing each SUBACK with its SUBSCRIBE by (client address, message id) and dropping the
pair when the return code is not 0x00. A wildcard subscriber can only receive a topic
once the broker has REGISTERed that topic with it, which the broker does on the topic's
first PUBLISH: so every entry whose topic name matches a wildcard still waiting for its
REGISTER is disabled (removed from the switch, kept here), and the broker's REGISTER
adds the subscriber and enables the entry again. UNSUBSCRIBE and DISCONNECT remove the
client's tuples. After each message the wanted table is compared with what was written,
and only the difference goes to the :class:`SwitchTables`.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from mqttbed.brokers.p4.tables import Subscriber, SwitchTables, TopicIdType, TopicKey
from mqttbed.core import mqttsn

Client = tuple[str, int]
ETH_P_ALL = 0x0003


@dataclass(frozen=True)
class PacketIn:
    """One control message as the switch copied it: addresses and the MQTT-SN bytes."""

    src: Client
    dst: Client
    src_mac: str
    dst_mac: str
    payload: bytes


@dataclass(frozen=True)
class PendingSubscribe:
    topic: str | int
    topic_id_type: mqttsn.TopicIdType
    mac: str


@dataclass
class Wildcard:
    """A wildcard subscription and the topic names the broker has REGISTERed with it."""

    registered: set[str] = field(default_factory=set)


def parse_frame(frame: bytes) -> PacketIn | None:
    """The UDP datagram in an Ethernet/IPv4 frame from the CPU port, or None if not one."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != socket.IPPROTO_UDP:
        return None
    header_len = (frame[14] & 0x0F) * 4
    udp = 14 + header_len
    if len(frame) < udp + 8:
        return None
    src_port, dst_port, length = struct.unpack_from("!HHH", frame, udp)
    return PacketIn(src=(socket.inet_ntoa(frame[26:30]), src_port),
                    dst=(socket.inet_ntoa(frame[30:34]), dst_port),
                    src_mac=frame[6:12].hex(":"), dst_mac=frame[0:6].hex(":"),
                    payload=frame[udp + 8:udp + length])


class PamsController:
    """Turns packet-ins into table writes (see the module docstring).

    ``switch_port_of`` maps a client's MAC to the switch port it hangs off (the
    topology's wiring, as an L2 table would learn it): the eBPF CPU port carries no
    ingress port, unlike the P4 program's packet_in header.
    """

    def __init__(self, tables: SwitchTables, broker: Client, switch_port_of: Mapping[str, int]):
        self.tables = tables
        self.broker = broker
        self.switch_port_of = switch_port_of
        self.events: Counter[str] = Counter()
        self.pending: dict[tuple[Client, int], PendingSubscribe] = {}
        self.clients: dict[Client, Subscriber] = {}
        self.explicit: dict[TopicKey, set[Client]] = {}
        self.names: dict[str, int] = {}
        self.wildcards: dict[Client, dict[str, Wildcard]] = {}
        self.applied: dict[TopicKey, set[Subscriber]] = {}

    # -- input -----------------------------------------------------------------------------

    def handle_frame(self, frame: bytes) -> None:
        """One frame read from the CPU port."""
        packet_in = parse_frame(frame)
        if packet_in is None:
            self.events["not udp"] += 1
            return
        self.handle(packet_in)

    def handle(self, packet_in: PacketIn) -> None:
        """One control message; undecodable ones are counted and otherwise ignored."""
        try:
            packet = mqttsn.decode(packet_in.payload)
        except mqttsn.MqttSnError:
            self.events["undecodable"] += 1
            return
        from_broker = packet_in.src == self.broker
        client = packet_in.dst if from_broker else packet_in.src
        client_mac = packet_in.dst_mac if from_broker else packet_in.src_mac
        match packet, from_broker:
            case mqttsn.Subscribe(), False:
                self.pending[(client, packet.msg_id)] = PendingSubscribe(
                    packet.topic, packet.topic_id_type, client_mac)
            case mqttsn.Suback(), True:
                self._suback(client, packet)
            case mqttsn.Register(), True:
                self._register(client, packet)
            case mqttsn.Unsubscribe(), False:
                self._unsubscribe(client, packet)
            case mqttsn.Disconnect(), _:
                self._disconnect(client)
            case _:
                self.events[f"ignored {type(packet).__name__}"] += 1
                return
        self.events[type(packet).__name__] += 1
        self._sync()

    def serve(self, cpu_link: str, stop: threading.Event) -> None:
        """Read the CPU port (an AF_PACKET socket on ``cpu_link``) until ``stop`` is set."""
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL)) as cpu:
            cpu.bind((cpu_link, 0))
            cpu.settimeout(0.1)
            while not stop.is_set():
                try:
                    self.handle_frame(cpu.recv(65535))
                except TimeoutError:
                    continue

    # -- Fig. 5 ----------------------------------------------------------------------------

    def _suback(self, client: Client, suback: mqttsn.Suback) -> None:
        pending = self.pending.pop((client, suback.msg_id), None)
        if pending is None:
            self.events["suback without subscribe"] += 1
            return
        if suback.return_code != mqttsn.ReturnCode.ACCEPTED:
            self.events["subscribe rejected"] += 1
            return
        if pending.mac not in self.switch_port_of:
            # No port to copy to (a MAC the wiring does not know): the broker serves this
            # subscriber unaccelerated. Found by fuzzing: it was a KeyError that ended the
            # controller's thread, and so the run.
            self.events["subscriber behind an unknown port"] += 1
            return
        self.clients[client] = Subscriber(mac=pending.mac, ip=client[0], port=client[1],
                                          switch_port=self.switch_port_of[pending.mac])
        match pending.topic_id_type, pending.topic:
            case mqttsn.TopicIdType.SHORT_NAME, str(name):
                key = TopicKey(TopicIdType.SHORT_NAME, mqttsn.short_name_id(name))
            case mqttsn.TopicIdType.PREDEFINED, int(topic_id):
                key = TopicKey(TopicIdType.PREDEFINED, topic_id)
            case _, str(name) if suback.topic_id == 0x0000:
                self.wildcards.setdefault(client, {})[name] = Wildcard()
                return
            case _, str(name):
                key = TopicKey(TopicIdType.NORMAL, suback.topic_id)
                self.names[name] = suback.topic_id
            case _:  # a topic of the other type than its id type says: decode makes none
                return
        self.explicit.setdefault(key, set()).add(client)

    def _register(self, client: Client, register: mqttsn.Register) -> None:
        """The broker telling ``client`` a topic id: if a wildcard of its wanted it, note it."""
        self.names[register.topic_name] = register.topic_id
        for topic_filter, wildcard in self.wildcards.get(client, {}).items():
            if mqttsn.topic_matches(topic_filter, register.topic_name):
                wildcard.registered.add(register.topic_name)

    def _unsubscribe(self, client: Client, unsubscribe: mqttsn.Unsubscribe) -> None:
        if isinstance(unsubscribe.topic, str) \
                and self.wildcards.get(client, {}).pop(unsubscribe.topic, None) is not None:
            return
        match unsubscribe.topic_id_type, unsubscribe.topic:
            case mqttsn.TopicIdType.SHORT_NAME, str(name):
                key = TopicKey(TopicIdType.SHORT_NAME, mqttsn.short_name_id(name))
            case mqttsn.TopicIdType.PREDEFINED, int(topic_id):
                key = TopicKey(TopicIdType.PREDEFINED, topic_id)
            case _, str(name) if name in self.names:
                key = TopicKey(TopicIdType.NORMAL, self.names[name])
            case _:
                return
        self.explicit.get(key, set()).discard(client)

    def _disconnect(self, client: Client) -> None:
        for members in self.explicit.values():
            members.discard(client)
        self.wildcards.pop(client, None)
        self.pending = {k: v for k, v in self.pending.items() if k[0] != client}

    # -- the wanted table, and writing the difference --------------------------------------

    def wanted(self) -> dict[TopicKey, set[Subscriber]]:
        """Every enabled entry with its subscribers, from the tuples."""
        members: dict[TopicKey, set[Client]] = {k: set(v) for k, v in self.explicit.items()}
        for client, filters in self.wildcards.items():
            for topic_filter, wildcard in filters.items():
                for name in wildcard.registered:
                    members.setdefault(TopicKey(TopicIdType.NORMAL, self.names[name]),
                                       set()).add(client)
                for key in members:  # short names need no REGISTER: a match is enough
                    if (key.topic_id_type == TopicIdType.SHORT_NAME and mqttsn.topic_matches(
                            topic_filter, mqttsn.short_name_of(key.topic_id))):
                        members[key].add(client)
        disabled = self._disabled()
        return {key: {self.clients[c] for c in clients} for key, clients in members.items()
                if clients and key not in disabled}

    def _disabled(self) -> set[TopicKey]:
        """Entries of named topics that a wildcard subscription still awaits a REGISTER for."""
        waiting = [(topic_filter, wildcard) for filters in self.wildcards.values()
                   for topic_filter, wildcard in filters.items()]
        return {TopicKey(TopicIdType.NORMAL, topic_id) for name, topic_id in self.names.items()
                if any(mqttsn.topic_matches(f, name) and name not in w.registered
                       for f, w in waiting)}

    def _sync(self) -> None:
        wanted = self.wanted()
        for key in set(self.applied) - set(wanted):
            self.tables.clear_topic(key)
            del self.applied[key]
        for key, subscribers in wanted.items():
            applied = self.applied.setdefault(key, set())
            for subscriber in applied - subscribers:
                self.tables.remove_subscriber(key, subscriber)
            for subscriber in sorted(subscribers - applied, key=lambda s: (s.ip, s.port)):
                self.tables.add_subscriber(key, subscriber)
            self.applied[key] = set(subscribers)
