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
    # The design is clocked, so every PUBLISH of the same size takes the same cycles:
    # one byte per cycle in (76 bytes), lookup, one byte per cycle out per copy.
    first, last = section["rtl_first_copy_ns"], section["rtl_last_copy_ns"]
    assert first["count"] == 100 and first["std"] == 0 and last["std"] == 0
    assert 1_520 < first["p50"] < 2_000
    # each further copy: 76 bytes out, one byte per cycle, and a cycle to take its job
    assert last["p50"] - first["p50"] == 3 * 770
    assert section["emulator_first_copy_ns"]["count"] == 100
    assert section["modelled_first_copy_ns"]["count"] == 0
    assert child_processes("mqttbed-fpga-rtl") == []
