"""Bad neighbours: a hand-written socket peer on a node's link port, byte by byte.

What a node does (see mqttbed.brokers.mqttst.node): a stream that is not MQTT, a packet
out of place or a CONNECT from outside the cluster ends or refuses the link; a BPDU
that is malformed or forged is answered, dropped and counted by reason, and the link
stays, so it forces no Topology Change. A well-formed root claim no node can disprove
(a dead member's id with a huge C) is believed, as in the paper; it never goes unseen:
the live brokers' stats no longer show a tree of live brokers.
"""

from __future__ import annotations

import math
import socket
import struct
import threading
from dataclasses import replace

import pytest

from mqttbed.brokers.mqttst import mqtt5
from mqttbed.brokers.mqttst.bpdu import Bpdu, encode_bpdu
from mqttbed.brokers.mqttst.cluster import ClusterNotConverged
from mqttbed.brokers.mqttst.mqtt5 import Ack, ConnAck, Connect, FrameBuffer, PingReq, Publish
from mqttbed.brokers.mqttst.tree import BrokerId
from mqttbed.core.mqtt_codec import PacketType
from tests.conftest import eventually
from tests.mqttst_support import (  # noqa: F401 - cluster_of_fixture is a fixture
    assert_exactly_once_everywhere,
    cluster_of_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


class RawPeer:
    """A TCP socket on a node's link port that speaks the link protocol by hand.

    A background thread answers what a live peer must (PINGRESP, PUBREC, PUBCOMP) and
    keeps what arrives, so the node sees a neighbour that is alive.
    """

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.received: list[mqtt5.Packet] = []
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def send(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def handshake(self, client_id: str, bridge: bool = True) -> ConnAck:
        """Send CONNECT; return the CONNACK; keep answering in the background if welcome."""
        self.send(mqtt5.encode(Connect(client_id, 1, bridge=bridge)))
        frames = FrameBuffer()
        while not (packets := frames.feed(self.sock.recv(65536))):
            pass
        connack = mqtt5.decode(*packets[0])
        assert isinstance(connack, ConnAck)
        if connack.reason_code == 0:
            self._thread = threading.Thread(target=self._answer, args=(frames,), daemon=True)
            self._thread.start()
        return connack

    def _answer(self, frames: FrameBuffer) -> None:
        self.sock.settimeout(None)
        try:
            while data := self.sock.recv(65536):
                for first, body in frames.feed(data):
                    packet = mqtt5.decode(first, body)
                    self.received.append(packet)
                    if isinstance(packet, PingReq):
                        self.send(mqtt5.encode(mqtt5.PingResp()))
                    elif isinstance(packet, Publish):
                        self.send(mqtt5.encode(Ack(PacketType.PUBREC, packet.packet_id)))
                    elif isinstance(packet, Ack) and packet.packet_type == PacketType.PUBREL:
                        self.send(mqtt5.encode(Ack(PacketType.PUBCOMP, packet.packet_id)))
        except OSError:
            pass
        self.closed.set()

    def is_closed_by_node(self, within_s: float = 3.0) -> bool:
        self.sock.settimeout(within_s)
        try:
            while self.sock.recv(65536):
                pass
            return True
        except TimeoutError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


def counters(cluster, index: int) -> dict:
    return cluster.states()[index]["counters"]


def test_the_link_port_refuses_garbage_clients_strangers_and_duplicates(cluster_of):
    cluster = cluster_of(3, capabilities={0: 100, 1: 300, 2: 200})
    assert cluster.wait_converged(20) == 1
    epoch = cluster.states()[0]["epoch"]
    port, ids = cluster.link_ports()[0], [f"{h}:{p}" for h, p in cluster.endpoints()]

    garbage = RawPeer(port)
    garbage.send(b"\xff\xff\xff\xff\xff\xff")       # no MQTT packet type 15 fits here
    assert garbage.is_closed_by_node()
    client = RawPeer(port)                          # a plain client on the wrong port
    assert client.handshake("some-client", bridge=False).reason_code == mqtt5.NOT_AUTHORIZED
    stranger = RawPeer(port)
    assert stranger.handshake("mqttst/127.0.0.1:1").reason_code == mqtt5.NOT_AUTHORIZED
    twin = RawPeer(port)                            # broker 1 is linked already
    assert twin.handshake(f"mqttst/{ids[1]}").reason_code == mqtt5.CLIENT_ID_NOT_VALID
    for peer in (client, stranger, twin):
        assert peer.is_closed_by_node()

    assert eventually(lambda: counters(cluster, 0)["links_refused"] == 3
                      and counters(cluster, 0)["protocol_errors"] == 1)
    assert cluster.health() is None
    assert cluster.wait_converged(5) == 1 and cluster.states()[0]["epoch"] == epoch


def test_malformed_and_forged_bpdus_are_dropped_counted_and_force_no_topology_change(
        cluster_of, tmp_path):
    cluster = cluster_of(3, capabilities={0: 100, 1: 300, 2: 200})
    assert cluster.wait_converged(20) == 1
    cluster.kill(2)
    assert cluster.wait_converged(10) == 1
    ids = [BrokerId(h, p) for h, p in cluster.endpoints()]
    epoch = cluster.states()[0]["epoch"]

    forger = RawPeer(cluster.link_ports()[0])      # dials node 0 as the dead broker 2
    assert forger.handshake(f"mqttst/{ids[2]}").reason_code == 0
    honest = Bpdu(ids[2], 200.0, ids[1], 300.0, 150, epoch)

    def bpdu(payload: bytes) -> None:
        forger.send(mqtt5.encode(PingReq(payload)))

    def patched(offset: int, raw: bytes) -> bytes:
        payload = bytearray(encode_bpdu(honest))
        payload[offset:offset + len(raw)] = raw
        return bytes(payload)

    bpdu(encode_bpdu(honest))                      # a valid one first: C is now 200
    bad = {
        "truncated": [encode_bpdu(honest)[:17], b"\x01"],
        "capability": [patched(13, struct.pack("!d", value))
                       for value in (math.nan, math.inf, -1.0, 1e300)],
        "version": [patched(0, b"\x09")],
        "flags": [patched(1, b"\x40")],
        "address": [patched(6, b"\x07")],
        "inconsistent": [encode_bpdu(replace(honest, root=ids[2], root_capability=9e8,
                                             root_path_cost_us=0))],
        "forged-sender": [encode_bpdu(replace(honest, sender=ids[1], sender_capability=300.0,
                                              root=ids[1], root_path_cost_us=0))],
        "forged-capability": [encode_bpdu(replace(honest, sender_capability=250.0))],
        "forged-root": [encode_bpdu(replace(honest, root=ids[0], root_capability=5e8)),
                        encode_bpdu(replace(honest, root_capability=9e8))],
        "unknown-root": [encode_bpdu(replace(honest, root=BrokerId("10.9.9.9", 1883),
                                             root_capability=9e8))],
    }
    for payloads in bad.values():
        for payload in payloads:
            bpdu(payload)
    expected = {reason: len(payloads) for reason, payloads in bad.items()}
    assert eventually(lambda: counters(cluster, 0)["malformed_by_reason"] == expected,
                      timeout_s=5), counters(cluster, 0)
    answered = sum(isinstance(p, mqtt5.PingResp) for p in forger.received)
    assert answered >= 1 + sum(expected.values())  # every PINGREQ still got its PINGRESP
    assert not forger.closed.is_set() and cluster.health() is None
    state = cluster.states()[0]
    assert (state["epoch"], state["root"], state["root_capability"]) == \
        (epoch, str(ids[1]), 300.0)
    assert state["counters"]["topology_changes"] == cluster.states()[1]["counters"][
        "topology_changes"]

    forger.close()                                 # its link fails: the tree restarts
    assert cluster.wait_converged(10) == 1
    epoch = cluster.states()[0]["epoch"]
    assert epoch != honest.epoch

    # A claim nobody can disprove: the dead broker 2 "is back" with a huge C. Believed,
    # as in the paper, yet not silent: no tree of live brokers shows any more, while
    # brokers 0 and 1 still reach each other. Once it goes, the tree heals.
    rogue = RawPeer(cluster.link_ports()[0])
    assert rogue.handshake(f"mqttst/{ids[2]}").reason_code == 0
    rogue.send(mqtt5.encode(PingReq(encode_bpdu(Bpdu(ids[2], 9e8, ids[2], 9e8, 0, epoch)))))
    assert eventually(lambda: all(s["root"] == str(ids[2]) for s in cluster.states()
                                  if s is not None), timeout_s=5)
    assert cluster.converged_root() is None
    with pytest.raises(ClusterNotConverged, match="broker 2"):
        cluster.wait_converged(0.5)
    assert_exactly_once_everywhere(cluster, tmp_path, "rogue", [0, 1], [0, 1])
    rogue.close()
    assert cluster.wait_converged(10) == 1
