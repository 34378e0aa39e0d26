"""Where a run's agents run: this machine, or the campaign's lab hosts over SSH."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from mqttbed.agents.deploy import Site
from mqttbed.campaigns.spec import CampaignSpec
from mqttbed.core.errors import RunFailed
from mqttbed.core.host import Host
from mqttbed.core.ssh import SshError, SshHost


@dataclass
class AgentSites:
    """One site per agent the run needs, and the SSH connections to close after it."""

    sites: list[Site]
    ssh_hosts: list[SshHost] = field(default_factory=list)

    def close(self) -> None:
        for host in self.ssh_hosts:
            host.close()


def open_sites(spec: CampaignSpec, local: Host, needed: int) -> AgentSites:
    """Sites for ``needed`` agents: hosts in the spec's order, or this machine.

    Fails the run before anything starts when a lab host could not reach the controller
    (this machine has no lab address) or cannot be reached over SSH.
    """
    if not spec.agents.hosts:
        return AgentSites([Site(local)] * needed)
    opened = AgentSites([])
    for i, target in enumerate(spec.agents.hosts):
        if len(opened.sites) >= needed:
            break
        if not target.host:
            opened.close()
            raise RunFailed(f"agents.hosts[{i}] names lab host {target.name!r}, which was "
                            "not resolved: create the campaign through a controller")
        if _is_loopback(local.address) and not _is_loopback(target.address):
            opened.close()
            raise RunFailed(f"agents.hosts[{i}] ({target.host}) cannot reach this controller "
                            f"or its broker on {local.address}: set MQTTBED_LAB_ADDRESS to this "
                            f"machine's address on the lab network")
        try:
            host = SshHost(target, name=target.name)  # else named by its SSH destination
        except SshError as exc:
            opened.close()
            raise RunFailed(f"agents.hosts[{i}]: {exc}") from exc
        opened.ssh_hosts.append(host)
        # The controller's own CA file means nothing there: the entry names the host's.
        env = {"MQTTBED_CA_FILE": target.ca_file or ""}
        opened.sites += [Site(host, (target.command, "agent"), env=env)] * target.count
    opened.sites = opened.sites[:needed]
    return opened


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: assume it is somewhere on the lab network
