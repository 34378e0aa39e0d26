"""MQTT-ST clusters of real Mosquittos and tree nodes, driven with mosquitto_pub/_sub."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter

import pytest

from mqttbed.brokers.mqttst.cluster import ClusterNotConverged
from mqttbed.core.errors import BackendError
from tests.conftest import eventually
from tests.mqttst_support import (  # noqa: F401 - cluster_of_fixture is a fixture
    Subscribers,
    assert_exactly_once_everywhere,
    cluster_of_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_full_mesh_of_three_delivers_every_message_once_at_every_broker(cluster_of, tmp_path):
    cluster = cluster_of(3, capabilities={0: 100, 1: 300, 2: 200})
    assert cluster.wait_converged(20) == 1
    states = cluster.states()
    assert all(state["root"] == states[1]["id"] for state in states)
    assert {link["role"] for link in states[1]["links"]} == {"designated"}
    assert sorted(cluster.processes()) == [f"{kind}-{i}" for kind in ("mosquitto", "node")
                                           for i in range(3)]
    assert cluster.health() is None
    assert_exactly_once_everywhere(cluster, tmp_path, "mesh", [0, 1, 2], [0, 1, 2])
    counters = [state["counters"] for state in cluster.states()]
    assert sum(c["injected"] for c in counters) >= 6    # 3 messages x 2 other brokers
    assert counters[0]["pingreq_bytes"] == {"bpdu": 42, "plain": 2}


def test_retain_flag_and_qos_of_a_publication_survive_forwarding(cluster_of):
    cluster = cluster_of(3, "chain", {0: 10, 1: 30, 2: 20})
    cluster.wait_converged(20)
    (host0, port0), _, (host2, port2) = cluster.endpoints()
    subprocess.run(["mosquitto_pub", "-h", host0, "-p", str(port0), "-t", "kept/x", "-m",
                    "hello", "-q", "1", "-r"], check=True, timeout=10)
    # Once broker 2's node injected it, a subscriber arriving there later gets it from
    # that Mosquitto's retained store: retained, at QoS 1 (its subscription allows 2).
    assert eventually(lambda: cluster.states()[2]["counters"]["injected"] == 1, timeout_s=10)
    got = subprocess.run(["mosquitto_sub", "-h", host2, "-p", str(port2), "-t", "kept/#",
                          "-q", "2", "-C", "1", "-W", "5", "-F", "%r %q %t %p"],
                         capture_output=True, text=True, timeout=10).stdout.strip()
    assert got == "1 1 kept/x hello"


def test_killing_the_root_elects_the_next_capability_and_delivery_resumes(cluster_of, tmp_path):
    cluster = cluster_of(3, capabilities={0: 100, 1: 300, 2: 200})
    assert cluster.wait_converged(20) == 1
    endpoints = cluster.endpoints()
    # A stream from broker 0 (one message per 5 ms) while the root dies in the middle:
    # whatever the root held in flight is lost, nothing arrives twice.
    with Subscribers([endpoints[0], endpoints[2]], "stream", tmp_path) as subs:
        subs.wait_ready(endpoints[0])
        stream = subprocess.Popen(["mosquitto_pub", "-h", endpoints[0][0], "-p",
                                   str(endpoints[0][1]), "-t", "stream/s", "-l", "-q", "1"],
                                  stdin=subprocess.PIPE, text=True)
        sent = [f"s{n}" for n in range(200)]
        for n, payload in enumerate(sent):
            stream.stdin.write(payload + "\n")
            stream.stdin.flush()
            time.sleep(0.005)  # window: paces the stream, one message per 5 ms
            if n == 100:
                killed_at = cluster.kill(1)
        stream.stdin.close()
        assert stream.wait(timeout=10) == 0
        local, remote = subs.wait_for(set(sent), timeout_s=3)
    assert local == Counter(dict.fromkeys(sent, 1))      # the publisher's own broker
    assert max(remote.values()) == 1
    print(f"broker 2 lost {len(sent) - len(remote)} of {len(sent)} messages streamed "
          "across the root's death")
    assert len(remote) >= len(sent) - 20
    assert cluster.wait_converged(10) == 2
    reconverged_ms = (cluster.converged_at_ns() - killed_at) / 1e6
    print(f"re-convergence after killing the root: {reconverged_ms:.1f} ms")
    assert 0 < reconverged_ms < 3000
    assert cluster.health() is None            # killed on purpose: not broken
    assert sorted(cluster.processes()) == ["mosquitto-0", "mosquitto-2", "node-0", "node-2"]
    assert cluster.states()[1] is None
    assert_exactly_once_everywhere(cluster, tmp_path, "afterkill", [0, 2], [0, 2])

    cluster.restore(1)                         # the restored root rejoins and wins again
    assert cluster.wait_converged(20) == 1
    assert_exactly_once_everywhere(cluster, tmp_path, "restored", [1, 2], [0, 1, 2])


@pytest.mark.parametrize(("brokers", "topology"), [
    (4, "ring"), (3, "chain"), (4, "0-1,1-2,2-3,3-0,0-2")])
def test_ring_chain_and_explicit_links_deliver_exactly_once(cluster_of, tmp_path, brokers,
                                                            topology):
    cluster = cluster_of(brokers, topology, {i: 10.0 * (i + 1) for i in range(brokers)})
    assert cluster.wait_converged(20) == brokers - 1
    blocked = sum(link["role"] == "blocked" for state in cluster.states()
                  for link in state["links"])
    assert blocked == len(cluster.edges) - (brokers - 1)   # one end of each spare link
    assert_exactly_once_everywhere(cluster, tmp_path, "topo", list(range(brokers)),
                                   list(range(brokers)))


def test_a_broker_that_dies_on_its_own_is_reported_by_health(cluster_of):
    cluster = cluster_of(2)
    cluster.wait_converged(20)
    os.kill(cluster.processes()["node-1"], signal.SIGKILL)   # not through kill(): a crash
    deadline = time.monotonic() + 5
    while cluster.health() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "node of broker 1" in cluster.health() and "SIGKILL" in cluster.health()
    with pytest.raises(BackendError, match="broke while converging"):
        cluster.wait_converged(2)


def test_wait_converged_says_why_on_timeout(cluster_of):
    cluster = cluster_of(2)
    cluster.wait_converged(20)
    cluster.kill(0)
    cluster.kill(1)
    with pytest.raises(ClusterNotConverged, match="no broker is alive"):
        cluster.wait_converged(0.2)
