"""cocotb tests of the MQTT parser's fast path (mqtt_parser_fast.v): toplevel cocotb_top,
its two extra parsers, each writing its own message queue: pt_* with the fast path, ps_*
without it (the byte-wise checks only, which the whole-broker tests hold to the model).

The fast path must take one single-beat QoS 0 PUBLISH a cycle and issue exactly the
descriptor beats the byte-wise path issues for it, in arrival order with everything else,
writing the same queue entries, and wait (never drop) on a full queue.
"""

from __future__ import annotations

import random
import zlib

import cocotb
import cocotb.utils
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge, with_timeout

from mqttbed.brokers.fpga.tables import rewritten_names
from mqttbed.core.mqtt_codec import (
    Connect,
    MalformedPacket,
    PingReq,
    Publish,
    Subscribe,
    Unsubscribe,
    decode,
    encode,
    encode_publish,
)

W = 128                               # bytes per beat (the parser's default)
SEEDS = (0x00000000, 0x5BD1E995)      # tables.py: Topic Table, Subscriber Table
SOURCE = (10 << 24 | 1, 1883)         # 10.0.0.1:1883
FAST_LATENCY = 3                      # cycles from a beat's arrival to its first descriptor
OP_PUBLISH = 2


def now() -> int:
    """The clock cycle we are in (10 ns a cycle)."""
    return int(cocotb.utils.get_sim_time("ns")) // 10


class Parser:
    """One of cocotb_top's extra parsers by its port prefix: pt (fast path) or ps (none)."""

    def __init__(self, dut, prefix: str):
        self._dut, self._prefix = dut, prefix
        self.clk = dut.clk
        self.inner = getattr(dut, prefix).parser

    def __getattr__(self, name):
        return getattr(self._dut, f"{self._prefix}_{name}")


async def reset(dut) -> tuple[Parser, Parser]:
    cocotb.start_soon(Clock(dut.clk, 10, units="ns").start())
    dut.s_axis_tvalid.value = 0
    dut.m_axis_tready.value = 1
    for name in ("wr_en", "commit", "discard", "pop", "pop_len", "rd_offset"):
        getattr(dut, f"qt_{name}").value = 0
    parsers = Parser(dut, "pt"), Parser(dut, "ps")
    for p in parsers:
        p.s_tvalid.value = 0
        p.s_tlast.value = 0
        p.d_tready.value = 1
        p.q_pop.value = 0
        p.q_pop_len.value = 0
        p.q_rd_offset.value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await RisingEdge(dut.clk)
    return parsers


async def drive(p: Parser, datagrams: list[bytes]) -> list[int]:
    """Drive datagrams back to back, W bytes a beat; return the cycle each beat was taken."""
    taken = []
    for datagram in datagrams:
        for i in range(0, len(datagram), W):
            beat = datagram[i:i + W]
            p.s_tvalid.value = 1
            p.s_tdata.value = int.from_bytes(beat, "little")
            p.s_tkeep.value = (1 << len(beat)) - 1
            p.s_tlast.value = int(i + W >= len(datagram))
            p.s_tuser.value = SOURCE[0] << 16 | SOURCE[1]
            while True:      # a beat moves on the edge where tvalid and tready are high
                await ReadOnly()
                ready, cycle = p.s_tready.value, now()
                await RisingEdge(p.clk)
                if ready:
                    taken.append(cycle)
                    break
    p.s_tvalid.value = 0
    p.s_tlast.value = 0
    return taken


class Descriptors:
    """Collects a parser's descriptor beats (and their cycles), d_tready low at random."""

    def __init__(self, p: Parser, stall: float = 0.0, seed: int = 1):
        self.p, self.stall, self.rng = p, stall, random.Random(seed)
        self.beats: list[tuple[int, bool]] = []
        self.cycles: list[int] = []
        cocotb.start_soon(self._run())

    async def _run(self) -> None:
        p = self.p
        while True:
            p.d_tready.value = int(self.rng.random() >= self.stall)
            await ReadOnly()
            if p.d_tvalid.value and p.d_tready.value:
                self.beats.append((p.d_tdata.value.integer, bool(p.d_tlast.value)))
                self.cycles.append(now())
            await RisingEdge(p.clk)

    def packets(self) -> list[list[int]]:
        """The beats, one list per descriptor packet (tlast ends one)."""
        out, current = [], []
        for beat, last in self.beats:
            current.append(beat)
            if last:
                out.append(current)
                current = []
        assert not current, "a descriptor packet without tlast"
        return out


class QueueWrites:
    """Follows a parser's queue writes, commits and discards; counts its fast-path takes."""

    def __init__(self, p: Parser, fast_path: bool = True):
        self.p, self.fast_path = p, fast_path
        self.committed = self.pending = self.fast = 0
        cocotb.start_soon(self._run())

    async def _run(self) -> None:
        p = self.p
        while True:
            await ReadOnly()
            write = bool(p.q_wr_en.value)
            assert not (write and p.q_full.value), "a write into a full queue"
            if p.q_abort.value:
                self.pending = 0
            else:
                self.pending += write
                if p.q_commit.value:
                    self.committed += self.pending
                    self.pending = 0
            if self.fast_path and p.inner.fast_take.value:
                self.fast += 1
            await RisingEdge(p.clk)


async def idle(*parsers: Parser) -> None:
    async def wait() -> None:
        quiet = 0
        while quiet < 3:
            await RisingEdge(parsers[0].clk)
            await ReadOnly()
            quiet = quiet + 1 if not any(p.busy.value or p.d_tvalid.value
                                         for p in parsers) else 0
        await RisingEdge(parsers[0].clk)
    await with_timeout(wait(), 1, "ms")


async def read_queue(p: Parser, count: int) -> list[bytes]:
    """The queue's first `count` entries (a registered read: a cycle each, and one more)."""
    entries = []
    for offset in range(count):
        p.q_rd_offset.value = offset
        await RisingEdge(p.clk)
        await ReadOnly()
        entries.append(p.q_rd_data.value.integer.to_bytes(W, "little"))
        await RisingEdge(p.clk)
    return entries


def entries_of(datagrams: list[bytes]) -> list[bytes]:
    """What the queue should hold: each well-formed PUBLISH's beats, zero-padded."""
    out = []
    for d in datagrams:
        try:
            packet = decode(d)
        except MalformedPacket:
            continue
        if isinstance(packet, Publish):
            out += [d[i:i + W].ljust(W, b"\0") for i in range(0, len(d), W)]
    return out


def first_difference(got: list[list[int]], want: list[list[int]]) -> str:
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            return (f"descriptor packet {i}: got {[header(b) | {'name': name(b)} for b in g]}, "
                    f"want {[header(b) | {'name': name(b)} for b in w]}")
    return f"got {len(got)} descriptor packets, want {len(want)}"


def header(beat: int) -> dict[str, int]:
    h = beat >> 81
    return {"op": h >> 104, "pid": h >> 88 & 0xFFFF, "src": h >> 40 & (1 << 48) - 1,
            "code": h >> 32 & 0xFF, "msg_len": h >> 16 & 0xFFFF, "top_len": h & 0xFFFF}


def name(beat: int) -> tuple[int, int, int, int]:
    """(crc0, crcS, len, refused) of a descriptor beat's name."""
    return beat >> 49 & 0xFFFFFFFF, beat >> 17 & 0xFFFFFFFF, beat >> 1 & 0xFFFF, beat & 1


def names_of(topic: str) -> list[tuple[int, int, int, int]]:
    """The names tables.rewritten_names gives, hashed as tables.py hashes them."""
    return [(zlib.crc32(n.encode(), SEEDS[0]), zlib.crc32(n.encode(), SEEDS[1]),
             len(n.encode()), 0) for n in rewritten_names(topic)]


def check_publish(packet: list[int], datagram: bytes) -> None:
    """A PUBLISH's descriptor packet: its header fields and names from the datagram."""
    publish = decode(datagram)
    assert isinstance(publish, Publish)
    topic = publish.topic.encode()
    fixed = 2 + (len(datagram) > 129) + (len(datagram) > 16_386)
    for beat in packet:
        assert header(beat) == {
            "op": OP_PUBLISH,
            "pid": fixed << 13 | (publish.qos > 0) << 12 | -(-len(datagram) // W) << 1,
            "src": SOURCE[0] << 16 | SOURCE[1], "code": 0,
            "msg_len": len(topic) + len(publish.payload), "top_len": len(topic)}
    assert [name(b) for b in packet] == names_of(publish.topic)


ALPHABET = [chr(c) for c in range(0x20, 0x7F) if chr(c) not in "+#/"]


def random_topic(rng: random.Random) -> str:
    size = rng.randint(1, 40)
    chars = [rng.choice(ALPHABET) if rng.random() > 0.15 else "/" for _ in range(size)]
    if rng.random() < 0.1:              # UTF-8 beyond ASCII: the byte-wise path's
        chars[rng.randrange(size)] = rng.choice(["é", "°", "€", "\U0001F600"])
    return "".join(chars)


def random_publish(rng: random.Random) -> bytes:
    topic = random_topic(rng)
    size = rng.randint(130, 300) if rng.random() < 0.1 else rng.randint(0, 90)
    qos = rng.choice([0] * 8 + [1, 2])
    return encode_publish(topic, rng.randbytes(size), qos=qos, retain=rng.random() < 0.05,
                          packet_id=rng.randint(1, 65535) if qos else None)


# ---- rate ------------------------------------------------------------------------------

@cocotb.test()
async def one_level_publishes_enter_one_a_cycle_and_leave_as_one_descriptor_beat_each(dut):
    """50 back-to-back 76-byte PUBLISHes of a one-level topic: a beat taken every cycle, a
    descriptor beat issued every cycle, the first FAST_LATENCY cycles after the first beat
    came in (the byte-wise path: 6, the beat's 5 cycles of checks and the issue)."""
    pt, ps = await reset(dut)
    publish = encode_publish("sync_pmu", bytes(range(64)))
    assert len(publish) == 76
    out, slow_out = Descriptors(pt), Descriptors(ps)
    taken = await drive(pt, [publish] * 50)
    slow_taken = await drive(ps, [publish])
    await idle(pt, ps)
    start = taken[0]
    assert taken == list(range(start, start + 50))
    assert out.cycles == list(range(start + FAST_LATENCY, start + FAST_LATENCY + 50))
    assert all(last for _, last in out.beats)
    for packet in out.packets():
        check_publish(packet, publish)
    # the same packet through the byte-wise path, from its first cycle on the input
    slow_start = slow_taken[0] - 4                     # taken in its 5th cycle (16 lanes)
    assert slow_out.cycles == [slow_start + 6]
    assert slow_out.packets() == out.packets()[:1]


@cocotb.test()
async def three_level_publishes_take_three_cycles_each_one_per_name(dut):
    """`s/sync/p` is issued as `s/sync/p`, `s/sync/#`, `s/#`: the emitter holds the pipeline
    for the names, so after the first three beats fill it, a beat every 3 cycles, and the
    descriptor beats leave back to back."""
    pt, _ = await reset(dut)
    publish = encode_publish("s/sync/p", bytes(64))
    out = Descriptors(pt)
    taken = await drive(pt, [publish] * 50)
    await idle(pt)
    start = taken[0]
    # two pipeline stages and the emitter hold three packets
    assert [t - start for t in taken] == [0, 1, 2] + [3 * k - 4 for k in range(3, 50)]
    assert out.cycles == list(range(start + FAST_LATENCY, start + FAST_LATENCY + 150))
    for packet in out.packets():
        check_publish(packet, publish)


# ---- the same descriptors as the byte-wise path ----------------------------------------

@cocotb.test()
async def fast_and_byte_wise_paths_issue_the_same_descriptors_for_random_publishes(dut):
    pt, ps = await reset(dut)
    rng = random.Random(11)
    datagrams = [random_publish(rng) for _ in range(400)]
    out, slow_out = Descriptors(pt, stall=0.3, seed=2), Descriptors(ps, stall=0.3, seed=3)
    writes = QueueWrites(pt)
    fast = cocotb.start_soon(drive(pt, datagrams))
    slow = cocotb.start_soon(drive(ps, datagrams))
    await fast
    await slow
    await idle(pt, ps)
    packets = out.packets()
    assert packets == slow_out.packets(), first_difference(packets, slow_out.packets())
    assert len(packets) == len(datagrams)
    for packet, datagram in zip(packets, datagrams, strict=True):
        check_publish(packet, datagram)
    # both paths had their share (one-beat QoS 0 ASCII topics of up to 28 bytes and 3 '/')
    assert 100 < writes.fast < 300, writes.fast
    assert pt.dropped_malformed.value.integer == 0 == ps.dropped_malformed.value.integer


# ---- order, backpressure, the queue ----------------------------------------------------

def mixed_datagrams(rng: random.Random) -> list[bytes]:
    kinds = [
        lambda: encode_publish(rng.choice(["a", "s/t", "x/y/z/w"]), rng.randbytes(40)),
        lambda: random_publish(rng),
        lambda: encode_publish("t/" + "x" * 30, bytes(8)),               # topic too long
        lambda: encode_publish("a/b/c/d/e", bytes(8)),                   # too many levels
        lambda: encode_publish("l", rng.randbytes(200)),                 # two beats
        lambda: encode_publish("r", bytes(3), retain=True),
        lambda: bytes([0x30, 5, 0, 3]) + b"a/#",                         # wildcard
        lambda: bytes([0x30, 9, 0, 3]) + b"a/b" + bytes(3),              # cut short
        lambda: bytes([0x30, 4, 0, 3]) + b"a/bc",                        # a byte too many
        lambda: bytes([0x30, 3, 0, 0, 7]),                               # empty topic
        lambda: bytes([0x38, 4, 0, 1, 0x61, 0]),                         # DUP on QoS 0
        lambda: encode(Subscribe(rng.randint(1, 9), (("s/t", 0), ("s/#", 1)))),
        lambda: encode(Unsubscribe(3, ("s/t",))),
        lambda: encode(Connect("c", 60, True, None, None, None, "MQTT", 4)),
        lambda: encode(PingReq()),
    ]
    weights = [6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    return [rng.choices(kinds, weights)[0]() for _ in range(250)]


@cocotb.test()
async def mixed_packets_leave_in_order_and_the_queue_holds_the_same_beats(dut):
    pt, ps = await reset(dut)
    rng = random.Random(23)
    datagrams = mixed_datagrams(rng)
    out, slow_out = Descriptors(pt, stall=0.4, seed=4), Descriptors(ps, stall=0.2, seed=5)
    writes, slow_writes = QueueWrites(pt), QueueWrites(ps, fast_path=False)
    fast = cocotb.start_soon(drive(pt, datagrams))
    slow = cocotb.start_soon(drive(ps, datagrams))
    await fast
    await slow
    await idle(pt, ps)
    assert out.packets() == slow_out.packets(), first_difference(out.packets(),
                                                                 slow_out.packets())
    assert pt.dropped_malformed.value.integer == ps.dropped_malformed.value.integer > 20
    assert pt.dropped_limit.value.integer == ps.dropped_limit.value.integer == 0
    assert writes.fast > 50
    want = entries_of(datagrams)
    assert writes.committed == slow_writes.committed == len(want) < 1024
    assert await read_queue(pt, len(want)) == want
    assert await read_queue(ps, len(want)) == want
    # in order: each well-formed PUBLISH's descriptor packet, in the datagrams' order
    publishes = [d for d in datagrams if _is_publish(d)]
    issued = [p for p in out.packets() if header(p[0])["op"] == OP_PUBLISH]
    assert len(issued) == len(publishes)
    for packet, datagram in zip(issued, publishes, strict=True):
        check_publish(packet, datagram)


def _is_publish(datagram: bytes) -> bool:
    try:
        return isinstance(decode(datagram), Publish)
    except MalformedPacket:
        return False


@cocotb.test()
async def a_full_queue_stalls_the_fast_path_without_loss(dut):
    """1,024 one-beat PUBLISHes fill the queue (nothing pops it); the next one's beat
    waits, not taken, until an entry is freed, then goes through, and so the one after."""
    pt, _ = await reset(dut)
    out = Descriptors(pt)
    writes = QueueWrites(pt)
    datagrams = [encode_publish(f"q{i:04}", i.to_bytes(2, "big") * 8) for i in range(1026)]
    fill = await drive(pt, datagrams[:1024])
    assert fill == list(range(fill[0], fill[0] + 1024))
    for i, datagram in enumerate(datagrams[1024:]):
        waiting = cocotb.start_soon(drive(pt, [datagram]))
        await ClockCycles(pt.clk, 40)
        await ReadOnly()
        assert pt.q_full.value == 1 and pt.s_tvalid.value == 1 and pt.s_tready.value == 0
        assert len(out.beats) == writes.committed == 1024 + i
        await RisingEdge(pt.clk)
        pt.q_pop.value = 1                  # the oldest message leaves: one entry free
        pt.q_pop_len.value = 1
        await RisingEdge(pt.clk)
        pt.q_pop.value = 0
        await waiting
        await idle(pt)
        assert len(out.beats) == writes.committed == 1025 + i
    for packet, datagram in zip(out.packets(), datagrams, strict=True):
        check_publish(packet, datagram)
    assert await read_queue(pt, 1024) == entries_of(datagrams[2:])
