"""The oscilloscope during a run: wire its channels to GPIO lines, acquire, keep the delays.

Each acquisition is a single shot triggered by the publisher's line; the scope's delay
measurement from that edge to each watched subscriber's edge is stored as a delivery row
with clock source ``scope`` (``t_pub_ns`` 0, ``t_recv_ns`` the delay, ``seq`` the
acquisition number): the same schema as the software timestamps, which are always taken
too. With ``resource: virtual`` the controller starts a virtual scope (a SCPI server on
loopback, Rigol dialect) and feeds it the agents' GPIO edges as they are uploaded; it is
reached through pyvisa-py exactly like a real instrument.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mqttbed.campaigns.spec import Scope
from mqttbed.campaigns.wiring import HEADER_PIN, Wiring, subscriber_role
from mqttbed.controller.storage import DataLayout, write_event_chunk
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.events import ClockSource, EventKind
from mqttbed.core.protocol import Assignment, ClockEstimate, ResultChunk, Role
from mqttbed.core.run_record import ScopeLine, ScopeSetup

log = logging.getLogger("mqttbed.scope")
SCOPE_AGENT = "scope"


@dataclass(frozen=True)
class Probe:
    """A scope channel clipped onto one client's GPIO line."""

    channel: int
    agent_id: str
    pin: int
    client_id: str
    role: str = ""   # publisher, first subscriber, last subscriber, subscriber <rank>


def probed_edges(edges: Mapping[str, Any], pins: list[int],
                 offset_ns: int) -> list[list[tuple[int, int]]]:
    """Per pin of ``pins``, its edges among a chunk's ``edges`` (columns pin, t_ns, level:
    lists or Arrow arrays) as ``(t_ns - offset_ns, level)``, in the chunk's order. Python
    objects are made for the probed lines' edges only."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pin, t_ns, level = (pa.array(edges[name], pa.int64())
                        for name in ("pin", "t_ns", "level"))
    found = []
    for wanted in pins:
        mask: Any = pc.equal(pin, pa.scalar(wanted, pa.int64()))
        times: Any = pc.subtract(pc.filter(t_ns, mask), pa.scalar(offset_ns, pa.int64()))
        levels: Any = pc.filter(level, mask)
        found.append(list(zip(times.to_pylist(), levels.to_pylist(), strict=True)))
    return found


def wire_probes(scope: Scope, assignments: dict[str, Assignment]) -> tuple[Probe, list[Probe]]:
    """Return (publisher probe, subscriber probes) for the run's clients."""
    clients = {c.client_id: (agent, c) for agent, a in assignments.items() for c in a.clients}
    publishers = sorted((c for _, c in clients.values() if c.role == Role.PUBLISHER),
                        key=lambda c: c.publisher_index)
    subscribers = sorted((c for _, c in clients.values() if c.role == Role.SUBSCRIBER),
                         key=lambda c: c.subscribe_rank)
    if not publishers or not subscribers:
        raise ValueError("a scope needs a publisher and at least one subscriber to watch")

    def probe(channel: int, client_id: str, role: str) -> Probe:
        agent, client = clients[client_id]
        return Probe(channel, agent, client.gpio_pin, client_id, role)

    watched = []
    for selector, channel in scope.channels.subscriber_channels().items():
        index = {"first": 0, "last": len(subscribers) - 1}.get(selector)
        index = int(selector) if index is None else index
        if index >= len(subscribers):
            raise ValueError(f"scope channel {channel} watches subscriber {selector}, but the "
                             f"run has {len(subscribers)} subscribers")
        watched.append(probe(channel, subscribers[index].client_id, subscriber_role(selector)))
    return probe(scope.channels.publisher, publishers[0].client_id, "publisher"), watched


class ScopeRecorder:
    """Acquires on its own thread while the run goes on; its rows are written at the end."""

    def __init__(self, spec: Scope, assignments: dict[str, Assignment],
                 wiring: Wiring | None = None):
        self.spec = spec
        # the run's wiring plan (campaigns.wiring.plan_wiring): where each probe's host is
        self.wiring = wiring
        self.publisher, self.subscribers = wire_probes(spec, assignments)
        publisher = next(c for a in assignments.values() for c in a.clients
                         if c.client_id == self.publisher.client_id)
        self._message = {"topic": publisher.topic, "payload_bytes": publisher.payload_bytes,
                         "qos": publisher.qos}
        # Arm for the first time half a period before the watched publisher's first
        # measured message, so no warm-up message is ever acquired.
        period_ns = 1e9 / publisher.rate_hz
        self._first_arm_after_start_ns = int(publisher.start_offset_ns + (
            publisher.warmup_messages - 0.5) * period_ns)
        self._virtual: Any = None
        self._scope: Any = None
        self._clocks: dict[str, ClockEstimate] = {}
        self._horizon: dict[str, int] = {}
        self._rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self.timeouts = 0  # acquisitions that saw no trigger in acquisition_timeout_s
        self.identity = ""

    # -- set-up -------------------------------------------------------------------------

    def open(self) -> None:
        """Start the virtual scope if asked for, open the instrument, configure it."""
        from mqttbed.instruments.scope import open_scope
        from mqttbed.instruments.scope.virtual import VirtualScope

        resource = self.spec.resource
        if resource == "virtual":
            self._virtual = VirtualScope().start()
            resource = self._virtual.resource
        self._scope = open_scope(resource, self.spec.dialect)
        self.identity = self._scope.identify()
        self._scope.configure(self.publisher.channel, [p.channel for p in self.subscribers],
                              timebase_s_per_div=self.spec.timebase_s_per_div,
                              level_v=self.spec.trigger_level_v)

    def metadata(self, with_acquisitions: bool = False) -> ScopeSetup:
        """The scope and its probes as the run records them; with what it acquired (and
        fell short of) once its acquisitions have ended."""
        channels = {str(p.channel): p.client_id for p in (self.publisher, *self.subscribers)}
        setup = ScopeSetup(resource=self.spec.resource, dialect=self.spec.dialect,
                           identity=self.identity, channels=channels, wiring=self.lines())
        if not with_acquisitions:
            return setup
        made, requested = self.acquisitions, self.spec.acquisitions
        return ScopeSetup(**setup.model_dump(exclude={"acquisitions", "requested", "shortfall",
                                                      "timeouts", "error"}),
                          acquisitions=made, requested=requested,
                          shortfall=max(0, requested - made), timeouts=self.timeouts,
                          error=self.error)

    def lines(self) -> dict[str, ScopeLine]:
        """Scope channel -> the line its probe is on, with the host the wiring plan put
        the client on (None without a plan)."""
        planned = {(line.channel, line.client_id): line.host
                   for line in (self.wiring.lines if self.wiring else ())}
        return {str(p.channel): ScopeLine(client=p.client_id, role=p.role, agent=p.agent_id,
                                          host=planned.get((p.channel, p.client_id)),
                                          bcm_pin=p.pin, header_pin=HEADER_PIN.get(p.pin))
                for p in (self.publisher, *self.subscribers)}

    # -- the virtual scope's feed -------------------------------------------------------

    def set_clocks(self, clocks: dict[str, ClockEstimate]) -> None:
        """The agents' clock offsets, to put their edges on the controller's clock."""
        self._clocks = dict(clocks)

    def feed(self, chunk: ResultChunk) -> None:
        """Pass a chunk's GPIO edges on the probed lines to the virtual scope."""
        if self._virtual is None or not chunk.edges:
            return
        offset = self._clocks.get(chunk.agent_id, ClockEstimate(
            offset_ns=0, uncertainty_ns=0, method="unknown")).offset_ns
        probes = [p for p in (self.publisher, *self.subscribers)
                  if p.agent_id == chunk.agent_id]
        if probes:
            for probe, edges in zip(probes, probed_edges(chunk.edges, [p.pin for p in probes],
                                                         offset), strict=True):
                if edges:
                    self._virtual.feed(probe.channel, edges)
        if chunk.edges_until_ns is not None:
            self._horizon[chunk.agent_id] = chunk.edges_until_ns - offset
        probed_agents = {p.agent_id for p in (self.publisher, *self.subscribers)}
        if probed_agents <= set(self._horizon):
            self._virtual.advance(min(self._horizon[a] for a in probed_agents))

    # -- acquisitions -------------------------------------------------------------------

    def start(self, t_start_ns: int) -> None:
        """Acquire from the run's first measured message on (``t_start_ns``: this clock)."""
        first_arm_ns = t_start_ns + self._first_arm_after_start_ns
        self._thread = threading.Thread(target=self._acquire_all, args=(first_arm_ns,),
                                        name="scope", daemon=True)
        self._thread.start()

    def _acquire_all(self, first_arm_ns: int) -> None:
        """Single acquisitions until ``acquisitions`` caught a trigger, or the run ends."""
        if self._stop.wait(max(0, first_arm_ns - monotonic_ns()) / 1e9):
            return
        try:
            number = 0
            while number < self.spec.acquisitions and not self._stop.is_set():
                self._scope.arm_single()
                if not self._scope.wait_triggered(self.spec.acquisition_timeout_s):
                    self.timeouts += 1
                    continue  # no trigger in time: nothing acquired, arm again
                self._keep(number, self._scope.edge_delays_s())
                number += 1
        except Exception as exc:  # noqa: BLE001 - recorded with the run, never fatal to it
            log.exception("scope acquisition failed")
            self.error = f"{type(exc).__name__}: {exc}"

    def _keep(self, number: int, delays: dict[int, float | None]) -> None:
        for probe in self.subscribers:
            delay = delays.get(probe.channel)
            if delay is None:
                continue
            self._rows.append({"kind": EventKind.DELIVERY.value, "publisher":
                               self.publisher.client_id, "seq": number,
                               "receiver": probe.client_id, "t_pub_ns": 0,
                               "t_recv_ns": round(delay * 1e9), "t_intended_ns": None})

    def finished(self) -> bool:
        """Whether acquiring is over: every acquisition made, or the scope failed."""
        return self.error is not None or self.acquisitions >= self.spec.acquisitions or (
            self._thread is not None and not self._thread.is_alive())

    @property
    def acquisitions(self) -> int:
        return len({row["seq"] for row in self._rows})

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop acquiring, close the instrument and the virtual scope; safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._scope is not None:
            self._scope.close()
            self._scope = None
        if self._virtual is not None:
            self._virtual.stop()
            self._virtual = None

    def write(self, layout: DataLayout, campaign_id: str, run_id: str) -> None:
        """Store the scope's delays as event rows of clock source ``scope``."""
        if not self._rows:
            return
        columns = {name: [row[name] for row in self._rows] for name in self._rows[0]}
        n = len(self._rows)
        constants = {"agent_id": SCOPE_AGENT, **self._message, "warmup": False,
                     "clock_source": ClockSource.SCOPE.value,
                     "clock_offset_ns": 0, "clock_offset_uncertainty_ns": 0}
        write_event_chunk(layout, campaign_id, run_id, SCOPE_AGENT, 0,
                          columns | {k: [v] * n for k, v in constants.items()}, {})
