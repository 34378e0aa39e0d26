"""campaigns/fpga-rtl.yaml from the CLI: Mosquitto against the RTL broker in Verilator.

The run takes a minute or more with its Spark session, over the RTL tests' share of
`make test`: it runs in `make rtl-test` (MQTTBED_RTL_FULL=1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mqttbed.campaigns.spec import SpecError, builtin_spec_path, parse_spec
from tests.conftest import child_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def test_a_bad_engine_names_the_field_and_the_value():
    base = {"name": "x", "workload": {"topic": "t"}}
    with pytest.raises(SpecError, match=r"^broker.engine: bad value 'vhdl': "):
        parse_spec({**base, "broker": {"backend": "fpga", "engine": "vhdl"}})


@pytest.mark.skipif(os.environ.get("MQTTBED_RTL_FULL") != "1",
                    reason="two runs and a Spark session: make rtl-test")
def test_mqttbed_run_against_the_rtl_reports_cycle_latency_beside_mosquitto(tmp_path):
    cli = Path(sys.executable).with_name("mqttbed")
    done = subprocess.run([str(cli), "run", str(builtin_spec_path("fpga-rtl")),
                           "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=380,
                          env={**os.environ, "COLUMNS": "200",
                               "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    stats_line = next(line for line in done.stdout.splitlines() if line.startswith("stats:"))
    stats = json.loads(Path(stats_line.split(":", 1)[1].strip()).read_text())
    points = {p["backend"]: p for p in stats["points"]}
    assert set(points) == {"mosquitto", "fpga"}
    for point in points.values():
        # 100 PUBLISHes, the first 10 warm-up (not counted in the point)
        assert point["messages_sent"] == 90 and point["deliveries_received"] == 4 * 90
        assert point["lost"] == 0 and point["duplicates"] == 0
    section = points["fpga"]["sections"]["hardware_latency"]
    assert section["publish_packets"] == 100 and section["copies_per_publish"] == 4
    # The design is clocked, so every PUBLISH of the same size takes the same cycles. The
    # 76-byte PUBLISH is one 128-byte beat; to its first copy, 15 cycles at 100 MHz:
    #   5  the beat in: written to the message queue, its 76 bytes checked 16 a cycle
    #   1  the parser registers the descriptor's header beat
    #   5  lookup engine: takes the header, takes the topic's name and reads the Topic
    #      Table, reads subscriber ID 1's window, finds the copy, registers its job
    #   4  packet generator: takes the job from the job FIFO, reads the queue entry,
    #      builds the beat, the beat on m_axis (counted in the cycle it is taken)
    first, last = section["rtl_first_copy_ns"], section["rtl_last_copy_ns"]
    assert first["count"] == 100 and first["std"] == 0
    assert first["p50"] == 150
    # each further copy: one cycle (the engine scans one ID a cycle; the generator keeps
    # the message's one entry and puts a copy out in the cycle it takes its job). About
    # one PUBLISH in 16 takes a cycle more to its last copy (seen here every 16th PUBLISH
    # in a row; the cause is not found yet)
    assert last["p50"] - first["p50"] == 3 * 10
    assert last["max"] <= first["p50"] + 4 * 10
    assert section["emulator_first_copy_ns"]["count"] == 100
    assert section["modelled_first_copy_ns"]["count"] == 0
    assert child_processes("mqttbed-fpga-rtl") == []
