"""A switch namespace with a bridge, host namespaces on its ports, and a way back to the root.

Layout for hosts ``h0 … hN`` under prefix ``P`` (7 characters, e.g. ``mb3fa9c``)::

    namespace P-sw:  bridge br0 with ports p0 … pN (veth); port ``cpu`` (veth) whose peer
                     ``Pc`` sits in the root namespace for the controller to read
    namespace P-hI:  ``sw0`` (peer of pI) with 10.77.0.(I+1)/24 on the switch network, and
                     ``mgmt0`` (peer of root-side ``PmI``) on a /30 of the management /24

The root-side management veths all carry :data:`ROOT_ADDRESS`, and every host routes it
through its ``mgmt0``: a listener in the root namespace on that address (the controller's
HTTP port) is reachable from every host, and nothing else outside the namespaces is.

Every name starts with the prefix and every creation is journalled before it happens, so
:func:`reap` removes all of it after a run or after the builder was killed mid-way.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mqttbed.core.procfs import pids, process_strings
from mqttbed.network import netns
from mqttbed.network.commands import NetworkCommandError, ip, run
from mqttbed.network.host import NamespaceHost

ROOT_ADDRESS = "10.77.255.254"
SWITCH_SUBNET = ipaddress.ip_network("10.77.0.0/24")
MGMT_CANDIDATES = [ipaddress.IPv4Network(f"10.77.{n}.0/24") for n in range(128, 255)]
JOURNAL_DIR = Path("/run/mqttbed/net")
MGMT_LOCK = "mgmt.lock"   # in JOURNAL_DIR: held while a builder claims a management /24
BPF_PIN_ROOT = Path("/sys/fs/bpf")
PREFIX_LEN = 7
HOST_IFACE = "sw0"
MGMT_IFACE = "mgmt0"
BRIDGE = "br0"
CPU_PORT = "cpu"
# A helper process a run starts in the root namespace (the delay proxy) carries
# ``--topology PREFIX`` in its argv: that is how reap finds it after a crash.
TOPOLOGY_FLAG = "--topology"


def new_prefix() -> str:
    """A fresh run-unique prefix: ``mb`` and 5 hex digits, short enough for 15-char links."""
    return "mb" + secrets.token_hex(3)[:PREFIX_LEN - 2]


def pin_dir(prefix: str) -> Path:
    """Where the eBPF objects of the run with ``prefix`` are pinned."""
    return BPF_PIN_ROOT / prefix


@dataclass(frozen=True)
class HostPort:
    """One host namespace and where it plugs into the switch."""

    name: str
    netns: str
    address: str          # on the switch network
    mac: str              # of its ``sw0``
    port: str             # the switch-side veth, in the switch namespace
    port_ifindex: int     # ... and its ifindex there (what the data plane redirects to)
    mgmt_address: str     # its end of the management /30
    mgmt_link: str = ""   # the root-side veth of that /30 (traffic towards the host leaves it)


class Topology:
    """Builds the switch and its hosts; use as a context manager to reap it on the way out."""

    def __init__(self, hosts: list[str], *, prefix: str | None = None):
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"host names must be unique and at least one: {hosts}")
        if len(hosts) > 63:
            raise ValueError(f"{len(hosts)} hosts: a topology holds at most 63 (one /30 each "
                             "in a management /24)")
        self.prefix = prefix or new_prefix()
        if len(self.prefix) != PREFIX_LEN:
            raise ValueError(f"prefix {self.prefix!r} must be {PREFIX_LEN} characters")
        self.host_names = list(hosts)
        self.switch_ns = f"{self.prefix}-sw"
        self.cpu_peer = f"{self.prefix}c"
        self.hosts: dict[str, HostPort] = {}
        self._journal = Journal(self.prefix)
        self._mgmt: ipaddress.IPv4Network | None = None

    def __enter__(self) -> Topology:
        try:
            self.build()
        except BaseException:
            reap(self.prefix)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        reap(self.prefix)

    def build(self) -> None:
        """Create the switch namespace, its bridge and CPU port, then every host."""
        self._journal.start()
        self._namespace(self.switch_ns)
        ip("link", "add", BRIDGE, "type", "bridge", netns=self.switch_ns)
        ip("link", "set", BRIDGE, "up", netns=self.switch_ns)
        self._journal.record("link", self.cpu_peer)
        ip("link", "add", self.cpu_peer, "type", "veth", "peer", "name", CPU_PORT,
           "netns", self.switch_ns)
        _quiet_root_link(self.cpu_peer)
        ip("link", "set", self.cpu_peer, "up")
        ip("link", "set", CPU_PORT, "up", netns=self.switch_ns)
        # The subnet is free until the first host's root-side address routes part of it:
        # another builder (a second controller, `mqttbed run` beside `serve`) must not
        # choose it in between.
        with _mgmt_lock():
            self._mgmt = _free_mgmt_subnet()
            first = self.host_names[0]
            self.hosts[first] = self._host(0, first, self._mgmt)
        for index, name in enumerate(self.host_names[1:], start=1):
            self.hosts[name] = self._host(index, name, self._mgmt)

    def add_host(self, name: str) -> HostPort:
        """Plug one more host into the built switch (a backend learns its agents late)."""
        if self._mgmt is None or name in self.hosts:
            raise ValueError(f"host {name!r}: the topology must be built and the name new")
        if len(self.hosts) >= 63:
            raise ValueError("a topology holds at most 63 hosts")
        self.host_names.append(name)
        self.hosts[name] = self._host(len(self.hosts), name, self._mgmt)
        return self.hosts[name]

    def _namespace(self, name: str) -> None:
        self._journal.record("netns", name)
        netns.create(name)
        run(["ip", "netns", "exec", name, "sysctl", "-q", "-w",
             "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])

    def _host(self, index: int, name: str, mgmt: ipaddress.IPv4Network) -> HostPort:
        host_ns, port = f"{self.prefix}-h{index}", f"p{index}"
        self._namespace(host_ns)
        ip("link", "add", port, "netns", self.switch_ns, "type", "veth", "peer", "name",
           HOST_IFACE, "netns", host_ns)
        ip("link", "set", port, "master", BRIDGE, "up", netns=self.switch_ns)
        address = str(SWITCH_SUBNET.network_address + index + 1)
        ip("addr", "add", f"{address}/{SWITCH_SUBNET.prefixlen}", "dev", HOST_IFACE,
           netns=host_ns)
        ip("link", "set", HOST_IFACE, "up", netns=host_ns)
        mgmt_address = self._management(index, host_ns, mgmt)
        return HostPort(name=name, netns=host_ns, address=address,
                        mac=link_info(HOST_IFACE, host_ns)["address"], port=port,
                        port_ifindex=link_info(port, self.switch_ns)["ifindex"],
                        mgmt_address=mgmt_address, mgmt_link=f"{self.prefix}m{index}")

    def _management(self, index: int, host_ns: str, mgmt: ipaddress.IPv4Network) -> str:
        """A /30 between the host and the root namespace; return the host's end."""
        root_link = f"{self.prefix}m{index}"
        root_end = str(mgmt.network_address + 4 * index + 1)
        host_end = str(mgmt.network_address + 4 * index + 2)
        self._journal.record("link", root_link)
        ip("link", "add", root_link, "type", "veth", "peer", "name", MGMT_IFACE,
           "netns", host_ns)
        _quiet_root_link(root_link)
        ip("addr", "add", f"{root_end}/30", "dev", root_link)
        ip("addr", "add", f"{ROOT_ADDRESS}/32", "dev", root_link)
        ip("link", "set", root_link, "up")
        ip("addr", "add", f"{host_end}/30", "dev", MGMT_IFACE, netns=host_ns)
        ip("link", "set", MGMT_IFACE, "up", netns=host_ns)
        ip("route", "add", f"{ROOT_ADDRESS}/32", "via", root_end, "dev", MGMT_IFACE,
           netns=host_ns)
        return host_end

    def namespace_host(self, name: str) -> NamespaceHost:
        """The :class:`NamespaceHost` for host ``name``, to deploy processes into."""
        port = self.hosts[name]
        return NamespaceHost(name=name, netns=port.netns, address=port.address,
                             controller_address=ROOT_ADDRESS)

    def switch_ports(self) -> list[str]:
        """The switch-side veths of every host, in host order."""
        return [port.port for port in self.hosts.values()]

    def switch_ifindex(self, link: str) -> int:
        """The ifindex of ``link`` inside the switch namespace."""
        return link_info(link, self.switch_ns)["ifindex"]


def link_info(link: str, namespace: str | None = None) -> dict:
    """``ip -j link show dev LINK`` as a dict (``ifindex``, ``address``, ``ifname``, …)."""
    return json.loads(ip("-j", "link", "show", "dev", link, netns=namespace))[0]


def _quiet_root_link(link: str) -> None:
    """No IPv6 (router solicitations, DAD) and no forwarding on a root-side link we made."""
    for path in (f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6",
                 f"/proc/sys/net/ipv4/conf/{link}/forwarding"):
        if Path(path).exists():
            Path(path).write_text("1" if "ipv6" in path else "0")


@contextlib.contextmanager
def _mgmt_lock() -> Iterator[None]:
    """Hold the machine-wide lock on choosing a management subnet (an flock, released
    when its holder exits, however it exits)."""
    JOURNAL_DIR.mkdir(parents=True, exist_ok=True)
    with (JOURNAL_DIR / MGMT_LOCK).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def _free_mgmt_subnet() -> ipaddress.IPv4Network:
    """The first management /24 that no route of the root namespace overlaps."""
    routes = json.loads(ip("-j", "-4", "route", "show", "table", "all"))
    used = []
    for route in routes:
        dst = route.get("dst", "")
        if dst and dst != "default" and dst[0].isdigit():
            used.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    for candidate in MGMT_CANDIDATES:
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise NetworkCommandError(["ip", "route"], 1, "every management /24 in 10.77.128-254 is "
                              "taken: reap old topologies (mqttbed.network.topology.reap_stale)")


class Journal:
    """What a topology created, written before each creation, with the builder's pid."""

    def __init__(self, prefix: str):
        self.path = JOURNAL_DIR / f"{prefix}.json"
        self.entries: list[list[str]] = []

    def start(self) -> None:
        """Open the journal, recording the pin directory the data plane will use."""
        self.record("pins", str(pin_dir(self.path.stem)))

    def record(self, kind: str, name: str) -> None:
        """Note ``name`` before creating it, so a crash right after still leaves a trace."""
        self.entries.append([kind, name])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "created": self.entries}))
        tmp.replace(self.path)


def reap(prefix: str) -> None:
    """Remove every namespace, root-side link, pin and journal of the run with ``prefix``.

    Found by name as well as through the journal, so it works for a builder that died
    before journalling its last step, and it is safe to call twice. Root-namespace
    helpers tagged with the prefix (:data:`TOPOLOGY_FLAG`) are killed first.
    """
    for pid in tagged_processes(prefix):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for name in netns.names():
        if name.startswith(f"{prefix}-"):
            netns.delete(name)
    for link in _root_links(prefix):
        ip("link", "delete", link, check=False)
    shutil.rmtree(pin_dir(prefix), ignore_errors=True)
    (JOURNAL_DIR / f"{prefix}.json").unlink(missing_ok=True)
    (JOURNAL_DIR / f"{prefix}.tmp").unlink(missing_ok=True)


def leftovers(prefix: str) -> list[str]:
    """Whatever of the run with ``prefix`` still exists (empty once reaped)."""
    found = [f"netns {n}" for n in netns.names() if n.startswith(f"{prefix}-")]
    found += [f"process {pid}" for pid in tagged_processes(prefix)]
    found += [f"link {link}" for link in _root_links(prefix)]
    if pin_dir(prefix).exists():
        found.append(f"pins {pin_dir(prefix)}")
    return found


def tagged_processes(prefix: str) -> list[int]:
    """Pids of live processes whose argv holds ``--topology PREFIX`` (zombies excluded; one
    in the middle of an ``execve`` is read again, not missed: :mod:`mqttbed.core.procfs`)."""
    tag = [TOPOLOGY_FLAG.encode(), prefix.encode()]
    found = []
    for pid in pids():
        argv = process_strings(pid, "cmdline") or []  # None: ended meanwhile
        if any(argv[i:i + 2] == tag for i in range(len(argv) - 1)):
            found.append(pid)
    return found


def reap_stale() -> list[str]:
    """Reap every journalled topology whose builder is no longer alive; return the prefixes."""
    reaped = []
    for journal in sorted(JOURNAL_DIR.glob("*.json")) if JOURNAL_DIR.is_dir() else []:
        try:
            pid = json.loads(journal.read_text())["pid"]
        except FileNotFoundError:
            continue  # torn down, or reaped by another process, since the listing
        except (ValueError, KeyError):
            pid = None
        if pid is None or not Path(f"/proc/{pid}").exists():
            reap(journal.stem)
            reaped.append(journal.stem)
    return reaped


def _root_links(prefix: str) -> list[str]:
    links = json.loads(ip("-j", "link", "show"))
    return [link["ifname"] for link in links if link["ifname"].startswith(prefix)]
