"""A message mix end to end: ``mqttbed run`` with two streams, real Mosquitto, real agents,
real Spark; the results break delivery and latency down per stream, exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from mqttbed.analytics.results_files import read_stats_parquet
from tests.test_spine_end_to_end import assert_nothing_left, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.timeout(240)]

SUBSCRIBERS = 3
SMALL = {"name": "small", "topic": "mix/small", "payload_bytes": 100, "rate_hz": 50,
         "messages": 100, "warmup_messages": 10}
LARGE = {"name": "large", "topic": "mix/large", "payload_bytes": 65_536, "period_s": 0.2,
         "publishers": 2, "messages": 10, "warmup_messages": 2, "qos": 1}
SPEC = {
    "name": "two-streams",
    "broker": {"backend": "mosquitto"},
    "workload": {"subscribers": SUBSCRIBERS, "streams": [SMALL, LARGE]},
    "agents": {"count": 2},
    "repetitions": 1,
}


def test_a_two_stream_mix_is_measured_and_reported_per_stream(tmp_path):
    data_dir = tmp_path / "data"
    done, stats_path = run_cli(SPEC, tmp_path)
    stats = json.loads(stats_path.read_text())

    # the whole run: both streams' measured messages, every one to every subscriber
    (point,) = stats["points"]
    sent = {"small": 1 * (100 - 10), "large": 2 * (10 - 2)}
    assert point["messages_sent"] == sum(sent.values())
    assert point["deliveries_expected"] == SUBSCRIBERS * sum(sent.values())
    assert point["lost"] == 0 and point["duplicates"] == 0

    # per stream, exact
    for level in (point, stats["runs"][0]):
        assert list(level["streams"]) == ["small", "large"]
        for name, stream in level["streams"].items():
            assert stream["messages_sent"] == sent[name]
            assert stream["deliveries_expected"] == SUBSCRIBERS * sent[name]
            assert stream["deliveries_received"] == SUBSCRIBERS * sent[name]
            assert stream["lost"] == stream["duplicates"] == stream["deliveries_unexpected"] == 0
            assert stream["latency_us"]["count"] == SUBSCRIBERS * sent[name]
    small, large = point["streams"]["small"], point["streams"]["large"]
    assert (small["topic"], small["payload_bytes"]) == ("mix/small", 100)
    assert (large["topic"], large["payload_bytes"]) == ("mix/large", 65_536)
    for stream in (small, large):
        latency = stream["latency_us"]
        assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    # 64 KiB takes longer than 100 B through the broker and two loopback hops
    assert large["latency_us"]["p50"] > small["latency_us"]["p50"]
    cdf = stats["series"]["stream_latency_cdf_us"]["0"]
    assert set(cdf) == {"small", "large"} and all(len(q) == 101 for q in cdf.values())

    # the CLI prints a row per stream; stats.parquet holds them as rows of their own
    assert "per stream" in done.stdout
    assert sum(line.split("│")[2].strip() in ("small", "large")
               for line in done.stdout.splitlines() if line.count("│") > 3) == 2
    rows = read_stats_parquet(stats_path.parent / "stats.parquet")
    streams = {r["stream"]: r for r in rows if r["level"] == "point_stream"}
    assert streams["large"]["deliveries_received"] == SUBSCRIBERS * sent["large"]
    assert streams["large"]["payload_bytes"] == 65_536

    # the events: each publisher's payload size and topic, each subscriber on both topics
    campaign_dir = data_dir / "events" / f"campaign_id={stats['campaign']['id']}"
    table = ds.dataset(campaign_dir, format="parquet", partitioning="hive").to_table()
    events = table.to_pylist()
    sizes = {(r["publisher"], r["topic"], r["payload_bytes"]) for r in events
             if r["kind"] == "delivery"}
    assert sizes == {("pub-0", "mix/small", 100), ("pub-1", "mix/large", 65_536),
                     ("pub-2", "mix/large", 65_536)}
    subscriptions = sorted((r["receiver"], r["topic"]) for r in events
                           if r["kind"] == "subscribe")
    assert subscriptions == sorted((f"sub-{j}", t) for j in range(SUBSCRIBERS)
                                   for t in ("mix/small", "mix/large"))
    warmup = {(r["publisher"], r["seq"]) for r in events if r["warmup"]}
    assert warmup == {("pub-0", k) for k in range(10)} | {
        (p, k) for p in ("pub-1", "pub-2") for k in range(2)}

    # the report: a table row and a CDF per stream
    report = tmp_path / "report.html"
    cli = Path(sys.executable).with_name("mqttbed")
    made = subprocess.run([str(cli), "report", "latest", "--data-dir", str(data_dir),
                           "--out", str(report)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-3000:]
    html = report.read_text()
    assert 'id="streams"' in html and html.count("<td class=\"l\">mix/") == 2
    assert "plot-stream-latency-cdf" in html and "small, 100 B" in html

    assert_nothing_left(done, tmp_path)
