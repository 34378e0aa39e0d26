"""What brokers are sampled for during a run: the contract between monitors and backends.

- :class:`BrokerResourceSample`: resource use of the broker's process tree.
- :class:`SysSample`: one numeric value a broker published on its ``$SYS`` topics.
- :class:`SysTopicsSource`: a backend that keeps the ``$SYS`` samples of its run.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class BrokerResourceSample(BaseModel):
    """One sample of a broker's resource use (whole process tree)."""

    model_config = ConfigDict(frozen=True)
    t_ns: int               # CLOCK_MONOTONIC
    cpu_percent: float      # of one core; 200 = two cores busy
    rss_bytes: int
    bytes_recv: int         # cumulative since deploy
    bytes_sent: int         # cumulative since deploy
    processes: int


class SysSample(BaseModel):
    """One numeric value a broker published on a ``$SYS`` topic, as it arrived.

    The broker decides what and how often (Mosquitto: every ``sys_interval`` seconds,
    10 by default); the value is the payload read as a number, in the broker's own unit
    (``$SYS/broker/load/bytes/received/1min`` is bytes per minute, averaged by the broker).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    t_ns: int = Field(description="arrival at the sampling client, CLOCK_MONOTONIC")
    topic: str = Field(description="e.g. $SYS/broker/clients/connected")
    value: float


@runtime_checkable
class SysTopicsSource(Protocol):
    """A backend that samples its broker's ``$SYS`` topics during the run."""

    def sys_samples(self) -> list[SysSample]:
        """The numeric ``$SYS`` values received since deploy (all of them after teardown)."""
        ...
