"""The one-machine lab: namespace hosts with their own sshd, provisioned from scratch.

Three "hosts" (network namespaces on a private bridge, each with its own sshd and host
key) are provisioned with ``mqttbed lab provision`` (host keys pinned on first connect),
then a campaign runs with its agents on two of them, named in the spec, and its
Mosquitto on the third (``broker.host``), the controller on the bridge address
(MQTTBED_LAB_ADDRESS). Afterwards ``mqttbed lab remove`` deletes the venvs and the lab
is reaped: namespaces, sshd processes, links. In the same lab, a Mosquitto started by
hand on a host is measured by the ``external`` backend, its process sampled over SSH.

Not covered here: ARM (the hosts run this machine's x86_64 Python, so the offline
wheelhouse path is taken, not the index path a Pi takes), real GPIO pins (virtual GPIO),
and clocks that really differ (every namespace reads the same CLOCK_MONOTONIC; the
agents are made to probe the controller as if they were elsewhere).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqttbed.api.report import render_report
from mqttbed.brokers.external.backend import ExternalBackend
from mqttbed.brokers.reachability import Unreachable, probe_mqtt_tcp
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.analysis import load_results
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import LabHostRow, RunRow, database_url, open_database
from mqttbed.controller.lab_hosts import HostArg, LabError, parse_extras
from mqttbed.core.errors import BackendError, SpecError
from mqttbed.core.mqtt_codec import Connect, encode, encode_publish
from mqttbed.core.settings import Settings
from mqttbed.core.ssh import SshHost, SshTarget
from mqttbed.network.lab import LabNetwork
from tests.conftest import eventually
from tests.generic_support import MOSQUITTO

pytestmark = [pytest.mark.timeout(300)]

MQTTBED = str(Path(sys.executable).with_name("mqttbed"))
# Kept between test runs, like a controller's data dir: the second run installs offline.
WHEEL_CACHE = Path(__file__).resolve().parent.parent / "build" / "lab-wheels"
HOSTS = ["lab-a", "lab-b", "lab-broker"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    network = LabNetwork(HOSTS, root)
    with network:
        yield network
        sshd_pids = [int((root / name / "sshd.pid").read_text()) for name in HOSTS]
    assert network.leftovers() == []
    assert [pid for pid in sshd_pids if Path(f"/proc/{pid}").exists()] == []


def mqttbed(*args: str, data_dir: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([MQTTBED, *args, "--data-dir", str(data_dir)], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "MQTTBED_LAB_WHEELS":
                                                       str(WHEEL_CACHE)})
    assert (done.returncode == 0) == ok, done.stderr + done.stdout
    return done


@pytest.mark.system
@pytest.mark.integration
def test_lab_hosts_are_provisioned_run_a_campaign_and_are_removed(lab, tmp_path):
    started = time.monotonic()
    data = tmp_path / "data"
    known_hosts = tmp_path / "known_hosts"
    access = ["--key", str(lab.client_key), "--known-hosts", str(known_hosts), "--trust-new"]
    provision = mqttbed("lab", "provision", *access,
                        *[f"{h.name}={h.ssh_destination}" for h in lab.hosts.values()
                          if h.name != "lab-broker"], data_dir=data)
    assert [line for line in provision.stdout.splitlines() if "provisioned" in line] == [
        "lab-a: provisioned (mqttbed 0.1.0)", "lab-b: provisioned (mqttbed 0.1.0)"]
    broker_host = lab.hosts["lab-broker"]
    provision = mqttbed("lab", "provision", "--no-agent", *access,
                        f"lab-broker={broker_host.ssh_destination}", data_dir=data)
    assert provision.stdout.splitlines()[-1] == "lab-broker: provisioned (no agent)"
    # each host's key was pinned on first connect: the one its own sshd holds
    pinned = sorted(known_hosts.read_text().splitlines())
    assert pinned == sorted(f"{h.address} {h.known_hosts_key}" for h in lab.hosts.values())

    print(f"provisioned after {time.monotonic() - started:.1f} s")
    # a host nobody answers for is recorded as failed, with why
    nobody = f"root@{broker_host.address}:2222"
    failed = mqttbed("lab", "provision", "--no-agent", *access, f"lab-x={nobody}",
                     data_dir=data, ok=False)
    assert failed.stderr.startswith("mqttbed lab provision: lab-x: SSH to lab-x failed: ")
    assert "Connection refused" in failed.stderr or "Unable to connect" in failed.stderr

    status = json.loads(mqttbed("lab", "status", "--json", data_dir=data).stdout)
    (unreachable,) = [entry for entry in status if entry["name"] == "lab-x"]
    assert unreachable["state"] == "failed" and unreachable["answers"].startswith(
        "unreachable: SSH to lab-x failed")
    status.remove(unreachable)
    assert [(s["name"], s["state"], s["answers"]) for s in status] == [
        ("lab-a", "provisioned", "mqttbed 0.1.0"), ("lab-b", "provisioned", "mqttbed 0.1.0"),
        ("lab-broker", "provisioned", "reachable, no agent")]
    assert [s["build"] for s in status] == ["current", "current", None]
    for entry in status:
        facts = entry["facts"]
        assert facts["python"].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
        assert facts["machine"] == os.uname().machine and facts["kernel"] == os.uname().release
        if entry["name"] == "lab-broker":
            assert not (Path(broker_host.home) / ".mqttbed").exists()
            continue
        assert facts["gpio_backends"] == ["virtual"] and facts["model"] is None
        assert facts["clock"]["source"] == "none"   # no chronyd or ptp4l in the lab
        # the venv holds the agent's needs and nothing of the controller's or Spark's
        venv = Path(lab.hosts[entry["name"]].home) / ".mqttbed" / "venv"
        site = next((venv / "lib").glob("python3*/site-packages"))
        for absent in ("pyspark", "fastapi", "sqlalchemy", "psutil"):
            assert not (site / absent).exists(), absent
        assert (site / "paho").is_dir() and (site / "mqttbed").is_dir()
        # the native load engine was compiled at provision, on the host, into its venv
        engine = facts["native_engine"]
        assert engine["state"] == "built" and engine["machine"] == os.uname().machine, engine
        library = Path(engine["library"])
        assert library.is_file() and library.is_relative_to(site / "mqttbed"), engine

    spec = parse_spec({
        "name": "lab", "broker": {"backend": "mosquitto", "host": "lab-broker"},
        "agents": {"hosts": [{"name": "lab-a"}, {"name": "lab-b"}],
                   "force_clock_probe": True, "clock_probe_interval_s": 0.5},
        "workload": {"publishers": 1, "subscribers": 3, "rate_hz": 100, "messages": 150,
                     "warmup_messages": 0},
        "timing": {"setup_timeout_s": 30}})
    with create_controller(Settings(data_dir=data, lab_address=lab.lab_address)) as controller:
        for hosts, error in (
                ([{"name": "lab-a"}, {"name": "pi-07"}],
                 r"agents.hosts\[1\].name: no lab host named 'pi-07'; known: lab-a, lab-b, "
                 r"lab-broker, lab-x"),
                ([{"name": "lab-x"}], r"agents.hosts\[0\].name: lab host 'lab-x' is failed: "
                                      r"SSH to lab-x failed"),
                ([{"name": "lab-broker"}], r"agents.hosts\[0\].name: lab host 'lab-broker' "
                                           r"has no agent")):
            with pytest.raises(SpecError, match=error):
                controller.engine.create_campaign(parse_spec({
                    "name": "x", "agents": {"hosts": hosts}}))
        campaign_id = controller.engine.create_campaign(spec)
        assert controller.run_campaign(campaign_id) == "done"
        with controller.sessions() as s:
            (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        results = load_results(controller.layout, campaign_id)
        report = render_report(controller, campaign_id, standalone=True)
    print(f"campaign done after {time.monotonic() - started:.1f} s")
    assert sorted(run.run_metadata["agent_hosts"].values()) == ["lab-a", "lab-b"]
    assert run.run_metadata["host"] == "lab-broker"
    assert run.run_metadata["endpoint"]["host"] == lab.hosts["lab-broker"].address
    assert run.run_metadata["broker"]["config"].startswith("# generated by mqttbed")

    (point,) = results.points
    assert (point.messages_sent, point.deliveries_expected, point.deliveries_received,
            point.lost, point.duplicates) == (150, 450, 450, 0, 0)
    (run_entry,) = results.runs
    agents = run_entry.clock.agents
    assert len(agents) == 2
    for clock in agents.values():
        assert (clock.method, clock.discipline) == ("ntp", "none")
        assert clock.offset_uncertainty_us_max is not None
        assert 0 < clock.offset_uncertainty_us_max < 1_000_000   # half an HTTP round trip
        assert clock.estimates is not None and clock.estimates >= 2   # re-probed in the run
    print(json.dumps({agent: clock.model_dump() for agent, clock in agents.items()}))
    # the report shows them too, one row per agent
    table = report[report.index('<table id="agent-clocks">'):]
    table = table[:table.index("</table>")]
    assert table.count("<td class=\"l\">ntp</td><td class=\"l\">none</td>") == 2
    # the broker was sampled on its host and the samples came back
    assert point.broker.samples > 0 and point.broker.rss_bytes_max > 0
    print(point.broker.model_dump())

    # an upgrade: lab-a's install drifted (a module edited there, its record names another
    # build): status says outdated, and upgrade puts this controller's build back
    site_a = next((Path(lab.hosts["lab-a"].home) / ".mqttbed" / "venv" / "lib").glob(
        "python3*/site-packages"))
    edited = site_a / "mqttbed" / "agents" / "facts.py"
    original = edited.read_bytes()
    edited.write_text("raise SystemExit('an old build')\n")
    sessions = open_database(database_url(data))
    with sessions() as s:
        row = s.get(LabHostRow, "lab-a")
        current = row.facts["build"]
        row.facts = {**row.facts, "build": "0123456789abcdef"}
        s.commit()
    sessions.kw["bind"].dispose()
    builds = {e["name"]: e["build"] for e in json.loads(
        mqttbed("lab", "status", "--json", data_dir=data).stdout)}
    assert builds["lab-a"].startswith("outdated") and builds["lab-b"] == "current"
    upgraded = mqttbed("lab", "upgrade", "lab-a", data_dir=data)
    assert upgraded.stdout.splitlines()[-1] == "lab-a: upgraded (mqttbed 0.1.0)"
    assert edited.read_bytes() == original
    (entry,) = json.loads(mqttbed("lab", "status", "--json", "lab-a", data_dir=data).stdout)
    assert (entry["build"], entry["facts"]["build"], entry["answers"]) == (
        "current", current, "mqttbed 0.1.0")

    # (lab-x was never reached, so nothing is there to delete: only its record goes)
    removed = mqttbed("lab", "remove", *HOSTS, "lab-x", data_dir=data)
    assert removed.stdout.splitlines() == [f"{name}: removed" for name in [*HOSTS, "lab-x"]]
    for host in lab.hosts.values():
        assert not (Path(host.home) / ".mqttbed").exists()
    sessions = open_database(database_url(data))
    with sessions() as s:
        assert s.query(LabHostRow).count() == 0
    sessions.kw["bind"].dispose()


def _answers(address: str, port: int) -> bool:
    try:
        probe_mqtt_tcp(address, port, 0.5)
    except Unreachable:
        return False
    return True


@pytest.mark.integration
def test_an_external_broker_on_a_lab_host_is_sampled_there_and_left_running(lab, tmp_path):
    host = lab.hosts["lab-broker"]
    # started by hand in the host's namespace, under a name no other process here has
    name = f"mq-{secrets.token_hex(4)}"
    (tmp_path / name).symlink_to(MOSQUITTO)
    conf = tmp_path / "broker.conf"
    conf.write_text(f"listener 1883 {host.address}\nallow_anonymous true\n"
                    "persistence false\nsys_interval 1\n")
    broker = subprocess.Popen(["ip", "netns", "exec", host.netns, str(tmp_path / name), "-c",
                               str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ssh = SshHost(SshTarget(host=host.ssh_destination, key_filename=str(lab.client_key),
                            known_hosts=str(tmp_path / "known_hosts"), trust_new=True),
                  name="lab-broker")
    try:
        assert eventually(lambda: _answers(host.address, 1883), 5)
        url = f"mqtt://{host.address}:1883"
        with pytest.raises(BackendError, match=f"process_name 'no-{name}': no process of that "
                                               "name runs on lab host lab-broker"):
            ExternalBackend().deploy_on_lab_host(
                {"url": url, "sample": {"process_name": f"no-{name}"}}, ssh)
        backend = ExternalBackend()
        endpoint = backend.deploy_on_lab_host(
            {"url": url, "sample": {"process_name": name, "interval_s": 0.05}}, ssh)
        assert (endpoint.host, endpoint.port) == (host.address, 1883)
        with socket.create_connection((host.address, 1883)) as client:   # some work for it
            client.sendall(encode(Connect(client_id="load")))
            client.sendall(encode_publish("load", bytes(200)) * 50_000)
        assert eventually(lambda: any(s.cpu_percent > 0 for s in backend.resource_samples()), 5)
        assert backend.health() is None
        backend.teardown()

        samples = backend.resource_samples()
        assert {s.processes for s in samples} == {1} and min(s.rss_bytes for s in samples) > 0
        rss_kb = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{broker.pid}/status")
                               .read_text()).group(1))
        assert abs(samples[-1].rss_bytes - rss_kb * 1024) < 4 << 20   # the same process
        assert [s.t_ns for s in samples] == sorted(s.t_ns for s in samples)
        assert samples[-1].t_ns <= time.monotonic_ns()   # on this machine's clock
        record = backend.deployment()
        sampled = record.sampled_process
        assert (sampled.host, sampled.pid, sampled.name) == ("lab-broker", broker.pid, name)
        assert (record.pid, record.binary, record.managed) == (broker.pid, MOSQUITTO, False)
        assert sampled.cmdline[0] == str(tmp_path / name) and len(record.binary_sha256) == 64
        assert broker.poll() is None and _answers(host.address, 1883)   # never signalled
        # a broker that ends while it is watched fails the run, saying so
        watcher = ExternalBackend()
        watcher.deploy_on_lab_host({"url": url, "sys_topics": False,
                                    "sample": {"pid": broker.pid, "interval_s": 0.05}}, ssh)
        broker.kill()
        assert eventually(lambda: watcher.health() is not None, 5)
        assert watcher.health() == (f"external broker {url}: its process {broker.pid} "
                                    f"({name}) on lab-broker has ended")
        watcher.teardown()
    finally:
        ssh.close()
        broker.kill()
        broker.wait(5)


def test_host_arguments_and_extras_are_checked_with_the_bad_value_named():
    assert HostArg.parse("pi-07=pi@192.168.1.57:2222") == HostArg("pi-07", "pi@192.168.1.57",
                                                                 2222)
    assert HostArg.parse("pi@10.0.0.9") == HostArg("10.0.0.9", "pi@10.0.0.9", None)
    for text, error in (("pi-07=192.168.1.57", "expected [name=]user@address[:port]"),
                        ("pi@10.0.0.9:99999", "port '99999' is not 1-65535"),
                        ("-x=pi@10.0.0.9", "name '-x' must be 1-64 letters")):
        with pytest.raises(LabError, match=re.escape(f"host {text!r}: {error}")):
            HostArg.parse(text)
    assert parse_extras("pi5") == ["agent", "pi5"]
    with pytest.raises(LabError, match=r"--extras 'agent,analytics': unknown analytics"):
        parse_extras("agent,analytics")
    with pytest.raises(LabError, match="pi .* and pi5 .* cannot both be installed"):
        parse_extras("pi,pi5")


def test_an_agent_host_needs_an_address_or_a_lab_host_name():
    with pytest.raises(SpecError, match=r"agents: hosts\[0\]: give host \(user@address\) or "
                                        r"the name of a lab host"):
        parse_spec({"name": "x", "agents": {"hosts": [{"count": 2}]}})
    with pytest.raises(SpecError, match=r"broker.host"):
        parse_spec({"name": "x", "broker": {"backend": "mosquitto", "host": ""}})
