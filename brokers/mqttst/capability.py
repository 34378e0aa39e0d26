"""A broker's capability C = alpha * L + beta * M (paper eq. 1), read once at startup.

L is the CPU speed: the sum of the ``cpu MHz`` lines of ``/proc/cpuinfo`` over all
logical CPUs (a 4-core 2 GHz machine counts 8000), falling back to the cpufreq maximum
where ``/proc/cpuinfo`` has no such line (Raspberry Pi kernels). M is ``MemTotal`` of
``/proc/meminfo`` in MiB. The paper gives no values for alpha and beta; the defaults
(1 per MHz, 1 per MiB) weigh 1 GHz of CPU about as much as 1 GiB of RAM.

C is read once, as in the paper: ``cpu MHz`` follows frequency scaling, and a C that
moved at run time would move the root with it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

DEFAULT_ALPHA = 1.0   # capability units per MHz of CPU
DEFAULT_BETA = 1.0    # capability units per MiB of RAM

_MHZ = re.compile(r"^cpu MHz\s*:\s*([0-9.]+)", re.MULTILINE)
_MEM_TOTAL = re.compile(r"^MemTotal:\s*([0-9]+)\s*kB", re.MULTILINE)


def cpu_mhz(cpuinfo: Path = Path("/proc/cpuinfo"),
            cpufreq: Path = Path("/sys/devices/system/cpu")) -> float:
    """L: the summed clock of all logical CPUs in MHz (0 if the kernel says nothing)."""
    try:
        speeds = [float(mhz) for mhz in _MHZ.findall(cpuinfo.read_text())]
    except OSError:
        speeds = []
    if not speeds:
        for path in sorted(cpufreq.glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq")):
            try:
                speeds.append(int(path.read_text()) / 1000.0)   # kHz
            except (OSError, ValueError):
                continue
    return round(sum(speeds), 0)


def memory_mib(meminfo: Path = Path("/proc/meminfo")) -> float:
    """M: the machine's total RAM in MiB (0 if unreadable)."""
    try:
        match = _MEM_TOTAL.search(meminfo.read_text())
    except OSError:
        return 0.0
    return round(int(match.group(1)) / 1024.0, 0) if match else 0.0


def capability(alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA) -> float:
    """C = alpha * L + beta * M for this machine."""
    for name, weight in (("alpha", alpha), ("beta", beta)):
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{name}={weight!r}: the capability weights must be finite "
                             "and >= 0")
    return alpha * cpu_mhz() + beta * memory_mib()
