"""campaigns/fpga-vs-software.yaml from the CLI: Mosquitto, the FPGA model and the FPGA
broker's RTL in Verilator, at one subscriber count and one repetition.

The run takes a minute or more with its Spark session, over the RTL tests' share of
`make test`: it runs in `make rtl-test` (MQTTBED_RTL_FULL=1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mqttbed.api.report import render_report
from mqttbed.campaigns.spec import (
    SpecError,
    builtin_spec_path,
    load_spec,
    parse_spec,
    plan_runs,
)
from mqttbed.controller.controller import create_controller
from mqttbed.core.settings import Settings
from tests.conftest import child_processes

pytestmark = [pytest.mark.integration, pytest.mark.rtl, pytest.mark.timeout(400)]


def test_a_bad_engine_names_the_field_and_the_value():
    base = {"name": "x", "workload": {"topic": "t"}}
    with pytest.raises(SpecError, match=r"^broker.engine: bad value 'vhdl': "):
        parse_spec({**base, "broker": {"backend": "fpga", "engine": "vhdl"}})


def test_the_quick_rtl_campaign_pairs_mosquitto_with_the_rtl():
    runs = plan_runs(load_spec(builtin_spec_path("fpga-rtl")))
    assert [(r.point.params["scenario"], r.point.spec.broker.model_dump().get("engine"))
            for r in runs] == [("mosquitto", None), ("fpga-rtl", "rtl")]


@pytest.mark.system
@pytest.mark.skipif(os.environ.get("MQTTBED_RTL_FULL") != "1",
                    reason="three runs and a Spark session: make rtl-test")
def test_the_papers_comparison_runs_against_the_rtl_and_reports_its_cycle_latency(tmp_path):
    spec = yaml.safe_load(builtin_spec_path("fpga-vs-software").read_text())
    spec.update(sweep={"workload.subscribers": [4]}, repetitions=1)
    path = tmp_path / "fpga-vs-software-4.yaml"
    path.write_text(yaml.safe_dump(spec))
    cli = Path(sys.executable).with_name("mqttbed")
    data = tmp_path / "d"
    done = subprocess.run([str(cli), "run", str(path), "--data-dir", str(data)],
                          capture_output=True, text=True, timeout=380,
                          env={**os.environ, "COLUMNS": "200",
                               "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    stats_line = next(line for line in done.stdout.splitlines() if line.startswith("stats:"))
    stats = json.loads(Path(stats_line.split(":", 1)[1].strip()).read_text())
    points = {p["params"]["scenario"]: p for p in stats["points"]}
    assert set(points) == {"mosquitto", "fpga-model", "fpga-rtl"}
    for point in points.values():
        # 100 PUBLISHes, the first 20 warm-up (not counted in the point)
        assert point["messages_sent"] == 80 and point["deliveries_received"] == 4 * 80
        assert point["lost"] == 0 and point["duplicates"] == 0
    section = points["fpga-rtl"]["sections"]["hardware_latency"]
    assert section["publish_packets"] == 100 and section["copies_per_publish"] == 4
    # The design is clocked, so every PUBLISH of the same size takes the same cycles. The
    # 76-byte PUBLISH of `sync/pmu` is one 128-byte beat and takes the parser's fast path;
    # to its first copy, 8 cycles at 100 MHz:
    #   1  the beat in: written to the message queue, found eligible, its topic captured
    #   2  the fast path's two CRC-32 stages (16 topic bytes each)
    #   1  the descriptor beat {header, `sync/pmu`}, taken by the lookup engine, which
    #      issues the Topic Table read and subscriber ID 1's read at once
    #   1  both windows on the read buses: the count and ID 1's destination, the copy's job
    #   1  the job written into the job FIFO
    #   1  the packet generator takes it and builds the copy from the kept entry
    #   1  the copy's beat on m_axis (counted in the cycle it is taken)
    first, last = section["rtl_first_copy_ns"], section["rtl_last_copy_ns"]
    assert first["count"] == 100 and first["std"] == 0
    assert first["p50"] == 80
    # each further copy: one cycle (the engine scans one ID a cycle; the generator keeps
    # the message's one entry and puts a copy out in the cycle it takes its job), for every
    # PUBLISH alike (the job FIFO's count once wrapped at 32 and stalled one in 16 a cycle)
    assert last["p50"] - first["p50"] == 3 * 10 and last["std"] == 0
    assert section["emulator_first_copy_ns"]["count"] == 100
    assert section["modelled_first_copy_ns"]["count"] == 0
    # the model's section: its modelled pipeline, no cycles
    model = points["fpga-model"]["sections"]["hardware_latency"]
    assert model["modelled_first_copy_ns"]["p50"] == pytest.approx(799.2)
    assert model["rtl_first_copy_ns"]["count"] == 0
    assert child_processes("mqttbed-fpga-rtl") == []

    # the report: the RTL's cycle latency in the FPGA section's table, Mosquitto's
    # measured latency in the summary, each in its point's row
    with create_controller(Settings(data_dir=data)) as controller:
        report = render_report(controller, stats["campaign"]["id"], standalone=True)
    rtl_row = table_row(report, "section-hardware_latency", "scenario=fpga-rtl")
    assert rtl_row["rtl_first_copy_ns p50"] == f"{first['p50']:.1f}"
    mosquitto_row = table_row(report, "summary", "scenario=mosquitto")
    assert mosquitto_row["lat p50 µs"] == f"{points['mosquitto']['latency_us']['p50']:.1f}"


def table_row(report: str, table_id: str, label_part: str) -> dict[str, str]:
    """The row of an HTML table of the report whose label contains ``label_part``, as
    {column header: cell text}."""
    table = report[report.index(f'<table id="{table_id}"'):]
    table = table[:table.index("</table>")]
    headers = [re.sub(r"<[^>]+>", "", h).strip()
               for h in re.findall(r"<th[^>]*>(.*?)</th>", table, re.S)]
    for row in re.findall(r"<tr>(.*?)</tr>", table, re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip()
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if cells and label_part in cells[0]:
            return dict(zip(headers, cells, strict=True))
    raise AssertionError(f"no row with {label_part!r} in table {table_id}")
