"""The PAMS eBPF data plane on a topology's switch: load, attach to every port, configure.

One copy of the program and its maps serves every port: bpftool loads the object once
and pins programs and maps under ``/sys/fs/bpf/<prefix>/``, tc attaches the pinned
programs, and :func:`mqttbed.network.topology.reap` removes the pins with the namespaces.
"""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

from mqttbed.brokers.p4.bpf import PinnedMap
from mqttbed.brokers.p4.build import ensure_built
from mqttbed.brokers.p4.tables import EbpfTables
from mqttbed.network.commands import bpftool, run, tc
from mqttbed.network.topology import BPF_PIN_ROOT, CPU_PORT, HostPort, Topology, pin_dir

PROGRAMS = {"ingress": "pams_ingress", "egress": "pams_egress"}


def ensure_bpffs() -> None:
    """Mount the BPF file system at /sys/fs/bpf unless it is already there."""
    mounts = Path("/proc/mounts").read_text().split("\n")
    if not any(line.split()[1:3] == [str(BPF_PIN_ROOT), "bpf"] for line in mounts if line):
        run(["mount", "-t", "bpf", "bpf", str(BPF_PIN_ROOT)])


class EbpfSwitch:
    """The data plane of one topology's switch namespace."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.pins = pin_dir(topology.prefix)

    def load(self) -> EbpfTables:
        """Build, load and pin the program, attach it to every host port; return its tables."""
        ensure_bpffs()
        obj = ensure_built()
        self.pins.mkdir(parents=True, exist_ok=True)
        bpftool("prog", "loadall", str(obj), str(self.pins / "progs"),
                "pinmaps", str(self.pins / "maps"))
        for port in self.topology.switch_ports():
            self.attach(port)
        return EbpfTables(self.pins / "maps")

    def attach(self, port: str) -> None:
        """Put the programs on ``port``'s ingress and egress (clsact) in the switch namespace."""
        namespace = self.topology.switch_ns
        tc("qdisc", "add", "dev", port, "clsact", netns=namespace)
        for direction, program in PROGRAMS.items():
            tc("filter", "add", "dev", port, direction, "bpf", "direct-action",
               "object-pinned", str(self.pins / "progs" / program), netns=namespace)

    def configure(self, broker: HostPort, broker_port: int, *, accelerate: bool = True,
                  punt: bool = True) -> None:
        """Tell the program the broker's address, port and MAC, and whether to accelerate."""
        cpu = self.topology.switch_ifindex(CPU_PORT) if punt else 0
        value = struct.pack("<4s2s6sII", socket.inet_aton(broker.address),
                            struct.pack("!H", broker_port), bytes.fromhex(broker.mac.replace(
                                ":", "")), cpu, int(accelerate))
        config = PinnedMap(self.pins / "maps" / "broker_config")
        try:
            config.update(struct.pack("<I", 0), value)
        finally:
            config.close()

    def run_stats(self) -> dict[str, dict[str, int]]:
        """``run_cnt`` and ``run_time_ns`` per program (non-zero only with bpf_stats_enabled)."""
        stats = {}
        for program in PROGRAMS.values():
            shown = json.loads(bpftool("-j", "prog", "show", "pinned",
                                       str(self.pins / "progs" / program)))
            stats[program] = {"run_cnt": shown.get("run_cnt", 0),
                              "run_time_ns": shown.get("run_time_ns", 0)}
        return stats
