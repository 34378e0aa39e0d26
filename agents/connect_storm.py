"""A connection storm on one agent (``workload.mode: connect``): its share of the clients
connects on the intended schedule, every connection is held, then all leave.

The native engine opens the connections itself (src/storm.c): non-blocking, many in
flight at once, each timed phase by phase from its intended connect time, and a refused
or failed connect is an outcome, not the run's failure. Before the storm the agent makes
sure its file limit (RLIMIT_NOFILE) holds every connection, raising the soft limit to the
hard one if it must, and refuses the storm naming both numbers when even that is short.
"""

from __future__ import annotations

import resource
from collections.abc import Callable

from mqttbed.agents.native import engine as native
from mqttbed.core.broker_access import ClientCredentials, MqttProtocol
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import Endpoint, StormOutcomes, StormPlan, Transport

# Descriptors the agent process needs beside its connections: the engine's epoll, timer
# and wake fds, the controller's HTTP connections, logs, Python's own.
NOFILE_MARGIN = 64
STEP_NS = 50_000_000  # the agent looks at its abort flag this often
# No message is published, but a read is let in only while the event tables could hold a
# delivery per packet it may bring (io.c: a 64 KiB read of minimal PUBLISHes)
STORM_EVENT_CAPACITY = 1 << 14


class StormRefused(ValueError):
    """The storm cannot run on this agent as asked (the message names why and the fix)."""


def ensure_file_limit(connections: int) -> int:
    """This process's soft RLIMIT_NOFILE, raised to the hard limit if ``connections`` (and
    :data:`NOFILE_MARGIN` more) need it; StormRefused names both numbers when even the
    hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = connections + NOFILE_MARGIN
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return soft
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise StormRefused(
            f"workload.connect.clients: this agent would hold {connections:,} connections "
            f"(+{NOFILE_MARGIN} other files = {needed:,}) but its file limit RLIMIT_NOFILE "
            f"is {hard:,} (hard; soft {soft:,}): raise the hard limit (ulimit -Hn, "
            f"LimitNOFILE=) or spread the clients over more agents (agents.count)")
    raised = hard if hard != resource.RLIM_INFINITY else needed
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    return raised


def unsupported_reason(endpoint: Endpoint) -> str | None:
    """Why a storm cannot run against ``endpoint`` here, or None if it can."""
    if endpoint.transport != Transport.MQTT_TCP:
        return (f"workload.mode connect: transport {endpoint.transport} has no connections "
                "to storm (mqtt-tcp, with TLS or WebSocket over it)")
    return native.unavailable_reason()


def _since(t: int, t_intended: int) -> int | None:
    return None if t == native.NO_TIME else t - t_intended


class ConnectStormSession:
    """One agent's storm clients in one native engine: :meth:`run` connects, holds and
    leaves; :meth:`outcomes` is what became of every connect."""

    def __init__(self, endpoint: Endpoint, plan: StormPlan, *, protocol: MqttProtocol = "3.1.1",
                 credentials: ClientCredentials | None = None):
        if (reason := unsupported_reason(endpoint)) is not None:
            raise StormRefused(reason)
        self.plan = plan
        self.nofile_limit = ensure_file_limit(plan.count)
        self._engine = native.Engine(kernel_stamps=False, pulse_mode=False,
                                     event_capacity=STORM_EVENT_CAPACITY)
        self._clients = list(plan.clients())
        self._t_start_ns: int | None = None
        self._t_all_done_ns: int | None = None
        self._t_left_ns: int | None = None
        self._final: list[native.StormOutcome] = []
        try:
            if endpoint.tls is not None:
                key = credentials.key_pem if credentials else None
                self._engine.configure_tls(
                    ca_pem=endpoint.tls.ca_pem, verify=endpoint.tls.verify,
                    cert_pem=credentials.cert_pem if credentials else None,
                    key_pem=None if key is None else key.get_secret_value())
            for k in self._clients:
                self._add(endpoint, k, protocol, credentials)
        except BaseException:
            self._engine.close()
            raise

    def _add(self, endpoint: Endpoint, k: int, protocol: MqttProtocol,
             credentials: ClientCredentials | None) -> None:
        index = self._engine.add_client(
            client_id=f"{self.plan.client_id_prefix}{k}", host=endpoint.host,
            port=endpoint.port, publisher=False, topic="", qos=0, gpio_pin=0,
            publisher_index=0, payload_bytes=0, rate_hz=0.0, messages=0, warmup_messages=0,
            start_offset_ns=self.plan.offset_ns(k), closed_loop=False)
        if endpoint.tls is not None:
            self._engine.set_tls(index, endpoint.tls.server_name)
        if endpoint.websocket_path is not None:
            self._engine.set_websocket(index, endpoint.websocket_path)
        if protocol != "3.1.1" or (credentials is not None and (
                credentials.username is not None or credentials.password is not None)):
            self._engine.set_session(
                index, protocol_level=5 if protocol == "5" else 4,
                username=credentials.username if credentials else None,
                password=credentials.password_bytes() if credentials else None)

    def wake(self) -> None:
        """Make a running step return now (thread-safe): the run rechecks its abort flag."""
        self._engine.wake()

    def run(self, t_start_ns: int, t_deadline_ns: int, abort: Callable[[], bool]) -> None:
        """Connect every client on its schedule from ``t_start_ns``, hold every connection
        ``hold_s`` once all are made or failed, then leave (DISCONNECT); by
        ``t_deadline_ns`` at the latest (connects still open then are timeouts)."""
        plan = self.plan
        self._t_start_ns = t_start_ns
        self._engine.storm_begin(t_start_ns, keepalive_s=plan.keepalive_s,
                                 timeout_s=plan.connect_timeout_s,
                                 clean_session=plan.clean_session)
        left = len(self._clients)
        while left and not abort() and monotonic_ns() < t_deadline_ns:
            left = self._engine.storm_step(min(monotonic_ns() + STEP_NS, t_deadline_ns))
        self._t_all_done_ns = monotonic_ns() if not left else None
        hold_end = min(monotonic_ns() + int(plan.hold_s * 1e9), t_deadline_ns)
        while not abort() and monotonic_ns() < hold_end:
            self._engine.storm_step(min(monotonic_ns() + STEP_NS, hold_end))
        self._final = [self._engine.storm_outcome(i) for i in range(len(self._clients))]
        self._engine.close()  # DISCONNECT on every held connection
        self._t_left_ns = monotonic_ns()

    def outcomes(self) -> StormOutcomes:
        """What became of every connect, as the agent reports it (``Done.storm``)."""
        if self._t_start_ns is None or not self._final:
            raise RuntimeError("the storm has not run")
        columns: dict[str, list] = {name: [] for name in (
            "intended_ns", "connect_ns", "tcp_ns", "tls_ns", "websocket_ns", "mqtt_sent_ns",
            "connack_ns", "ended_ns", "outcome", "code")}
        details: dict[str, str] = {}
        for out in self._final:
            intended = out.t_intended_ns
            columns["intended_ns"].append(intended - self._t_start_ns)
            for name in ("connect", "tcp", "tls", "websocket", "mqtt_sent", "connack",
                         "ended"):
                columns[f"{name}_ns"].append(_since(getattr(out, f"t_{name}_ns"), intended))
            outcome = native.STORM_OUTCOMES[out.outcome]
            if outcome == "opening":  # still under way when the deadline came
                outcome = "timeout"
            columns["outcome"].append(outcome)
            columns["code"].append(int(out.code))
            named = "lost" if outcome == "connected" else outcome  # lost while held
            if out.detail and named not in details:
                details[named] = out.detail.decode(errors="replace")
        return StormOutcomes(t_start_ns=self._t_start_ns, t_all_done_ns=self._t_all_done_ns,
                             t_left_ns=self._t_left_ns, clients=self._clients,
                             details=details, **columns)

    def close(self) -> None:
        """End every connection and free the engine (idempotent)."""
        self._engine.close()
