"""Agents on lab hosts, started over SSH: a real sshd on loopback stands in for the Pis.

The "remote" side is this machine reached through OpenSSH, so what is exercised for real
is the deployment path: the spec's hosts, SSH login with a checked host key, the agent
started by its remote command with the token on stdin, output streamed back, a dead or
missing agent reported with its reason, and every remote process stopped after the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pyarrow.dataset as ds
import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.db import RunRow
from mqttbed.core.errors import SpecError
from tests.sshd import LocalSshd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MQTTBED = str(Path(os.sys.executable).with_name("mqttbed"))


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = LocalSshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def remote_spec(sshd: LocalSshd, hosts: list[dict], **workload) -> dict:
    return {"name": "lab", "agents": {"hosts": [sshd.target(**h) for h in hosts]},
            "workload": {"publishers": 1, "subscribers": 3, "rate_hz": 100, "messages": 40,
                         "warmup_messages": 0, **workload},
            "timing": {"setup_timeout_s": 20}}


def agent_processes(controller_url: str) -> list[psutil.Process]:
    """Live ``mqttbed agent`` processes of the controller at ``controller_url`` (not those
    another test, in another pytest-xdist worker, may be running at the same time)."""
    found = []
    for proc in psutil.process_iter():
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        if (len(cmdline) > 1 and cmdline[0] == MQTTBED and cmdline[1] == "agent"
                and controller_url in cmdline):
            found.append(proc)
    return found


def only_run(controller, campaign_id) -> RunRow:
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        return run


def test_a_campaign_runs_its_agents_on_the_hosts_over_ssh(controller, sshd):
    spec = remote_spec(sshd, [{"count": 2, "command": MQTTBED}])
    campaign_id = controller.engine.create_campaign(parse_spec(spec))
    assert controller.engine.run_campaign(campaign_id) == "done"
    run = only_run(controller, campaign_id)
    assert run.state == "done"
    hosts = run.run_metadata["agent_hosts"]
    assert sorted(hosts.values()) == ["root@127.0.0.1", "root@127.0.0.1"]
    assert set(run.run_metadata["agents"]) and len(run.run_metadata["agents"]) == 2

    # every publish and every delivery arrived from the remote agents
    path = controller.layout.events / f"campaign_id={campaign_id}" / f"run_id={run.id}"
    rows = ds.dataset(path, format="parquet").to_table().to_pylist()
    kinds = [r["kind"] for r in rows]
    assert kinds.count("publish") == 40 and kinds.count("delivery") == 40 * 3
    assert kinds.count("subscribe") == 3
    # each agent's output streams back over SSH into the run's log directory (a quiet
    # agent logs nothing; the failing-command test below reads a line that came back)
    logs = list((controller.layout.run_dir(campaign_id, run.id) / "agents").glob("*.log"))
    assert len(logs) == 2
    # nothing outlives the run, and the token never showed in a command line
    assert agent_processes(controller.url) == []


def test_an_agent_command_missing_on_the_host_fails_the_run_with_the_shells_message(
        controller, sshd):
    spec = remote_spec(sshd, [{"command": "/opt/nowhere/mqttbed"}])
    campaign_id = controller.engine.create_campaign(parse_spec(spec))
    assert controller.engine.run_campaign(campaign_id) == "failed"
    reason = only_run(controller, campaign_id).reason
    assert "on root@127.0.0.1" in reason and "exited with code 127" in reason
    assert "/opt/nowhere/mqttbed" in reason  # the shell's "not found" line names it


def test_a_host_whose_key_is_not_trusted_fails_the_run_before_anything_starts(
        controller, sshd, tmp_path):
    other = (sshd.root / "other_key.pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    spec = remote_spec(sshd, [{"command": MQTTBED, "known_hosts": str(wrong)}])
    campaign_id = controller.engine.create_campaign(parse_spec(spec))
    assert controller.engine.run_campaign(campaign_id) == "failed"
    reason = only_run(controller, campaign_id).reason
    assert reason.startswith("agents.hosts[0]: SSH to root@127.0.0.1 failed")


def test_a_lab_host_without_a_lab_address_is_refused_with_the_setting_to_use(controller):
    spec = {"name": "lab", "agents": {"hosts": [{"host": "pi@192.0.2.10"}]},
            "workload": {"subscribers": 1, "messages": 5, "warmup_messages": 0}}
    campaign_id = controller.engine.create_campaign(parse_spec(spec))
    assert controller.engine.run_campaign(campaign_id) == "failed"
    reason = only_run(controller, campaign_id).reason
    assert "agents.hosts[0] (pi@192.0.2.10) cannot reach this controller" in reason
    assert "MQTTBED_LAB_ADDRESS" in reason


def test_count_and_hosts_must_agree():
    with pytest.raises(SpecError, match="count 3 differs from the 2 agents the hosts run"):
        parse_spec({"name": "x", "agents": {"count": 3, "hosts": [
            {"host": "pi@10.0.0.2", "count": 2}]}})
