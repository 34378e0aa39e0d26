"""cocotb tests of the message queue alone (toplevel cocotb_top, its qt_* ports: a
msg_queue of depth 1024 beside the broker, an entry one 1024-bit beat)."""

from __future__ import annotations

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge


class Ports:
    """The queue's ports on the toplevel (qt_<name>)."""

    def __init__(self, dut):
        self._dut = dut
        self.clk = dut.clk
        self.rst = dut.rst

    def __getattr__(self, name):
        return getattr(self._dut, f"qt_{name}")


async def reset(dut) -> None:
    cocotb.start_soon(Clock(dut.clk, 10, units="ns").start())
    dut.s_axis_tvalid.value = 0
    for name in ("wr_en", "commit", "discard", "pop", "pop_len", "rd_offset", "wr_data"):
        getattr(dut, f"qt_{name}").value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


async def write(dut, entries: list[int], end: str | None = None) -> None:
    for i, entry in enumerate(entries):
        dut.wr_en.value = 1
        dut.wr_data.value = entry
        last = i == len(entries) - 1
        dut.commit.value = int(last and end == "commit")
        await RisingEdge(dut.clk)
    dut.wr_en.value = 0
    dut.commit.value = 0
    if end == "discard":
        dut.discard.value = 1
        await RisingEdge(dut.clk)
        dut.discard.value = 0


async def read(dut, offset: int) -> int:
    dut.rd_offset.value = offset
    await RisingEdge(dut.clk)
    await ReadOnly()
    value = dut.rd_data.value.integer
    await RisingEdge(dut.clk)
    return value


def beat(i: int) -> int:
    """A 1024-bit entry told apart by i in its first and last bytes."""
    return (i % 251 << 1016) | (1 << 512) | i


@cocotb.test()
async def the_queue_is_full_at_1024_entries_and_ignores_further_writes(top):
    await reset(top)
    dut = Ports(top)
    await write(dut, [beat(i) for i in range(1024)], end="commit")
    await ReadOnly()
    assert dut.full.value == 1 and dut.others.value == 1
    await RisingEdge(dut.clk)
    await write(dut, [beat(5000)])                 # refused: full
    assert [await read(dut, i) for i in (0, 1, 255, 1023)] == [beat(i) for i in
                                                                (0, 1, 255, 1023)]
    dut.pop.value = 1
    dut.pop_len.value = 1000
    await RisingEdge(dut.clk)
    dut.pop.value = 0
    await ReadOnly()
    assert dut.full.value == 0
    await RisingEdge(dut.clk)
    assert await read(dut, 0) == beat(1000)
    assert await read(dut, 24) == beat(0)          # the refused write left no entry


@cocotb.test()
async def a_discarded_packet_leaves_no_entries_behind(top):
    await reset(top)
    dut = Ports(top)
    await write(dut, [beat(1), beat(2)], end="commit")
    await write(dut, [beat(66), beat(67), beat(68)], end="discard")
    await write(dut, [beat(3)], end="commit")
    assert [await read(dut, i) for i in range(3)] == [beat(1), beat(2), beat(3)]
    await ReadOnly()
    assert dut.others.value == 1
