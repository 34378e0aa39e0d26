"""The engine's GPIO edges through a real kernel driver, read back as a logic analyser would.

The arm64 guest (``scripts/lab-vm/build-arm64.sh``: Debian's arm64 kernel, an initramfs
with a static busybox and the engine cross-built statically) boots on QEMU's ``virt``
board (a Cortex-A72 under TCG) and runs ``gpio-edges``: a publisher and a subscriber of the native
engine against a real Mosquitto on this machine (QEMU's user network, 10.0.2.2), each
toggling its own line of the board's PL061 at every publish and every receive through the
kernel's gpiolib and PL061 driver (the engine's uAPI v2 calls, ``src/gpio_chip.c``).
QEMU's ``pl061_set_output`` trace, stamped by this machine's clock, is the logic analyser.

Asserted, for two pairs of lines: every message sent and received once; the engine drove
exactly its two lines, one edge per publish and per receive; the trace shows those edges
and no other, line for line and level for level, in the same order; and one constant
offset between the two clocks puts every traced edge inside the window the engine recorded
for it (the stamp right before the SET_VALUES ioctl, plus that ioctl's duration), so the
inter-edge intervals agree within the two edges' windows (median and max printed). The
same comparison is shown to fail on the run's own data with the publisher's edges moved
to another line, with none, and with one edge 1 ms off. The figures (build, boot to
/init, the run, the agreement) are printed as one JSON line. Not opt-in, unlike the lab
VM's: it runs in `make test-system` (alone: its windows are times), so in CI, wherever the
`gpio` profile is installed; a cold build takes about 30 s, a boot a few seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from mqttbed.network.lab_vm_gpio import (
    BUILD_SCRIPT,
    CLOCK_SLACK_NS,
    QEMU,
    GpioGuestError,
    build_gpio_image,
    check_run_arguments,
    compare_edges,
    run_gpio_guest,
)
from tests.generic_support import own_mosquitto

pytestmark = [pytest.mark.system, pytest.mark.integration,
              # a cold build downloads Debian's arm64 kernel (60 MB); a boot takes seconds
              pytest.mark.timeout(900)]

MESSAGES = 200
RATE_HZ = 50
MEASURED: dict[str, object] = {}


def missing_reason() -> str | None:
    """Why the guest cannot run here, or None."""
    if shutil.which(QEMU) is None:
        return f"{QEMU} is missing: scripts/system-deps.sh gpio installs it"
    guest_dir = subprocess.run(["bash", str(BUILD_SCRIPT), "--dir"], capture_output=True,
                               text=True, check=True).stdout.strip()
    if not (Path(guest_dir) / "manifest.json").exists():
        for tool in ("cpio", "aarch64-linux-gnu-gcc"):
            if shutil.which(tool) is None:
                return f"no built guest and no {tool}: scripts/system-deps.sh gpio installs it"
    return None


@pytest.fixture(scope="module")
def image():
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    built = build_gpio_image()
    MEASURED["build_s"] = round(time.monotonic() - started, 1)
    MEASURED["guest"] = built.manifest
    yield built
    print("lab-vm-gpio measured: " + json.dumps(MEASURED))


@pytest.fixture(scope="module")
def broker_port(image, tmp_path_factory):
    """A Mosquitto on 127.0.0.1, which the guest reaches as 10.0.2.2."""
    with own_mosquitto(tmp_path_factory.mktemp("mosquitto")) as (_process, port):
        yield port


@pytest.mark.parametrize(("pub_line", "sub_line"), [(1, 2), (6, 0)])
def test_every_edge_the_engine_drove_shows_on_its_pl061_line_at_the_moment_it_recorded(
        image, broker_port, tmp_path, pub_line, sub_line):
    run = run_gpio_guest(image, tmp_path / "guest", broker_port=broker_port,
                         messages=MESSAGES, rate_hz=RATE_HZ, pub_line=pub_line,
                         sub_line=sub_line)
    assert (run.exit_status, run.errors) == (0, []), run
    assert "9030000.pl061" in run.chip, run.chip    # the virt board's PL061, by its address
    assert (run.sent, run.deliveries, run.refused_writes) == (MESSAGES, MESSAGES, 0)
    agreement = compare_edges(run.engine_edges, run.trace_edges)
    # the engine toggled its two lines, once per publish and once per receive ...
    assert agreement.engine_per_line == {pub_line: MESSAGES, sub_line: MESSAGES}
    # ... and the PL061 changed exactly those lines, edge for edge, in the same order
    assert agreement.trace_per_line == agreement.engine_per_line
    assert agreement.same_sequence, agreement.first_difference
    # one offset between the clocks puts every traced edge in its engine window
    assert agreement.window_width_ns >= -CLOCK_SLACK_NS, agreement.summary()
    assert agreement.intervals_outside_windows == 0, agreement.summary()
    assert agreement.agrees

    # The comparison fails on this run's own trace when the engine's edges say otherwise
    other_line = next(line for line in range(8) if line not in (pub_line, sub_line))
    moved = [replace(e, line=other_line) if e.line == pub_line else e
             for e in run.engine_edges]
    assert not compare_edges(moved, run.trace_edges).agrees
    assert not compare_edges([], run.trace_edges).agrees
    shift_ns = max(1_000_000, 2 * agreement.window_width_ns)
    middle = len(run.engine_edges) // 2
    late = [replace(e, t_ns=e.t_ns + shift_ns) if i == middle else e
            for i, e in enumerate(run.engine_edges)]
    assert not compare_edges(late, run.trace_edges).agrees
    MEASURED[f"lines_{pub_line}_{sub_line}"] = {
        "boot_to_init_wall_s": run.boot_to_init_s,
        "guest_uptime_at_init_s": run.guest_uptime_at_init_s, "total_s": run.total_s,
        **agreement.summary()}


@pytest.mark.parametrize(("field", "arguments", "value"), [
    ("pub_line", (200, 50, 3, 2), "3"),     # the power button's
    ("sub_line", (200, 50, 1, 8), "8"),     # the PL061 has 8
    ("pub_line and sub_line", (200, 50, 4, 4), "4"),
    ("messages", (0, 50, 1, 2), "0"),
    ("rate_hz", (200, 0, 1, 2), "0")])
def test_a_run_the_guest_cannot_take_is_refused_naming_the_field_and_value(
        field, arguments, value):
    with pytest.raises(GpioGuestError) as refused:
        check_run_arguments(*arguments)
    assert str(refused.value).startswith(field) and value in str(refused.value)
