"""The PAMS eBPF data plane on real namespaces, veths and a bridge, with real datagrams.

Needs root, clang and bpftool (``make install``); every test builds its own topology
and checks that nothing of it is left afterwards.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from pathlib import Path

import pytest

from mqttbed.brokers.p4.controller import PamsController
from mqttbed.brokers.p4.tables import TopicIdType, TopicKey
from mqttbed.core import mqttsn as mqttsn_codec
from mqttbed.network.netns import socket_in
from tests.conftest import wait_until
from tests.pams_net import (
    BROKER_PORT,
    SUBSCRIBER_PORT,
    drain,
    pams_lab,
    publish,
    register,
    subscribe,
)

# integration: network namespaces, eBPF (root, clang, bpftool)
pytestmark = pytest.mark.integration

TOPIC = TopicKey(TopicIdType.NORMAL, 0x0101)


def packet_sockets_on(link: str) -> int:
    """AF_PACKET sockets of this network namespace bound to ``link`` and receiving
    (/proc/net/packet: Iface is the bound link's index, R is 1 once its hook is in)."""
    index = str(socket.if_nametoindex(link))
    rows = [line.split() for line in Path("/proc/net/packet").read_text().splitlines()[1:]]
    return sum(1 for row in rows if row[4] == index and row[5] == "1")


def install_three(lab) -> None:
    for name in ("s1", "s2", "s3"):
        lab.tables.add_subscriber(TOPIC, lab.subscriber_entry(name))


def test_accelerated_publish_reaches_each_subscriber_once_from_the_broker_and_not_the_broker():
    with pams_lab() as lab:
        install_three(lab)
        payloads = [f"msg-{i}".encode() * 10 for i in range(20)]
        for payload in payloads:
            lab.send(publish(TOPIC.topic_id, payload))
        for name, sock in lab.subscribers.items():
            got = drain(sock)
            assert [source for _, source in got] == [lab.broker_address] * 20, name
            assert [data for data, _ in got] == [publish(TOPIC.topic_id, p) for p in payloads]
        assert drain(lab.broker, 0.1) == []
        counters = lab.tables.counters()
        assert counters["publish_accelerated"] == 20
        assert counters["clones_sent"] == 60
        assert counters["clone_errors"] == 0
        ports = lab.tables.port_counters()
        hosts = lab.topology.hosts
        assert ports[(hosts["pub"].port_ifindex, "ingress")] >= 20  # plus its ARP request
        for name in ("s1", "s2", "s3"):
            assert ports[(hosts[name].port_ifindex, "egress")] >= 20
        assert ports.get((hosts["broker"].port_ifindex, "egress"), 0) < 20


def test_long_length_form_and_short_topic_names_are_accelerated_too():
    short = TopicKey(TopicIdType.SHORT_NAME, int.from_bytes(b"ab", "big"))
    with pams_lab() as lab:
        lab.tables.add_subscriber(short, lab.subscriber_entry("s2"))
        datagram = publish(short.topic_id, b"x" * 300, topic_id_type=TopicIdType.SHORT_NAME)
        assert datagram[0] == 0x01  # the 3-byte length form
        lab.send(datagram)
        assert [d for d, _ in drain(lab.subscribers["s2"])] == [datagram]
        assert drain(lab.broker, 0.1) == []


def test_without_an_entry_or_with_acceleration_off_the_broker_gets_every_publish():
    with pams_lab() as lab:
        for i in range(10):
            lab.send(publish(TOPIC.topic_id, b"p%d" % i))
        assert len(drain(lab.broker)) == 10
        assert all(drain(sock, 0.05) == [] for sock in lab.subscribers.values())
        assert lab.tables.counters()["publish_accelerated"] == 0
    with pams_lab(accelerate=False) as lab:
        install_three(lab)
        for i in range(10):
            lab.send(publish(TOPIC.topic_id, b"p%d" % i))
        assert len(drain(lab.broker)) == 10
        assert lab.tables.counters()["clones_sent"] == 0


def test_removing_the_last_subscriber_sends_publishes_to_the_broker_again():
    with pams_lab() as lab:
        install_three(lab)
        for name in ("s1", "s2"):
            lab.tables.remove_subscriber(TOPIC, lab.subscriber_entry(name))
        lab.send(publish(TOPIC.topic_id, b"one"))
        assert len(drain(lab.subscribers["s3"])) == 1
        assert drain(lab.subscribers["s1"], 0.05) == []
        lab.tables.remove_subscriber(TOPIC, lab.subscriber_entry("s3"))
        assert lab.tables.installed() == {}
        lab.send(publish(TOPIC.topic_id, b"two"))
        assert [d for d, _ in drain(lab.broker)] == [publish(TOPIC.topic_id, b"two")]


def test_a_short_message_in_the_3_byte_length_form_is_malformed_and_goes_to_the_broker():
    body = publish(TOPIC.topic_id, b"short")[1:]
    non_canonical = bytes([0x01]) + (len(body) + 3).to_bytes(2, "big") + body
    with pams_lab() as lab:
        install_three(lab)
        lab.send(non_canonical)
        assert [d for d, _ in drain(lab.broker)] == [non_canonical]
        assert lab.tables.counters()["malformed"] == 1


@pytest.mark.parametrize("datagram", [
    publish(TOPIC.topic_id, b"will bit", topic_id_type=0x08),
    publish(TOPIC.topic_id, b"qos1", qos=1, msg_id=7),
    publish(TOPIC.topic_id, b"retained", retain=True),
    publish(TOPIC.topic_id, b"qos-1", qos=3),
    b"not mqtt-sn at all, but sent to the broker's port",
], ids=["reserved-flag", "qos1", "retain", "qos-minus-1", "not-mqttsn"])
def test_what_is_not_a_qos0_unretained_publish_passes_untouched(datagram):
    with pams_lab() as lab:
        install_three(lab)
        lab.send(datagram)
        assert drain(lab.broker) == [(datagram, (lab.topology.hosts["pub"].address,
                                                 lab.publisher.getsockname()[1]))]
        assert all(drain(sock, 0.05) == [] for sock in lab.subscribers.values())


def test_other_udp_and_tcp_between_hosts_pass_untouched():
    with pams_lab() as lab:
        install_three(lab)
        s1 = lab.topology.hosts["s1"]
        lab.publisher.sendto(publish(TOPIC.topic_id, b"to s1"), (s1.address, SUBSCRIBER_PORT))
        assert [d for d, _ in drain(lab.subscribers["s1"])] == [publish(TOPIC.topic_id, b"to s1")]
        listener = socket_in(lab.topology.hosts["broker"].netns, socket.AF_INET,
                             socket.SOCK_STREAM)
        client = socket_in(lab.topology.hosts["pub"].netns, socket.AF_INET, socket.SOCK_STREAM)
        with listener, client:
            listener.bind((lab.broker_address[0], BROKER_PORT))
            listener.listen()
            client.settimeout(2)
            client.connect(lab.broker_address)
            conn, _ = listener.accept()
            with conn:
                client.sendall(publish(TOPIC.topic_id, b"over tcp"))
                conn.settimeout(2)
                assert conn.recv(100) == publish(TOPIC.topic_id, b"over tcp")
        assert lab.tables.counters()["publish_accelerated"] == 0


def test_control_messages_to_the_broker_are_copied_to_the_cpu_port():
    with pams_lab() as lab:
        cpu = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        with cpu:
            cpu.bind((lab.topology.cpu_peer, 0))
            sent = [subscribe("a/b", 1), register(0x0101, 2, "a/b")]
            for datagram in sent:
                lab.send(datagram)
            frames = [frame for frame, _ in drain(cpu)]
        udp_payloads = [frame[42:] for frame in frames if frame[23] == socket.IPPROTO_UDP]
        assert udp_payloads == sent
        assert [d for d, _ in drain(lab.broker)] == sent
        assert lab.tables.counters()["punted"] == 2


def mutate(rng: random.Random, datagram: bytes) -> bytes:
    """One random corruption: a flipped byte, a cut, a grown tail, or a bad length field."""
    data = bytearray(datagram)
    match rng.randrange(4):
        case 0:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        case 1:
            del data[rng.randrange(1, len(data)):]
        case 2:
            data += bytes(rng.randrange(1, 8))
        case _:
            data[0] = rng.choice([0, 1, 2, len(data) + 1, len(data) - 1, 255]) & 0xFF
    return bytes(data)


def test_fuzzed_datagrams_are_never_rewritten_wrongly_and_malformed_ones_are_counted():
    rng = random.Random(20240610)
    seeds = [publish(TOPIC.topic_id, b"fuzz payload"), publish(TOPIC.topic_id, b"L" * 260),
             subscribe("a/#", 9), register(0x0101, 3, "a/b")]
    with pams_lab() as lab:
        install_three(lab)
        cases = [mutate(rng, rng.choice(seeds)) for _ in range(300)]
        for datagram in cases:
            lab.send(datagram)
        to_broker = [d for d, _ in drain(lab.broker)]
        at_s1 = [d for d, _ in drain(lab.subscribers["s1"])]
        counters = lab.tables.counters()
    # Every datagram went exactly one way: to the broker untouched, or to all subscribers.
    assert len(to_broker) + len(at_s1) == len(cases)
    assert sorted(to_broker + at_s1) == sorted(cases)
    for datagram in at_s1:  # accelerated ones are what the broker's codec takes as such
        packet = mqttsn_codec.decode(datagram)
        assert isinstance(packet, mqttsn_codec.Publish)
        assert (packet.qos, packet.retain, packet.topic_id) == (0, False, TOPIC.topic_id)
    assert counters["malformed"] > 0
    assert counters["publish_accelerated"] == len(at_s1)


def test_the_controller_learns_a_subscription_from_packet_ins_and_the_switch_accelerates_it():
    with pams_lab() as lab:
        ports = {host.mac: host.port_ifindex for host in lab.topology.hosts.values()}
        controller = PamsController(lab.tables, lab.broker_address, ports)
        stop = threading.Event()
        cpu_link = lab.topology.cpu_peer
        bound_before = packet_sockets_on(cpu_link)
        reader = threading.Thread(target=controller.serve, args=(cpu_link, stop))
        reader.start()
        try:
            wait_until(lambda: packet_sockets_on(cpu_link) > bound_before, 5,
                       f"the controller's AF_PACKET socket bound to {cpu_link}")
            s1 = lab.subscribers["s1"]
            s1.sendto(subscribe("a/b", 5), lab.broker_address)
            [(request, client)] = drain(lab.broker)
            suback = mqttsn_codec.Suback(0x0101, 5, mqttsn_codec.ReturnCode.ACCEPTED)
            lab.broker.sendto(mqttsn_codec.encode(suback), client)
            assert len(drain(s1)) == 1  # the SUBACK itself
            deadline = time.monotonic() + 2
            while not lab.tables.installed() and time.monotonic() < deadline:
                time.sleep(0.01)
            lab.send(publish(0x0101, b"straight to s1"))
            assert [d for d, _ in drain(s1)] == [publish(0x0101, b"straight to s1")]
            assert drain(lab.broker, 0.1) == []
        finally:
            stop.set()
            reader.join()
        assert controller.events["Subscribe"] == 1 and controller.events["Suback"] == 1
