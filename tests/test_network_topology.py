"""Namespaces, veths and the bridge a run builds, and that nothing of them outlives the run."""

from __future__ import annotations

import http.server
import ipaddress
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mqttbed.core.host import Host
from mqttbed.network.netns import socket_in
from mqttbed.network.topology import ROOT_ADDRESS, Topology, leftovers, new_prefix, reap, reap_stale
from tests.conftest import wait_until

BUILD_AND_WAIT = """
import sys, time
from mqttbed.brokers.p4.dataplane import EbpfSwitch
from mqttbed.network.topology import Topology
topology = Topology(["broker", "pub", "s1", "s2", "s3"], prefix=sys.argv[1])
topology.build()
EbpfSwitch(topology).load()
print("built", flush=True)
time.sleep(600)  # window: holds the topology until the test kills this builder
"""


@pytest.mark.integration  # network namespaces (root)
def test_hosts_reach_each_other_over_the_switch():
    with Topology(["a", "b"]) as topology:
        a, b = topology.hosts["a"], topology.hosts["b"]
        receiver = socket_in(b.netns)
        sender = socket_in(a.netns)
        with receiver, sender:
            receiver.bind((b.address, 5000))
            receiver.settimeout(2)
            sender.sendto(b"over the bridge", (b.address, 5000))
            assert receiver.recvfrom(100) == (b"over the bridge", (a.address,
                                                                  sender.getsockname()[1]))
        assert len(topology.prefix) + len("m63") <= 15
    assert leftovers(topology.prefix) == []


@pytest.mark.integration  # network namespaces (root)
def test_a_process_in_a_host_namespace_reaches_an_http_server_in_the_root_namespace(tmp_path):
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Topology(["agent"]) as topology:
            host = topology.namespace_host("agent")
            assert isinstance(host, Host)
            log = tmp_path / "curl.log"
            url = f"http://{host.controller_address}:{server.server_port}/"
            process = host.spawn([sys.executable, "-c", "import sys, urllib.request; "
                                  f"print(urllib.request.urlopen({url!r}, timeout=5).status)"],
                                 log_path=log)
            deadline = time.monotonic() + 10
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert process.poll() == 0, log.read_text()
            assert log.read_text().strip() == "200"
            assert host.controller_address == ROOT_ADDRESS
            with socket_in(host.netns, socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host.address, host.free_port()))
    finally:
        server.shutdown()


@pytest.mark.integration  # network namespaces (root)
@pytest.mark.parametrize("kill_after", ["built", "started"], ids=["after-build", "mid-build"])
def test_reap_removes_everything_of_a_builder_killed_with_sigkill(kill_after):
    prefix = new_prefix()
    builder = subprocess.Popen([sys.executable, "-c", BUILD_AND_WAIT, prefix],
                               stdout=subprocess.PIPE, text=True)
    try:
        if kill_after == "built":
            assert builder.stdout.readline().strip() == "built"
            assert any(item.startswith("pins") for item in leftovers(prefix))
        else:  # as soon as the first thing of it exists, while it builds the rest
            wait_until(lambda: leftovers(prefix), 30, f"the builder to create anything of {prefix}")
        builder.send_signal(signal.SIGKILL)
        builder.wait(timeout=10)
        reaped = reap_stale()  # what a later run does first: the builder's pid is gone
        assert prefix in reaped or kill_after != "built"
    finally:
        builder.kill()
        reap(prefix)
    assert leftovers(prefix) == []


@pytest.mark.integration  # network namespaces (root)
def test_topologies_built_at_once_take_different_management_subnets():
    """Two controllers on one machine may build at the same moment: each must claim its
    own management /24 (chosen from the root's routes, which the first host's address
    changes), or their /30s would collide."""
    builders = [Topology(["h"]) for _ in range(3)]
    start = threading.Barrier(len(builders))
    failures: list[BaseException] = []

    def build(topology: Topology) -> None:
        start.wait()
        try:
            topology.build()
        except BaseException as failure:  # noqa: BLE001 - reported by the test below
            failures.append(failure)

    threads = [threading.Thread(target=build, args=(t,)) for t in builders]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not failures, failures
        subnets = {ipaddress.ip_network(f"{t.hosts['h'].mgmt_address}/24", strict=False)
                   for t in builders}
        assert len(subnets) == len(builders), subnets
    finally:
        for topology in builders:
            reap(topology.prefix)
    assert all(leftovers(t.prefix) == [] for t in builders)


def test_bad_names_are_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="unique"):
        Topology(["a", "a"])
    with pytest.raises(ValueError, match="7 characters"):
        Topology(["a"], prefix="far-too-long-prefix")


def test_reaping_stale_topologies_skips_a_journal_that_vanishes_under_it(monkeypatch, tmp_path):
    """Two controllers (or test workers) on one machine: a journal listed by one may be
    gone (torn down, or reaped by the other) when it reads it; that is not an error."""
    import mqttbed.network.topology as topology

    journals = tmp_path / "net"
    journals.mkdir()
    (journals / "mbgone.json").write_text('{"pid": 1}')
    monkeypatch.setattr(topology, "JOURNAL_DIR", journals)
    real_read_text = Path.read_text

    def vanishing_read_text(path: Path, *args: object, **kwargs: object) -> str:
        if path.name == "mbgone.json":
            path.unlink()   # the other process got there first
        return real_read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", vanishing_read_text)
    assert topology.reap_stale() == []
