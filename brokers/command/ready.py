"""Whether a command broker is ready: the shared MQTT probe, as a readiness poll asks it.

One try is :func:`mqttbed.brokers.reachability.probe`, the probe every backend uses: TCP
connect, the TLS handshake verified against the endpoint's CA and server name
(:mod:`mqttbed.core.client_tls`), the WebSocket upgrade to subprotocol ``mqtt``
(:mod:`mqttbed.core.websocket`), then a CONNECT in the run's MQTT version with its user
name and password, answered by a CONNACK that accepts it (over UDP a PINGREQ its PINGRESP).

:func:`probe_ready` sorts the outcome for the poll in
:meth:`~mqttbed.brokers.command.backend.CommandBackend._await_ready`: a broker not up yet
raises :class:`~mqttbed.brokers.reachability.Unreachable` (tried again until the deadline,
whose error names the address and this last reason); a CONNACK that refuses raises
:class:`~mqttbed.brokers.reachability.ConnectRefused`; what waiting cannot fix (a
certificate that does not verify, a WebSocket upgrade answered with another HTTP status)
raises BackendError at once, naming the broker, its address and the reason.
"""

from __future__ import annotations

from mqttbed.brokers import reachability
from mqttbed.brokers.reachability import ConnectRefused, Unreachable
from mqttbed.core.broker_access import ClientCredentials, MqttProtocol
from mqttbed.core.errors import BackendError
from mqttbed.core.protocol import Endpoint

__all__ = ["probe_ready"]


def probe_ready(broker: str, endpoint: Endpoint, timeout_s: float,
                credentials: ClientCredentials | None = None,
                protocol: MqttProtocol = "3.1.1") -> None:
    """One readiness try at ``endpoint`` as the run's clients reach it; returns once the
    broker accepts the CONNECT (see the module docstring for what it raises)."""
    try:
        reachability.probe(endpoint, timeout_s, credentials, protocol)
    except ConnectRefused:
        raise
    except Unreachable as exc:
        if not exc.lasting:
            raise
        raise BackendError(f"broker {broker} at {endpoint.url}: {exc.reason}"
                           ) from None
