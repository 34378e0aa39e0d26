"""MQTT-ST clusters of real Mosquittos and tree nodes, driven with mosquitto_pub/_sub."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from mqttbed.brokers.mqttst.cluster import Cluster, ClusterNotConverged, TreeOptions
from mqttbed.brokers.processes import processes_in_group
from tests.mqttst_clients import Subscribers, free_port_range, publish

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FAST = dict(keepalive_s=0.5, reconnect_s=0.2)


def start_cluster(tmp_path, brokers: int, topology="full-mesh",
                  capabilities: dict[int, float] | None = None) -> Cluster:
    cluster = Cluster(brokers, free_port_range(brokers), topology,
                      TreeOptions(capabilities=capabilities, **FAST), tmp_path / "cluster")
    cluster.start()
    return cluster


def assert_exactly_once_everywhere(cluster: Cluster, tmp_path, topic: str,
                                   publishers: list[int], live: list[int]) -> None:
    """Each broker in ``publishers`` publishes once; every ``live`` broker's subscriber
    gets each of those messages exactly once."""
    endpoints = cluster.endpoints()
    with Subscribers([endpoints[i] for i in live], topic, tmp_path) as subs:
        subs.wait_ready(endpoints[publishers[0]])
        sent = set()
        for qos, i in enumerate(publishers):
            payload = f"from-{i}-{time.monotonic_ns()}"
            publish(endpoints[i], f"{topic}/b{i}", payload, qos=qos % 3)
            sent.add(payload)
        received = subs.wait_for(sent)
    assert received == [Counter(dict.fromkeys(sent, 1))] * len(live), cluster.describe_states()


def assert_nothing_left(cluster: Cluster) -> None:
    groups = cluster.process_groups()
    cluster.stop()
    assert groups and all(processes_in_group(group) == [] for group in groups)
    assert cluster.processes() == {}


def test_full_mesh_of_three_delivers_every_message_once_at_every_broker(tmp_path):
    cluster = start_cluster(tmp_path, 3, capabilities={0: 100, 1: 300, 2: 200})
    try:
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
    finally:
        assert_nothing_left(cluster)


def test_killing_the_root_elects_the_next_capability_and_delivery_resumes(tmp_path):
    cluster = start_cluster(tmp_path, 3, capabilities={0: 100, 1: 300, 2: 200})
    try:
        assert cluster.wait_converged(20) == 1
        killed_at = cluster.kill(1)
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
    finally:
        assert_nothing_left(cluster)


@pytest.mark.parametrize(("brokers", "topology"), [
    (4, "ring"), (3, "chain"), (4, "0-1,1-2,2-3,3-0,0-2")])
def test_ring_chain_and_explicit_links_deliver_exactly_once(tmp_path, brokers, topology):
    cluster = start_cluster(tmp_path, brokers, topology,
                            capabilities={i: 10.0 * (i + 1) for i in range(brokers)})
    try:
        root = cluster.wait_converged(20)
        assert root == brokers - 1
        blocked = sum(link["role"] == "blocked" for state in cluster.states()
                      for link in state["links"])
        assert blocked == len(cluster.edges) - (brokers - 1)   # one end of each spare link
        assert_exactly_once_everywhere(cluster, tmp_path, "topo", list(range(brokers)),
                                       list(range(brokers)))
    finally:
        assert_nothing_left(cluster)


def test_a_broker_that_dies_on_its_own_is_reported_by_health(tmp_path):
    cluster = start_cluster(tmp_path, 2)
    try:
        cluster.wait_converged(20)
        pid = cluster.processes()["node-1"]
        import os
        import signal
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while cluster.health() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "node of broker 1" in cluster.health() and "SIGKILL" in cluster.health()
        with pytest.raises(Exception, match="broke while converging"):
            cluster.wait_converged(2)
    finally:
        assert_nothing_left(cluster)


def test_wait_converged_says_why_on_timeout(tmp_path):
    cluster = start_cluster(tmp_path, 2)
    try:
        cluster.wait_converged(20)
        cluster.kill(0)
        cluster.kill(1)
        with pytest.raises(ClusterNotConverged, match="no broker is alive"):
            cluster.wait_converged(0.2)
    finally:
        assert_nothing_left(cluster)
