"""Resource samples of a broker's process tree: the contract between monitors and backends."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class BrokerStatsSample(BaseModel):
    """One sample of a broker's resource use (whole process tree)."""

    model_config = ConfigDict(frozen=True)
    t_ns: int               # CLOCK_MONOTONIC
    cpu_percent: float      # of one core; 200 = two cores busy
    rss_bytes: int
    bytes_recv: int         # cumulative since deploy
    bytes_sent: int         # cumulative since deploy
    processes: int
