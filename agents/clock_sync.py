"""How far this agent's clock is from the controller's, re-estimated through a run.

An agent on the controller's machine (same kernel boot id) reads the very same
CLOCK_MONOTONIC: offset 0, uncertainty 0. Anywhere else the agent probes the controller
NTP-style (RFC 5905 on-wire: four timestamps per probe) and keeps the probe with the
shortest round trip, whose half is the bound on the error of the estimate: milliseconds
over a busy HTTP path. When both machines' clocks are disciplined (chrony or PTP, see
:mod:`mqttbed.core.clock_discipline`) and the sum of their error bounds is smaller than
that, the offset comes from comparing their realtime - monotonic differences instead,
and its uncertainty is that sum. That holds only when the two keep one time: a chronyd
that serves its own clock (``local``) agrees with no other machine, so a controller's
such clock counts only when the agent's chronyd is synchronised to the controller itself,
and an agent's never. Either way the probe runs, as the fallback and as a
check, and :class:`ClockTracker` repeats the estimate through the run so drift shows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from mqttbed.core.clock import boot_id, monotonic_ns, ntp_offset
from mqttbed.core.clock_discipline import (
    ClockDiscipline,
    is_own_local_reference,
    read_discipline,
    realtime_minus_monotonic_ns,
    references_address,
)
from mqttbed.core.protocol import ClockEstimate, ClockProbe

PROBES = 16
TRACKING_PROBES = 8  # per re-estimate during a run: fewer requests while it measures


def probe_offset(http: httpx.Client, probes: int = PROBES) -> tuple[ClockEstimate, ClockProbe]:
    """Estimate agent - controller by NTP-style probes; also return the best probe's answer."""
    best: tuple[int, int, ClockProbe] | None = None
    for _ in range(probes):
        t0 = monotonic_ns()
        response = http.post("/agent/v1/clock")
        t3 = monotonic_ns()
        response.raise_for_status()
        answer = ClockProbe.model_validate_json(response.content)
        server_ahead, half_rtt = ntp_offset(t0, answer.t_recv_ns, answer.t_send_ns, t3)
        if best is None or half_rtt < best[1]:
            best = (-server_ahead, half_rtt, answer)
    assert best is not None
    return (ClockEstimate(offset_ns=best[0], uncertainty_ns=best[1], method="ntp",
                          probe_uncertainty_ns=best[1]), best[2])


def keep_one_time(ours: ClockDiscipline, theirs: ClockDiscipline,
                  controller_address: str | None) -> bool:
    """Whether two synchronised disciplines keep one time (module docstring): neither is
    chronyd's own ``local`` clock, or the controller's is and ours is synchronised to the
    controller at ``controller_address``."""
    if is_own_local_reference(ours):
        return False
    if is_own_local_reference(theirs):
        return controller_address is not None and references_address(ours,
                                                                      controller_address)
    return True


def combine(probe: ClockEstimate, answer: ClockProbe, ours: ClockDiscipline,
            our_realtime_minus_monotonic_ns: int, controller_address: str | None = None
            ) -> ClockEstimate:
    """The better of the probe and the two disciplines' comparison (module docstring);
    ``controller_address``: the controller's IP address as the agent reaches it."""
    theirs = answer.discipline
    fields = {"discipline": ours.source, "discipline_error_ns": ours.error_bound_ns,
              "probe_uncertainty_ns": probe.uncertainty_ns}
    if (ours.synchronised and theirs is not None and theirs.synchronised
            and ours.error_bound_ns is not None and theirs.error_bound_ns is not None
            and answer.realtime_minus_monotonic_ns is not None
            and keep_one_time(ours, theirs, controller_address)):
        bound = ours.error_bound_ns + theirs.error_bound_ns
        if bound < probe.uncertainty_ns:
            offset = answer.realtime_minus_monotonic_ns - our_realtime_minus_monotonic_ns
            return ClockEstimate(offset_ns=offset, uncertainty_ns=bound, method=ours.source,
                                 **fields)
    return probe.model_copy(update=fields)


def estimate_offset(http: httpx.Client, controller_boot_id: str | None,
                    force_probe: bool = False, probes: int = PROBES,
                    discipline: Callable[[], ClockDiscipline] = read_discipline
                    ) -> ClockEstimate:
    """The offset of this agent's clock to the controller's, with its uncertainty."""
    ours = discipline()
    if not force_probe and controller_boot_id is not None and controller_boot_id == boot_id():
        return ClockEstimate(offset_ns=0, uncertainty_ns=0, method="same-clock",
                             discipline=ours.source, discipline_error_ns=ours.error_bound_ns)
    probe, answer = probe_offset(http, probes)
    return combine(probe, answer, ours, realtime_minus_monotonic_ns(), http.base_url.host)


class ClockTracker:
    """Re-estimates the offset every ``interval_s`` on a thread until stopped.

    Each new estimate goes to ``on_estimate`` (the runner gives it to its uploader, so the
    events recorded after it carry it). A failed estimate keeps the last one; a failed
    hand-over (the uploader gave up) ends the tracking.
    """

    def __init__(self, estimate: Callable[[], ClockEstimate], interval_s: float,
                 on_estimate: Callable[[ClockEstimate], None]):
        self._estimate = estimate
        self._interval_s = interval_s
        self._on_estimate = on_estimate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="clock-tracker", daemon=True)
        self.estimates = 0
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                estimate = self._estimate()
            except (httpx.HTTPError, ValueError):
                self.failures += 1
                continue
            self.estimates += 1
            try:
                self._on_estimate(estimate)
            except RuntimeError:
                return   # the upload failed for good: the runner reports that, not us
