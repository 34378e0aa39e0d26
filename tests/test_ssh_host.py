"""SshHost against a real OpenSSH server on loopback: run, spawn, watch, stop, secrets."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from mqttbed.brokers.processes import processes_in_group
from mqttbed.core.host import Host
from mqttbed.core.ssh import SshError, SshHost, SshTarget
from tests.conftest import eventually
from tests.sshd import LocalSshd

# integration: a real sshd
pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = LocalSshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def host(sshd):
    ssh_host = SshHost(SshTarget(**sshd.target()))
    yield ssh_host
    ssh_host.close()


def test_it_is_a_host_and_runs_quoted_argv(host):
    assert isinstance(host, Host)
    assert host.address == "127.0.0.1"
    assert host.run(["printf", "%s|", "a b", "$HOME", "'q'"], "echo") == "a b|$HOME|'q'|"
    with pytest.raises(SshError, match=r"`false` \(to fail on purpose\) exited with 1"):
        host.run(["false"], "fail on purpose")


def test_make_dir_and_free_port_are_answered_by_the_remote_side(host):
    path = host.make_dir("mqttbed-test-")
    try:
        assert path.name.startswith("mqttbed-test-")
        assert oct(os.stat(path).st_mode & 0o777) == "0o700"  # the remote side is this machine
    finally:
        os.rmdir(path)
    port = host.free_port()
    assert 1024 <= port <= 65535


def test_a_spawned_process_streams_its_output_and_reports_its_exit_code(host, tmp_path):
    log = tmp_path / "out.log"
    proc = host.spawn(["sh", "-c", 'echo "token=$SECRET"; echo oops >&2; exit 3'],
                      env={"SECRET": "s3cr3t value"}, log_path=log)
    assert eventually(lambda: proc.poll() is not None)
    assert proc.poll() == 3
    assert eventually(lambda: "oops" in log.read_text())
    assert log.read_text().splitlines() == ["token=s3cr3t value", "oops"]


def test_the_environment_never_shows_in_the_remote_command_lines(host, tmp_path):
    proc = host.spawn(["sleep", "30"], env={"MQTTBED_AGENT_TOKEN": "do-not-leak-me"},
                      log_path=tmp_path / "out.log")
    try:
        # the wrapper shell (the group's leader) and sleep, once it is started
        assert eventually(lambda: sorted(p.name() for p in processes_in_group(proc.pid))
                          == ["sh", "sleep"])
        members = processes_in_group(proc.pid)
        for p in members:
            assert "do-not-leak-me" not in " ".join(p.cmdline())
            assert p.environ().get("MQTTBED_AGENT_TOKEN") in (None, "do-not-leak-me")
        assert any(p.environ().get("MQTTBED_AGENT_TOKEN") == "do-not-leak-me" for p in members)
    finally:
        assert proc.stop(timeout_s=2) == -signal.SIGTERM
    assert eventually(lambda: processes_in_group(proc.pid) == [])  # the whole group


def test_stop_kills_the_whole_group_even_when_term_is_ignored(host, tmp_path):
    proc = host.spawn(["sh", "-c", "trap '' TERM; sleep 60 & wait"], log_path=tmp_path / "l")
    assert eventually(lambda: len(processes_in_group(proc.pid)) == 3)
    assert proc.poll() is None
    assert proc.stop(timeout_s=0.5) == -signal.SIGKILL
    assert eventually(lambda: processes_in_group(proc.pid) == [])


def test_a_process_killed_there_reads_as_killed_by_its_signal(host, tmp_path):
    proc = host.spawn(["sleep", "60"], log_path=tmp_path / "l")
    # The wrapper prints its pid before it reads the environment and starts sleep.
    assert eventually(lambda: psutil.Process(proc.pid).children() != [])
    sleeper = psutil.Process(proc.pid).children()[0]
    sleeper.send_signal(signal.SIGINT)
    assert eventually(lambda: proc.poll() is not None)
    assert proc.poll() == -signal.SIGINT


def test_a_program_that_does_not_exist_fails_with_the_shells_message(host, tmp_path):
    log = tmp_path / "l"
    proc = host.spawn(["/nonexistent/mqttbed", "agent"], log_path=log)
    assert eventually(lambda: proc.poll() is not None)
    assert proc.poll() == 127
    assert eventually(lambda: "not found" in log.read_text() or "No such" in log.read_text())


def test_an_unreachable_or_untrusted_host_is_refused_with_its_name(sshd, tmp_path):
    other = (sshd.root / "other_key.pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    with pytest.raises(SshError, match="SSH to lab-pi failed"):
        SshHost(SshTarget(**sshd.target(known_hosts=str(wrong))), name="lab-pi")


def test_mosquitto_given_an_ssh_host_to_deploy_starts_there_as_on_a_lab_host(host):
    """``deploy`` with an SshHost takes the lab-host path (it called a method that was gone)."""
    from mqttbed.brokers.mosquitto.backend import MosquittoBackend

    backend = MosquittoBackend()
    try:
        endpoint = backend.deploy({}, host)
        assert endpoint.host == host.address
        assert backend.health() is None
    finally:
        backend.teardown()
