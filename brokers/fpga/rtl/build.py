"""Building the RTL broker: the Verilated UDP harness, and the yosys synthesis check.

Verilator builds take tens of seconds on a small machine, so each build goes to a directory
named after a hash of the sources it is made from (``build/<sha256[:16]>/`` beside the
sources, or ``~/.cache/mqttbed/fpga-rtl`` when the package is read-only): a build is reused
until a source changes, and a lock file serialises concurrent builds of the same sources.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from mqttbed.core.errors import BackendError, MissingSystemDependency, system_deps_hint

SOURCE_DIR = Path(__file__).resolve().parent
SIM_BINARY = "mqttbed-fpga-rtl"
# A guard against a hung tool, not a budget: CI runs the synthesis niced beside `make
# test`'s two workers, where yosys took over 600 s of wall time (2026-11-29).
BUILD_TIMEOUT_S = 1800
INSTALL_HINT = ("install Verilator (and yosys for the synthesis check): "
                + system_deps_hint("rtl", "verilator yosys g++ make"))


def sources() -> list[Path]:
    """Every file the builds are made from: Verilog, the harness, the Makefile, synth.ys."""
    return sorted([*SOURCE_DIR.glob("*.v"), *SOURCE_DIR.glob("*.vh"),
                   SOURCE_DIR / "harness.cpp", SOURCE_DIR / "Makefile", SOURCE_DIR / "synth.ys"])


def source_hash() -> str:
    """A hash of the sources' names and contents (the build directory's name)."""
    digest = hashlib.sha256()
    for path in sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_root() -> Path:
    """Where builds go: ``MQTTBED_RTL_BUILD_DIR`` if set, else ``build/`` beside the sources
    if writable, else a user cache."""
    if override := os.environ.get("MQTTBED_RTL_BUILD_DIR"):
        return Path(override)
    local = SOURCE_DIR / "build"
    if os.access(SOURCE_DIR, os.W_OK) and (not local.exists() or os.access(local, os.W_OK)):
        return local
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mqttbed" / "fpga-rtl"


def build_dir() -> Path:
    return build_root() / source_hash()[:16]


def missing_tool(*tools: str) -> str | None:
    """Return an install hint if a tool the builds need is missing, else None."""
    for tool in ("make", "g++", *tools):
        if shutil.which(tool) is None:
            return f"{tool} is not installed; {INSTALL_HINT}"
    return None


def _make(target: str, output: Path, *tools: str) -> Path:
    if output.exists():
        return output
    if (missing := missing_tool(*tools)) is not None:
        raise MissingSystemDependency(missing)
    out_dir = output.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if output.exists():           # another process built it while we waited
            return output
        try:
            result = subprocess.run(["make", "-C", str(SOURCE_DIR), target, f"BUILD={out_dir}"],
                                    capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BackendError(f"make {target} for the RTL broker took over "
                               f"{BUILD_TIMEOUT_S} s") from None
        if result.returncode != 0 or not output.exists():
            raise BackendError(f"make {target} for the RTL broker failed "
                               f"(exit {result.returncode}):\n{result.stdout[-3000:]}"
                               f"{result.stderr[-3000:]}")
    return output


def ensure_sim() -> Path:
    """Return the Verilated UDP harness for the current sources, building it if needed."""
    return _make("sim", build_dir() / SIM_BINARY, "verilator")


def ensure_synth() -> Path:
    """Run yosys synthesis for the current sources if needed; return its stat report."""
    return _make("synth", build_dir() / "stat.txt", "yosys")


RTL_SOURCES = ("mqtt_broker.v", "mqtt_parser.v", "mqtt_parser_lane.v", "mqtt_parser_fast.v",
               "msg_queue.v", "lookup_engine.v", "hash_table.v", "sync_fifo.v", "packet_gen.v")


def run_cocotb(toplevel: str, test_module: str, results_dir: Path) -> tuple[int, int]:
    """Build ``toplevel`` for cocotb with Verilator (once per source hash) and run the
    cocotb tests of ``mqttbed.brokers.fpga.rtl.tests.<test_module>``; return (tests, failed).
    """
    from cocotb.runner import get_results, get_runner

    if (missing := missing_tool("verilator")) is not None:
        raise MissingSystemDependency(missing)
    runner = get_runner("verilator")
    # the build's arguments are here: a build kept by the sources' hash alone would outlive
    # a change to them
    arguments = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]
    out_dir = build_root() / f"cocotb-{toplevel}-{source_hash()[:16]}-{arguments}"
    out_dir.mkdir(parents=True, exist_ok=True)
    env_before = os.environ.get("MAKEFLAGS")
    os.environ["MAKEFLAGS"] = "-j2"
    try:
        with open(out_dir / ".build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            built = (out_dir / ".built").exists()
            if built:   # the runner has no "only if needed" for Verilator: skip its commands
                runner._execute = lambda _cmds, cwd: None
            runner.build(verilog_sources=[SOURCE_DIR / name
                                          for name in (*RTL_SOURCES, "cocotb_top.v")],
                         includes=[SOURCE_DIR], hdl_toplevel=toplevel,
                         build_args=["-Wno-fatal", "-Wno-WIDTH", "-O3", "--x-assign", "fast"],
                         build_dir=out_dir)
            if built:
                del runner._execute
            else:
                (out_dir / ".built").touch()
        results = runner.test(test_module=f"mqttbed.brokers.fpga.rtl.tests.{test_module}",
                              hdl_toplevel=toplevel, build_dir=out_dir, test_dir=results_dir)
    finally:
        if env_before is None:
            os.environ.pop("MAKEFLAGS", None)
        else:
            os.environ["MAKEFLAGS"] = env_before
    return get_results(results)


_FF_CELLS = ("FDRE", "FDSE", "FDCE", "FDPE")
_LUTRAM_CELLS = ("RAM32M", "RAM32M16", "RAM64M", "RAM64M8", "RAM32X1D", "RAM64X1D",
                 "RAM128X1D", "RAM256X1D")


def parse_stat(text: str) -> dict[str, dict[str, float]]:
    """Per module of yosys's ``stat`` report (and ``total`` for the whole design): LUTs,
    LUTs used as memory (LUTRAM cells), flip-flops, block RAM in 36 Kb units
    (RAMB18 = 0.5, as Vivado and the paper count), and latches."""
    modules: dict[str, dict[str, float]] = {}
    current: dict[str, float] | None = None
    for line in text.splitlines():
        if line.startswith("=== ") and line.endswith(" ==="):
            name = line[4:-4].strip()
            if name == "design hierarchy":
                name = "total"
            elif name.startswith("$paramod"):    # $paramod$<hash>\name or $paramod\name\P=v
                name = name.split("\\")[1]
            current = modules.setdefault(name, {"lut": 0, "lutram_cells": 0, "ff": 0,
                                                "bram36": 0.0, "latch": 0})
            continue
        parts = line.split()
        if current is None or len(parts) != 2 or not parts[1].isdigit():
            continue
        cell, count = parts[0], int(parts[1])
        if cell.startswith("LUT") and cell[3:].isdigit():
            current["lut"] += count
        elif cell in _FF_CELLS:
            current["ff"] += count
        elif cell.startswith("RAMB36"):
            current["bram36"] += count
        elif cell.startswith("RAMB18"):
            current["bram36"] += count / 2
        elif cell in _LUTRAM_CELLS:
            current["lutram_cells"] += count
        elif cell.startswith("LD"):
            current["latch"] += count
    return modules
