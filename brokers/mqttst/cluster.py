"""K MQTT-ST brokers on one host: the API the ``mqtt-st`` backend and the CLI build on.

Broker i is a Mosquitto on client port ``port + i`` and a tree node beside it
(:mod:`.run_node`), each started through the :class:`~mqttbed.core.host.Host` in a
process group of its own. Nodes link over internal link ports the host says are free;
a node that finds its port taken by then exits with a known code, and the nodes are
started again on new ports. Each broker keeps its files (Mosquitto config and log, node
log, stats file) in ``workdir/broker-<i>``; a workdir the cluster made itself is removed
by :meth:`Cluster.stop`, one it was given is left to the caller.

Only :class:`~mqttbed.core.host.LocalHost` is supported: :meth:`Cluster.kill` signals
process groups and the stats files are read from the local file system.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.brokers.mosquitto.backend import Options as MosquittoOptions
from mqttbed.brokers.mosquitto.backend import find_binary, render_config
from mqttbed.brokers.mqttst.capability import DEFAULT_ALPHA, DEFAULT_BETA
from mqttbed.brokers.mqttst.run_node import EXIT_BIND_FAILED
from mqttbed.brokers.mqttst.topology import TOPOLOGIES, topology_edges, tree_verdict
from mqttbed.brokers.processes import listens_on, tail_of
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.errors import BackendError
from mqttbed.core.host import Host, LocalHost, ProcessHandle, describe_exit, wait_for_tcp

__all__ = ["TOPOLOGIES", "Cluster", "ClusterDeployment", "ClusterNotConverged", "TreeOptions",
           "free_port_range", "topology_edges"]

START_ATTEMPTS = 3
MOSQUITTO_STARTUP_S = 5.0
STOP_TIMEOUT_S = 3.0
POLL_S = 0.05


def free_port_range(count: int, address: str = "127.0.0.1") -> int:
    """A base port such that base..base+count-1 were all free on ``address`` a moment ago
    (for ``Cluster(count, free_port_range(count))``; as with any free port, another
    process can take one before the Mosquittos bind: :meth:`Cluster.start` then fails
    naming the port)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for _ in range(200):
        base = random.randrange(20_000, 40_000)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(family)
                sockets.append(sock)
                sock.bind((address, port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise BackendError(f"found no {count} consecutive free ports on {address}")


# (dialing broker index, peer index, the peer's link address) -> the address to dial
LinkVia = Callable[[int, int, tuple[str, int]], tuple[str, int]]


class ClusterNotConverged(BackendError):
    """The tree did not form in time; the message says why and what each node reported."""


@dataclass(frozen=True)
class TreeOptions:
    """How the nodes build their tree (the same for every broker of a cluster)."""

    keepalive_s: float = 10.0          # the paper's Keep Alive: seconds between BPDUs
    alpha: float = DEFAULT_ALPHA       # C weight per CPU MHz
    beta: float = DEFAULT_BETA         # C weight per MiB of RAM
    capabilities: dict[int, float] | None = None   # broker index -> C, overriding alpha/beta
    reconnect_s: float = 1.0           # seconds between attempts to relink a lost neighbour
    hysteresis: float = 0.2            # see mqttbed.brokers.mqttst.tree
    startup_timeout_s: float = 15.0
    stats_interval_s: float = 0.1

    def __post_init__(self) -> None:
        for name in ("keepalive_s", "reconnect_s", "startup_timeout_s", "stats_interval_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"TreeOptions.{name}={value!r}: must be a positive number")
        for name in ("alpha", "beta", "hysteresis"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"TreeOptions.{name}={value!r}: must be a number >= 0")
        for index, capability in (self.capabilities or {}).items():
            if not (isinstance(capability, int | float) and math.isfinite(capability)
                    and 0 <= capability <= 1e9):
                raise ValueError(f"capability of broker {index}: {capability!r} is not a "
                                 "number in 0..1e9")


@dataclass
class _Broker:
    index: int
    port: int
    dir: Path
    link_port: int = 0
    mosquitto: ProcessHandle | None = None
    node: ProcessHandle | None = None
    killed: bool = False

    @property
    def stats_file(self) -> Path:
        return self.dir / "stats.json"

    def handles(self) -> dict[str, ProcessHandle]:
        found = {"mosquitto": self.mosquitto, "node": self.node}
        return {name: handle for name, handle in found.items() if handle is not None}

    def running(self) -> bool:
        return self.mosquitto is not None and self.node is not None and all(
            handle.poll() is None for handle in self.handles().values())


class ClusterDeployment(BaseModel):
    """What a cluster deployed: its brokers' ports and links, the nodes' options, and one
    broker's Mosquitto config (the others differ only in their port and directory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    brokers: int
    address: str
    client_ports: list[int]
    link_ports: list[int] = Field(description="each node's link port (where peers dial it)")
    topology: str | list[tuple[int, int]]
    edges: list[tuple[int, int]]
    options: TreeOptions
    mosquitto_binary: str | None
    mosquitto_config_broker_0: str | None


class Cluster:
    """K Mosquittos, each with a tree node, linked as ``topology`` says.

    ``link_via``, if given, chooses where the dialing node of each link connects (the
    lower index dials: the ids share the address and ports rise with the index), e.g. a
    delay proxy in front of the peer's link port; without it nodes dial each other.
    """

    def __init__(self, brokers: int, port: int, topology: str | Sequence[Sequence[int]] =
                 "full-mesh", options: TreeOptions | None = None, workdir: Path | None = None,
                 address: str = "127.0.0.1", mosquitto_conf_extra: str = "", *,
                 host: Host | None = None, link_via: LinkVia | None = None):
        self.edges = topology_edges(topology, brokers)   # checks brokers too
        if not isinstance(port, int) or not 1 <= port <= 0xFFFF - brokers + 1:
            raise ValueError(f"port={port!r}: brokers listen on port..port+{brokers - 1}, "
                             "which must all lie in 1..65535")
        self.topology = topology
        self.options = options or TreeOptions()
        for index in self.options.capabilities or {}:
            if not (isinstance(index, int) and 0 <= index < brokers):
                raise ValueError(f"capability given for broker {index!r}; brokers are "
                                 f"0..{brokers - 1}")
        self.address = address
        self.host = host or LocalHost(address)
        if not isinstance(self.host, LocalHost):
            raise ValueError("an MQTT-ST cluster runs on LocalHost only (it signals process "
                             "groups and reads stats files locally)")
        self.mosquitto_conf_extra = mosquitto_conf_extra
        self.link_via = link_via
        self._workdir, self._own_workdir = workdir, workdir is None
        self._brokers = [_Broker(i, port + i, Path()) for i in range(brokers)]
        self._binary: str | None = None
        self._started = self._stopped = False

    # -- start --------------------------------------------------------------------------

    def start(self) -> None:
        """Start K Mosquittos, then K nodes; return once every node is ready."""
        if self._started:
            raise BackendError("this Cluster was started already; make a new one")
        self._started = True
        try:
            self._binary = find_binary(None)
            if self._workdir is None:
                self._workdir = self.host.make_dir("mqttbed-mqtt-st-")
            for broker in self._brokers:
                broker.dir = Path(self._workdir) / f"broker-{broker.index}"
                broker.dir.mkdir(parents=True, exist_ok=True)
                self._start_mosquitto(broker)
            self._start_nodes()
        except BaseException:
            self.stop()
            raise

    def _start_mosquitto(self, broker: _Broker) -> None:
        assert self._binary is not None
        conf = broker.dir / "mosquitto.conf"
        conf.write_text(render_config(MosquittoOptions(), self.address, broker.port, broker.dir)
                        + self.mosquitto_conf_extra.rstrip("\n") + "\n")
        handle = self.host.spawn([self._binary, "-c", str(conf)],
                                 log_path=broker.dir / "stdout.log")
        broker.mosquitto = handle
        try:
            wait_for_tcp(self.address, broker.port, MOSQUITTO_STARTUP_S, alive=handle)
            if not listens_on(handle.pid, broker.port):
                raise RuntimeError(f"port {broker.port} answered, but another process holds it")
        except (RuntimeError, TimeoutError) as exc:
            raise BackendError(f"Mosquitto of broker {broker.index} did not start on "
                               f"{self.address}:{broker.port}: {exc}; last log lines:\n"
                               f"{self._log_tail(broker)}") from None

    def _start_nodes(self, only: _Broker | None = None) -> None:
        """Start the nodes (or ``only`` one, with its old link port) and wait until ready."""
        for attempt in range(1, START_ATTEMPTS + 1):
            starting = [only] if only is not None else self._brokers
            if only is None:
                self._pick_link_ports()
            for broker in starting:
                (broker.dir / "ready.json").unlink(missing_ok=True)
                broker.stats_file.unlink(missing_ok=True)
                broker.node = self.host.spawn(self._node_argv(broker),
                                              log_path=broker.dir / "node.log")
            if self._wait_ready(starting):
                return
            for broker in starting:
                if broker.node is not None:
                    broker.node.stop(timeout_s=STOP_TIMEOUT_S)
            if only is not None or attempt == START_ATTEMPTS:
                break
        raise BackendError(f"MQTT-ST nodes did not bind their link ports after "
                           f"{START_ATTEMPTS} attempts")

    def _pick_link_ports(self) -> None:
        clients = {broker.port for broker in self._brokers}
        taken: set[int] = set()
        for broker in self._brokers:
            port = self.host.free_port()
            while port in clients or port in taken:
                port = self.host.free_port()
            taken.add(port)
            broker.link_port = port

    def _node_argv(self, broker: _Broker) -> list[str]:
        options = self.options
        argv = [sys.executable, "-m", "mqttbed.brokers.mqttst", "node",
                "--local", self._id(broker), "--link", f"{self._host_part()}:{broker.link_port}",
                "--index", str(broker.index), "--keepalive", repr(options.keepalive_s),
                "--reconnect", repr(options.reconnect_s),
                "--hysteresis", repr(options.hysteresis),
                "--startup-timeout", repr(options.startup_timeout_s),
                "--stats-interval", repr(options.stats_interval_s),
                "--stats-file", str(broker.stats_file),
                "--ready-file", str(broker.dir / "ready.json")]
        capability = (options.capabilities or {}).get(broker.index)
        if capability is not None:
            argv += ["--capability", repr(float(capability))]
        else:
            argv += ["--alpha", repr(options.alpha), "--beta", repr(options.beta)]
        for a, b in self.edges:
            if broker.index in (a, b):
                peer = self._brokers[b if a == broker.index else a]
                argv += ["--peer", f"{self._id(peer)}@{self._dialed(broker, peer)}"]
        for other in self._brokers:
            if other is not broker:
                argv += ["--member", self._id(other)]
        return argv

    def _dialed(self, broker: _Broker, peer: _Broker) -> str:
        """HOST:PORT where ``broker`` reaches ``peer``'s link server."""
        if self.link_via is None or broker.index > peer.index:  # the higher index never dials
            return f"{self._host_part()}:{peer.link_port}"
        host, port = self.link_via(broker.index, peer.index, (self.address, peer.link_port))
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _host_part(self) -> str:
        return f"[{self.address}]" if ":" in self.address else self.address

    def _id(self, broker: _Broker) -> str:
        return f"{self._host_part()}:{broker.port}"

    def _wait_ready(self, brokers: list[_Broker]) -> bool:
        """True once all ``brokers`` wrote their ready files; False if one could not bind."""
        deadline = time.monotonic() + self.options.startup_timeout_s + 5.0
        waiting = list(brokers)
        while waiting:
            for broker in list(waiting):
                assert broker.node is not None
                if (broker.dir / "ready.json").exists():
                    waiting.remove(broker)
                elif (code := broker.node.poll()) is not None:
                    if code == EXIT_BIND_FAILED:
                        return False
                    raise BackendError(f"node of broker {broker.index} exited with code "
                                       f"{describe_exit(code)} while starting; last log "
                                       f"lines:\n{self._log_tail(broker)}")
            if time.monotonic() > deadline:
                stuck = [broker.index for broker in waiting]
                raise BackendError(f"nodes of brokers {stuck} were not ready within "
                                   f"{self.options.startup_timeout_s + 5.0:.0f} s; last log "
                                   f"lines:\n{self._log_tail(waiting[0])}")
            time.sleep(POLL_S)
        return True

    # -- while running ------------------------------------------------------------------

    def endpoints(self) -> list[tuple[str, int]]:
        """Where clients connect: (host, port) of each broker's Mosquitto."""
        return [(self.address, broker.port) for broker in self._brokers]

    def link_ports(self) -> list[int]:
        """Each node's link port (where neighbours dial it)."""
        return [broker.link_port for broker in self._brokers]

    def states(self) -> list[dict[str, Any] | None]:
        """Each node's last stats file; None for a broker that is down or wrote none yet."""
        found: list[dict[str, Any] | None] = []
        for broker in self._brokers:
            state = None
            if broker.running():
                try:
                    state = json.loads(broker.stats_file.read_text())
                except (OSError, ValueError):
                    state = None
            found.append(state)
        return found

    def converged_root(self) -> int | None:
        """The root's index if the live brokers show one converged tree right now, else None."""
        return self._verdict()[0]

    def wait_converged(self, timeout_s: float) -> int:
        """Wait until the live brokers show one converged spanning tree; return the root index.

        Raises ClusterNotConverged with the reason and every node's view on timeout, and
        BackendError at once if a broker dies that was not killed on purpose.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if (broken := self.health()) is not None:
                raise BackendError(f"MQTT-ST cluster broke while converging: {broken}")
            root, why = self._verdict()
            if root is not None:
                return root
            if time.monotonic() > deadline:
                raise ClusterNotConverged(f"the MQTT-ST tree did not converge within "
                                          f"{timeout_s:.1f} s: {why}\n{self.describe_states()}")
            time.sleep(POLL_S)

    def converged_at_ns(self) -> int | None:
        """When the last live node last changed its root or roles (CLOCK_MONOTONIC ns).

        After :meth:`kill`, ``converged_at_ns() - kill_ns`` is the re-convergence time.
        """
        times = [state["converged_at_ns"][-1]["t_ns"] for state in self.states()
                 if state is not None and state["converged_at_ns"]]
        return max(times) if times else None

    def describe_states(self) -> str:
        """One line per broker: its root, epoch and link roles (or that it is down)."""
        lines = []
        for broker, state in zip(self._brokers, self.states(), strict=True):
            if state is None:
                lines.append(f"  broker {broker.index}: "
                             f"{'killed' if broker.killed else 'down or silent'}")
                continue
            links = ", ".join(f"{link['peer']} {link['role']}" for link in state["links"])
            lines.append(f"  broker {broker.index} ({state['id']}): root {state['root']} "
                         f"epoch {state['epoch']} cost {state['root_path_cost_us']} us; {links}")
        return "\n".join(lines)

    def _verdict(self) -> tuple[int | None, str]:
        live = [broker.running() for broker in self._brokers]
        ids = [self._id(broker) for broker in self._brokers]
        return tree_verdict(self.states(), ids, live, self.edges)

    def kill(self, index: int) -> int:
        """SIGKILL broker ``index``'s node and Mosquitto; return CLOCK_MONOTONIC ns of the kill."""
        broker = self._broker(index)
        if broker.killed:
            raise BackendError(f"broker {index} was killed already")
        broker.killed = True
        handles = list(broker.handles().values())
        killed_at = monotonic_ns()
        for handle in handles:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(handle.pid, signal.SIGKILL)
        for handle in handles:
            handle.stop(timeout_s=STOP_TIMEOUT_S)   # reaps it: the group is gone already
        return killed_at

    def restore(self, index: int) -> None:
        """Start a killed broker again on the same ports; its node relinks to the others."""
        broker = self._broker(index)
        if not broker.killed:
            raise BackendError(f"broker {index} was not killed; nothing to restore")
        broker.killed = False
        self._start_mosquitto(broker)
        self._start_nodes(only=broker)

    def processes(self) -> dict[str, int]:
        """``mosquitto-<i>`` and ``node-<i>`` -> pid, for every process still running."""
        return {f"{name}-{broker.index}": handle.pid for broker in self._brokers
                for name, handle in broker.handles().items()
                if not broker.killed and handle.poll() is None}

    def process_groups(self) -> list[int]:
        """The process group of every process the cluster ever started (for leak checks)."""
        return [handle.pid for broker in self._brokers for handle in broker.handles().values()]

    def health(self) -> str | None:
        """None while every broker not killed on purpose runs, else which process died how."""
        if not self._started:
            return "the MQTT-ST cluster was not started"
        if self._stopped:
            return "the MQTT-ST cluster was stopped"
        for broker in self._brokers:
            if broker.killed:
                continue
            for name, handle in broker.handles().items():
                if (code := handle.poll()) is not None:
                    return (f"{name} of broker {broker.index} (pid {handle.pid}) exited with "
                            f"code {describe_exit(code)}; last log lines:\n"
                            f"{self._log_tail(broker)}")
        return None

    def log_tail(self, index: int) -> str:
        """The last lines of broker ``index``'s Mosquitto and node logs."""
        return self._log_tail(self._broker(index))

    def deployment(self) -> ClusterDeployment:
        """What was deployed: ports, links, options and one broker's Mosquitto config."""
        conf = self._brokers[0].dir / "mosquitto.conf"
        return ClusterDeployment(
            brokers=len(self._brokers), address=self.address,
            client_ports=[broker.port for broker in self._brokers],
            link_ports=self.link_ports(),
            topology=self.topology if isinstance(self.topology, str) else
            [(a, b) for a, b in self.topology],
            edges=self.edges, options=self.options, mosquitto_binary=self._binary,
            mosquitto_config_broker_0=conf.read_text() if conf.exists() else None)

    # -- stop ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every node and Mosquitto (SIGTERM, SIGKILL after a grace); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for broker in self._brokers:
            if broker.node is not None:
                broker.node.stop(timeout_s=STOP_TIMEOUT_S)
        for broker in self._brokers:
            if broker.mosquitto is not None:
                broker.mosquitto.stop(timeout_s=STOP_TIMEOUT_S)
        if self._own_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _broker(self, index: int) -> _Broker:
        if not isinstance(index, int) or not 0 <= index < len(self._brokers):
            raise ValueError(f"broker index {index!r} is outside 0..{len(self._brokers) - 1}")
        return self._brokers[index]

    def _log_tail(self, broker: _Broker) -> str:
        return tail_of([broker.dir / "mosquitto.log", broker.dir / "stdout.log",
                        broker.dir / "node.log"], lines=30)
