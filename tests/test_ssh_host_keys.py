"""Host keys over SSH against a real sshd: unknown keys refused unless the entry trusts
new ones, then pinned and held to; a changed key always refused, saying how to fix it."""

from __future__ import annotations

import re
import stat

import pytest

from mqttbed.campaigns.spec import parse_spec
from mqttbed.core.ssh import SshError, SshHost, SshTarget
from tests.sshd import LocalSshd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def sshd(tmp_path):
    (tmp_path / "sshd").mkdir()
    server = LocalSshd(tmp_path / "sshd")
    yield server
    server.stop()


def target(sshd: LocalSshd, known_hosts, **extra) -> SshTarget:
    return SshTarget(**sshd.target(known_hosts=str(known_hosts), **extra))


def test_an_unknown_host_key_is_refused_naming_the_host_the_key_and_the_fix(sshd, tmp_path):
    known_hosts = tmp_path / "nowhere" / "known_hosts"
    with pytest.raises(SshError) as refused:
        SshHost(target(sshd, known_hosts), name="lab-pi")
    message = str(refused.value)
    assert message.startswith(f"SSH to lab-pi failed: the host key of [127.0.0.1]:{sshd.port} "
                              "(ssh-ed25519 SHA256:")
    assert f"is not in {known_hosts}, so it is refused" in message
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {known_hosts}" in message
    assert "set trust_new: true in this host's entry" in message
    assert not known_hosts.exists()


def test_trust_new_pins_the_key_on_first_connect_and_uses_it_from_then_on(sshd, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    first = SshHost(target(sshd, known_hosts, trust_new=True))
    assert first.run(["echo", "hi"], "greet") == "hi"
    first.close()
    assert known_hosts.read_text() == sshd.known_hosts_line()
    assert stat.S_IMODE(known_hosts.stat().st_mode) == 0o600

    again = SshHost(target(sshd, known_hosts))  # pinned: no trust needed any more
    again.close()
    assert known_hosts.read_text() == sshd.known_hosts_line()  # not pinned twice

    sshd.rotate_host_key()
    with pytest.raises(SshError) as refused:
        SshHost(target(sshd, known_hosts, trust_new=True))  # trust_new never overrides a pin
    message = str(refused.value)
    assert re.search(rf"the host key of \[127.0.0.1\]:{sshd.port} changed: it offers "
                     r"ssh-ed25519 SHA256:\S+, .* pins SHA256:", message)
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {known_hosts}" in message


def test_without_known_hosts_the_users_file_is_used(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    fields = {k: v for k, v in sshd.target().items() if k != "known_hosts"}
    with pytest.raises(SshError, match=r"is not in .*home/\.ssh/known_hosts"):
        SshHost(SshTarget(**fields))
    SshHost(SshTarget(**fields, trust_new=True)).close()
    pinned = tmp_path / "home" / ".ssh" / "known_hosts"
    assert pinned.read_text() == sshd.known_hosts_line()
    assert stat.S_IMODE(pinned.parent.stat().st_mode) == 0o700


def test_agent_hosts_and_boards_take_trust_new():
    spec = parse_spec({"name": "lab", "agents": {"hosts": [
        {"host": "pi@10.0.0.21", "trust_new": True}, {"host": "pi@10.0.0.22"}]}})
    assert [h.trust_new for h in spec.agents.hosts] == [True, False]
