"""cocotb tests of the whole RTL broker (toplevel cocotb_top: mqtt_broker on its ports),
the model as reference.

Run by tests/test_fpga_rtl_cocotb.py through cocotb's runner (Verilator). Unlike the UDP
harness, which waits for the design to go idle after each datagram, these drive datagrams
back to back and hold the output stream's tready low at random, so the parser waits on a
full message queue and the lookup engine on a full job FIFO.
"""

from __future__ import annotations

import random
import zlib

import cocotb
import cocotb.utils
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge, with_timeout

from mqttbed.brokers.fpga.model import BrokerModel
from mqttbed.core.mqtt_codec import Connect, Subscribe, Unsubscribe, encode, encode_publish

CLIENTS = [("10.0.0.1", 1883), ("10.0.0.2", 40000), ("192.168.1.7", 5)]
SEEDS = (0x00000000, 0x5BD1E995)     # tables.py: Topic Table, Subscriber Table
W = 128                               # bytes per beat (mqtt_broker.v's default)


def user(address: tuple[str, int]) -> int:
    a, b, c, d = (int(x) for x in address[0].split("."))
    return (((a << 24) | (b << 16) | (c << 8) | d) << 16) | address[1]


def address_of(value: int) -> tuple[str, int]:
    ip = value >> 16
    return (".".join(str((ip >> s) & 0xFF) for s in (24, 16, 8, 0)), value & 0xFFFF)


async def reset(dut) -> None:
    cocotb.start_soon(Clock(dut.clk, 10, units="ns").start())
    dut.rst.value = 1
    dut.s_axis_tvalid.value = 0
    dut.s_axis_tlast.value = 0
    dut.m_axis_tready.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


async def send(dut, datagram: bytes, source: tuple[str, int]) -> int:
    """Drive one datagram, W bytes a beat; return the cycles s_axis_tready was low
    meanwhile."""
    waited = 0
    for i in range(0, len(datagram), W):
        beat = datagram[i:i + W]
        dut.s_axis_tvalid.value = 1
        dut.s_axis_tdata.value = int.from_bytes(beat, "little")
        dut.s_axis_tkeep.value = (1 << len(beat)) - 1
        dut.s_axis_tlast.value = int(i + W >= len(datagram))
        dut.s_axis_tuser.value = user(source)
        while True:          # a beat moves on the edge where tvalid and tready are high
            await ReadOnly()
            ready = dut.s_axis_tready.value
            await RisingEdge(dut.clk)
            if ready:
                break
            waited += 1
    dut.s_axis_tvalid.value = 0
    dut.s_axis_tlast.value = 0
    return waited


class Sink:
    """Collects m_axis packets as (destination, bytes), tready low at random if asked."""

    def __init__(self, dut, stall: float = 0.0, seed: int = 1):
        self.dut, self.stall, self.rng = dut, stall, random.Random(seed)
        self.packets: list[tuple[tuple[str, int], bytes]] = []
        cocotb.start_soon(self._run())

    async def _run(self) -> None:
        dut, current = self.dut, bytearray()
        while True:
            dut.m_axis_tready.value = int(self.rng.random() >= self.stall)
            await ReadOnly()
            if dut.m_axis_tvalid.value and dut.m_axis_tready.value:
                keep = dut.m_axis_tkeep.value.integer
                lanes = keep.bit_length()
                assert keep == (1 << lanes) - 1 and lanes > 0, f"tkeep {keep:#x}"
                beat = dut.m_axis_tdata.value.integer.to_bytes(W, "little")
                assert lanes == W or dut.m_axis_tlast.value, "a short beat before the last"
                current += beat[:lanes]
                if dut.m_axis_tlast.value:
                    self.packets.append((address_of(dut.m_axis_tuser.value.integer),
                                         bytes(current)))
                    current = bytearray()
            await RisingEdge(dut.clk)


async def idle(dut) -> None:
    async def wait() -> None:
        quiet = 0
        while quiet < 3:
            await RisingEdge(dut.clk)
            await ReadOnly()
            quiet = quiet + 1 if not dut.busy.value and not dut.m_axis_tvalid.value else 0
        await RisingEdge(dut.clk)      # out of the read-only phase: inputs may be driven
    await with_timeout(wait(), 2, "ms")


def first_difference(got, want) -> str:
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            return f"packet {i}: got {g[0]} {g[1][:24].hex()}.. ({len(g[1])} B), " \
                   f"want {w[0]} {w[1][:24].hex()}.. ({len(w[1])} B)"
    return f"got {len(got)} packets, want {len(want)}"


def model_output(steps) -> list[tuple[tuple[str, int], bytes]]:
    model, out = BrokerModel(), []
    for client, datagram in steps:
        outcome = model.handle(datagram, CLIENTS[client])
        if outcome.packet is not None:
            out += [(d.address, outcome.packet) for d in outcome.destinations]
    return out


@cocotb.test()
async def back_to_back_with_backpressure_matches_the_model(dut):
    await reset(dut)
    sink = Sink(dut, stall=0.3)
    rng = random.Random(7)
    steps = [
        (0, encode(Connect("a", 60, True, None, None, None, "MQTT", 4))),
        (0, encode(Subscribe(1, (("s/t", 0), ("s/#", 0))))),
        (1, encode(Subscribe(2, (("s/t", 0), ("#", 0), ("s/+", 0))))),
        (2, encode(Subscribe(3, (("s/t/u", 0),)))),
    ]
    for i in range(60):
        topic = rng.choice(["s/t", "s/t/u", "s/x", "q"])
        steps.append((rng.randrange(3), encode_publish(topic, rng.randbytes(rng.randint(0, 90)))))
        if i % 7 == 0:
            steps.append((rng.randrange(3), bytes([0x30, 3, 0, 1])))          # cut short
        if i == 30:
            steps.append((1, encode(Unsubscribe(4, ("s/t",)))))
    for client, datagram in steps:
        await send(dut, datagram, CLIENTS[client])
    await idle(dut)
    want = model_output(steps)
    assert len(want) > 60
    assert sink.packets == want, first_difference(sink.packets, want)
    assert dut.dropped_malformed.value.integer == 9
    assert dut.dropped_limit.value.integer == 0


@cocotb.test()
async def publishes_over_several_beats_match_the_model(dut):
    """Copies cut from two neighbouring entries: a packet identifier taken out where it
    straddles a beat boundary, 1-, 2- and 3-byte remaining lengths, and a remaining length
    the sender encoded in more bytes than needed."""
    await reset(dut)
    sink = Sink(dut, stall=0.2, seed=5)
    steps = [(0, encode(Subscribe(1, (("t/#", 0), ("l/#", 0), ("a/#", 0)))))]
    for topic_len in range(118, 128):
        topic = "t/" + "x" * (topic_len - 2)
        for payload in (0, 1, 130, 300):
            message = bytes(i % 251 for i in range(payload))
            steps.append((1, encode_publish(topic, message, qos=1, packet_id=7)))
    steps += [(1, encode_publish("l/" + "y" * 120, bytes(16_400), qos=q, packet_id=q or None))
              for q in (0, 1)]
    # remaining length 7 sent as 0x87 0x80 0x00 (decode accepts it; the copy says 0x07)
    steps.append((2, b"\x30\x87\x80\x00\x00\x03a/bzz"))
    steps.append((2, b"\x32\x89\x00\x00\x03a/b\x00\x05zz"))
    for client, datagram in steps:
        await send(dut, datagram, CLIENTS[client])
    await idle(dut)
    want = model_output(steps)
    assert len(want) == len(steps)            # a SUBACK, then one copy each
    assert sink.packets == want, first_difference(sink.packets, want)
    assert dut.dropped_malformed.value.integer == 0


async def publish_rate(dut, subscribers: int, topic: str = "pmu",
                       count: int = 50) -> tuple[int, list[int]]:
    """Drive `count` 76-byte PUBLISHes of `topic` back to back to a topic with `subscribers`
    subscribers, the sink always ready; return the cycles the PUBLISHes took to go in and
    the cycle of each copy out, from the first beat in."""
    await reset(dut)
    sink = Sink(dut)
    for client in range(subscribers):
        await send(dut, encode(Subscribe(1, ((topic, 0),))), (f"10.0.1.{client + 1}", 7000))
    await idle(dut)
    out: list[int] = []
    start = cocotb.utils.get_sim_time("ns")

    async def monitor() -> None:
        while True:
            await ReadOnly()
            if dut.m_axis_tvalid.value and dut.m_axis_tready.value:
                out.append(int((cocotb.utils.get_sim_time("ns") - start) // 10))
            await RisingEdge(dut.clk)

    cocotb.start_soon(monitor())
    publish = encode_publish(topic, bytes(72 - len(topic)))
    assert len(publish) == 76
    for _ in range(count):
        await send(dut, publish, CLIENTS[2])
    took = int((cocotb.utils.get_sim_time("ns") - start) // 10)
    await idle(dut)
    assert len(sink.packets) == subscribers + count * subscribers
    return took, out


@cocotb.test()
async def one_level_publishes_go_in_one_a_cycle_and_copies_out_one_a_cycle(dut):
    """The paper's rate (6.2: a PUBLISH every cycle at 100 MHz): one-beat PUBLISHes of a
    one-level topic are taken one per cycle, and with one subscriber their copies leave one
    per cycle, back to back."""
    took, out = await publish_rate(dut, subscribers=1)
    assert took == 50
    assert out == list(range(out[0], out[0] + 50))


@cocotb.test()
async def copies_leave_one_a_cycle_across_publishes_to_four_subscribers(dut):
    """With four subscribers the output is the bound: a copy every cycle, across PUBLISHes
    (the scan's last copy takes the next PUBLISH's name; the generator reads the next
    message's entry as it pops the last one)."""
    _, out = await publish_rate(dut, subscribers=4)
    assert out == list(range(out[0], out[0] + 200))


@cocotb.test()
async def a_two_level_publish_takes_a_cycle_per_name(dut):
    """`sync/pmu` is looked up as `sync/pmu` and `sync/#` (the rewriter, 5.3): two names,
    so back to back a PUBLISH every 2 cycles, its copy every 2 cycles. The parser's fast
    path takes the first few a cycle apart until its pipeline is full."""
    took, out = await publish_rate(dut, subscribers=1, topic="sync/pmu")
    assert out == list(range(out[0], out[0] + 100, 2))
    assert 2 * 50 - 4 <= took < 2 * 50


@cocotb.test()
async def a_full_message_queue_stalls_the_parser_and_an_oversized_message_is_dropped(dut):
    await reset(dut)
    sink = Sink(dut, stall=0.5, seed=3)
    steps = [(c, encode(Subscribe(1, (("big", 0),)))) for c in range(3)]
    # 40,008-byte datagrams, 313 beats: 313 of the queue's 1024 entries each
    steps += [(0, encode_publish("big", bytes([i]) * 40_000)) for i in range(4)]
    waited = 0
    for client, datagram in steps:
        waited += await send(dut, datagram, CLIENTS[client])
    await idle(dut)
    # three messages take 939 entries: the fourth's 86th beat waits until the first
    # message has gone out 3 times (3 x 313 beats, half the cycles stalled by the sink)
    assert waited > 300
    want = model_output(steps)
    assert sink.packets == want, first_difference(sink.packets, want)
    assert dut.dropped_limit.value.integer == 0
    # topic + message over 65,535 bytes (the jobs' length field) is dropped, counted (no
    # UDP datagram is that long; the model, which has no such field, would forward it)
    before = len(sink.packets)
    await send(dut, encode_publish("big", bytes(65_533)), CLIENTS[1])
    await send(dut, encode_publish("big", bytes(65_532)), CLIENTS[1])   # exactly 65,535
    await idle(dut)
    assert dut.dropped_limit.value.integer == 1
    assert [len(p) for _, p in sink.packets[before:]] == [1 + 3 + 65_537] * 3


@cocotb.test()
async def the_rewriter_issues_the_topic_then_each_prefix_with_hash(dut):
    await reset(dut)
    Sink(dut)
    beats = []

    async def monitor() -> None:
        while True:
            await ReadOnly()
            if dut.broker.parser.d_tvalid.value and dut.broker.parser.d_tready.value:
                beats.append(dut.broker.parser.d_tdata.value.integer)
            await RisingEdge(dut.clk)

    cocotb.start_soon(monitor())
    await send(dut, encode_publish("topic1/topic2/humid", b"21.5"), CLIENTS[0])
    await send(dut, bytes([0x30, 5, 0, 3]) + b"a/#", CLIENTS[0])            # malformed
    await idle(dut)
    names = ["topic1/topic2/humid", "topic1/topic2/#", "topic1/#"]
    # one beat per name, each {header, name} (mqtt_defs.vh)
    assert len(beats) == len(names)
    for beat, name in zip(beats, names, strict=True):
        header = beat >> 81
        assert header >> 104 == 2                              # OP_PUBLISH
        assert header & 0xFFFF == len("topic1/topic2/humid")   # topic length
        raw = name.encode()
        assert (beat >> 49) & 0xFFFFFFFF == zlib.crc32(raw, SEEDS[0])
        assert (beat >> 17) & 0xFFFFFFFF == zlib.crc32(raw, SEEDS[1])
        assert (beat >> 1) & 0xFFFF == len(raw)
