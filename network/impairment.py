"""Link impairment: delay, jitter, loss and a rate cap on the path of one host to the broker.

This kernel has no netem (``tc qdisc add … netem`` fails: unknown qdisc kind), so each
impairment is built from parts that work here (mechanism ``user-space``), all on the
real path of the host's packets to the broker:

- **delay and jitter**: the user-space delay proxy (:mod:`.delay_proxy`), one process
  per impaired host, in the root namespace on :data:`~.topology.ROOT_ADDRESS`, forwarding
  to the broker; the host's clients connect to it over their management link.
- **rate cap**: htb on both ends of that link (the host's ``mgmt0`` for upstream, the
  root-side veth for downstream). Only the broker path's packets (the proxy's port) fall
  in the capped class; the agent's controller traffic on the same link is not shaped.
- **loss**: iptables ``-m statistic --mode random`` drops inside the host's namespace,
  OUTPUT for upstream and INPUT for downstream, again only on the proxy's port.

On a kernel with netem (mechanism ``netem``, detected per run), netem does delay, jitter
and loss as the leaf of the same htb class on both ends, and the proxy forwards without
delay (it is still how a namespace reaches a broker on the root's loopback). That path
is not exercised on this machine; only its commands are tested.

Every value applies to **each direction** of the link on its own: 50 ms delay adds 50 ms
upstream and 50 ms downstream; 20 % loss drops 20 % of the packets either way. A
message from an unimpaired publisher to an impaired subscriber crosses the impaired
link once (downstream), so it gains the delay once and is lost with the loss
probability once.

Everything lives inside the topology's namespaces, on its links, or in a process tagged
with its prefix, so :func:`~.topology.reap` removes all of it after the run, or after a
crash of the process that built it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mqttbed.core.host import LocalHost, LocalProcess
from mqttbed.network.commands import NetworkCommandError, run, tc
from mqttbed.network.topology import MGMT_IFACE, ROOT_ADDRESS, TOPOLOGY_FLAG, HostPort

# What each mechanism is, as the run's metadata records it. netem is used where the
# kernel has it (detected per run); this machine's kernel does not.
MECHANISMS = {
    "user-space": "user-space delay proxy + htb + iptables statistic",
    "netem": "netem (delay, jitter, loss) under htb (rate cap), both ends of the link; a "
             "proxy without delay forwards to the broker",
}
Mechanism = Literal["user-space", "netem"]
NETEM_LIMIT = 100_000  # packets held at once (the default 1000 drops at delay x rate)
PROXY_MODULE = "mqttbed.network.delay_proxy"
IP_PROTOCOL = {"tcp": 6, "udp": 17}
UNSHAPED_RATE = "10gbit"
READY_TIMEOUT_S = 10.0
STATS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class LinkImpairment:
    """What one link does to packets, per direction: delay, jitter, loss, rate cap."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    rate_kbit: int | None = None


def netem_available(netns: str) -> bool:
    """Whether this kernel has netem: try it on the loopback of namespace ``netns``."""
    try:
        tc("qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", netns=netns)
    except NetworkCommandError:
        return False
    tc("qdisc", "del", "dev", "lo", "root", netns=netns, check=False)
    return True


def iptables_version() -> str:
    """``iptables --version`` (which backend, nf_tables or legacy, drops the packets)."""
    return run(["iptables", "--version"]).strip()


class ImpairedPath:
    """The impaired path of one topology host to the broker: proxy, htb, iptables drops.

    :meth:`open` returns the address the host's clients use instead of the broker's.
    """

    def __init__(self, prefix: str, host: HostPort, impairment: LinkImpairment,
                 upstream: tuple[str, int], transport: Literal["tcp", "udp"], work_dir: Path,
                 seed: int = 0, mechanism: Mechanism = "user-space"):
        self.prefix, self.host, self.impairment = prefix, host, impairment
        self.upstream, self.transport, self.seed = upstream, transport, seed
        self.mechanism = mechanism
        self.work_dir = work_dir
        self.port: int | None = None
        self.commands: list[str] = []
        self._proxy: LocalProcess | None = None

    @property
    def _ready_file(self) -> Path:
        return self.work_dir / f"proxy-{self.host.name}.ready.json"

    @property
    def _stats_file(self) -> Path:
        return self.work_dir / f"proxy-{self.host.name}.stats.json"

    def open(self) -> tuple[str, int]:
        """Start the proxy, cap and drop on the link; return where clients connect."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = self._start_proxy()
        if self.mechanism == "netem":
            self._shape(self.impairment.rate_kbit, self._netem_args())
            return ROOT_ADDRESS, self.port
        if self.impairment.rate_kbit is not None:
            self._shape(self.impairment.rate_kbit)
        if self.impairment.loss_percent > 0:
            self._drop(self.impairment.loss_percent / 100)
        return ROOT_ADDRESS, self.port

    def _netem_args(self) -> list[str]:
        """netem's delay, jitter and loss for this link (each end gets the same)."""
        i = self.impairment
        return ["netem", "limit", str(NETEM_LIMIT), "delay", f"{i.delay_ms}ms",
                *([f"{i.jitter_ms}ms"] if i.jitter_ms else []),
                *(["loss", f"{i.loss_percent}%"] if i.loss_percent else [])]

    def _start_proxy(self) -> int:
        self._ready_file.unlink(missing_ok=True)
        in_proxy = self.impairment if self.mechanism == "user-space" else LinkImpairment()
        argv = [sys.executable, "-m", PROXY_MODULE, TOPOLOGY_FLAG, self.prefix,
                "--listen", f"{ROOT_ADDRESS}:0", "--upstream", "{}:{}".format(*self.upstream),
                "--transport", self.transport, "--delay-ms", str(in_proxy.delay_ms),
                "--jitter-ms", str(in_proxy.jitter_ms), "--seed", str(self.seed),
                "--ready-file", str(self._ready_file), "--stats-file", str(self._stats_file)]
        self._proxy = LocalHost().spawn(argv, log_path=self.work_dir / f"proxy-{self.host.name}"
                                        ".log")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready_file.exists():
            if (code := self._proxy.poll()) is not None or time.monotonic() > deadline:
                raise NetworkCommandError(argv, -1 if code is None else code,
                                          f"the delay proxy did not bind; see {self.work_dir}")
            time.sleep(0.01)
        return json.loads(self._ready_file.read_text())["port"]

    def _shape(self, rate_kbit: int | None, leaf: list[str] | None = None) -> None:
        """htb on both ends of the management link: the proxy's port in class 1:1 (capped
        at ``rate_kbit``, with qdisc ``leaf`` under it), everything else in 1:2."""
        rate = UNSHAPED_RATE if rate_kbit is None else f"{rate_kbit}kbit"
        for netns, link, match in ((self.host.netns, MGMT_IFACE, "dport"),
                                   (None, self.host.mgmt_link, "sport")):
            self._tc(netns, "qdisc", "add", "dev", link, "root", "handle", "1:", "htb",
                     "default", "2")
            self._tc(netns, "class", "add", "dev", link, "parent", "1:", "classid", "1:1",
                     "htb", "rate", rate, "ceil", rate)
            self._tc(netns, "class", "add", "dev", link, "parent", "1:", "classid", "1:2",
                     "htb", "rate", UNSHAPED_RATE, "quantum", "60000")
            self._tc(netns, "filter", "add", "dev", link, "parent", "1:", "protocol", "ip",
                     "prio", "1", "u32", "match", "ip", "protocol",
                     str(IP_PROTOCOL[self.transport]), "0xff", "match", "ip", match,
                     str(self.port), "0xffff", "flowid", "1:1")
            if leaf:
                self._tc(netns, "qdisc", "add", "dev", link, "parent", "1:1", "handle", "10:",
                         *leaf)

    def _drop(self, probability: float) -> None:
        """iptables random drops in the host's namespace, each direction on its own."""
        for chain, peer, port in (("OUTPUT", "-d", "--dport"), ("INPUT", "-s", "--sport")):
            argv = ["iptables", "-w", "-A", chain, peer, ROOT_ADDRESS, "-p", self.transport,
                    port, str(self.port), "-m", "statistic", "--mode", "random",
                    "--probability", f"{probability:.6f}", "-j", "DROP"]
            self.commands.append(" ".join(argv))
            run(["ip", "netns", "exec", self.host.netns, *argv])

    def packets_dropped(self) -> dict[str, int] | None:
        """Packets the iptables rules dropped so far, upstream and downstream (None: none
        set: no loss, or netem drops)."""
        if not any(c.startswith("iptables") for c in self.commands):
            return None
        dropped = {}
        for chain, direction in (("OUTPUT", "upstream"), ("INPUT", "downstream")):
            listing = run(["ip", "netns", "exec", self.host.netns, "iptables", "-w", "-L",
                           chain, "-v", "-x", "-n"], check=False)
            dropped[direction] = sum(int(line.split()[0]) for line in listing.splitlines()
                                     if "statistic" in line and "DROP" in line)
        return dropped

    def _tc(self, netns: str | None, *args: str) -> None:
        self.commands.append(" ".join(("tc", *args)) + (f"  (in {netns})" if netns else ""))
        tc(*args, netns=netns)

    def proxy_stats(self) -> dict[str, Any] | None:
        """The proxy's statistics now (releases, bytes, lateness percentiles), or None."""
        if self._proxy is None or self._proxy.poll() is not None:
            return self._read_stats()
        before = self._stats_file.stat().st_mtime_ns if self._stats_file.exists() else None
        self._signal(signal.SIGUSR1)
        deadline = time.monotonic() + STATS_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._stats_file.exists() and self._stats_file.stat().st_mtime_ns != before:
                return self._read_stats()
            time.sleep(0.01)
        return self._read_stats()

    def health(self) -> str | None:
        """None while the proxy runs, else why not."""
        if self._proxy is not None and (code := self._proxy.poll()) is not None:
            return (f"the delay proxy of {self.host.name} exited with code {code}; see "
                    f"{self.work_dir}")
        return None

    def close(self) -> dict[str, Any] | None:
        """Stop the proxy (its last statistics are kept and returned); safe to call twice."""
        if self._proxy is not None and self._proxy.poll() is None:
            self._proxy.stop(timeout_s=STATS_TIMEOUT_S)
        return self._read_stats()

    def _signal(self, sig: int) -> None:
        assert self._proxy is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proxy.pid, sig)

    def _read_stats(self) -> dict[str, Any] | None:
        try:
            return json.loads(self._stats_file.read_text())
        except (OSError, ValueError):
            return None
