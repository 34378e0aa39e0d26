"""Clocks every side of mqttbed timestamps with.

All software timestamps are CLOCK_MONOTONIC nanoseconds. On one machine every process
reads the same CLOCK_MONOTONIC, so a publisher's ``t_pub_ns`` and a subscriber's
``t_recv_ns`` in another process are directly comparable; across machines an agent's
offset to the controller's clock is recorded with each event.
"""

from __future__ import annotations

import time
from pathlib import Path

CLOCK_NAME = "CLOCK_MONOTONIC"


def boot_id() -> str | None:
    """This kernel's boot id: two processes with the same one read the same CLOCK_MONOTONIC."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def monotonic_ns() -> int:
    """Return CLOCK_MONOTONIC in nanoseconds (never wall time, never steps)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def seconds_until(deadline_ns: int) -> float:
    """Seconds from now to ``deadline_ns`` (a :func:`monotonic_ns` time), 0 once past: a
    timeout for the next wait of a loop that has one deadline."""
    return max(0.0, (deadline_ns - monotonic_ns()) / 1e9)


def resolution_ns() -> int:
    """Return the resolution of CLOCK_MONOTONIC in nanoseconds."""
    return int(time.clock_getres(time.CLOCK_MONOTONIC) * 1e9) or 1


def ntp_offset(t0: int, t1: int, t2: int, t3: int) -> tuple[int, int]:
    """Offset of the server's clock relative to ours, and half the round trip.

    ``t0``/``t3``: our clock when the request left and the answer came back; ``t1``/``t2``:
    the server's clock when the request arrived and the answer left (RFC 5905, on-wire).
    The true offset lies within +/- the returned half round trip of the estimate.
    """
    offset = ((t1 - t0) + (t2 - t3)) // 2
    half_round_trip = ((t3 - t0) - (t2 - t1)) // 2
    return offset, max(half_round_trip, 0)


def sleep_until_ns(deadline_ns: int, spin_ns: int = 200_000) -> None:
    """Sleep until ``deadline_ns`` on the monotonic clock.

    Sleeps coarsely, then spins for the last ``spin_ns`` so open-loop send times are not
    at the mercy of the scheduler's wake-up slack (typically 50-100 us).
    """
    while True:
        remaining = deadline_ns - monotonic_ns()
        if remaining <= 0:
            return
        if remaining > spin_ns:
            time.sleep((remaining - spin_ns) / 1e9)
