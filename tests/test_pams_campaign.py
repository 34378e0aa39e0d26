"""The p4 backend end to end: real namespaces, eBPF switch, gateway, agents and Spark.

From the CLI and over the REST API, then a run killed mid-way: nothing of it may stay.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from mqttbed.analytics.queueing import pams_expected_wait_s
from mqttbed.campaigns.spec import builtin_spec_path, load_spec
from mqttbed.network.commands import ip
from mqttbed.network.topology import JOURNAL_DIR, leftovers, reap_stale
from tests.conftest import processes_tagged, run_tagged, wait_until

pytestmark = pytest.mark.integration

SPEC = {
    "name": "pams-smoke",
    "broker": {"backend": "p4"},
    "workload": {"publishers": 1, "subscribers": 3, "topic": "pams/sensor",
                 "payload_bytes": 100, "rate_hz": 1000, "messages": 100, "qos": 0,
                 "warmup_messages": 10},
    "agents": {"count": 4},
    "sweep": {"broker.acceleration": [False, True]},
    "timing": {"heartbeat_timeout_s": 10},
    "repetitions": 1,
}
CLI = Path(sys.executable).with_name("mqttbed")
ENV = {**os.environ, "COLUMNS": "200", "PYSPARK_PYTHON": sys.executable}


def run_prefixes(data_dir: Path) -> list[str]:
    """The topology prefixes the runs under ``data_dir`` used (from their run.json)."""
    return [json.loads(path.read_text())["metadata"]["broker"]["topology_prefix"]
            for path in data_dir.glob("campaigns/*/runs/*/run.json")]


@pytest.mark.system
@pytest.mark.parallel
@pytest.mark.timeout(300)
def test_the_pams_packets_campaign_from_the_cli_accelerates_and_leaves_nothing(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    # what the run starts carries its tag: a gateway of a test on another worker is not
    # this run's leftover
    tag = str(tmp_path)
    done, seen = run_tagged([str(CLI), "run", str(spec_path), "--data-dir", str(tmp_path / "d")],
                            tag, timeout_s=280,
                            env={"COLUMNS": "200", "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    stats_line = next(line for line in done.stdout.splitlines() if line.startswith("stats:"))
    stats = json.loads(Path(stats_line.split(":", 1)[1].strip()).read_text())
    points = {p["params"]["broker.acceleration"]: p for p in stats["points"]}
    for point in points.values():
        assert point["messages_sent"] == 90 and point["deliveries_received"] == 3 * 90
        assert point["lost"] == 0 and point["duplicates"] == 0
    plain, fast = points[False]["sections"]["packets"], points[True]["sections"]["packets"]
    assert plain["broker_publish_received"] == 100 and plain["switch_publish_accelerated"] == 0
    assert fast["broker_publish_received"] < 0.1 * plain["broker_publish_received"]
    assert fast["switch_publish_accelerated"] == 100
    for packets in (plain, fast):
        assert packets["publishers_sent"] >= 100 and packets["subscribers_received"] >= 300
        assert packets["switch_received"] >= packets["publishers_sent"]
    prefixes = run_prefixes(tmp_path / "d")
    assert len(prefixes) == 2 and all(leftovers(prefix) == [] for prefix in prefixes)
    # the tag reached the gateway and the agents (in their namespaces), and none is left
    assert any("mqttbed.brokers.mqttsn" in line for line in seen), seen
    assert any("mqttbed.agents" in line for line in seen), seen
    assert processes_tagged(tag) == set()


@pytest.mark.system
@pytest.mark.parallel
@pytest.mark.timeout(300)
def test_a_pams_point_over_the_rest_api_delivers_everything(tmp_path):
    from tests.conftest import Served

    served = Served(tmp_path / "served")
    spec = {**SPEC, "sweep": {}, "broker": {"backend": "p4", "acceleration": True}}
    with served.server, served.client() as http:
        created = http.post("/api/v1/campaigns", json=spec)
        assert created.status_code == 201, created.text
        campaign_id = created.json()["id"]
        assert http.post(f"/api/v1/campaigns/{campaign_id}/start").status_code == 200
        served.wait_for_status(campaign_id, ("done",), 240)
        (point,) = http.get(f"/api/v1/campaigns/{campaign_id}/stats").json()["points"]
    assert point["deliveries_received"] == point["deliveries_expected"] == 3 * 90
    assert point["sections"]["packets"]["broker_publish_received"] == 0
    assert all(leftovers(prefix) == [] for prefix in run_prefixes(tmp_path / "served"))


def journal_of(pid: int) -> dict | None:
    """The topology journal a process wrote, with its prefix, once it holds an agent host."""
    for path in JOURNAL_DIR.glob("*.json") if JOURNAL_DIR.is_dir() else []:
        try:
            journal = json.loads(path.read_text())
        except ValueError:
            continue  # being replaced
        if journal["pid"] == pid and any(name.endswith("-h2") for _, name in
                                         journal["created"]):
            return {**journal, "prefix": path.stem}
    return None


@pytest.mark.system
@pytest.mark.timeout(120)
def test_a_run_killed_mid_way_is_reaped_with_everything_running_inside(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    long_run = {**SPEC, "sweep": {}, "workload": {**SPEC["workload"], "messages": 60_000}}
    spec_path.write_text(yaml.safe_dump(long_run))
    proc = subprocess.Popen([str(CLI), "run", str(spec_path), "--data-dir",
                             str(tmp_path / "d")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV)
    try:
        deadline = time.monotonic() + 60
        while (journal := journal_of(proc.pid)) is None:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        prefix = journal["prefix"]

        def both_running() -> list[int]:
            """The pids in the gateway's namespace (h0) and an agent's (h1), once both
            have one."""
            per_host = [ip("netns", "pids", f"{prefix}-h{n}").split() for n in (0, 1)]
            return [int(pid) for pids in per_host for pid in pids] if all(per_host) else []

        # agents up: the gateway and an agent run in their namespaces
        inside = wait_until(both_running, 30,
                            f"the gateway and an agent in the namespaces {prefix}-h0, -h1")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert leftovers(prefix) != []
    assert prefix in reap_stale()
    assert leftovers(prefix) == []

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    wait_until(lambda: not any(running(pid) for pid in inside), 5,
               f"the processes that ran in the namespaces ({inside}) to end")


@pytest.mark.parametrize("name", ["pams-packets", "pams-latency"])
def test_pams_campaigns_quote_the_papers_queueing_model(name):
    spec = load_spec(builtin_spec_path(name))
    assert spec.sweep["broker.acceleration"] == [False, True]
    mu = 12207.03125  # reference-figures.yaml pams_p4.queueing_parameters
    expected = {f"paper model E[W], omega {omega}": round(
        pams_expected_wait_s(1, mu, omega, 1) * 1e6, 2) for omega in (0, 1)}
    assert {r.label: r.y_us for r in spec.report.reference} == expected
