"""The ``$SYS`` sampler as a backend runs it: started after deploy, stopped at teardown.

A backend holds one :class:`SysMonitor`, starts it once its broker answers, stops it
before the broker goes, returns its samples from ``sys_samples()`` and its
:class:`SysTopicsRecord` in the deployment record. A broker that refuses the sampler
(a user without the right to read ``$SYS``, no ``$SYS``) costs the run nothing: the record
says why.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.core.broker_access import ClientCredentials, MqttProtocol
from mqttbed.core.protocol import Endpoint, Transport
from mqttbed.core.samples import SysSample
from mqttbed.instruments.sys_topics import SysTopicsSampler, SysTopicsUnavailable

logger = logging.getLogger(__name__)

VERSION_TOPIC = "$SYS/broker/version"


class SysTopicsRecord(BaseModel):
    """What the ``$SYS`` sampler of a run got."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    samples: int = Field(description="numeric values kept")
    topics: int = Field(description="distinct topics among them")
    dropped: int = Field(0, description="values dropped past the sampler's memory bound")
    error: str | None = Field(None, description="why sampling did not start or ended early")


class SysMonitor:
    """One run's ``$SYS`` sampling (see the module docstring)."""

    def __init__(self) -> None:
        self._sampler: SysTopicsSampler | None = None
        self._error: str | None = None
        self._kept: list[SysSample] | None = None
        self.started = False

    def start(self, endpoint: Endpoint, credentials: ClientCredentials | None = None,
              protocol: MqttProtocol = "3.1.1") -> None:
        """Subscribe to the broker's ``$SYS/#`` as the run's clients reach it: over the
        endpoint's TLS and WebSocket, in ``protocol``, with ``credentials`` (MQTT over TCP
        only; over UDP a noted no-op)."""
        self.started = True
        if endpoint.transport != Transport.MQTT_TCP:
            self._error = (f"not sampled: $SYS is read over MQTT/TCP, the broker speaks "
                           f"{endpoint.transport}")
            return
        sampler = SysTopicsSampler(endpoint.host, endpoint.port, endpoint=endpoint,
                                   credentials=credentials, protocol=protocol)
        try:
            sampler.start()
        except SysTopicsUnavailable as exc:
            self._error = str(exc)
            logger.info("no $SYS samples: %s", exc)
            return
        self._sampler = sampler

    def stop(self) -> None:
        """Disconnect the sampler and keep its samples; safe to call twice."""
        if self._sampler is not None and self._kept is None:
            self._kept = self._sampler.stop()

    def connected(self) -> bool:
        """Whether the sampler's session with the broker is up right now."""
        return self._sampler is not None and self._sampler.connected

    def samples(self) -> list[SysSample]:
        """The numeric values so far (all of them once stopped)."""
        if self._kept is not None:
            return list(self._kept)
        return [] if self._sampler is None else self._sampler.samples

    def version(self) -> str | None:
        """What the broker says it is on ``$SYS/broker/version`` ("mosquitto version 2.0.11")."""
        return None if self._sampler is None else self._sampler.texts().get(VERSION_TOPIC)

    def record(self) -> SysTopicsRecord | None:
        """The summary for the deployment record; None when sampling was not asked for."""
        if not self.started:
            return None
        samples = self.samples()
        sampler = self._sampler
        return SysTopicsRecord(
            samples=len(samples), topics=len({s.topic for s in samples}),
            dropped=0 if sampler is None else sampler.dropped,
            error=self._error if sampler is None else sampler.error)
