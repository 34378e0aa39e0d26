"""An mqtt-sn campaign from the CLI: real gateway, real agents, real Spark, the packets section."""

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
    "name": "mqtt-sn-smoke",
    "broker": {"backend": "mqtt-sn", "predefined_topics": {1: "unused/by/agents"}},
    "workload": {"publishers": 1, "subscribers": 3, "topic": "sn/sync", "payload_bytes": 100,
                 "rate_hz": 500, "messages": 200, "qos": 0, "warmup_messages": 10},
    "repetitions": 1,
    "agents": {"count": 2},
    "timing": {"heartbeat_timeout_s": 10},
}


@pytest.mark.system
@pytest.mark.parallel
@pytest.mark.timeout(300)
def test_mqttbed_run_on_mqtt_sn_delivers_everything_and_reports_the_gateways_packets(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    cli = Path(sys.executable).with_name("mqttbed")
    done = subprocess.run([str(cli), "run", str(spec_path), "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=280,
                          env={**os.environ, "COLUMNS": "200",
                               "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    stats_line = next(line for line in done.stdout.splitlines() if line.startswith("stats:"))
    stats_path = Path(stats_line.split(":", 1)[1].strip())
    stats = json.loads(stats_path.read_text())
    (point,) = stats["points"]
    assert point["backend"] == "mqtt-sn"
    assert point["messages_sent"] == 190 and point["deliveries_received"] == 3 * 190
    assert point["lost"] == 0 and point["duplicates"] == 0
    assert 0 < point["latency_us"]["p50"] <= point["latency_us"]["p99"]
    packets = point["sections"]["packets"]
    assert packets["broker_publish_received"] == 200
    assert packets["broker_publish_sent"] == 3 * 200
    assert packets["broker_dropped"] == 0
    # 4 CONNECT, 1 REGISTER, 3 SUBSCRIBE, 4 DISCONNECT around the PUBLISHes, at least
    assert packets["broker_received"] >= 200 + 12
    assert packets["broker_sent"] >= 600 + 12
    (run,) = stats["runs"]
    assert run["sections"]["packets"] == packets
    # both agents ran their MQTT-SN clients on the native engine, and it dropped nothing
    (run_record,) = stats_path.parent.glob("runs/*/run.json")
    generators = json.loads(run_record.read_text())["metadata"]["generators"].values()
    assert [g["mqtt_client"] for g in generators] == ["native", "native"]
    assert [g["datagrams_dropped"] for g in generators] == [0, 0]


def test_a_bad_mqtt_sn_option_names_the_field_and_the_value():
    with pytest.raises(SpecError, match=r"^broker.stats_interval_s: bad value -1: "):
        parse_spec({**SPEC, "broker": {"backend": "mqtt-sn", "stats_interval_s": -1}})
    with pytest.raises(SpecError, match=r"^broker.predefined_topics: bad value \{0: 'a'\}: "
                                        r"pre-defined topic 0='a': the id must be in 1..65534"):
        parse_spec({**SPEC, "broker": {"backend": "mqtt-sn", "predefined_topics": {0: "a"}}})
