"""The ``p4`` broker backend: the MQTT-SN gateway behind the PAMS switch, per run.

What runs is **not a P4 switch**: ``pams.p4`` was never compiled (no p4c, BMv2 or Tofino
here). The switch is the same pipeline as eBPF programs attached with tc (clsact) to
every port of a bridge in a network namespace (:mod:`.dataplane`). Per run, deploy()

1. builds a :class:`~mqttbed.network.topology.Topology` with the broker's host,
2. loads the data plane and attaches it to every switch port,
3. starts the ``mqtt-sn`` gateway inside the broker's namespace (the ``mqtt-sn``
   backend, driven through a :class:`~mqttbed.network.host.NamespaceHost`),
4. with ``acceleration: true``, tells the data plane to accelerate and to copy control
   messages to the CPU port, and runs the PAMS controller on that port, writing the
   eBPF tables. With ``acceleration: false`` the program stays attached but is told
   neither to accelerate nor to punt, and no table is ever written: the switch only
   forwards, and its counters still count every packet, so both settings are counted
   at the same places by the same code.

The engine then asks :meth:`P4Backend.agent_placement` where the agents go: one more
host per agent, plugged into the same switch, and a TCP relay on the root side of the
management links so agents inside namespaces reach a controller listening on
127.0.0.1. Teardown stops all of it and reaps the topology (whatever still runs inside
is killed with it), on failure paths too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field

from mqttbed.brokers.mqttsn.backend import MqttSnBackend, MqttSnDeployment
from mqttbed.brokers.mqttsn.backend import Options as GatewayOptions
from mqttbed.brokers.mqttsn.section import packet_records
from mqttbed.brokers.p4.build import SOURCE
from mqttbed.brokers.p4.controller import PamsController
from mqttbed.brokers.p4.dataplane import EbpfSwitch
from mqttbed.brokers.p4.tables import EbpfTables
from mqttbed.core.backends import AgentPlacement
from mqttbed.core.errors import BackendError, system_deps_hint
from mqttbed.core.host import Host
from mqttbed.core.protocol import Endpoint
from mqttbed.core.samples import BrokerResourceSample
from mqttbed.core.sections import SectionRecords
from mqttbed.network.netns import socket_in
from mqttbed.network.relay import TcpRelay
from mqttbed.network.topology import ROOT_ADDRESS, Topology, reap

BROKER_HOST = "broker"
MECHANISM = ("eBPF tc (clsact) programs on a Linux bridge in a network namespace: the PAMS "
             "pipeline in the kernel, not a P4 switch (pams.p4 has never been compiled)")
REQUIRED_TOOLS = ("ip", "tc", "bpftool", "nsenter", "clang")


class Options(GatewayOptions):
    """The broker section for ``p4``: the gateway's options and whether to accelerate."""

    backend: Literal["p4"] = "p4"  # type: ignore[assignment]  # the subtype's tag
    acceleration: bool = Field(
        True, description="false: the switch only forwards (program attached, counting, "
                          "its table never written)")

    def gateway(self) -> GatewayOptions:
        """The options of the gateway behind the switch."""
        return GatewayOptions.model_validate(
            self.model_dump(exclude={"backend", "acceleration"}))


class P4Deployment(MqttSnDeployment):
    """The gateway's deployment, and what the switch in front of it was and counted.

    ``config`` is this backend's options (acceleration included) as sorted JSON, and
    ``config_sha256`` that text's hash."""

    options: Options  # the gateway's options, and acceleration
    acceleration: bool
    mechanism: str = MECHANISM
    program_sha256: str = Field(description="the data plane's source, ebpf/pams.bpf.c")
    topology_prefix: str | None = Field(None, description="the namespaces' and links' "
                                                          "prefix (reaped by it)")
    agent_roles: dict[str, list[str]] = Field(default_factory=dict,
                                              description="agent host -> its client roles")
    switch_counters: dict[str, int] | None = Field(None, description="the data plane's "
                                                   "totals, by counter (after teardown)")
    switch_port_counters: dict[str, dict[str, int]] | None = Field(
        None, description="host -> {ingress, egress}: packets at its switch port")
    controller_events: dict[str, int] | None = Field(
        None, description="what the PAMS controller saw, by kind (with acceleration)")


class P4Backend:
    """The PAMS switch (eBPF) with its controller, and the MQTT-SN gateway behind it."""

    name = "p4"

    def __init__(self) -> None:
        self._options: Options | None = None
        self._topology: Topology | None = None
        self._switch: EbpfSwitch | None = None
        self._tables: EbpfTables | None = None
        self._gateway = MqttSnBackend()
        self._endpoint: Endpoint | None = None
        self._controller: PamsController | None = None
        self._controller_thread: threading.Thread | None = None
        self._controller_error: str | None = None
        self._stop = threading.Event()
        self._relay: TcpRelay | None = None
        self._switch_port_of: dict[str, int] = {}  # MAC -> switch port ifindex
        self._roles: dict[str, frozenset[str]] = {}  # agent host -> client roles
        self._counters: dict[str, int] | None = None
        self._ports: dict[str, dict[str, int]] | None = None
        self._torn_down = False

    # -- deploy ----------------------------------------------------------------------------

    def deploy(self, spec: Options | Mapping[str, Any], host: Host) -> Endpoint:
        """Build the switch and the broker's host, start gateway and controller.

        ``host`` is the controller's machine: namespaces exist only there.
        """
        if self._topology is not None or self._torn_down:
            raise BackendError("this P4Backend was already deployed; create a new one per run")
        options = spec if isinstance(spec, Options) else Options.model_validate(spec)
        self._options = options
        try:
            self._endpoint = self._start(options)
        except BaseException:
            self.teardown()
            raise
        return self._endpoint

    def _start(self, options: Options) -> Endpoint:
        topology = self._topology = Topology([BROKER_HOST])
        topology.build()
        self._switch = EbpfSwitch(topology)
        self._tables = self._switch.load()
        broker = topology.hosts[BROKER_HOST]
        self._switch_port_of[broker.mac] = broker.port_ifindex
        endpoint = self._gateway.deploy(
            options.gateway(), topology.namespace_host(BROKER_HOST),
            probe_socket=lambda: socket_in(broker.netns))
        accelerate = options.acceleration
        self._switch.configure(broker, endpoint.port, accelerate=accelerate, punt=accelerate)
        if accelerate:
            self._start_controller(broker.address, endpoint.port)
        return endpoint

    def _start_controller(self, address: str, port: int) -> None:
        """The PAMS controller on the CPU port, in a thread that records why it ended."""
        assert self._topology is not None and self._tables is not None
        controller = self._controller = PamsController(self._tables, (address, port),
                                                       self._switch_port_of)
        cpu_link = self._topology.cpu_peer

        def serve() -> None:
            try:
                controller.serve(cpu_link, self._stop)
            except Exception as exc:  # noqa: BLE001 - health() reports it
                self._controller_error = f"{type(exc).__name__}: {exc}"

        self._controller_thread = threading.Thread(target=serve, name="pams-controller",
                                                   daemon=True)
        self._controller_thread.start()

    def agent_placement(self, roles: list[frozenset[str]], controller_url: str
                        ) -> AgentPlacement:
        """One host per agent on the switch, and a relay to the controller for them."""
        if self._topology is None or self._switch is None:
            raise BackendError("deploy the p4 backend before placing agents")
        hosts: list[Host] = []
        for index, agent_roles in enumerate(roles):
            name = f"agent{index}"
            port = self._topology.add_host(name)
            self._switch.attach(port.port)
            self._switch_port_of[port.mac] = port.port_ifindex
            self._roles[name] = agent_roles
            hosts.append(self._topology.namespace_host(name))
        url = urlsplit(controller_url)
        if url.hostname is None or url.port is None:
            raise BackendError(f"controller URL {controller_url!r} has no host and port")
        self._relay = TcpRelay((url.hostname, url.port))
        relayed = url._replace(netloc=f"{ROOT_ADDRESS}:{self._relay.address[1]}").geturl()
        return AgentPlacement(hosts=hosts, controller_url=relayed)

    # -- while running ---------------------------------------------------------------------

    def health(self) -> str | None:
        """None while gateway and (with acceleration) controller run, else why not."""
        if (broken := self._gateway.health()) is not None:
            return broken
        if self._controller_error is not None:
            return f"switch controller died: {self._controller_error}"
        if self._controller_thread is not None and not self._controller_thread.is_alive():
            return "switch controller died: its thread ended"
        return None

    def resource_samples(self) -> list[BrokerResourceSample]:
        """The gateway's resource samples (the switch runs in the kernel: not sampled)."""
        return self._gateway.resource_samples()

    def broker_processes(self) -> dict[str, list[int]]:
        """The gateway's process (the switch runs in the kernel, its controller in this
        process: neither is under ``broker.cpu_limit``)."""
        return self._gateway.broker_processes()

    # -- after -----------------------------------------------------------------------------

    def teardown(self) -> None:
        """Stop controller, relay and gateway, keep the switch's counters, reap; idempotent."""
        if self._torn_down:
            return
        self._torn_down = True
        try:
            self._stop.set()
            if self._controller_thread is not None:
                self._controller_thread.join(timeout=5)
            if self._relay is not None:
                self._relay.close()
            self._gateway.teardown()
            if self._tables is not None:
                self._keep_counters(self._tables)
        finally:
            if self._tables is not None:
                self._tables.close()
            if self._topology is not None:
                reap(self._topology.prefix)

    def _keep_counters(self, tables: EbpfTables) -> None:
        """The switch's counters, totals and per host port, before the maps go."""
        assert self._topology is not None
        self._counters = tables.counters()
        by_port = tables.port_counters()
        self._ports = {name: {direction: by_port.get((port.port_ifindex, direction), 0)
                              for direction in ("ingress", "egress")}
                       for name, port in self._topology.hosts.items()}

    def section_records(self) -> SectionRecords:
        """The gateway's packet counts and the switch's, per place (see :class:`Packets`)."""
        records = packet_records(self._gateway.gateway_stats)
        if self._counters is None or self._ports is None:
            return records
        ports = self._ports

        def by_role(role: str, direction: str) -> float:
            return float(sum(ports[name][direction] for name, roles in self._roles.items()
                             if role in roles))

        return {**records,
                "publishers_sent": [by_role("publisher", "ingress")],
                "switch_received": [float(self._counters["packets"])],
                "switch_publish_accelerated": [float(self._counters["publish_accelerated"])],
                "subscribers_received": [by_role("subscriber", "egress")]}

    def deployment(self) -> P4Deployment:
        """The gateway's deployment, and what the switch was: mechanism, program, counters."""
        options = self._options or Options()
        config = json.dumps(options.model_dump(mode="json"), sort_keys=True)
        gateway = self._gateway.deployment()
        return P4Deployment(**{
            **dict(gateway),
            "backend": self.name,
            "config": config,
            "config_sha256": hashlib.sha256(config.encode()).hexdigest(),
            "options": options,
            "acceleration": options.acceleration,
            "program_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
            "topology_prefix": None if self._topology is None else self._topology.prefix,
            "agent_roles": {name: sorted(roles) for name, roles in self._roles.items()},
            "switch_counters": self._counters,
            "switch_port_counters": self._ports,
            "controller_events": None if self._controller is None
            else dict(self._controller.events)})


def unavailable() -> str | None:
    """Why the switch cannot be built here: not root, or a missing tool."""
    if os.geteuid() != 0:
        return "the p4 backend builds network namespaces and loads eBPF: it needs root"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing or not Path("/usr/include/bpf/bpf_helpers.h").exists():
        return (f"the p4 backend needs {', '.join(missing) or 'libbpf headers'}; "
                + system_deps_hint("network", "iproute2 bpftool clang libbpf-dev"))
    return None

