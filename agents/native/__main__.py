"""``python -m mqttbed.agents.native``: build the native load engine here, now, and say how
that went (one JSON line).

``mqttbed lab provision`` and ``lab upgrade`` run this on every agent host right after they
install mqttbed, so the C is compiled then, by the host's own compiler for its own CPU
(arm64 or armhf on a Pi), not when the host's first run starts; and a host that cannot
build it is known before any campaign: its agents will run the lean Python client, and
the host's facts (``native_engine``) say why. Prints ``{"state": "built", "library": ...,
"machine": ..., "seconds": ...}`` or ``{"state": "unavailable", "reason": ..., "seconds":
...}`` (seconds: to build, or to find the library built and current); exits 0 either way:
no engine is a fact of the host, not a failed install.

``python -m mqttbed.agents.native --gpio-check CHIP LINE [LINE ...]`` checks, on a board,
the path a ``gpiod`` run takes: the engine requests the lines on the GPIO character device
(uAPI v2, as in a run) and drives each high and low ``--toggles`` times with SET_VALUES,
then releases them low. Prints ``{"state": "driven", "chip": ..., "lines": [...], "writes":
..., "set_values_p50_ns": ..., "set_values_max_ns": ...}`` and exits 0, or ``{"state":
"refused", "reason": ...}`` (the chip's errno, e.g. EBUSY while an agent holds the lines)
and exits 1. A scope or an LED on the line shows the pulses; ``gpioinfo CHIP`` run meanwhile
names the consumer ``mqttbed``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any

from mqttbed.agents.native import engine
from mqttbed.core.clock import monotonic_ns


def build_report() -> dict[str, Any]:
    """Build (or find current) and load the engine; what happened (module docstring)."""
    started = time.monotonic()
    reason = engine.unavailable_reason()
    seconds = round(time.monotonic() - started, 2)
    if reason is not None:
        return {"state": "unavailable", "reason": reason, "seconds": seconds}
    return {"state": "built", "library": str(engine.library_path()),
            "machine": platform.machine(), "seconds": seconds}


def gpio_check(chip: str, lines: list[int], toggles: int) -> dict[str, Any]:
    """Request ``lines`` on ``chip`` from the engine and drive each up and down
    ``toggles`` times; the SET_VALUES timings, or why the chip refused (module docstring)."""
    reason = engine.unavailable_reason()
    if reason is not None:
        return {"state": "refused", "reason": reason}
    lines_engine = engine.Engine(kernel_stamps=False, pulse_mode=False, event_capacity=16)
    try:
        lines_engine.open_gpio_chip(chip, lines)
        costs = []
        for _ in range(toggles):
            for line in lines:
                for level in (1, 0):
                    started = monotonic_ns()
                    lines_engine.gpio_set(line, level)
                    costs.append(monotonic_ns() - started)
    except OSError as exc:
        return {"state": "refused", "reason": exc.strerror or str(exc)}
    finally:
        lines_engine.close()
    return {"state": "driven", "chip": chip, "lines": lines, "writes": len(costs),
            "set_values_p50_ns": int(statistics.median(costs)) if costs else None,
            "set_values_max_ns": max(costs) if costs else None}


def main(argv: list[str] | None = None) -> int:
    """Build the engine and report it, or with --gpio-check drive a chip's lines."""
    parser = argparse.ArgumentParser(prog="python -m mqttbed.agents.native")
    parser.add_argument("--gpio-check", nargs="+", metavar=("CHIP", "LINE"),
                        help="drive LINEs of the GPIO character device CHIP from the engine")
    parser.add_argument("--toggles", type=int, default=1000,
                        help="up-and-down pulses per line (--gpio-check; default 1000)")
    args = parser.parse_args(argv)
    if args.gpio_check is None:
        report = build_report()
    else:
        chip, *numbers = args.gpio_check
        try:
            lines = [int(n) for n in numbers]
        except ValueError:
            parser.error(f"--gpio-check: lines are offsets on the chip, not {numbers!r}")
        if not lines or args.toggles < 1:
            parser.error("--gpio-check needs a chip, at least one line and --toggles >= 1")
        report = gpio_check(chip, lines, args.toggles)
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 1 if report["state"] == "refused" else 0


if __name__ == "__main__":
    sys.exit(main())
