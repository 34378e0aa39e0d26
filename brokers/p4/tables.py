"""Writing the PAMS switch's tables: one interface, for the eBPF maps and for P4Runtime.

The controller (Fig. 5 of the PAMS paper) decides *who* subscribes to *which* topic;
a :class:`SwitchTables` turns that into table writes for one kind of switch:

- :class:`EbpfTables` writes the pinned maps of ``ebpf/pams.bpf.c`` (used and tested here);
- :class:`~mqttbed.brokers.p4.p4runtime.P4RuntimeTables` builds P4Runtime writes from the
  P4Info of ``pams.p4``; it has never met a switch.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from mqttbed.brokers.p4.bpf import PinnedMap

# In step with MAX_SUBSCRIBERS in ebpf/pams.bpf.c: the topic_table value holds this many.
MAX_SUBSCRIBERS = 64
# In step with enum pams_counter in ebpf/pams.bpf.c and the CNT_* constants of pams.p4.
COUNTERS = ("packets", "mqttsn", "publish_accelerated", "clones_sent", "clone_errors",
            "punted", "malformed", "passed")


class TopicIdType(IntEnum):
    """The TopicIdType bits of an MQTT-SN PUBLISH (MQTT-SN 1.2, 5.3.4)."""

    NORMAL = 0
    PREDEFINED = 1
    SHORT_NAME = 2


@dataclass(frozen=True)
class TopicKey:
    """What a PUBLISH is matched on: its topic id type and topic id (or short name)."""

    topic_id_type: TopicIdType
    topic_id: int


@dataclass(frozen=True)
class Subscriber:
    """Where a copy goes: the subscriber's MAC, IPv4, UDP port, and the switch port to it.

    ``switch_port`` is the ifindex of the switch-side veth for the eBPF data plane and the
    egress port number for a P4 switch.
    """

    mac: str
    ip: str
    port: int
    switch_port: int


@runtime_checkable
class SwitchTables(Protocol):
    """The tables of a PAMS switch, as the controller sees them."""

    def add_subscriber(self, key: TopicKey, subscriber: Subscriber) -> None:
        """Send PUBLISHes matching ``key`` to ``subscriber`` too (idempotent)."""
        ...

    def remove_subscriber(self, key: TopicKey, subscriber: Subscriber) -> None:
        """Stop sending ``key``'s PUBLISHes to ``subscriber`` (absent is fine)."""
        ...

    def clear_topic(self, key: TopicKey) -> None:
        """Forget ``key`` altogether: its PUBLISHes go to the broker again."""
        ...

    def counters(self) -> dict[str, int]:
        """The switch's packet counters by name (:data:`COUNTERS`)."""
        ...


class SubscriberSets:
    """Who subscribes to what, kept by a table writer to compute each new table entry."""

    def __init__(self) -> None:
        self.topics: dict[TopicKey, list[Subscriber]] = {}

    def add(self, key: TopicKey, subscriber: Subscriber) -> bool:
        """Add; return False if it was already there."""
        members = self.topics.setdefault(key, [])
        if subscriber in members:
            return False
        members.append(subscriber)
        return True

    def remove(self, key: TopicKey, subscriber: Subscriber) -> bool:
        """Remove; return False if it was not there. An emptied topic is forgotten."""
        members = self.topics.get(key, [])
        if subscriber not in members:
            return False
        members.remove(subscriber)
        if not members:
            del self.topics[key]
        return True


def topic_key_bytes(key: TopicKey) -> bytes:
    """``struct topic_key``: type, a zero pad byte, the topic id in network order."""
    return struct.pack("!BxH", key.topic_id_type, key.topic_id)


def subscriber_bytes(subscriber: Subscriber) -> bytes:
    """``struct subscriber``: ifindex (host order), IPv4, UDP port (network order), MAC."""
    return (struct.pack("<I", subscriber.switch_port) + socket.inet_aton(subscriber.ip)
            + struct.pack("!H", subscriber.port) + bytes.fromhex(subscriber.mac.replace(":", "")))


def topic_entry_bytes(subscribers: list[Subscriber]) -> bytes:
    """``struct topic_entry``: the count, then the subscribers, zero-padded to the maximum."""
    body = b"".join(subscriber_bytes(s) for s in subscribers)
    return struct.pack("<I", len(subscribers)) + body.ljust(MAX_SUBSCRIBERS * 16, b"\0")


class EbpfTables:
    """:class:`SwitchTables` over the pinned maps of the eBPF data plane.

    Each change rewrites the topic's whole entry (one bpf() syscall), so the data plane
    never sees a half-written subscriber list. A topic with more than
    :data:`MAX_SUBSCRIBERS` subscribers has no entry: its PUBLISHes go through the
    broker to all of them, and it is accelerated again once it is back under the limit.
    """

    def __init__(self, maps_dir: Path):
        self._topics = PinnedMap(maps_dir / "topic_table")
        self._counters = PinnedMap(maps_dir / "pams_counters")
        self._ports = PinnedMap(maps_dir / "port_counters")
        self.subscribers = SubscriberSets()

    def close(self) -> None:
        """Release the maps' descriptors (the pins keep the maps for the data plane)."""
        for pinned in (self._topics, self._counters, self._ports):
            pinned.close()

    def add_subscriber(self, key: TopicKey, subscriber: Subscriber) -> None:
        if self.subscribers.add(key, subscriber):
            self._write(key)

    def remove_subscriber(self, key: TopicKey, subscriber: Subscriber) -> None:
        if self.subscribers.remove(key, subscriber):
            self._write(key)

    def clear_topic(self, key: TopicKey) -> None:
        self.subscribers.topics.pop(key, None)
        self._topics.delete(topic_key_bytes(key))

    def _write(self, key: TopicKey) -> None:
        members = self.subscribers.topics.get(key, [])
        if 0 < len(members) <= MAX_SUBSCRIBERS:
            self._topics.update(topic_key_bytes(key), topic_entry_bytes(members))
        else:
            self._topics.delete(topic_key_bytes(key))

    def installed(self) -> dict[TopicKey, int]:
        """The entries the data plane holds now, with their subscriber counts."""
        found = {}
        for raw in self._topics.list_keys():
            id_type, topic_id = struct.unpack("!BxH", raw)
            value = self._topics.lookup(raw) or b"\0\0\0\0"
            found[TopicKey(TopicIdType(id_type), topic_id)] = struct.unpack("<I", value[:4])[0]
        return found

    def counters(self) -> dict[str, int]:
        return {name: self._counters.lookup_sum(struct.pack("<I", index))
                for index, name in enumerate(COUNTERS)}

    def port_counters(self) -> dict[tuple[int, str], int]:
        """Packets per (switch port ifindex, "ingress" or "egress")."""
        directions = ("ingress", "egress")
        found = {}
        for raw in self._ports.list_keys():
            ifindex, direction = struct.unpack("<II", raw)
            found[(ifindex, directions[direction])] = self._ports.lookup_sum(raw)
        return found
