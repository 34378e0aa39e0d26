"""Retained state end to end: ``mqttbed run`` with workload.retained on Mosquitto and on
amqtt (the command backend's preset), real agents, real Spark; every late subscriber holds
exactly every topic's latest value, the events carry the RETAIN flag, and the report
draws the section."""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest

from mqttbed.analytics.results_files import read_stats
from mqttbed.api.report import build_figures
from mqttbed.controller.analysis import results_type
from mqttbed.core.backends import unavailable_reason
from tests.test_spine_end_to_end import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.parallel,
              pytest.mark.timeout(240)]

TOPICS = 200
UPDATES = 2
SUBSCRIBERS = 3
SPEC = {
    "name": "retained-e2e",
    "broker": {"backend": "mosquitto"},
    "workload": {"publishers": 2, "subscribers": SUBSCRIBERS, "topic": "e2e/retained",
                 "rate_hz": 2000, "qos": 1,
                 "retained": {"topics": TOPICS, "updates": UPDATES, "subscribe_after_s": 0.4}},
    "scenarios": [{"name": "mosquitto", "broker.backend": "mosquitto"},
                  {"name": "amqtt", "broker.backend": "amqtt"}],
    "agents": {"count": 1},
    "repetitions": 1,
}


def test_late_subscribers_hold_the_retained_state_on_mosquitto_and_amqtt(tmp_path):
    if (reason := unavailable_reason("amqtt")) is not None:
        pytest.skip(f"amqtt cannot run here: {reason}")
    _, stats_path = run_cli(SPEC, tmp_path)
    stats = json.loads(stats_path.read_text())
    assert {p["backend"] for p in stats["points"]} == {"mosquitto", "amqtt"}
    for point in stats["points"]:
        retained = point["retained"]
        assert (retained["topics"], retained["values_set"], retained["subscribers"]) == (
            TOPICS, TOPICS * UPDATES, SUBSCRIBERS), point["backend"]
        assert retained["delivered_latest"] == retained["expected"] == TOPICS * SUBSCRIBERS
        assert (retained["missing"], retained["stale"], retained["duplicates"],
                retained["without_retain_flag"], retained["live"]) == (0, 0, 0, 0, 0), \
            point["backend"]
        assert retained["subscribers_holding_all"] == SUBSCRIBERS
        hold = retained["hold_from_subscribe_us"]
        assert hold["count"] == SUBSCRIBERS and 0 < hold["p50"] <= hold["max"]
        assert retained["subscribe_after_set_us"]["p50"] >= 0.4e6
        # retained values have no latency: the delivery figures leave them out
        assert point["latency_us"]["count"] == 0 and point["lost"] == 0
        # Mosquitto's own resource samples give its memory with and without the state
        if point["backend"] == "mosquitto":
            assert retained["rss_before_bytes"] and retained["rss_with_state_bytes"]

    campaign = stats["campaign"]["id"]
    events = ds.dataset(tmp_path / "data" / "events" / f"campaign_id={campaign}",
                        format="parquet", partitioning="hive").to_table().to_pylist()
    deliveries = [e for e in events if e["kind"] == "delivery"]
    assert len(deliveries) == 2 * TOPICS * SUBSCRIBERS
    assert all(e["retain"] for e in deliveries)
    assert all(e["retain"] for e in events if e["kind"] == "publish")
    # a delivery's topic is the publish's: each of the 200 topics, at every subscriber
    assert len({(e["run_id"], e["receiver"], e["topic"]) for e in deliveries}) == len(deliveries)

    # the report draws the section: holding time per point, its counts in the title
    document = read_stats(stats_path, results_type())
    figures = build_figures(document, SPEC)
    hold = figures["plot-retained-hold"]
    assert f"{TOPICS * SUBSCRIBERS} of {TOPICS * SUBSCRIBERS} latest values held, 0 stale, " \
        "0 missing, 0 duplicated, 0 without RETAIN, 0 live" in hold["layout"]["title"]["text"]
    assert all(len(bars["y"]) == 2 and None not in bars["y"] for bars in hold["data"])
    assert "plot-retained-topics" in figures
