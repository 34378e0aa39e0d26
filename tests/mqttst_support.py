"""Helpers for MQTT-ST tests: clusters that clean up after themselves, Debian's
mosquitto_pub/mosquitto_sub as the clients, free ports, campaigns run from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from mqttbed.brokers.mqttst.cluster import Cluster, TreeOptions, free_port_range
from mqttbed.brokers.processes import processes_in_group

Endpoint = tuple[str, int]
CLI = Path(sys.executable).with_name("mqttbed")
CLI_ENV = {**os.environ, "COLUMNS": "200", "PYSPARK_PYTHON": sys.executable}


def run_campaign(spec: dict, tmp_path: Path, timeout_s: float = 280) -> list[dict]:
    """Run ``spec`` with ``mqttbed run`` (data in ``tmp_path / "d"``); its stats' points."""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([str(CLI), "run", str(spec_path), "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=timeout_s, env=CLI_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    stats_line = next(line for line in done.stdout.splitlines() if line.startswith("stats:"))
    return json.loads(Path(stats_line.split(":", 1)[1].strip()).read_text())["points"]


def publish(endpoint: Endpoint, topic: str, payload: str, qos: int = 1) -> None:
    """Publish one message with mosquitto_pub (which waits for the QoS handshake)."""
    host, port = endpoint
    subprocess.run(["mosquitto_pub", "-h", host, "-p", str(port), "-t", topic, "-m", payload,
                    "-q", str(qos)], check=True, timeout=10, capture_output=True)


class Subscribers:
    """One mosquitto_sub per endpoint on ``topic/#``, each printing ``topic payload`` lines."""

    def __init__(self, endpoints: list[Endpoint], topic: str, directory: Path):
        self.endpoints = endpoints
        self.topic = topic
        self.files = [directory / f"sub-{topic.replace('/', '_')}-{i}.txt"
                      for i in range(len(endpoints))]
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Subscribers:
        for (host, port), path in zip(self.endpoints, self.files, strict=True):
            with path.open("wb") as out:
                self._procs.append(subprocess.Popen(
                    ["mosquitto_sub", "-h", host, "-p", str(port), "-t", f"{self.topic}/#",
                     "-q", "2", "-v"], stdout=out, stderr=subprocess.STDOUT))
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.wait(timeout=5)

    def payloads(self, index: int) -> Counter[str]:
        """How often subscriber ``index`` received each payload."""
        lines = self.files[index].read_text(errors="replace").splitlines()
        return Counter(line.partition(" ")[2] for line in lines
                       if line.startswith(f"{self.topic}/"))

    def wait_ready(self, via: Endpoint, timeout_s: float = 15.0) -> None:
        """Publish warm-up messages at ``via`` until every subscriber has received one."""
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while time.monotonic() < deadline:
            attempt += 1
            publish(via, f"{self.topic}/warmup", f"warmup-{attempt}")
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                if all(any(p.startswith("warmup-") for p in self.payloads(i))
                       for i in range(len(self.endpoints))):
                    return
                time.sleep(0.02)
        raise AssertionError(f"subscribers not all ready within {timeout_s} s: "
                             f"{[dict(self.payloads(i)) for i in range(len(self.endpoints))]}")

    def wait_for(self, expected: set[str], timeout_s: float = 10.0,
                 settle_s: float = 0.5) -> list[Counter[str]]:
        """Wait until every subscriber has every payload of ``expected`` (then ``settle_s``
        more, for duplicates); return each subscriber's counts of those payloads."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(expected <= set(self.payloads(i)) for i in range(len(self.endpoints))):
                break
            time.sleep(0.02)
        time.sleep(settle_s)  # window: a late duplicate copy would arrive within it
        return [Counter({payload: count for payload, count in self.payloads(i).items()
                         if payload in expected}) for i in range(len(self.endpoints))]


FAST = dict(keepalive_s=0.5, reconnect_s=0.2)


def start_cluster(workdir: Path, brokers: int, topology="full-mesh",
                  capabilities: dict[int, float] | None = None) -> Cluster:
    """A started cluster on free ports with a short keep-alive, its files in ``workdir``."""
    cluster = Cluster(brokers, free_port_range(brokers), topology,
                      TreeOptions(capabilities=capabilities, **FAST), workdir)
    cluster.start()
    return cluster


@pytest.fixture(name="cluster_of")
def cluster_of_fixture(tmp_path) -> Iterator[Callable[..., Cluster]]:
    """Start clusters with :func:`start_cluster`; afterwards, stop them and check that
    nothing of them is left in any of their process groups."""
    started: list[Cluster] = []

    def start(brokers: int, topology="full-mesh",
              capabilities: dict[int, float] | None = None) -> Cluster:
        workdir = tmp_path / f"cluster-{len(started)}"
        started.append(start_cluster(workdir, brokers, topology, capabilities))
        return started[-1]

    yield start
    for cluster in started:
        assert_nothing_left(cluster)


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
