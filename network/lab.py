"""A lab on one machine: N "hosts" as network namespaces on a private bridge, each with sshd.

The closest this machine gets to a rack of Raspberry Pis. Layout for prefix ``P``::

    root namespace:  bridge ``Pbr`` with the lab address (.254 of a free 10.78.x.0/24):
                     the controller's MQTTBED_LAB_ADDRESS; veth ``PvI`` per host on it
    namespace P-hI:  ``eth0`` with .(I+1); its own sshd on port 22 with its own host key,
                     a HOME of its own under the lab directory (where its agent venv goes)

Every host is reached over real SSH on its own address, so provisioning and agents go
through the same code as for a Pi. The namespaces share this machine's file system,
kernel and clock: what the lab does not cover is ARM, real GPIO pins, and clocks that
differ (every host reads the same CLOCK_MONOTONIC).

Every name starts with the prefix, so :func:`mqttbed.network.topology.reap` removes the
namespaces (killing every sshd, agent and broker inside them) and the root-side links.
``python -m mqttbed.network.lab up|down`` (``make lab-up`` / ``make lab-down``) keeps a
lab running between commands, its state in ``lab.json`` of its directory.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mqttbed.core.errors import system_deps_hint
from mqttbed.network import netns
from mqttbed.network.commands import NetworkCommandError, ip
from mqttbed.network.topology import _quiet_root_link, leftovers, reap

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
SUBNET_CANDIDATES = [ipaddress.IPv4Network(f"10.78.{n}.0/24") for n in range(0, 255)]
HOST_IFACE = "eth0"
STATE_FILE = "lab.json"
SSHD_START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class LabHost:
    """One namespace host: how to reach it over SSH and where its files live."""

    name: str
    netns: str
    address: str
    home: str
    known_hosts_key: str   # its host public key, ``type base64`` (what ssh-keyscan shows)

    @property
    def ssh_destination(self) -> str:
        return f"root@{self.address}"


class LabNetwork:
    """Builds the bridge, the host namespaces and their sshd; a context manager reaps it."""

    def __init__(self, host_names: list[str], root: Path, *, prefix: str | None = None):
        if not host_names or len(set(host_names)) != len(host_names):
            raise ValueError(f"host names must be unique and at least one: {host_names}")
        if len(host_names) > 250:
            raise ValueError(f"{len(host_names)} hosts: a lab /24 holds at most 250")
        self.prefix = prefix or "lb" + secrets.token_hex(3)[:5]
        self.host_names = list(host_names)
        self.root = root
        self.bridge = f"{self.prefix}br"
        self.hosts: dict[str, LabHost] = {}
        self.lab_address = ""
        self.client_key = root / "client_key"

    def __enter__(self) -> LabNetwork:
        try:
            self.build()
        except BaseException:
            self.reap()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.reap()

    def build(self) -> None:
        """Create the bridge, then every host with its sshd; write ``lab.json``."""
        if not Path(SSHD).exists():
            raise NetworkCommandError([SSHD], 127, "sshd not found: " + system_deps_hint(
                "lab", "openssh-server"))
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)   # sshd refuses to start without it
        self.root.mkdir(parents=True, exist_ok=True)
        _keygen(self.client_key)
        lab = create_bridge(self.bridge)
        self.lab_address, subnet = str(lab.ip), lab.network
        self._save()   # the prefix on disk before any namespace exists: `down` finds it
        for index, name in enumerate(self.host_names):
            self.hosts[name] = self._host(index, name, subnet)
        self._save()

    def _host(self, index: int, name: str, subnet: ipaddress.IPv4Network) -> LabHost:
        namespace, root_link = f"{self.prefix}-h{index}", f"{self.prefix}v{index}"
        netns.create(namespace)
        ip("link", "add", root_link, "type", "veth", "peer", "name", HOST_IFACE,
           "netns", namespace)
        attach_to_bridge(root_link, self.bridge)
        address = str(subnet.network_address + index + 1)
        ip("addr", "add", f"{address}/24", "dev", HOST_IFACE, netns=namespace)
        ip("link", "set", HOST_IFACE, "up", netns=namespace)
        host_dir = self.root / name
        home = host_dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        _keygen(host_dir / "host_key")
        config = host_dir / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {address}:22", f"HostKey {host_dir / 'host_key'}",
            f"AuthorizedKeysFile {self.client_key}.pub", f"PidFile {host_dir / 'sshd.pid'}",
            "UsePAM no", "StrictModes no", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
            "Subsystem sftp internal-sftp", "MaxStartups 50",
            # Each host has a home of its own (the namespaces share one file system).
            f"SetEnv HOME={home}", ""]))
        with (host_dir / "sshd.log").open("ab") as log:
            subprocess.Popen(["ip", "netns", "exec", namespace, SSHD, "-D", "-e", "-f",
                              str(config)], stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        _wait_for_banner(namespace, address, host_dir / "sshd.log")
        key = (host_dir / "host_key.pub").read_text().split()
        return LabHost(name=name, netns=namespace, address=address, home=str(home),
                       known_hosts_key=f"{key[0]} {key[1]}")

    def _save(self) -> None:
        state = {"prefix": self.prefix, "lab_address": self.lab_address,
                 "client_key": str(self.client_key),
                 "hosts": [asdict(host) for host in self.hosts.values()]}
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=2))

    def reap(self) -> None:
        """Remove the namespaces (and everything running in them) and the root links."""
        reap(self.prefix)

    def leftovers(self) -> list[str]:
        """Whatever of this lab still exists on the machine (empty once reaped)."""
        return leftovers(self.prefix)


def create_bridge(bridge: str) -> ipaddress.IPv4Interface:
    """Create a lab bridge named ``bridge`` with .254 of a free 10.78.x.0/24; return it.

    :class:`LabNetwork`'s bridge, and the lab VM's (:mod:`mqttbed.network.lab_vm`): the
    same layout, so the controller's address is found the same way.
    """
    subnet = _free_subnet()
    address = ipaddress.IPv4Interface(f"{subnet.broadcast_address - 1}/{subnet.prefixlen}")
    ip("link", "add", bridge, "type", "bridge")
    _quiet_root_link(bridge)
    ip("addr", "add", str(address), "dev", bridge)
    ip("link", "set", bridge, "up")
    return address


def attach_to_bridge(link: str, bridge: str) -> None:
    """Enslave a root-side ``link`` we made (a veth, a VM's tap) to ``bridge`` and bring it up."""
    _quiet_root_link(link)
    ip("link", "set", link, "master", bridge, "up")


def _keygen(path: Path) -> None:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name,
                        "-f", str(path)], check=True)


def _free_subnet() -> ipaddress.IPv4Network:
    """The first 10.78.x.0/24 that no route of the root namespace overlaps."""
    routes = json.loads(ip("-j", "-4", "route", "show", "table", "all"))
    used = [ipaddress.ip_network(r["dst"] if "/" in r["dst"] else f"{r['dst']}/32",
                                 strict=False)
            for r in routes if r.get("dst", "default")[0].isdigit()]
    for candidate in SUBNET_CANDIDATES:
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise NetworkCommandError(["ip", "route"], 1, "every lab /24 in 10.78.0-254 is taken")


def _wait_for_banner(namespace: str, address: str, log: Path) -> None:
    deadline = time.monotonic() + SSHD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), netns.socket_in(
                namespace, socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            s.connect((address, 22))
            if s.recv(64).startswith(b"SSH-2.0"):
                return
        time.sleep(0.05)
    raise NetworkCommandError([SSHD], 1, f"sshd in {namespace} did not answer on "
                              f"{address}:22: {log.read_text(errors='replace')[-500:]}")


def load(root: Path) -> dict:
    """The state ``up`` wrote into ``root``."""
    return json.loads((root / STATE_FILE).read_text())


def main(argv: list[str] | None = None) -> int:
    """``up --hosts N --dir D`` builds a lab and leaves it running; ``down --dir D`` reaps it."""
    parser = argparse.ArgumentParser(prog="python -m mqttbed.network.lab")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="create N namespace hosts with sshd on a private bridge")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--dir", type=Path, default=Path("data/lab"))
    down = sub.add_parser("down", help="remove the lab in --dir and everything in it")
    down.add_argument("--dir", type=Path, default=Path("data/lab"))
    args = parser.parse_args(argv)
    if args.command == "up":
        if (args.dir / STATE_FILE).exists():
            parser.error(f"{args.dir / STATE_FILE} exists: a lab is up there; "
                         f"`make lab-down` (or `down --dir {args.dir}`) first")
        if not 1 <= args.hosts <= 250:
            parser.error(f"--hosts {args.hosts}: between 1 and 250")
        lab = LabNetwork([f"lab-{i}" for i in range(args.hosts)], args.dir)
        try:
            lab.build()
        except BaseException:
            lab.reap()
            raise
        print(f"lab {lab.prefix}: controller address {lab.lab_address}")
        for host in lab.hosts.values():
            print(f"  {host.name}: ssh -i {lab.client_key} {host.ssh_destination} "
                  f"(namespace {host.netns})")
        print(f"provision: mqttbed lab provision --key {lab.client_key} --trust-new "
              + " ".join(f"{h.name}={h.ssh_destination}" for h in lab.hosts.values()))
        return 0
    state_path = args.dir / STATE_FILE
    if not state_path.exists():
        print(f"no lab in {args.dir} ({state_path} missing)", file=sys.stderr)
        return 1
    reap(load(args.dir)["prefix"])
    shutil.rmtree(args.dir)
    print(f"lab in {args.dir} removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
