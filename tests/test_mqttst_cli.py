"""``mqttbed broker run mqtt-st`` by hand, and what a BPDU PINGREQ costs on the wire."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from mqttbed.brokers.mqttst.cluster import free_port_range
from mqttbed.brokers.mqttst.signalling import measure_frame_sizes, pingreq_sizes
from tests.conftest import processes_mentioning
from tests.mqttst_support import Subscribers, publish

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None  # started with stdout=PIPE
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().strip() if ready else ""


def test_broker_run_mqtt_st_converges_serves_and_leaves_nothing_on_sigterm(tmp_path):
    port = free_port_range(3)
    workdir = tmp_path / "by-hand"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqttbed.controller.cli", "broker", "run", "mqtt-st",
         "--brokers", "3", "--port", str(port), "--topology", "chain", "--keepalive", "0.5",
         "--capability", "0=10", "--capability", "1=30", "--capability", "2=20",
         "--workdir", str(workdir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert read_line(proc, 30) == "converged root=1"
        started = [p for p in processes_mentioning(str(workdir)) if p.pid != proc.pid]
        assert len(started) == 6                                # 3 Mosquittos, 3 nodes
        endpoints = [("127.0.0.1", port + i) for i in range(3)]
        with Subscribers(endpoints, "byhand", tmp_path) as subs:
            subs.wait_ready(endpoints[0])
            publish(endpoints[2], "byhand/x", "across-the-chain", qos=2)
            assert [counts["across-the-chain"] for counts in subs.wait_for(
                {"across-the-chain"})] == [1, 1, 1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()   # a failed check: its children outlive a SIGKILL, stop them too
            for child in processes_mentioning(str(workdir)):
                child.kill()
    out, err = proc.communicate()
    assert out == "" and "stopped" in err          # one 'converged' line, read above
    deadline = time.monotonic() + 5
    while processes_mentioning(str(workdir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_mentioning(str(workdir)) == []


def test_broker_run_mqtt_st_refuses_a_bad_topology_naming_it():
    result = subprocess.run(
        [sys.executable, "-m", "mqttbed.controller.cli", "broker", "run", "mqtt-st",
         "--brokers", "3", "--port", "30000", "--topology", "star"],
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "'star'" in result.stderr
    assert result.stdout == ""


def test_a_bpdu_pingreq_costs_40_bytes_more_than_a_plain_one():
    assert pingreq_sizes() == {"plain_bytes": 2, "mqtt_st_bytes": 42}
    if os.geteuid() != 0:
        pytest.skip("capturing frames on lo needs CAP_NET_RAW")
    frames = measure_frame_sizes()
    assert frames is not None
    print(f"PINGREQ frames on lo: {frames}")
    assert frames["mqtt_st_frame_bytes"] - frames["plain_frame_bytes"] == 40
    assert frames["header_bytes"] >= 14 + 20 + 20   # Ethernet, IPv4, TCP at the least
