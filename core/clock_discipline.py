"""What keeps this machine's clock right: chrony, linuxptp, or nothing, with its error bound.

Read by an agent (and by the controller, for its own side) so that two machines whose
clocks are disciplined can be compared to within the disciplines' bounds instead of the
millisecond round trip of an HTTP probe.

chrony: ``chronyc -c tracking`` prints one CSV line; its fields, in the order of the
``tracking`` report documented in chronyc(1):

 1. Reference ID (hex; ``7F7F0101`` is chrony's own ``local`` reference)
 2. reference name or address (empty with ``-n`` or for a local reference)
 3. Stratum
 4. Ref time: UTC seconds since the epoch of the last measurement of the reference
 5. System time: seconds the system clock is off NTP time, as the correction chronyd is
    still applying (positive: the clock is slow; the human report says "slow"/"fast")
 6. Last offset (s)   7. RMS offset (s)   8. Frequency (ppm; positive: slow)
 9. Residual freq (ppm)   10. Skew (ppm)
 11. Root delay (s): total network path delay to the stratum-1 source
 12. Root dispersion (s): total dispersion accumulated up to the stratum-1 source
 13. Update interval (s)   14. Leap status (Normal, Insert second, Delete second,
     Not synchronised)

chronyc(1) gives the bound on the clock's error from these:
``|System time| + Root dispersion + Root delay / 2``. Stratum 0 / reference id 0 /
leap status "Not synchronised" mean not synchronised, and no bound. chronyd serving its
own clock (``local stratum N``, reference id 7F7F0101) is synchronised to itself only: a
controller's such clock is comparable with an agent's only when the agent's chronyd is
synchronised to that controller (:func:`is_own_local_reference`, :func:`references_address`).

linuxptp: ``pmc -u -b 0 'GET TIME_STATUS_NP'`` asks ptp4l for ``master_offset`` (ns, its
clock's last measured offset to the grandmaster) and ``gmPresent``. Its bound here is
``|master_offset|``: it covers ptp4l's clock, not phc2sys's copy of it into the system
clock (a hardware-timestamping NIC's PHC); on a Pi without PHC, ptp4l -S disciplines the
system clock itself and the bound is the one that matters.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import threading
import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

CHRONY_FIELDS = 14
LOCAL_REFERENCE = "7F7F0101"
COMMAND_TIMEOUT_S = 2.0


class ClockDiscipline(BaseModel):
    """This machine's clock discipline as found now."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str                        # "chrony", "ptp" or "none"
    synchronised: bool = False
    offset_ns: int | None = None       # how far the clock is off its reference (+: ahead)
    error_bound_ns: int | None = None  # the clock is within this of its reference
    reference: str | None = None       # chrony's reference id / name, ptp's grandmaster
    detail: str = ""                   # why not synchronised, or what was not found


class ClockParseError(ValueError):
    """A discipline tool printed something this parser does not understand."""


def parse_chronyc_tracking(line: str) -> ClockDiscipline:
    """The discipline described by one ``chronyc -c tracking`` CSV line (module docstring)."""
    fields = line.strip().split(",")
    if len(fields) != CHRONY_FIELDS:
        raise ClockParseError(f"chronyc -c tracking printed {len(fields)} fields, expected "
                              f"{CHRONY_FIELDS}: {line.strip()[:200]!r}")
    try:
        ref_id, name, stratum = fields[0], fields[1], int(fields[2])
        system_time_s, root_delay_s, root_dispersion_s = (float(fields[4]), float(fields[10]),
                                                          float(fields[11]))
    except ValueError as exc:
        raise ClockParseError(f"chronyc -c tracking: {exc}: {line.strip()[:200]!r}") from None
    leap = fields[13]
    reference = f"{ref_id} ({name})" if name else ref_id
    if int(ref_id, 16) == 0 or stratum == 0 or leap == "Not synchronised":
        return ClockDiscipline(source="chrony", reference=reference,
                               detail=f"chronyd is not synchronised (leap status {leap!r})")
    bound_s = abs(system_time_s) + root_dispersion_s + root_delay_s / 2
    detail = ("chronyd's own local reference, not a real clock: no agreement with other "
              "machines" if ref_id.upper() == LOCAL_REFERENCE else f"stratum {stratum}")
    return ClockDiscipline(source="chrony", synchronised=True,
                           offset_ns=round(-system_time_s * 1e9),   # slow by x: -x off
                           error_bound_ns=round(bound_s * 1e9), reference=reference,
                           detail=detail)


def parse_pmc_time_status(text: str) -> ClockDiscipline:
    """The discipline in ``pmc -u -b 0 'GET TIME_STATUS_NP'`` output (module docstring)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            values[parts[0]] = parts[1]
    if "master_offset" not in values:
        raise ClockParseError(f"pmc printed no master_offset (is ptp4l running?): "
                              f"{text.strip()[:200]!r}")
    try:
        offset = int(values["master_offset"])
    except ValueError:
        raise ClockParseError(f"pmc: master_offset {values['master_offset']!r} is not an "
                              "integer") from None
    grandmaster = values.get("gmIdentity")
    if values.get("gmPresent") != "true":
        return ClockDiscipline(source="ptp", reference=grandmaster,
                               detail="ptp4l sees no grandmaster (gmPresent false)")
    return ClockDiscipline(source="ptp", synchronised=True, offset_ns=offset,
                           error_bound_ns=abs(offset), reference=grandmaster,
                           detail="ptp4l's clock to the grandmaster")


def read_discipline(chronyc: str = "chronyc", pmc: str = "pmc",
                    chronyc_socket: str | None = None) -> ClockDiscipline:
    """Ask linuxptp, then chrony; ``none`` (with what was tried) when neither answers."""
    tried = []
    if shutil.which(pmc):
        done = _run([pmc, "-u", "-b", "0", "GET TIME_STATUS_NP"])
        if done is not None and "master_offset" in done:
            return parse_pmc_time_status(done)
        tried.append("pmc: ptp4l did not answer")
    else:
        tried.append("pmc not installed")
    if shutil.which(chronyc):
        argv = [chronyc, *(("-h", chronyc_socket) if chronyc_socket else ()), "-c", "tracking"]
        done = _run(argv)
        if done:
            return parse_chronyc_tracking(done.splitlines()[0])
        tried.append("chronyc: chronyd did not answer")
    else:
        tried.append("chronyc not installed")
    return ClockDiscipline(source="none", detail="; ".join(tried))


def is_own_local_reference(discipline: ClockDiscipline) -> bool:
    """Whether chronyd's reference is its own ``local`` clock (reference id 7F7F0101).

    Such a clock is synchronised only to itself: its bound says nothing about how far it
    is from any other machine's.
    """
    return (discipline.source == "chrony" and discipline.reference is not None
            and discipline.reference.split(" ", 1)[0].upper() == LOCAL_REFERENCE)


def references_address(discipline: ClockDiscipline, address: str) -> bool:
    """Whether chronyd's reference is the NTP server at ``address`` (an IP address).

    An IPv4 source's reference id is its address's 32 bits; an IPv6 source's is a hash of
    its address, so for those the reference's name (chronyc prints the address when it
    cannot resolve it) is compared instead.
    """
    if discipline.source != "chrony" or discipline.reference is None:
        return False
    ref_id, _, name = discipline.reference.partition(" ")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if name.strip("()") == str(ip):
        return True
    try:
        return ip.version == 4 and int(ref_id, 16) == int(ip)
    except ValueError:
        return False


def realtime_minus_monotonic_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC now (read in between two monotonic reads).

    The disciplines keep CLOCK_REALTIME; the monotonic clock runs at its rate. Two
    machines' realtime clocks agree within their bounds, so ``theirs - ours`` of this
    difference is the offset of our monotonic clock to theirs within the same bounds.
    """
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    real = time.clock_gettime_ns(time.CLOCK_REALTIME)
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return real - (before + after) // 2


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


class CachedDiscipline:
    """:func:`read_discipline`, asked at most every ``max_age_s`` (the controller's side)."""

    def __init__(self, max_age_s: float = 10.0,
                 read: Callable[[], ClockDiscipline] = read_discipline):
        self._max_age_ns = int(max_age_s * 1e9)
        self._read = read
        self._lock = threading.Lock()
        self._value: ClockDiscipline | None = None
        self._read_at_ns = 0

    def get(self) -> ClockDiscipline:
        with self._lock:
            now = time.monotonic_ns()
            if self._value is None or now - self._read_at_ns > self._max_age_ns:
                self._value, self._read_at_ns = self._read(), now
            return self._value
