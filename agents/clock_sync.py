"""How far this agent's clock is from the controller's.

An agent on the controller's machine (same kernel boot id) reads the very same
CLOCK_MONOTONIC: offset 0, uncertainty 0. Anywhere else the agent probes the controller
NTP-style (RFC 5905 on-wire: four timestamps per probe) and keeps the probe with the
shortest round trip, whose half is the bound on the error of the estimate.
"""

from __future__ import annotations

import httpx

from mqttbed.core.clock import boot_id, monotonic_ns, ntp_offset
from mqttbed.core.protocol import ClockEstimate, ClockProbe

PROBES = 16


def probe_offset(http: httpx.Client, probes: int = PROBES) -> ClockEstimate:
    """Estimate agent - controller by NTP-style probes over the agent's HTTP connection."""
    best: tuple[int, int] | None = None
    for _ in range(probes):
        t0 = monotonic_ns()
        response = http.post("/agent/v1/clock")
        t3 = monotonic_ns()
        response.raise_for_status()
        answer = ClockProbe.model_validate_json(response.content)
        server_ahead, half_rtt = ntp_offset(t0, answer.t_recv_ns, answer.t_send_ns, t3)
        if best is None or half_rtt < best[1]:
            best = (-server_ahead, half_rtt)
    assert best is not None
    return ClockEstimate(offset_ns=best[0], uncertainty_ns=best[1], method="ntp")


def estimate_offset(http: httpx.Client, controller_boot_id: str | None,
                    force_probe: bool = False) -> ClockEstimate:
    """The offset of this agent's clock to the controller's, with its uncertainty."""
    if not force_probe and controller_boot_id is not None and controller_boot_id == boot_id():
        return ClockEstimate(offset_ns=0, uncertainty_ns=0, method="same-clock")
    return probe_offset(http)
