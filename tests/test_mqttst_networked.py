"""The networked MQTT-ST environment (seed 001, III-B, Fig. 6): regions, WAN delays on loopback.

Three regions a - b - c with a short way round (a/b 20 ms + b/c 20 ms) and a long direct
one (a/c 60 ms): the tree routes a to c through b because its path costs are measured
RTTs, so a message from a publisher in a to a subscriber in c takes 40 ms, not 60. A
cloud broker in c costs 60 ms at 0 % locality (publishers in a, subscribers at home in
c) and 120 ms at 100 % (everyone in a, the broker an ocean away both ways). Every delay
is a real delay proxy process on the path; none is left after the run, nor after a
SIGKILLed owner once its journal is reaped.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mqttbed.brokers.mqttst.wan import Geography
from mqttbed.campaigns.spec import builtin_spec_path, expand_points, load_spec, parse_spec
from mqttbed.core.errors import SpecError
from mqttbed.core.protocol import Role
from mqttbed.network.topology import JOURNAL_DIR, reap, tagged_processes
from tests.conftest import eventually, processes_mentioning
from tests.mqttst_support import CLI_ENV, run_campaign

PROXY = "mqttbed.network.delay_proxy"
GEOGRAPHY = {"regions": ["a", "b", "c"], "wan_delay_ms": {"a/b": 20, "b/c": 20, "a/c": 60},
             "publisher_region": "a", "subscriber_region": "c"}
NETWORKED = {
    "name": "mqtt-st-networked-smoke",
    "broker": {"backend": "mqtt-st", "brokers": 3, "keepalive_s": 2,
               "capabilities": {0: 900, 1: 800, 2: 700}, **GEOGRAPHY},
    "workload": {"publishers": 2, "subscribers": 2, "topic": "mqttst/net", "rate_hz": 20,
                 "messages": 40, "qos": 1, "warmup_messages": 5},
    "agents": {"count": 2},
    "timing": {"drain_s": 1, "heartbeat_timeout_s": 10},
    "scenarios": [{"name": "distributed", "workload.placement": "distributed"},
                  {"name": "cloud-c", "workload.placement": "benchmark",
                   "broker.cloud_region": "c"}],
    "sweep": {"broker.locality_percent": [0, 100]},
}
# (scenario, locality) -> the WAN delay a delivery crosses, ms
EXPECTED_MS = {("distributed", 0): 40, ("distributed", 100): 0,
               ("cloud-c", 0): 60, ("cloud-c", 100): 120}


def proxies() -> set[int]:
    return {p.pid for p in processes_mentioning(PROXY)}


@pytest.mark.system
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_wan_delays_land_where_the_regions_put_them_and_no_proxy_is_left(tmp_path):
    before = proxies()
    points = run_campaign(NETWORKED, tmp_path)
    by_key = {(p["params"]["scenario"], p["params"]["broker.locality_percent"]): p
              for p in points}
    assert set(by_key) == set(EXPECTED_MS)
    for key, expected_ms in EXPECTED_MS.items():
        point = by_key[key]
        assert point["lost"] == 0 and point["duplicates"] == 0, key
        assert point["deliveries_received"] == point["deliveries_expected"] == 2 * 2 * 35
        latency_ms = {q: point["latency_us"][q] / 1e3 for q in ("p50", "mean")}
        # the WAN delay (one clock: nothing arrives sooner), a few ms of proxies, nodes and
        # brokers on top: 6 ms at p50 on a quiet machine, 16 ms seen with the 2 cores
        # shared with a full test run; more in the mean. That the route goes a-b-c rather
        # than over the direct 60 ms link is checked on the tree itself below.
        assert expected_ms <= latency_ms["p50"] < expected_ms + 20, (key, latency_ms)
        assert latency_ms["mean"] < expected_ms + 30, (key, latency_ms)
    assert by_key[("distributed", 0)]["sections"]["mqtt_st"]["root"] == 0

    runs = [json.loads(path.read_text())["metadata"]["broker"]
            for path in (tmp_path / "d" / "campaigns").rglob("run.json")]
    assert len(runs) == 4
    for tree in (m for m in runs if m["placement"] == "distributed"):
        # the tree reflects geography: c reaches the root a through b (2 x 20 ms), its
        # direct link (60 ms) is blocked; its path cost is the RTTs to the root, 80 ms and
        # more (smoothed samples of a loaded machine, held within the 20 % hysteresis)
        a, b, c = tree["states_at_convergence"]
        assert c["root"] == a["id"] and c["root_link"] == b["id"], c
        assert {link["peer"]: link["role"] for link in c["links"]}[a["id"]] == "blocked"
        assert 80_000 <= c["root_path_cost_us"] < 150_000
    for meta in runs:
        geography = meta["geography"]
        assert tagged_processes(geography["proxy_prefix"]) == []
        assert not (JOURNAL_DIR / f"{geography['proxy_prefix']}.json").exists()
        for proxy in geography["proxies"]:
            stats = proxy["stats"]
            assert stats["delay_ms"] == proxy["delay_ms"] and stats["releases"] > 0, proxy
            # the proxy's own account of releasing late: about 0.15 ms on a quiet machine;
            # CI's full suite saw 2.4 ms here (and 7.7 ms in test_impairment). The latencies
            # above hold within 20 ms of the regions' delays either way.
            assert stats["lateness_p50_us"] < 10_000
    cloud_100 = next(m for m in runs if m["placement"] == "benchmark"
                     and m["geography"]["locality_percent"] == 100)["geography"]
    assert {c["delay_ms"] for c in cloud_100["clients"].values()} == {60}
    assert proxies() <= before


def described(pids: list[int]) -> list[str]:
    """Each process's pid, parent and command line, as far as they are still there."""
    said = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            said.append(f"{pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            said.append(f"{pid}: gone")
    return said


KILLED_OWNER = """
import json, sys, time
from types import SimpleNamespace
from mqttbed.brokers.mqttst.backend import MqttStBackend, Options
from mqttbed.core.host import LocalHost
backend = MqttStBackend()
backend.prepare(SimpleNamespace(placement="distributed"))
backend.deploy(Options(keepalive_s=2, **json.loads(sys.argv[1])), LocalHost())
print(json.dumps({"prefix": backend._proxies.prefix,
                  "workdir": str(backend._cluster._workdir)}), flush=True)
time.sleep(600)  # window: holds the cluster until the test kills this owner
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_proxies_of_a_sigkilled_owner_are_reaped_from_its_journal():
    owner = subprocess.Popen([sys.executable, "-c", KILLED_OWNER, json.dumps(GEOGRAPHY)],
                             stdout=subprocess.PIPE, text=True, env=CLI_ENV)
    try:
        line = json.loads(owner.stdout.readline())
        prefix = line["prefix"]
        # one per link across regions (ci6 counted 6 once, under load: a second look at
        # them, if it happens again, says which)
        assert eventually(lambda: len(tagged_processes(prefix)) == 3, timeout_s=10), \
            described(tagged_processes(prefix))
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        journal = json.loads((JOURNAL_DIR / f"{prefix}.json").read_text())
        assert journal["pid"] == owner.pid and not Path(f"/proc/{owner.pid}").exists()
        reap(prefix)   # what reap_stale (the next controller's recover) does for it
        deadline = time.monotonic() + 5
        while tagged_processes(prefix) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tagged_processes(prefix) == []
        assert not (JOURNAL_DIR / f"{prefix}.json").exists()
    finally:
        owner.kill()
        owner.wait(timeout=10)
        # the killed owner's Mosquittos and nodes outlive it (their own sessions)
        for proc in processes_mentioning(line["workdir"]) if "line" in locals() else []:
            proc.kill()


def test_the_paper_splits_clients_by_locality():
    def regions(locality: int, role: Role) -> list[str]:
        geography = Geography(("a", "b"), {frozenset("ab"): 10}, "a", "b", locality)
        return [geography.client_region(role, i) for i in range(4)]

    assert regions(0, Role.PUBLISHER) == ["a"] * 4 and regions(0, Role.SUBSCRIBER) == ["b"] * 4
    assert regions(50, Role.PUBLISHER) == regions(50, Role.SUBSCRIBER) == ["a", "b"] * 2
    assert regions(100, Role.PUBLISHER) == regions(100, Role.SUBSCRIBER) == ["a"] * 4


@pytest.mark.parametrize(("broker", "message"), [
    ({"locality_percent": 30}, r"locality_percent 30: the paper's setups are 0, 50 and 100"),
    ({"regions": ["a", "b"]}, r"regions \['a', 'b'\] names 2 regions for 3 brokers"),
    ({"wan_delay_ms": {"a/b": 20, "b/c": 20}}, r"no delay between a and c: add 'a/c: MS'"),
    ({"wan_delay_ms": {"a/b": 20, "b/c": 20, "a/c": 60, "c/a": 50}},
     r"gives a and c two delays \(60.0 and 50.0\)"),
    ({"wan_delay_ms": {"a/b": -1, "b/c": 20, "a/c": 60}}, r"wan_delay_ms\['a/b'\] = -1"),
    ({"wan_delay_ms": {"ab": 1}}, r"wan_delay_ms key 'ab'"),
    ({"cloud_region": "mars"}, r"cloud_region 'mars' is not a broker's region"),
    ({"publisher_region": None}, r"regions need publisher_region"),
    ({"regions": None}, r"publisher_region needs regions"),
])
def test_a_wrong_geography_names_the_field_and_value(broker, message):
    with pytest.raises(SpecError, match=message):
        parse_spec({"name": "x", "broker": {"backend": "mqtt-st", **GEOGRAPHY, **broker}})


def test_locality_is_sweepable_and_the_networked_campaign_loads():
    spec = load_spec(builtin_spec_path("mqtt-st-networked"))
    points = expand_points(spec)
    assert len(points) == 12
    options = [p.spec.broker.options() for p in points]
    assert {o.locality_percent for o in options} == {0, 50, 100}
    assert {o.cloud_region for o in options} == {None, "us-west", "us-east", "eu"}
