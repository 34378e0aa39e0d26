"""A run's impaired groups of clients: an agent of their own, behind their impaired link.

For a spec with ``network.impairments``, each impaired group (publishers, subscribers,
or one named client) gets one agent in a network namespace of its own, on one host of a
:class:`~mqttbed.network.topology.Topology`. That agent reaches the broker only through
its group's :class:`~mqttbed.network.impairment.ImpairedPath` (delay proxy, htb, iptables
drops on its management link) and the controller through a relay. Clients in no group
keep the default path exactly: agents on this machine, straight to the broker.

The broker stays where its backend put it; everything built here is reaped after the
run (and by ``reap_stale`` after a crash).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from mqttbed.agents.deploy import Site
from mqttbed.campaigns.spec import CLIENT_NAME, CampaignSpec, Impairment
from mqttbed.controller.agent_sites import AgentSites
from mqttbed.controller.assignments import ClientPlacement, client_ids
from mqttbed.core.errors import RunFailed
from mqttbed.core.host import Host
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.run_record import ImpairedGroup, NetworkRecord
from mqttbed.network.impairment import (
    MECHANISMS,
    ImpairedPath,
    LinkImpairment,
    Mechanism,
    iptables_version,
    netem_available,
)
from mqttbed.network.relay import TcpRelay
from mqttbed.network.topology import ROOT_ADDRESS, Topology, reap

PROXY_TRANSPORT: dict[Transport, Literal["tcp", "udp"]] = {
    Transport.MQTT_TCP: "tcp", Transport.MQTT_UDP: "udp", Transport.MQTT_SN_UDP: "udp"}


@dataclass(frozen=True)
class LinkGroup:
    """Clients sharing one link to the broker: an impaired group, or (None) the rest."""

    impairment: Impairment | None
    clients: list[str]


def link_groups(spec: CampaignSpec) -> list[LinkGroup]:
    """The unimpaired clients first, then each impaired group with clients, in spec order.

    A client named in an impairment belongs to that one, not to its role's group.
    """
    named = {i.group: i for i in spec.network.impairments if CLIENT_NAME.fullmatch(i.group)}
    by_role = {i.group: i for i in spec.network.impairments if i.group not in named}
    members: dict[str, list[str]] = {i.group: [] for i in spec.network.impairments}
    rest: list[str] = []
    for client in client_ids(spec):
        role = "publishers" if client.startswith("pub-") else "subscribers"
        group = named.get(client) or by_role.get(role)
        (rest if group is None else members[group.group]).append(client)
    return [LinkGroup(None, rest)] + [LinkGroup(i, members[i.group])
                                      for i in spec.network.impairments if members[i.group]]


def has_impaired_clients(spec: CampaignSpec) -> bool:
    """Whether any client of the run sits behind an impaired link."""
    return len(link_groups(spec)) > 1


class ImpairedLinks:
    """The namespaces, paths and relay of one run's impaired groups; close() reaps them."""

    def __init__(self, spec: CampaignSpec, endpoint: Endpoint, local: Host,
                 controller_url: str, work_dir: Path):
        self.spec, self.endpoint, self.local = spec, endpoint, local
        self.controller_url, self.work_dir = controller_url, work_dir
        self.groups = link_groups(spec)
        self.topology: Topology | None = None
        self.paths: dict[str, ImpairedPath] = {}
        self._relay: TcpRelay | None = None
        self._netem: bool | None = None
        self.mechanism: Mechanism | None = None

    def open(self) -> tuple[AgentSites, ClientPlacement]:
        """Build every impaired group's host and path; return the agents' sites and which
        agent plays which client. On failure everything built so far is reaped."""
        try:
            return self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> tuple[AgentSites, ClientPlacement]:
        transport = PROXY_TRANSPORT[self.endpoint.transport]
        impaired = [g for g in self.groups if g.impairment is not None]
        topology = self.topology = Topology([_host_name(g) for g in impaired])
        topology.build()
        self.mechanism = self._mechanism(topology.hosts[_host_name(impaired[0])].netns)
        url = urlsplit(self.controller_url)
        if url.hostname is None or url.port is None:
            raise RunFailed(f"controller URL {self.controller_url!r} has no host and port")
        self._relay = TcpRelay((url.hostname, url.port))
        relayed = url._replace(netloc=f"{ROOT_ADDRESS}:{self._relay.address[1]}").geturl()

        rest = self.groups[0].clients
        unimpaired_agents = min(self.spec.agents.resolved_count(), len(rest))
        sites = [Site(self.local)] * unimpaired_agents
        endpoints: list[Endpoint | None] = [None] * unimpaired_agents
        agent_of = {client: n % unimpaired_agents for n, client in enumerate(rest)}
        for seed, group in enumerate(impaired):
            assert group.impairment is not None
            name = _host_name(group)
            path = self.paths[name] = ImpairedPath(
                topology.prefix, topology.hosts[name], _link(group.impairment),
                (self.endpoint.host, self.endpoint.port), transport, self.work_dir, seed=seed,
                mechanism=self.mechanism)
            host, port = path.open()
            agent_of.update(dict.fromkeys(group.clients, len(sites)))
            sites.append(Site(topology.namespace_host(name), controller_url=relayed))
            endpoints.append(Endpoint(host=host, port=port, transport=self.endpoint.transport))
        return AgentSites(sites), ClientPlacement(agent_of, endpoints)

    def _mechanism(self, netns: str) -> Mechanism:
        """netem where the kernel has it (unless the spec says user-space), else user-space."""
        self._netem = netem_available(netns)
        asked = self.spec.network.mechanism
        if asked == "netem" and not self._netem:
            raise RunFailed("network.mechanism is netem but this kernel has no netem (`tc "
                            "qdisc add ... netem` fails); use auto or user-space")
        return "netem" if self._netem and asked != "user-space" else "user-space"

    def health(self) -> str | None:
        """None while every delay proxy runs, else why not."""
        return next((broken for path in self.paths.values()
                     if (broken := path.health()) is not None), None)

    def metadata(self, with_proxy_stats: bool = False) -> NetworkRecord:
        """What impaired which clients, and how: mechanism, commands, proxies' own error."""
        groups = {}
        for group in self.groups[1:]:
            assert group.impairment is not None
            path = self.paths.get(_host_name(group))
            groups[group.impairment.group] = ImpairedGroup(
                **group.impairment.model_dump(exclude={"group"}),
                clients=group.clients,
                namespace=None if path is None else path.host.netns,
                proxy=None if path is None or path.port is None
                else f"{ROOT_ADDRESS}:{path.port}",
                commands=[] if path is None else path.commands,
                **({"proxy_stats": path.proxy_stats() if path else None,
                    "packets_dropped": path.packets_dropped() if path else None}
                   if with_proxy_stats else {}))
        return NetworkRecord(
            mechanism=None if self.mechanism is None else MECHANISMS[self.mechanism],
            netem_available=self._netem, iptables=iptables_version(),
            semantics="delay_ms one way, added in each direction; loss_percent and "
                      "rate_kbit apply to each direction on its own",
            topology_prefix=None if self.topology is None else self.topology.prefix,
            groups=groups)

    def close(self) -> dict[str, Any]:
        """Stop proxies and relay, reap the namespaces; return each proxy's last statistics."""
        stats = {name: path.close() for name, path in self.paths.items()}
        if self._relay is not None:
            self._relay.close()
        if self.topology is not None:
            reap(self.topology.prefix)
        return stats


def _host_name(group: LinkGroup) -> str:
    assert group.impairment is not None
    return f"{group.impairment.group}-link"


def _link(impairment: Impairment) -> LinkImpairment:
    return LinkImpairment(**impairment.model_dump(exclude={"group"}))
