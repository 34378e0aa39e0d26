"""An adaptive-broker campaign from the CLI: real broker, real agents, real Spark, its section.

A two-stream message mix (small and large, as in the cloud-edge paper's Table 3) through
the adaptive broker: the agents get the RTT queries and ignore them, every message is
delivered, and the broker's own figures split by size as the streams do.
"""

from __future__ import annotations

import json

import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.core.errors import SpecError
from tests.test_spine_end_to_end import run_cli

pytestmark = pytest.mark.integration

SUBSCRIBERS = 2
SMALL = {"name": "small", "topic": "Msg/Small", "payload_bytes": 100, "rate_hz": 25,
         "messages": 50, "warmup_messages": 5, "qos": 1}
LARGE = {"name": "large", "topic": "Msg/Large", "payload_bytes": 20_000, "rate_hz": 25,
         "messages": 50, "warmup_messages": 5, "qos": 1}
SPEC = {
    "name": "adaptive-smoke",
    "broker": {"backend": "adaptive", "policy": "historic", "rtt_query_period_s": 0.2,
               "rtt_query_bytes": 1000, "lazy_allocation": False},
    "workload": {"subscribers": SUBSCRIBERS, "streams": [SMALL, LARGE]},
    "repetitions": 1,
    "agents": {"count": 1},
    "timing": {"heartbeat_timeout_s": 10},
}


@pytest.mark.system
@pytest.mark.timeout(300)
def test_mqttbed_run_on_the_adaptive_broker_delivers_a_mix_and_reports_withholding(tmp_path):
    _, stats_path = run_cli(SPEC, tmp_path)
    stats = json.loads(stats_path.read_text())
    (point,) = stats["points"]
    assert point["backend"] == "adaptive"
    # the agents ignore the RTT queries they get: no extra deliveries, nothing lost
    assert point["messages_sent"] == 2 * 45
    assert point["deliveries_received"] == point["deliveries_expected"] == SUBSCRIBERS * 2 * 45
    assert point["lost"] == point["duplicates"] == point["deliveries_unexpected"] == 0
    section = point["sections"]["withholding"]
    # the broker counts warm-up messages too: 50 per stream and subscriber
    assert section["small_deliveries"] == section["large_deliveries"] == SUBSCRIBERS * 50
    # paho acknowledges every query; on loopback nothing looks congested
    assert section["rtt_queries_answered"] > 0 and section["rtt_ms"]["count"] > 0
    assert section["large_sent_immediately"] == SUBSCRIBERS * 50
    assert section["withheld_s"]["count"] == 0
    assert section["payload_copies_made"] == SUBSCRIBERS * 100   # eager: one per delivery
    assert section["held_payload_bytes_peak"]["count"] == 1
    assert section["held_payload_bytes_peak"]["max"] >= 20_000
    assert sorted(section["subscribers"]) == ["sub-0", "sub-1"]   # per client id
    assert section["subscribers"]["sub-1"]["large_deliveries"] == 50
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
