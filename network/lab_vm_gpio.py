"""The engine's GPIO edges through a real kernel driver, read back as a logic analyser would.

An arm64 guest (Debian's arm64 kernel on QEMU's ``virt`` board, a Cortex-A72 under TCG)
runs the native engine's GPIO run (``agents/native/tests/gpio_edges.c``): a publisher and
a subscriber against a broker on this machine, each toggling a line of the board's PL061
GPIO controller at every publish and every receive, through the kernel's gpiolib and
PL061 driver (uAPI v2 ``GPIO_V2_GET_LINE_IOCTL``, ``GPIO_V2_LINE_SET_VALUES_IOCTL``). Outside
the guest, QEMU's ``pl061_set_output`` trace event is the logic analyser: every change of
the controller's output lines as the emulated device sees the register write, stamped by
this machine's clock (the ``log`` trace backend with ``-msg timestamp=on``: CLOCK_REALTIME,
microseconds). :func:`compare_edges` holds the engine's recorded edges against it.

The guest is built by ``scripts/lab-vm/build-arm64.sh`` (kernel and initramfs only, no
disk; cached by the digest of its recipe) and reaches the broker through QEMU's user
network, where 10.0.2.2 is this machine's loopback: a broker listening on 127.0.0.1 is
enough, and the guest needs no bridge, tap or root.

What the comparison can show: the engine stamps each edge (``EDGE_T``) right before the
SET_VALUES ioctl and records how long the ioctl took (``EDGE_WRITE``), so the register
write happened within ``[t, t + write]`` of the guest's CLOCK_MONOTONIC. Under TCG that
clock is QEMU's virtual clock, which is this machine's CLOCK_MONOTONIC plus a constant
while the guest runs, read on the same host thread that executes the write; so one
constant offset must place every traced edge inside its engine window, give or take the
clocks' resolutions. That is checked, edge by edge, along with the lines, levels and order.
It shows the engine's calls drive the kernel's real driver, edge for edge, at the moments
it says; it says nothing of a Pi's pins or of electrical timing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mqttbed.core.errors import MissingSystemDependency, system_deps_hint
from mqttbed.network.lab_vm import (
    BUILD_SCRIPT as AMD64_BUILD_SCRIPT,
)
from mqttbed.network.lab_vm import (
    SERIAL_TAIL_CHARS,
    STOP_TIMEOUT_S,
    TCG_CODE_CACHE_MB,
    LabVmError,
    run_build_script,
    stop_qemu,
)

BUILD_SCRIPT = AMD64_BUILD_SCRIPT.with_name("build-arm64.sh")
QEMU = "qemu-system-aarch64"
PL061_LINES = 8
# hw/arm/virt.c (create_gpio_keys): the board's power button, a gpio-key device, drives
# the PL061's line 3 as an input, and the device tree names it; the guest leaves it alone
POWER_BUTTON_LINE = 3
# The Pi 4's core. TCG's `-cpu max` emulates the architected pointer authentication
# (QARMA), which made the same boot 6x slower here: /init at 11.4 s of guest time against
# 1.9 s with this CPU
CPU = "cortex-a72"
GUEST_BROKER = "10.0.2.2"   # QEMU's user network: this machine's 127.0.0.1
DEFAULT_MEMORY_MB = 256
RUN_TIMEOUT_S = 300.0       # boot (2-5 s here) and the run, with room for a busy machine
MAX_MESSAGES = 32767        # gpio-edges keeps 65536 edges: two lines' worth
MAX_RATE_HZ = 10000
TRACE_EVENTS = ("pl061_reset", "pl061_set_output")
# The log backend's stamp is gettimeofday's (microseconds, truncated); the guest's clock
# counts the virt board's 62.5 MHz generic timer (16 ns). One edge may sit outside its
# window by at most this before the offset check fails.
CLOCK_SLACK_NS = 2_000
SERIAL_PREFIX = "mqttbed-"
_TRACE_LINE = re.compile(
    r"^\d+@(?P<sec>\d+)\.(?P<usec>\d{6}):(?P<event>pl061_\w+)"
    r"(?: \S+ setting output (?P<line>\d+) to (?P<level>\d+))?")


class GpioGuestError(LabVmError):
    """The arm64 GPIO guest could not be built, booted or run; the message says why."""


@dataclass(frozen=True)
class GpioGuestImage:
    """A built guest: Debian's arm64 kernel, the initramfs, what the manifest says."""

    directory: Path
    kernel_release: str
    manifest: dict[str, object]

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.cpio"

    @classmethod
    def load(cls, directory: Path) -> GpioGuestImage:
        """The guest built into ``directory`` (refused, naming the fix, if it is not one)."""
        manifest_path = directory / "manifest.json"
        if not manifest_path.is_file():
            raise GpioGuestError(f"{directory}: no manifest.json there, so no built guest; "
                                 f"build one with {BUILD_SCRIPT}")
        manifest = json.loads(manifest_path.read_text())
        return cls(directory=directory, kernel_release=str(manifest["kernel_release"]),
                   manifest=manifest)


def build_gpio_image() -> GpioGuestImage:
    """Build the guest with ``scripts/lab-vm/build-arm64.sh`` (instant when cached)."""
    return GpioGuestImage.load(run_build_script(BUILD_SCRIPT))


@dataclass(frozen=True)
class Edge:
    """A line's change: the engine's (guest CLOCK_MONOTONIC, and how long its write took)
    or the trace's (this machine's CLOCK_REALTIME, ``write_ns`` 0)."""

    line: int
    level: int
    t_ns: int
    write_ns: int = 0


@dataclass(frozen=True)
class GuestRun:
    """What one boot of the guest did and recorded."""

    engine_edges: list[Edge]
    trace_edges: list[Edge]
    chip: str                   # the PL061's character device and its sysfs path
    sent: int
    deliveries: int
    refused_writes: int
    exit_status: int            # gpio-edges's
    guest_uptime_at_init_s: float
    boot_to_init_s: float       # wall: QEMU started -> the guest's /init printed
    total_s: float              # wall: QEMU started -> QEMU exited
    errors: list[str] = field(default_factory=list)


def check_run_arguments(messages: int, rate_hz: int, pub_line: int, sub_line: int) -> None:
    """Refuse, naming the field and its value, what the guest's run cannot take."""
    for name, line in (("pub_line", pub_line), ("sub_line", sub_line)):
        if not 0 <= line < PL061_LINES:
            raise GpioGuestError(f"{name} {line}: the PL061 has lines 0..{PL061_LINES - 1}")
        if line == POWER_BUTTON_LINE:
            raise GpioGuestError(f"{name} {line}: the virt board's power button drives "
                                 "that line (hw/arm/virt.c); take another of 0..7")
    if pub_line == sub_line:
        raise GpioGuestError(f"pub_line and sub_line are both {pub_line}: give two lines")
    if not 1 <= messages <= MAX_MESSAGES:
        raise GpioGuestError(f"messages {messages}: between 1 and {MAX_MESSAGES}")
    if not 1 <= rate_hz <= MAX_RATE_HZ:
        raise GpioGuestError(f"rate_hz {rate_hz}: between 1 and {MAX_RATE_HZ}")


def run_gpio_guest(image: GpioGuestImage, root: Path, *, broker_port: int, messages: int,
                   rate_hz: int, pub_line: int, sub_line: int,
                   memory_mb: int = DEFAULT_MEMORY_MB,
                   timeout_s: float = RUN_TIMEOUT_S) -> GuestRun:
    """Boot the guest once: it runs ``messages`` publishes against the broker listening on
    this machine's 127.0.0.1:``broker_port`` and powers off; return what it recorded and
    what QEMU's trace saw. The serial console, QEMU's output and the trace stay in ``root``.
    """
    check_run_arguments(messages, rate_hz, pub_line, sub_line)
    if shutil.which(QEMU) is None:
        raise MissingSystemDependency(f"{QEMU} not found: " + system_deps_hint(
            "gpio", "qemu-system-arm"))
    root.mkdir(parents=True, exist_ok=True)
    serial, trace, events = root / "serial.log", root / "trace.log", root / "trace-events"
    for stale in (serial, trace):
        stale.unlink(missing_ok=True)
    events.write_text("".join(f"{event}\n" for event in TRACE_EVENTS))
    name = f"mqttbed-gpio-{root.name}"
    append = " ".join([
        "console=ttyAMA0", "panic=-1", "quiet",
        f"mqttbed.broker={GUEST_BROKER}", f"mqttbed.port={broker_port}",
        f"mqttbed.messages={messages}", f"mqttbed.rate={rate_hz}",
        f"mqttbed.pub_line={pub_line}", f"mqttbed.sub_line={sub_line}"])
    argv = [QEMU, "-name", name, "-machine", "virt", "-cpu", CPU,
            "-accel", f"tcg,tb-size={TCG_CODE_CACHE_MB}", "-m", str(memory_mb),
            "-nodefaults", "-display", "none", "-no-reboot",
            "-serial", f"file:{serial}",
            "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", append,
            # the user network (slirp): the guest at 10.0.2.15 reaches this machine's
            # loopback at 10.0.2.2, one host socket per guest connection
            "-netdev", "user,id=net0", "-device", "virtio-net-device,netdev=net0",
            "-trace", f"events={events},file={trace}", "-msg", "timestamp=on"]
    started = time.monotonic()
    boot_to_init_s: float | None = None
    with (root / "qemu.log").open("wb") as log:
        qemu = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        while qemu.poll() is None:
            if boot_to_init_s is None and f"{SERIAL_PREFIX}init " in _read(serial):
                boot_to_init_s = time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise GpioGuestError(f"the guest did not power off within {timeout_s:.0f} s "
                                     f"of QEMU's start; {_tails(root)}")
            time.sleep(0.05)
    finally:
        if qemu.poll() is None:
            stop_qemu(qemu.pid, name)
            qemu.wait(STOP_TIMEOUT_S)
    total_s = time.monotonic() - started
    if qemu.returncode != 0:
        raise GpioGuestError(f"QEMU exited with {qemu.returncode}; {_tails(root)}")
    return _guest_run(_read(serial), _read(trace), boot_to_init_s, total_s, root)


def _guest_run(console: str, trace: str, boot_to_init_s: float | None, total_s: float,
               root: Path) -> GuestRun:
    said: dict[str, list[str]] = {}
    engine_edges: list[Edge] = []
    for raw in console.splitlines():
        words = raw.strip().split()
        if not words:
            continue
        if words[0] == "edge" and len(words) == 5:
            line, level, t_ns, write_ns = (int(w) for w in words[1:])
            engine_edges.append(Edge(line, level, t_ns, write_ns))
        elif words[0].startswith(SERIAL_PREFIX) or words[0] in ("client", "refused-writes"):
            key = words[0] if words[0] != "client" else f"client-{words[1]}"
            said.setdefault(key, []).extend(words[1:])
    if "mqttbed-exit" not in said or boot_to_init_s is None:
        raise GpioGuestError(f"the guest powered off without running gpio-edges; "
                             f"{_tails(root)}")
    publisher, subscriber = said.get("client-0", []), said.get("client-1", [])
    if len(publisher) < 3 or len(subscriber) < 5:
        raise GpioGuestError(f"gpio-edges ended before its counts; {_tails(root)}")
    return GuestRun(
        engine_edges=engine_edges, trace_edges=parse_trace(trace),
        chip=" ".join(said.get("mqttbed-chip", [])),
        sent=int(publisher[2]), deliveries=int(subscriber[4]),
        refused_writes=int(said.get("refused-writes", ["-1"])[0]),
        exit_status=int(said["mqttbed-exit"][0]),
        guest_uptime_at_init_s=float(said["mqttbed-init"][0]),
        boot_to_init_s=round(boot_to_init_s, 2), total_s=round(total_s, 2),
        errors=[" ".join(said[k]) for k in said if k == "mqttbed-error"])


def parse_trace(text: str) -> list[Edge]:
    """The output changes QEMU's trace recorded after the PL061's last reset, in the
    trace's order.

    The reset (the board's own, at start-up, before the guest runs) is followed by its
    report of every line's level, lines 0..7 in order (QEMU 7.2's ``pl061_update`` after
    ``pl061_reset``): that report is the starting state, not an edge, and is left out.
    """
    edges: list[Edge] = []
    report: list[int] | None = None   # the lines reported since the last reset
    for raw in text.splitlines():
        match = _TRACE_LINE.match(raw)
        if match is None:
            continue
        if match["event"] == "pl061_reset":
            edges.clear()
            report = []
        elif match["event"] == "pl061_set_output" and match["line"] is not None:
            line = int(match["line"])
            if report is not None and len(report) < PL061_LINES:
                if line != len(report):
                    raise GpioGuestError(
                        f"the PL061's reset reported line {line} after lines {report}, not "
                        f"all {PL061_LINES} lines in order: this QEMU traces its reset "
                        "otherwise than 7.2 does, so its edges cannot be told apart")
                report.append(line)
                continue
            t_ns = int(match["sec"]) * 1_000_000_000 + int(match["usec"]) * 1000
            edges.append(Edge(line, int(match["level"]), t_ns))
    if report is None:
        raise GpioGuestError("QEMU's trace has no pl061_reset event: without it the "
                             "board's start-up report cannot be told from the guest's edges")
    return edges


@dataclass(frozen=True)
class EdgeAgreement:
    """The engine's edges against the trace's: lines, levels, order, and timing."""

    engine_per_line: dict[int, int]
    trace_per_line: dict[int, int]
    same_sequence: bool          # the same (line, level) list, in the same order
    first_difference: int | None
    # The offset (trace clock - guest clock) that would put each traced edge inside its
    # engine window [t, t + write]: the windows' intersection is [offset_low, offset_high];
    # its width < 0 means no single offset fits every edge (by that much, ns).
    offset_low_ns: int
    offset_high_ns: int
    # |trace interval - engine interval| between consecutive edges, ns, and how many of
    # them exceed what their windows allow (the larger write of the two + CLOCK_SLACK_NS)
    interval_differences_ns: list[int]
    intervals_outside_windows: int
    # where in its window the traced edge fell, on the fitted offset (0: at t; 1: at
    # t + write), the median
    median_window_position: float | None
    write_ns: list[int]          # the engine's windows: each SET_VALUES ioctl's duration

    @property
    def window_width_ns(self) -> int:
        return self.offset_high_ns - self.offset_low_ns

    @property
    def agrees(self) -> bool:
        """Every edge, line, level and order the same, and one offset fits every window."""
        return (self.same_sequence and self.engine_per_line == self.trace_per_line
                and self.window_width_ns >= -CLOCK_SLACK_NS
                and self.intervals_outside_windows == 0)

    def summary(self) -> dict[str, object]:
        """The figures, for a report or a JSON line."""
        differences = self.interval_differences_ns
        return {
            "agrees": self.agrees, "engine_per_line": self.engine_per_line,
            "trace_per_line": self.trace_per_line, "same_sequence": self.same_sequence,
            "offset_window_width_us": round(self.window_width_ns / 1e3, 3),
            "interval_difference_us": {
                "median": round(statistics.median(differences) / 1e3, 1) if differences
                else None,
                "max": round(max(differences) / 1e3, 1) if differences else None},
            "intervals_outside_windows": self.intervals_outside_windows,
            "median_window_position": self.median_window_position,
            "write_us": {"median": round(statistics.median(self.write_ns) / 1e3, 1)
                         if self.write_ns else None,
                         "max": round(max(self.write_ns) / 1e3, 1) if self.write_ns
                         else None}}


def compare_edges(engine: list[Edge], trace: list[Edge]) -> EdgeAgreement:
    """Hold the engine's recorded edges against the traced ones (module docstring)."""
    def per_line(edges: list[Edge]) -> dict[int, int]:
        counts: dict[int, int] = {}
        for edge in edges:
            counts[edge.line] = counts.get(edge.line, 0) + 1
        return dict(sorted(counts.items()))

    pairs = list(zip(engine, trace, strict=False))
    first_difference = next((i for i, (e, t) in enumerate(pairs)
                             if (e.line, e.level) != (t.line, t.level)), None)
    if first_difference is None and len(engine) != len(trace):
        first_difference = len(pairs)
    # the trace's stamp is truncated to the microsecond: the write was up to 1 us later
    low = max((t.t_ns - e.t_ns - e.write_ns for e, t in pairs), default=0)
    high = min((t.t_ns + 1000 - e.t_ns for e, t in pairs), default=0)
    differences, outside = [], 0
    for (e0, t0), (e1, t1) in zip(pairs, pairs[1:], strict=False):
        difference = abs((t1.t_ns - t0.t_ns) - (e1.t_ns - e0.t_ns))
        differences.append(difference)
        outside += int(difference > max(e0.write_ns, e1.write_ns) + CLOCK_SLACK_NS)
    offset = (low + high) // 2
    positions = [(t.t_ns - offset - e.t_ns) / e.write_ns for e, t in pairs if e.write_ns > 0]
    return EdgeAgreement(
        engine_per_line=per_line(engine), trace_per_line=per_line(trace),
        same_sequence=first_difference is None, first_difference=first_difference,
        offset_low_ns=low, offset_high_ns=high, interval_differences_ns=differences,
        intervals_outside_windows=outside,
        median_window_position=round(statistics.median(positions), 3) if positions
        else None, write_ns=[e.write_ns for e in engine])


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _tails(root: Path) -> str:
    serial = _read(root / "serial.log")[-SERIAL_TAIL_CHARS:] or "(nothing)"
    return (f"QEMU's output ({root / 'qemu.log'}): {_read(root / 'qemu.log')[-500:]}\n"
            f"the serial console's tail ({root / 'serial.log'}):\n{serial}")


def main(argv: list[str] | None = None) -> int:
    """Boot the guest once against a broker on this machine; print the agreement as JSON."""
    parser = argparse.ArgumentParser(prog="python -m mqttbed.network.lab_vm_gpio")
    parser.add_argument("--broker-port", type=int, required=True,
                        help="a broker listening on this machine's 127.0.0.1")
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--rate", type=int, default=50, help="publishes per second")
    parser.add_argument("--pub-line", type=int, default=1)
    parser.add_argument("--sub-line", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=Path("data/lab-vm-gpio"))
    args = parser.parse_args(argv)
    try:
        check_run_arguments(args.messages, args.rate, args.pub_line, args.sub_line)
    except GpioGuestError as exc:
        parser.error(str(exc))
    image = build_gpio_image()
    run = run_gpio_guest(image, args.dir, broker_port=args.broker_port,
                         messages=args.messages, rate_hz=args.rate, pub_line=args.pub_line,
                         sub_line=args.sub_line)
    agreement = compare_edges(run.engine_edges, run.trace_edges)
    figures = {key: value for key, value in asdict(run).items()
               if key not in ("engine_edges", "trace_edges")}
    print(json.dumps({"kernel_release": image.kernel_release, **figures,
                      "edges": agreement.summary()}))
    return 0 if agreement.agrees and run.exit_status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
