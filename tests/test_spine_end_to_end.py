"""The spine end to end: ``mqttbed run`` on a two-point sweep, real Mosquitto, real Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml

from tests.conftest import processes_tagged, run_tagged

pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.parallel,
              pytest.mark.timeout(240)]

SPEC = {
    "name": "two-points",
    "broker": {"backend": "mosquitto"},
    "workload": {"publishers": 1, "subscribers": 2, "topic": "e2e/sync", "payload_bytes": 64,
                 "rate_hz": 200, "messages": 100, "qos": 0, "warmup_messages": 10},
    "sweep": {"workload.subscribers": [2, 5]},
    "repetitions": 1,
}


def run_cli(spec: dict, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Run ``mqttbed run`` on ``spec`` into ``tmp_path/data``; return it and its stats.json.

    Everything the run starts carries ``MQTTBED_TEST_TAG=<tmp_path>`` in its environment
    (:func:`tests.conftest.run_tagged`); ``done.seen`` holds their command lines."""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    cli = Path(sys.executable).with_name("mqttbed")
    done, seen = run_tagged([str(cli), "run", str(spec_path), "--data-dir",
                             str(tmp_path / "data")], str(tmp_path), env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-3000:]
    done.seen = seen
    stats_line = next(line for line in done.stdout.splitlines() if line.startswith("stats:"))
    return done, Path(stats_line.split(":", 1)[1].strip())


def assert_nothing_left(done: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """The run's broker and agents were seen by their tag while it ran, and none is left."""
    assert any("mosquitto" in line for line in done.seen), done.seen
    assert any("mqttbed.agents" in line for line in done.seen), done.seen
    assert processes_tagged(str(tmp_path)) == set()


def test_mqttbed_run_measures_a_two_point_sweep(tmp_path):
    data_dir = tmp_path / "data"
    done, stats_path = run_cli(SPEC, tmp_path)
    # the statistics are computed before the campaign is done, as under `mqttbed serve`
    assert "runs ended; computing statistics with Spark" in done.stderr

    # one table row per sweep point, then the paths
    rows = [line for line in done.stdout.splitlines() if "workload.subscribers=" in line]
    assert len(rows) == 2 and "mosquitto" in rows[0]
    stats = json.loads(stats_path.read_text())
    assert (stats_path.parent / "stats.parquet").exists()

    assert stats["campaign"]["name"] == "two-points"
    assert stats["campaign"]["spec"]["sweep"] == {"workload.subscribers": [2, 5]}
    points = {p["params"]["workload.subscribers"]: p for p in stats["points"]}
    assert set(points) == {2, 5}
    for subscribers, point in points.items():
        assert point["backend"] == "mosquitto" and point["runs"] == 1
        assert point["messages_sent"] == 90  # warm-up excluded
        assert point["deliveries_expected"] == 90 * subscribers
        assert point["deliveries_received"] + point["lost"] == point["deliveries_expected"]
        assert point["lost"] == 0 and point["duplicates"] == 0
        latency = point["latency_us"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
        # Two or more subscribers never receive at the same nanosecond; and a message's
        # spread is at most its last receiver's latency.
        spread = point["sync_spread_us"]
        assert 0 < spread["p50"] <= spread["p99"] <= latency["max"]
        assert point["throughput_msgs_per_s"] > 0
        assert point["broker"]["rss_bytes_max"] > 0

    # the dataset holds every publish, delivery and subscription, partitioned by run
    campaign_dir = data_dir / "events" / f"campaign_id={stats['campaign']['id']}"
    runs = sorted(p.name for p in campaign_dir.iterdir())
    assert len(runs) == 2 and all(r.startswith("run_id=") for r in runs)
    table = ds.dataset(campaign_dir, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 2 * 100 + 100 * (2 + 5) + (2 + 5)

    # subscriptions happen in rank order across both agents: sub-0 first, the last one last
    for run in runs:
        rows = ds.dataset(campaign_dir / run, format="parquet").to_table().to_pylist()
        subscribed = [r["receiver"] for r in sorted(
            (r for r in rows if r["kind"] == "subscribe"), key=lambda r: r["t_recv_ns"])]
        assert subscribed == [f"sub-{i}" for i in range(len(subscribed))]
        assert len({r["agent_id"] for r in rows if r["kind"] == "subscribe"}) >= 2

    # nothing it started is left running
    assert_nothing_left(done, tmp_path)
