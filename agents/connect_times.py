"""When one client's connection reached each of its phases, and the phases' durations.

A client marks what it can see on the agent's monotonic clock; a phase's duration is
reported only when both of its ends were seen (:class:`~mqttbed.core.broker_access.ConnectPhases`
says None otherwise): never a number pieced together from a neighbouring phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqttbed.core.broker_access import ConnectPhases


@dataclass
class ConnectTimes:
    """The instants (monotonic ns) one connection passed; None: not seen by this client."""

    t_start_ns: int = 0                  # connect() was called
    t_tcp_start_ns: int | None = None    # the TCP connect began (name resolution included)
    t_tcp_done_ns: int | None = None     # the TCP connection is established
    t_tls_done_ns: int | None = None     # the TLS handshake finished
    t_websocket_done_ns: int | None = None  # the WebSocket upgrade's 101 was read
    t_connect_sent_ns: int | None = None  # CONNECT was handed to the socket
    t_connack_ns: int | None = None      # CONNACK was read

    def phases(self, client_id: str) -> ConnectPhases:
        """The durations of the phases whose both ends were seen."""
        ws_start = self.t_tls_done_ns if self.t_tls_done_ns is not None else self.t_tcp_done_ns
        return ConnectPhases(
            client_id=client_id, t_start_ns=self.t_start_ns,
            tcp_ns=_span(self.t_tcp_start_ns, self.t_tcp_done_ns),
            tls_ns=_span(self.t_tcp_done_ns, self.t_tls_done_ns),
            websocket_ns=_span(ws_start, self.t_websocket_done_ns),
            connack_ns=_span(self.t_connect_sent_ns, self.t_connack_ns))


def _span(start: int | None, end: int | None) -> int | None:
    return None if start is None or end is None else end - start
