"""Spark beyond one machine: ``mqttbed analyze`` on a real standalone cluster.

A campaign is measured and analysed with ``local[2]`` (``mqttbed run``); then a master and
a worker are started from the venv's pyspark and ``mqttbed analyze`` recomputes the same
campaign on ``spark://127.0.0.1:PORT``. The results document must be the same: counts
exactly, every percentile and interval exactly (percentiles are exact, the bootstrap is
seeded), means and standard deviations up to the order of floating-point sums. Afterwards
no process of the cluster is left.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.spark_cluster import StandaloneCluster

# a campaign with its own Spark, then a master, a worker and an executor: over a minute
pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.parallel,
              pytest.mark.timeout(420)]

SPEC = {
    "name": "cluster-check",
    "broker": {"backend": "mosquitto"},
    "workload": {"publishers": 1, "subscribers": 2, "topic": "cluster/check",
                 "payload_bytes": 64, "rate_hz": 200, "messages": 150, "qos": 0,
                 "warmup_messages": 10},
    "sweep": {"workload.subscribers": [2, 4]},
    "repetitions": 2,
}
# Figures that must agree to the last bit: order statistics and intervals built from them.
EXACT = {"p50", "p90", "p99", "p999", "max", "p50_ci", "p99_ci"}


def mqttbed(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    cli = Path(sys.executable).with_name("mqttbed")
    done = subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-4000:])
    return done


def differences(local: Any, cluster: Any, path: str = "") -> list[str]:
    """Where the two documents differ beyond what the rules above allow."""
    if isinstance(local, dict) and isinstance(cluster, dict):
        if local.keys() != cluster.keys():
            return [f"{path}: keys {sorted(local.keys() ^ cluster.keys())}"]
        return [d for key in local for d in differences(local[key], cluster[key], f"{path}.{key}")]
    if isinstance(local, list) and isinstance(cluster, list):
        if len(local) != len(cluster):
            return [f"{path}: {len(local)} vs {len(cluster)} items"]
        return [d for i, (a, b) in enumerate(zip(local, cluster, strict=True))
                for d in differences(a, b, f"{path}[{i}]")]
    exact = type(local) is not float or any(part.split("[")[0] in EXACT
                                            for part in path.split("."))
    same = local == cluster if exact else (
        type(cluster) is float and math.isclose(local, cluster, rel_tol=1e-9, abs_tol=1e-9))
    return [] if same else [f"{path}: {local!r} vs {cluster!r}"]


def test_analyze_on_a_standalone_cluster_gives_the_local_results(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    data_dir = tmp_path / "data"
    # The cluster's master and worker start while the campaign is measured: neither needs
    # the other, and what is compared (local vs cluster analysis of the same events) does
    # not depend on how busy the machine was while they were recorded.
    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(StandaloneCluster, tmp_path / "spark", cores=1)
        try:
            mqttbed("run", str(spec_path), "--data-dir", str(data_dir),
                    "--spark-master", "local[2]")
        except BaseException:
            # the run's failure is the one to report; the cluster must not outlive it
            with contextlib.suppress(BaseException):
                starting.result().stop()
            raise
        cluster = starting.result()
    try:
        (stats_path,) = data_dir.glob("campaigns/*/stats.json")
        local = json.loads(stats_path.read_text())
        campaign_id = local["campaign"]["id"]
        assert len(local["points"]) == 2 and all(p["runs"] == 2 for p in local["points"])
        done = mqttbed("analyze", campaign_id, "--data-dir", str(data_dir),
                       "--spark-master", cluster.url)
        applications = cluster.state()
    finally:
        cluster.stop()
    assert cluster.processes() == [], "the cluster left processes behind"

    assert f"stats:   {stats_path}" in done.stdout
    # it ran on the cluster: the master saw the application, the worker ran its executor
    ran = applications.get("completedapps", []) + applications.get("activeapps", [])
    assert [app["name"] for app in ran] == ["mqttbed-analytics"]
    assert list((tmp_path / "spark" / "work").glob("app-*/*/stderr")), "no executor ran"

    remote = json.loads(stats_path.read_text())
    assert remote["generated_at"] != local["generated_at"]  # recomputed, not left alone
    local.pop("generated_at")
    remote.pop("generated_at")
    assert differences(local, remote) == []
    # and the figures are there to compare, not nulls on both sides
    point = remote["points"][0]
    assert point["deliveries_received"] > 0 and point["latency_us"]["p99"] > 0
    assert point["latency_us"]["p50_ci"] is not None
