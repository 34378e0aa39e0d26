"""Connection figures: how long each phase of a client's connect took, per run and point.

Every agent times each connection its clients make (``Done.connections``, one
:class:`~mqttbed.core.broker_access.ConnectPhases` per connection) on its own
CLOCK_MONOTONIC, read in user space by the client's loop before and after each phase:
the TCP connect, the TLS handshake, the WebSocket upgrade and CONNECT -> CONNACK. The
run's record keeps them; the controller hands them to the analysis as each run's
:class:`ConnectTimes` (in ``RunInfo.connections``), and a run or point gets a
:class:`ConnectionFigures` block from them (``connections`` in the results).

The figures are computed here in plain Python, not with Spark: a run has one connection
per client (thousands, not millions), and the values come from the run record, not the
events. Percentiles are exact, by the rule every figure of the document follows (linear
interpolation at rank (n - 1) q, :func:`mqttbed.analytics.passes.quantile_at`), pooled
over every connection of a point's done runs. A run's figures depend on its ``RunInfo``
alone, which a run partial's fingerprint covers, so a document merged from partials has
the same figures to the bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.analytics.passes import PERCENTILES, quantile_at
from mqttbed.core.broker_access import ConnectPhases
from mqttbed.core.sections import Distribution

# The clock every connect phase is timed on, as the results and the report label it.
CONNECT_CLOCK = "agent CLOCK_MONOTONIC, user space"
# figure in the results -> the ConnectTimes field it pools (ns)
CONNECT_PHASE_FIGURES: dict[str, str] = {
    "tcp_connect_us": "tcp_ns",
    "tls_handshake_us": "tls_ns",
    "websocket_upgrade_us": "websocket_ns",
    "connack_us": "connack_ns",
}


@dataclass(frozen=True)
class ConnectTimes:
    """One connection's phase durations in ns (None: the phase did not happen on this
    transport, or did not end)."""

    tcp_ns: int | None = None
    tls_ns: int | None = None
    websocket_ns: int | None = None
    connack_ns: int | None = None


class ConnectionFigures(BaseModel):
    """How the clients' connections were made, phase by phase, in microseconds: every
    connection the agents timed (of a run, or pooled over a point's done runs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    clock: str = Field(CONNECT_CLOCK, description="what the phases are timed on: each "
                                                  "agent's CLOCK_MONOTONIC, read in user "
                                                  "space by the client's loop")
    connections: int = Field(0, description="connections timed (a client that connected "
                                            "again counts again)")
    without_connack: int = Field(0, description="connections whose CONNACK never came (cut "
                                                "or timed out before it)")
    tcp_connect_us: Distribution = Field(
        default_factory=Distribution,
        description="TCP connect: connect() called to the socket established (the "
                    "SYN, SYN-ACK round trip as the client sees it)")
    tls_handshake_us: Distribution = Field(
        default_factory=Distribution,
        description="TLS handshake: ClientHello sent to the handshake finished, certificate "
                    "verification included; connections over TLS only")
    websocket_upgrade_us: Distribution = Field(
        default_factory=Distribution,
        description="WebSocket upgrade: the HTTP GET sent to its 101 response read; "
                    "connections over WebSocket only")
    connack_us: Distribution = Field(
        default_factory=Distribution,
        description="MQTT CONNECT written to its CONNACK read (accepted or refused)")


def connect_times(connections: Mapping[str, Sequence[ConnectPhases]]
                  ) -> tuple[ConnectTimes, ...]:
    """A run's connections (the record's, agent id -> its clients' connect phases) as the
    analysis takes them: agent by agent in the order of their ids, each agent's in the
    order it reported them."""
    return tuple(ConnectTimes(tcp_ns=phases.tcp_ns, tls_ns=phases.tls_ns,
                              websocket_ns=phases.websocket_ns, connack_ns=phases.connack_ns)
                 for agent_id in sorted(connections) for phases in connections[agent_id])


def connection_figures(connections: Sequence[ConnectTimes]) -> ConnectionFigures | None:
    """The connection block of a level (a run, or a point's done runs pooled) from its
    connections; None when none were timed (runs from before, or agents that did not)."""
    if not connections:
        return None
    return ConnectionFigures(
        connections=len(connections),
        without_connack=sum(c.connack_ns is None for c in connections),
        **{figure: phase_distribution([getattr(c, field) for c in connections])
           for figure, field in CONNECT_PHASE_FIGURES.items()})


def phase_distribution(durations_ns: Sequence[int | None]) -> Distribution:
    """count, mean, sample std, exact percentiles and max of one phase, in microseconds,
    over the connections that went through it (None: not this connection's)."""
    # sorted first: the percentiles are read by rank, and the sums taken in one order
    values = sorted(d / 1e3 for d in durations_ns if d is not None)
    n = len(values)
    if n == 0:
        return Distribution()
    mean = math.fsum(values) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    by_rank = dict(enumerate(values))
    return Distribution(count=n, mean=mean, std=std, max=values[-1],
                        **{name: quantile_at(by_rank, n, q)
                           for name, q in PERCENTILES.items()})
