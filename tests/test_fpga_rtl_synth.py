"""yosys synthesis of the RTL broker for Xilinx UltraScale+ (synth_xilinx -family xcup).

Minutes of yosys on a small machine: run by ``make rtl-test`` (MQTTBED_RTL_FULL=1), not
by ``make test``. The counts are yosys 0.23's and exact for these sources.
"""

from __future__ import annotations

import os

import pytest

from mqttbed.brokers.fpga.rtl.build import ensure_synth, parse_stat

pytestmark = [
    pytest.mark.integration, pytest.mark.system, pytest.mark.rtl, pytest.mark.timeout(1200),
    pytest.mark.skipif(os.environ.get("MQTTBED_RTL_FULL") != "1",
                       reason="yosys synthesis takes minutes: make rtl-test")]


def test_the_design_synthesizes_for_ultrascale_plus_without_latches():
    stat = ensure_synth()
    log = (stat.parent / "synth.log").read_text()
    assert "Latch inferred" not in log and "ERROR" not in log
    modules = parse_stat(stat.read_text())
    total = modules["total"]
    assert total["latch"] == 0
    # the two 65,536-word tables (93- and 129-bit words) fill 416 RAMB36, the message
    # queue's 1,024 entries of 1,024 bits 28.5 (1 Mbit in 36 Kb blocks); nothing else is
    # block RAM
    assert modules["hash_table"]["bram36"] == 416
    assert modules["msg_queue"]["bram36"] == 28.5
    assert total["bram36"] == 444.5
    assert modules["mqtt_parser"]["bram36"] == 0 and modules["packet_gen"]["bram36"] == 0
    # the 1024-bit datapath: the parser (16 lanes of byte checks, the names into their
    # slots) and the generator's beat cutting are most of the LUTs, the beat registers of
    # the FFs
    assert 5_000 < total["ff"] < 10_000
    assert 50_000 < total["lut"] < 90_000
    assert 5_000 < modules["mqtt_parser_lane"]["lut"] * 16 < 30_000
