"""What the adaptive broker counts per client id, and the totals and records made of it.

A client's :class:`ClientTally` lives as long as the broker and follows its client id
across connections, so the figures of a subscriber that reconnected (or left before the
end of a run) are kept: its withholding counts and durations, its RTT queries and samples.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from mqttbed.brokers.adaptive.outbox import Outbox, WithholdingCounts
from mqttbed.brokers.adaptive.rtt import RttProbe

_COUNT_NAMES = tuple(f.name for f in fields(WithholdingCounts) if f.name != "withheld_s")


@dataclass
class ClientTally:
    """One client id's withholding counts and RTT probe."""

    probe: RttProbe
    counts: WithholdingCounts = field(default_factory=WithholdingCounts)

    def active(self) -> bool:
        """Whether there is anything to report: it got a delivery or a query."""
        counts = self.counts
        return bool(counts.small_deliveries or counts.large_deliveries or self.probe.sent)

    def figures(self, outbox: Outbox | None, queried: bool) -> dict[str, Any]:
        """Its counters now (``outbox``: its live queues, None if not connected)."""
        probe = self.probe
        return {
            **{name: getattr(self.counts, name) for name in _COUNT_NAMES},
            **{f"rtt_queries_{kind}": n for kind, n in probe.counts().items()},
            "rtt_latest_ms": None if probe.latest_s is None else probe.latest_s * 1e3,
            "connected": outbox is not None, "queried": queried,
            "queued": None if outbox is None else len(outbox.express) + len(outbox.bulk),
            "withheld": None if outbox is None else len(outbox.withheld),
        }


def totals(tallies: dict[str, ClientTally]) -> dict[str, int]:
    """Every counter summed over every client there was."""
    summed = dict.fromkeys(_COUNT_NAMES, 0)
    queries: dict[str, int] = {}
    for tally in tallies.values():
        for name, value in asdict(tally.counts).items():
            if name in summed:
                summed[name] += value
        for kind, value in tally.probe.counts().items():
            queries[f"rtt_queries_{kind}"] = queries.get(f"rtt_queries_{kind}", 0) + value
    return summed | {f"rtt_queries_{kind}": queries.get(f"rtt_queries_{kind}", 0)
                     for kind in RttProbe(0).counts()}


def samples(tallies: dict[str, ClientTally]) -> dict[str, Any]:
    """RTT samples and withheld durations: pooled, and per client that has any."""
    per_client = {client_id: {"rtt_ms": t.probe.samples_ms, "withheld_s": t.counts.withheld_s}
                  for client_id, t in tallies.items()
                  if t.probe.samples_ms or t.counts.withheld_s}
    return {"rtt_ms": [v for c in per_client.values() for v in c["rtt_ms"]],
            "withheld_s": [v for c in per_client.values() for v in c["withheld_s"]],
            "clients": per_client}
