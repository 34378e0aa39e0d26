"""A broker's own counters, read from its ``$SYS`` topics while a run measures.

Brokers such as Mosquitto publish their counters (clients connected, messages and bytes
received and sent, load averages) under ``$SYS/#``, every ``sys_interval`` seconds in
Mosquitto's case. :class:`SysTopicsSampler` is one more MQTT client of the broker,
subscribed to ``$SYS/#`` at QoS 0, that keeps each numeric payload as a
:class:`~mqttbed.core.samples.SysSample` (arrival time, topic, value). What it costs the
measurement: one more connected client (``$SYS/broker/clients/connected`` counts it) and
the ``$SYS`` messages sent to it; a broker publishes them whether or not anyone listens.

A broker without ``$SYS`` just sends nothing: the sampler then holds no samples, which is
not an error. Non-numeric payloads (``$SYS/broker/version``) are kept as text, last value
per topic, for the deployment record. Memory is bounded: past ``max_samples`` the newest
are dropped and counted, so the start of the run is kept whole.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading

from mqttbed.core.broker_access import ClientCredentials, MqttProtocol
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.mqtt_codec import MalformedPacket, Publish, SubAck
from mqttbed.core.mqtt_stream import MqttSession, StreamClosed, connect
from mqttbed.core.protocol import Endpoint
from mqttbed.core.samples import SysSample

logger = logging.getLogger(__name__)

SYS_FILTER = "$SYS/#"
MAX_TEXT_TOPICS = 256
MAX_TEXT_CHARS = 256


class SysTopicsUnavailable(Exception):
    """The sampler could not subscribe to ``$SYS/#``; the message says why."""


def numeric_value(payload: bytes) -> float | None:
    """The payload as a finite number ("42", "0.25"), or None ("2.0.11", "12 seconds")."""
    try:
        value = float(payload.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class SysTopicsSampler:
    """Subscribes to a broker's ``$SYS/#`` and keeps what it publishes (over the
    ``endpoint``'s TLS and WebSocket if given, else plain TCP to ``host:port``; in
    ``protocol`` with ``credentials``' user name and password)."""

    def __init__(self, host: str, port: int, *, max_samples: int = 100_000,
                 timeout_s: float = 2.0, endpoint: Endpoint | None = None,
                 credentials: ClientCredentials | None = None,
                 protocol: MqttProtocol = "3.1.1"):
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples!r}")
        self.host, self.port = host, port
        self.max_samples = max_samples
        self.timeout_s = timeout_s
        self.endpoint = endpoint or Endpoint(host=host, port=port)
        self.credentials, self.protocol = credentials, protocol
        self.dropped = 0
        self.error: str | None = None   # why reading ended early, if it did
        self._samples: list[SysSample] = []
        self._texts: dict[str, str] = {}
        self._lock = threading.Lock()
        self._sock: MqttSession | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        """Connect, subscribe to ``$SYS/#`` and read in a background thread.

        Raises SysTopicsUnavailable when the broker refuses the connection or the
        subscription (the reason names the CONNACK or SUBACK code, or the OS error).
        """
        if self._thread is not None:
            raise RuntimeError("this SysTopicsSampler was already started")
        where = f"{self.host}:{self.port}"
        try:
            # keep-alive 0: the broker never drops a client that only listens
            sock = connect(self.endpoint, f"mqttbed-sys-{os.getpid()}-{id(self):x}",
                           self.timeout_s, credentials=self.credentials,
                           protocol=self.protocol)
        except (OSError, ValueError) as exc:   # MalformedPacket is a ValueError
            raise SysTopicsUnavailable(f"cannot connect to {where}: {exc}") from None
        try:
            if not sock.accepted:
                raise SysTopicsUnavailable(f"{where} refused the connection: "
                                           f"{sock.refusal()}")
            sock.subscribe(1, ((SYS_FILTER, 0),))
            self._await_suback(sock, where)
        except BaseException:
            sock.close()
            raise
        sock.stream.settimeout(None)   # stop() ends the blocking read by shutting the socket down
        self._sock = sock
        self._thread = threading.Thread(target=self._read, name=f"sys-topics-{where}",
                                        daemon=True)
        self._thread.start()

    def _await_suback(self, sock: MqttSession, where: str) -> None:
        """Wait for the SUBACK; retained ``$SYS`` messages may come before it: keep them."""
        try:
            while not isinstance(packet := sock.read(), SubAck):
                self._keep(packet)
        except (OSError, MalformedPacket) as exc:
            raise SysTopicsUnavailable(f"no SUBACK from {where}: {exc}") from None
        if packet.return_codes[0] > 2:
            raise SysTopicsUnavailable(f"{where} refused the subscription to {SYS_FILTER} "
                                       f"(SUBACK {packet.return_codes[0]:#x})")

    def _read(self) -> None:
        sock = self._sock   # stop() takes the attribute away; this thread keeps its own
        assert sock is not None
        try:
            while True:
                self._keep(sock.read())
        except StreamClosed:
            if not self._stopping.is_set():
                self.error = "the broker closed the connection"
        except (OSError, MalformedPacket) as exc:
            if not self._stopping.is_set():
                self.error = f"reading stopped: {exc}"
                logger.warning("$SYS sampler of %s:%d: %s", self.host, self.port, self.error)

    def _keep(self, packet: object) -> None:
        """Keep a PUBLISH's value (numeric) or text; anything else is ignored."""
        if not isinstance(packet, Publish):
            return
        t_ns = monotonic_ns()
        value = numeric_value(packet.payload)
        with self._lock:
            if value is None:
                if packet.topic in self._texts or len(self._texts) < MAX_TEXT_TOPICS:
                    text = packet.payload[:MAX_TEXT_CHARS].decode("utf-8", "replace")
                    self._texts[packet.topic] = text
            elif len(self._samples) < self.max_samples:
                self._samples.append(SysSample(t_ns=t_ns, topic=packet.topic, value=value))
            else:
                self.dropped += 1

    @property
    def connected(self) -> bool:
        """Whether the session is up and being read (False once the broker closed it)."""
        return (self._thread is not None and self._thread.is_alive()
                and not self._stopping.is_set())

    @property
    def samples(self) -> list[SysSample]:
        """A copy of the numeric samples so far, in arrival order."""
        with self._lock:
            return list(self._samples)

    def texts(self) -> dict[str, str]:
        """The last non-numeric payload of each topic that had one."""
        with self._lock:
            return dict(self._texts)

    def stop(self) -> list[SysSample]:
        """Disconnect and stop reading; return every sample. Safe to call twice."""
        self._stopping.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.disconnect()
            with contextlib.suppress(OSError):
                sock.stream.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)
        return self.samples
