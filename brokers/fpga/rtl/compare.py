"""Replaying one datagram sequence against the behavioural model and the RTL broker.

The RTL broker is reached over real UDP (the Verilated harness); the model is called in
process (:class:`~mqttbed.brokers.fpga.model.BrokerModel`). Each client is a real UDP
socket on loopback; after every datagram a PINGREQ from a separate probe socket acts as a
barrier (the harness answers datagrams in order, so once PINGRESP is back every packet the
datagram caused has been sent). The result is, per step, what each client received, in
order: equal for the two brokers when the RTL behaves as the model does.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from mqttbed.brokers.fpga.model import BrokerModel

PINGREQ = b"\xc0\x00"
PINGRESP = b"\xd0\x00"

Step = tuple[int, bytes]                    # (client index, datagram)
Received = list[list[tuple[int, bytes]]]    # per step: (client index, packet), per client in order


def expected(steps: Sequence[Step], clients: Sequence[tuple[str, int]],
             model: BrokerModel | None = None) -> Received:
    """What the model sends for ``steps``: per step, (client index, packet) in send order."""
    model = model or BrokerModel()
    index = {address: i for i, address in enumerate(clients)}
    out: Received = []
    for client, datagram in steps:
        outcome = model.handle(datagram, clients[client])
        out.append(_per_client([(index[d.address], outcome.packet)
                                for d in outcome.destinations if outcome.packet is not None]))
    return out


class UdpReplay:
    """Client sockets on loopback that replay steps against a broker's UDP endpoint."""

    def __init__(self, endpoint: tuple[str, int], clients: int, timeout_s: float = 10.0):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.sockets = []
        for _ in range(clients):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
            self.sockets.append(sock)
        self.probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.probe.bind(("127.0.0.1", 0))
        self.probe.settimeout(timeout_s)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [sock.getsockname()[:2] for sock in self.sockets]

    def run(self, steps: Sequence[Step]) -> Received:
        """Send each step's datagram, wait for the barrier, collect what each client got."""
        out: Received = []
        for client, datagram in steps:
            self.sockets[client].sendto(datagram, self.endpoint)
            self.barrier()
            got = []
            for i, sock in enumerate(self.sockets):
                while True:
                    try:
                        got.append((i, sock.recv(65535)))
                    except BlockingIOError:
                        break
            out.append(_per_client(got))
        return out

    def barrier(self) -> None:
        self.probe.sendto(PINGREQ, self.endpoint)
        reply = self.probe.recv(16)
        if reply != PINGRESP:
            raise AssertionError(f"barrier: expected PINGRESP, got {reply!r}")

    def close(self) -> None:
        for sock in [*self.sockets, self.probe]:
            sock.close()


def _per_client(pairs: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    # Sockets are read one after another, so only each client's own order is comparable.
    return sorted(pairs, key=lambda pair: pair[0])
