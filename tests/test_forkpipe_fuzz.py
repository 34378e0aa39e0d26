"""Malformed and mutated packets never take the fork/pipe broker down (a bounded fuzz run).

Each case opens a connection and sends bytes derived from valid packets (bit flips,
truncations, insertions, a lying remaining length, random types) or plain noise, with or
without a valid CONNECT first. Afterwards a well-behaved subscriber and publisher must
still be served, every client process must have ended, and the sanitizer build must not
have reported anything. The generator is seeded: a failure names the seed and the case.
"""

from __future__ import annotations

import random
import socket
import time

import pytest

from tests.test_forkpipe_protocol import (
    DISCONNECT,
    PINGREQ,
    assert_clean_teardown,
    connect,
    deploy,
    eventually,
    packet,
    publish,
    subscribe,
    unsubscribe,
)

# integration: the C broker
pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SEED = 20240521
CASES = 600
TIME_BUDGET_S = 12.0

VALID_PACKETS = [
    connect("fuzz", keepalive=5), connect("w", will=("w/t", b"bye"), username="u", password=b"p"),
    subscribe(1, ("fz/a", 0), ("fz/+/b", 1), ("fz/#", 2)), unsubscribe(2, "fz/a", "fz/#"),
    publish("fz/a", b"payload"), publish("fz/x/b", b"q1", qos=1, packet_id=3),
    publish("fz/q2", b"q2", qos=2, packet_id=4), packet(0x62, b"\x00\x04"),
    PINGREQ, DISCONNECT,
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    """Return ``data`` damaged in one of the ways a broken client or a bad link would."""
    buf = bytearray(data)
    kind = rng.randrange(7)
    if kind == 0 and buf:                                   # flip some bits
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == 1 and buf:                                 # overwrite a byte
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif kind == 2:                                         # truncate
        del buf[rng.randrange(len(buf) + 1):]
    elif kind == 3:                                         # insert noise
        at = rng.randrange(len(buf) + 1)
        buf[at:at] = rng.randbytes(rng.randint(1, 16))
    elif kind == 4 and len(buf) > 1:                        # lie about the length
        buf[1] = rng.choice([0x00, 0x7F, 0xFF, rng.randrange(256)])
        if buf[1] & 0x80:
            buf[2:2] = bytes([0xFF, 0xFF, rng.choice([0x7F, 0xFF])])
    elif kind == 5:                                         # another packet type
        buf[0] = rng.randrange(256)
    else:                                                   # repeat a slice
        at = rng.randrange(len(buf) + 1)
        buf[at:at] = buf[: rng.randint(0, len(buf))]
    return bytes(buf)


def case_bytes(rng: random.Random) -> bytes:
    """One connection's worth of bytes."""
    style = rng.randrange(4)
    if style == 0:
        return rng.randbytes(rng.randint(1, 64))
    if style == 1:
        return mutate(rng, rng.choice(VALID_PACKETS[:2]))
    prefix = VALID_PACKETS[0]
    if style == 2:
        return prefix + mutate(rng, rng.choice(VALID_PACKETS[2:]))
    sequence = [rng.choice(VALID_PACKETS[2:]) for _ in range(rng.randint(1, 5))]
    sequence[rng.randrange(len(sequence))] = mutate(rng, rng.choice(VALID_PACKETS[2:]))
    return prefix + b"".join(sequence)


def send_case(port: int, data: bytes, linger_s: float) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
        try:
            sock.sendall(data)
            if linger_s:
                sock.settimeout(linger_s)
                while sock.recv(65536):
                    pass
        except (TimeoutError, ConnectionError):
            pass


@pytest.mark.parametrize("sanitizers", [True, False], ids=["sanitized", "release"])
def test_mutated_packets_never_stop_a_well_behaved_client_being_served(sanitizers):
    rng = random.Random(SEED)
    deployed = deploy(sanitizers)
    port = deployed.endpoint.port
    try:
        deadline = time.monotonic() + TIME_BUDGET_S
        sent = 0
        while sent < CASES and time.monotonic() < deadline:
            data = case_bytes(rng)
            # Most cases hang up at once; some wait for the broker's answer (or hang-up).
            send_case(port, data, linger_s=0.02 if rng.random() < 0.3 else 0.0)
            sent += 1
            assert deployed.backend.health() is None, f"seed {SEED} case {sent}: {data!r}"
        assert sent >= 100, f"only {sent} cases in {TIME_BUDGET_S} s"
        # The fuzz connections' client processes exit first (under the sanitizers, on a
        # loaded machine, hundreds of them take seconds: a CONNACK waited 3 s behind them)
        assert eventually(lambda: deployed.processes() == 1, timeout_s=30)

        subscriber = deployed.client("good-sub")
        subscriber.subscribe("after/fuzz/#")
        publisher = deployed.client("good-pub")
        publisher.send(publish("after/fuzz/ok", b"still served"))
        assert subscriber.next_message() == ("after/fuzz/ok", b"still served")
        subscriber.close()
        publisher.close()
        # Every fuzz connection ended its client process and removed its directory.
        assert eventually(lambda: deployed.processes() == 1, timeout_s=15)
        assert list(deployed.state.iterdir()) == []
    finally:
        assert_clean_teardown(deployed)
