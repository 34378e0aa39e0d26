"""Helpers for tests on a real PAMS switch: a topology with the data plane, MQTT-SN bytes."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from mqttbed.brokers.p4.dataplane import EbpfSwitch
from mqttbed.brokers.p4.tables import EbpfTables, Subscriber
from mqttbed.network.netns import socket_in
from mqttbed.network.topology import Topology, leftovers

BROKER_PORT = 10000
SUBSCRIBER_PORT = 20000
SO_RCVBUFFORCE = 33


def mqttsn(msg_type: int, body: bytes) -> bytes:
    """An MQTT-SN 1.2 message: length (1 byte, or 0x01 + 2 bytes past 255 octets), type, body."""
    if len(body) + 2 > 255:
        return struct.pack("!BHB", 0x01, len(body) + 4, msg_type) + body
    return struct.pack("!BB", len(body) + 2, msg_type) + body


def publish(topic_id: int, payload: bytes, *, qos: int = 0, retain: bool = False,
            topic_id_type: int = 0, msg_id: int = 0) -> bytes:
    """PUBLISH (0x0C): flags (QoS bits 6-5, retain bit 4, topic id type bits 1-0), ids, data."""
    flags = ((qos & 3) << 5) | (0x10 if retain else 0) | topic_id_type
    return mqttsn(0x0C, struct.pack("!BHH", flags, topic_id, msg_id) + payload)


def subscribe(topic: str, msg_id: int, qos: int = 0) -> bytes:
    """SUBSCRIBE (0x12) by topic name: flags (QoS, topic id type 0), msg id, name."""
    return mqttsn(0x12, struct.pack("!BH", (qos & 3) << 5, msg_id) + topic.encode())


def register(topic_id: int, msg_id: int, name: str) -> bytes:
    """REGISTER (0x0A): topic id, msg id, topic name."""
    return mqttsn(0x0A, struct.pack("!HH", topic_id, msg_id) + name.encode())


@dataclass
class Lab:
    """A running topology (broker, pub, s1-s3) with the data plane and bound sockets."""

    topology: Topology
    switch: EbpfSwitch
    tables: EbpfTables
    broker: socket.socket
    publisher: socket.socket
    subscribers: dict[str, socket.socket] = field(default_factory=dict)

    @property
    def broker_address(self) -> tuple[str, int]:
        return self.topology.hosts["broker"].address, BROKER_PORT

    def subscriber_entry(self, name: str) -> Subscriber:
        host = self.topology.hosts[name]
        return Subscriber(mac=host.mac, ip=host.address, port=SUBSCRIBER_PORT,
                          switch_port=host.port_ifindex)

    def send(self, datagram: bytes) -> None:
        self.publisher.sendto(datagram, self.broker_address)


def udp_socket(topology: Topology, host: str, port: int) -> socket.socket:
    """A UDP socket bound to ``host``'s switch address and ``port``, inside its namespace."""
    sock = socket_in(topology.hosts[host].netns)
    # Room for a whole burst: tests read only after sending (SO_RCVBUFFORCE, root only).
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    sock.bind((topology.hosts[host].address, port))
    return sock


def drain(sock: socket.socket, quiet_s: float = 0.3) -> list[tuple[bytes, tuple[str, int]]]:
    """Every datagram that arrives until ``quiet_s`` passes with none."""
    got = []
    sock.settimeout(quiet_s)
    while True:
        try:
            got.append(sock.recvfrom(65535))
        except TimeoutError:
            return got


@contextmanager
def pams_lab(*, accelerate: bool = True, attach: bool = True) -> Iterator[Lab]:
    """Build the lab, yield it, reap it, and check nothing is left."""
    topology = Topology(["broker", "pub", "s1", "s2", "s3"])
    prefix = topology.prefix
    with topology:
        switch = EbpfSwitch(topology)
        tables = switch.load() if attach else None
        if attach:
            switch.configure(topology.hosts["broker"], BROKER_PORT, accelerate=accelerate)
        sockets = [udp_socket(topology, "broker", BROKER_PORT), udp_socket(topology, "pub", 0)]
        subs = {name: udp_socket(topology, name, SUBSCRIBER_PORT) for name in ("s1", "s2", "s3")}
        try:
            yield Lab(topology, switch, tables, *sockets, subs)
        finally:
            for sock in [*sockets, *subs.values()]:
                sock.close()
            if tables is not None:
                tables.close()
    assert leftovers(prefix) == []
