"""An adaptive-broker campaign from the CLI: real broker, real agents, real Spark, its section."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mqttbed.campaigns.spec import parse_spec
from mqttbed.core.errors import SpecError

pytestmark = pytest.mark.integration

SPEC = {
    "name": "adaptive-smoke",
    "broker": {"backend": "adaptive", "policy": "historic", "rtt_query_period_s": 0.2,
               "rtt_query_bytes": 1000, "lazy_allocation": False},
    "workload": {"publishers": 1, "subscribers": 2, "topic": "edge/video", "qos": 1,
                 "payload_bytes": 20_000, "rate_hz": 50, "messages": 100,
                 "warmup_messages": 10},
    "repetitions": 1,
    "agents": {"count": 1},
    "timing": {"heartbeat_timeout_s": 10},
}


@pytest.mark.timeout(300)
def test_mqttbed_run_on_the_adaptive_broker_delivers_everything_and_reports_withholding(
        tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    cli = Path(sys.executable).with_name("mqttbed")
    done = subprocess.run([str(cli), "run", str(spec_path), "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=280,
                          env={**os.environ, "COLUMNS": "200",
                               "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    stats_line = next(line for line in done.stdout.splitlines() if line.startswith("stats:"))
    stats = json.loads(Path(stats_line.split(":", 1)[1].strip()).read_text())
    (point,) = stats["points"]
    assert point["backend"] == "adaptive"
    # the agents ignore the RTT queries they get: no extra deliveries, nothing lost
    assert point["messages_sent"] == 90 and point["deliveries_received"] == 2 * 90
    assert point["lost"] == 0 and point["duplicates"] == 0
    section = point["sections"]["withholding"]
    assert section["large_deliveries"] == 2 * 100 and section["small_deliveries"] == 0
    # paho acknowledges every query; on loopback nothing looks congested
    assert section["rtt_queries_answered"] > 0 and section["rtt_ms"]["count"] > 0
    assert section["large_sent_immediately"] == 2 * 100 and section["withheld_s"]["count"] == 0
    assert section["payload_copies_made"] == 2 * 100   # eager: one copy per subscriber
    assert section["held_payload_bytes_peak"]["count"] == 1
    assert section["held_payload_bytes_peak"]["max"] >= 20_000
    assert sorted(section["subscribers"]) == ["sub-0", "sub-1"]   # per client id
    assert section["subscribers"]["sub-1"]["large_deliveries"] == 100
    assert section["subscribers"]["sub-1"]["rtt_ms"]["count"] > 0
    (run,) = stats["runs"]
    assert run["sections"]["withholding"] == section


def test_a_bad_adaptive_option_names_the_field_and_the_value():
    with pytest.raises(SpecError, match=r"^broker.policy: bad value 'fifo': "):
        parse_spec({**SPEC, "broker": {"backend": "adaptive", "policy": "fifo"}})
    with pytest.raises(SpecError, match=r"^broker.threshold_l_s: bad value 0: "):
        parse_spec({**SPEC, "broker": {"backend": "adaptive", "threshold_l_s": 0}})
    with pytest.raises(SpecError, match=r"^broker.starvation: unknown key"):
        parse_spec({**SPEC, "broker": {"backend": "adaptive", "starvation": 20}})
