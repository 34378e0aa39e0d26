"""The FPGA broker as RTL (brokers/fpga/rtl), Verilated behind a real UDP socket, against
the behavioural model: the same datagrams in, the same datagrams out."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
import zlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqttbed.brokers.fpga.rtl.build import ensure_sim
from mqttbed.brokers.fpga.rtl.compare import UdpReplay, expected
from mqttbed.core.mqtt_codec import (
    Connect,
    Disconnect,
    PingReq,
    Subscribe,
    Unsubscribe,
    Will,
    encode,
    encode_publish,
)

# system: a Verilator build of the harness (half a minute from empty) before any test;
# rtl-test runs them.
pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.rtl,
              pytest.mark.timeout(180)]


class Harness:
    """One mqttbed-fpga-rtl process on a free loopback port, stopped with SIGTERM."""

    def __init__(self, binary: Path, workdir: Path):
        self.dir = workdir
        ready = workdir / "ready.json"
        self.proc = subprocess.Popen(
            [str(binary), "--port", "0", "--ready-file", str(ready),
             "--stats-file", str(workdir / "stats.json"),
             "--records-file", str(workdir / "records.json")],
            stdout=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert self.proc.poll() is None, "the harness exited before binding"
            assert time.monotonic() < deadline, "the harness did not bind in 10 s"
            time.sleep(0.02)
        bound = json.loads(ready.read_text())
        self.endpoint = (bound["host"], bound["port"])

    def counters_snapshot(self) -> dict:
        """The harness's counters now: SIGUSR1, then its stats file (written whole, by rename)."""
        path = self.dir / "stats.json"
        path.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not path.exists():
            assert time.monotonic() < deadline, "no stats file 10 s after SIGUSR1"
            time.sleep(0.02)
        return json.loads(path.read_text())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def binary() -> Path:
    return ensure_sim()


@pytest.fixture
def harness(binary, tmp_path) -> Iterator[Harness]:
    h = Harness(binary, tmp_path)
    yield h
    if h.proc.poll() is None:
        h.stop()


def replay(harness: Harness, steps, clients: int):
    udp = UdpReplay(harness.endpoint, clients)
    try:
        return udp.run(steps), expected(steps, udp.addresses), udp.addresses
    finally:
        udp.close()


CONNECT = encode(Connect("c", 60, True, None, None, None, "MQTT", 4))

# Datagrams core/mqtt_codec.decode() refuses, one rule each (none may change the tables).
MALFORMED = [
    b"", b"\x30", b"\x00\x00", b"\xf0\x00",                     # short, reserved types
    b"\x32\x05\x00\x01a\x00\x00",                                # QoS 1 PUBLISH, id 0
    b"\x36\x03\x00\x01a", b"\x38\x03\x00\x01a",                  # QoS 3; DUP on QoS 0
    b"\x30\x03\x00\x00x", b"\x30\x05\x00\x03a+b",             # empty topic; wildcard
    b"\x30\x05\x00\x03a#b", b"\x30\x05\x00\x03a\x00b",           # '#', U+0000
    b"\x30\x05\x00\x03\xed\xa0\x80", b"\x30\x04\x00\x02\xc0\x80",  # surrogate, overlong
    b"\x30\x06\x00\x04\xf4\x90\x80\x80", b"\x30\x04\x00\x02\xe2\x82",  # > U+10FFFF, cut
    b"\x30\x06\x00\x03abc", b"\x30\x04\x00\x03abc",              # length mismatches
    b"\x30\xff\xff\xff\xff\x7f", b"\x30\x80",                    # RL past 4 bytes, cut off
    b"\x80\x06\x00\x01\x00\x01a\x00",                            # SUBSCRIBE flags 0
    b"\x82\x06\x00\x00\x00\x01a\x00", b"\x82\x02\x00\x01",       # id 0; no filter
    b"\x82\x06\x00\x01\x00\x01a\x03", b"\x82\x05\x00\x01\x00\x01a",  # QoS 3; QoS cut
    b"\xa2\x02\x00\x01", b"\xa2\x05\x00\x01\x00\x02a",          # UNSUBSCRIBE empty, cut
    b"\xc0\x01\x00", b"\xc1\x00", b"\xe0\x01\x00",               # PINGREQ body/flags; DISC
    b"\x10\x0c\x00\x04MQTT\x04\x01\x00\x3c\x00\x00",             # CONNECT reserved flag
    b"\x10\x0c\x00\x04MQTT\x04\x18\x00\x3c\x00\x00",             # will QoS without will
    b"\x10\x0c\x00\x04MQTT\x04\x40\x00\x3c\x00\x00",             # password, no user name
    b"\x10\x0e\x00\x04MQTT\x04\x1c\x00\x3c\x00\x00\x00\x00",     # will QoS 3
    b"\x10\x0a\x00\x04MQTT\x04\x02\x00\x3c",                     # no client id
]


def test_fixed_sequence_with_malformed_datagrams_matches_the_model(harness):
    steps = [
        (0, CONNECT),
        (0, encode(Connect("old", 60, True, None, None, None, "MQIsdp", 3))),
        (1, encode(Connect("w", 5, False, Will("w/t", b"bye", 1, True), "u", b"p", "MQTT", 4))),
        (0, encode(Subscribe(7, (("a/b", 0), ("x/#", 1), ("+/y", 0), ("#", 0), ("a#", 2),
                                 ("x/#/z", 0), ("", 0))))),
        (1, encode(Subscribe(8, (("a/b", 0), ("a/#", 0), ("sync/\u00e9t\u00e9", 0))))),
        (1, encode(Subscribe(9, (("a/b", 0),)))),            # again: no second entry
        (2, encode_publish("a/b", b"hello")),
        (2, encode_publish("x/y/z", b"deep" * 60)),          # 2-byte remaining length
        (2, encode_publish("a/b", b"q1", qos=1, packet_id=5, retain=True)),
        (2, encode_publish("sync/\u00e9t\u00e9", b"utf-8")),
        *[(2, datagram) for datagram in MALFORMED],
        (0, encode(Unsubscribe(10, ("a/b", "never")))),
        (2, encode_publish("a/b", b"after unsubscribe")),
        (0, encode(Subscribe(11, (("a/b", 0),)))),            # reuses no tombstone: trailing freed
        (1, encode(Unsubscribe(12, ("a/b",)))),              # a tombstone below a live entry
        (2, encode_publish("a/b", b"one left")),
        (1, encode(Subscribe(13, (("a/b", 0),)))),            # reuses the tombstone
        (2, encode_publish("a/b/c/d", b"three names")),
        (1, encode(Disconnect())),                            # clean session: all of 1's go
        (2, encode_publish("a/b/c/d", b"nobody")),
        (2, encode_publish("a/b", b"only 0")),
        (2, encode(PingReq())),
    ]
    got, want, _ = replay(harness, steps, 3)
    assert got == want
    # the comparison is not vacuous: what the model sends, counted
    sent = [len(step) for step in want]
    assert sum(sent) == 25
    assert sent[6] == 3 and sent[7] == 1 and sent[-5] == 1 and sent[-3:] == [0, 1, 1]
    stats = harness.counters_snapshot()["counters"]
    # every MALFORMED datagram but the empty one (no AXI4-Stream packet) is counted
    assert stats["dropped_malformed"] == len(MALFORMED) - 1
    assert stats["dropped_limit"] == 0
    assert harness.stop() == 0


def _random_datagram(rng: random.Random) -> bytes:
    levels = ["a", "b", "sync", "pmu", "\u00e9", "x"]
    topic = "/".join(rng.choice(levels) for _ in range(rng.randint(1, 4)))
    kind = rng.random()
    if kind < 0.45:
        return encode_publish(topic, rng.randbytes(rng.randint(0, 40)), qos=rng.choice((0, 1)),
                              packet_id=rng.randint(1, 9))
    if kind < 0.7:
        filters = []
        for _ in range(rng.randint(1, 3)):
            f = rng.choice([topic, topic.rsplit("/", 1)[0] + "/#", "+/a", "#", "a/#"])
            filters.append((f, rng.randint(0, 2)))
        return encode(Subscribe(rng.randint(1, 9), tuple(filters)))
    if kind < 0.8:
        return encode(Unsubscribe(rng.randint(1, 9), (topic, "a/#")))
    if kind < 0.85:
        return CONNECT
    if kind < 0.88:
        return encode(Disconnect())
    # a valid packet, mutated: one byte changed, cut short, or grown
    raw = bytearray(encode_publish(topic, b"xy") if rng.random() < 0.5 else
                    encode(Subscribe(3, ((topic, 0),))))
    how = rng.random()
    if how < 0.5:
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    elif how < 0.75:
        del raw[rng.randrange(1, len(raw)):]
    else:
        raw += rng.randbytes(rng.randint(1, 3))
    return bytes(raw)


def test_random_sequence_matches_the_model(harness):
    rng = random.Random(16)
    steps = []
    while len(steps) < 400:
        steps.append((rng.randrange(4), _random_datagram(rng)))
    got, want, _ = replay(harness, steps, 4)
    mismatches = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert mismatches == []
    assert sum(len(step) for step in want) > 300


def _colliding_topics(count: int) -> list[str]:
    """``count`` topic names with the same home word in the 65,536-word Topic Table."""
    buckets: dict[int, list[str]] = defaultdict(list)
    i = 0
    while True:
        name = f"c/{i}"
        bucket = buckets[zlib.crc32(name.encode()) % 65_536]
        bucket.append(name)
        if len(bucket) == count:
            return bucket
        i += 1


def test_hash_collisions_fill_the_probe_window_as_in_the_model(harness):
    names = _colliding_topics(9)      # 8 fit the 8-word probe window, the 9th is refused
    steps = [(0, encode(Subscribe(i + 1, ((name, 0),)))) for i, name in enumerate(names)]
    steps += [(1, encode_publish(name, b"p")) for name in names]
    got, want, _ = replay(harness, steps, 2)
    assert got == want
    assert [step[0][1][-1] for step in want[:9]] == [0] * 8 + [0x80]
    assert [len(step) for step in want[9:]] == [1] * 8 + [0]


@pytest.mark.skipif(os.environ.get("MQTTBED_RTL_FULL") != "1",
                    reason="8.4 M cycles of ID scans: make rtl-test")
def test_the_4096th_subscriber_of_a_filter_is_refused(harness):
    """The Topic Table's 12-bit count: IDs 1..4095; the 4096th SUBSCRIBE gets 0x80."""
    subscribe = encode(Subscribe(1, (("many", 0),)))
    # 4,094 subscribers from distinct loopback addresses (their SUBACKs and copies go to
    # ports nobody listens on, as the model's would)
    for i in range(4094):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            raw.bind((f"127.1.{i // 250}.{i % 250 + 1}", 0))
            raw.sendto(subscribe, harness.endpoint)
    udp = UdpReplay(harness.endpoint, 3, timeout_s=120)   # ~8.4 M cycles of ID scans
    try:
        got = udp.run([(0, subscribe), (1, subscribe), (2, encode_publish("many", b"x"))])
    finally:
        udp.close()
    assert got[0] == [(0, b"\x90\x03\x00\x01\x00")]          # ID 4,095
    assert got[1] == [(1, b"\x90\x03\x00\x01\x80")]          # the 4,096th: refused
    assert got[2] == [(0, b"\x30\x07\x00\x04manyx")]
    counters = harness.counters_snapshot()["counters"]
    assert counters["datagrams_out"] == 4094 + 2 + 4095 + 3   # + the barriers' PINGRESPs
