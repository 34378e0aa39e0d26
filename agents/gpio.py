"""GPIO lines an agent toggles on every publish and every receive.

The oscilloscope measures the time between these edges (seed 000, section 6.1): the
publisher toggles its line right after writing a PUBLISH, each subscriber toggles its
line on receipt. Backends:

- ``virtual`` (default off a Pi): lines in memory.
- ``rpi``: the RPi.GPIO API. On a Raspberry Pi 1-4 install RPi.GPIO
  (``pip install 'mqttbed[pi]'``); on a Raspberry Pi 5, whose GPIO sits behind the RP1
  chip that RPi.GPIO cannot drive, install its drop-in rpi-lgpio instead
  (``pip install 'mqttbed[pi5]'``). Never both: they provide the same module.
- ``gpiod``: the kernel's GPIO character device through libgpiod v2 (``gpiod`` package,
  in the agent extra); works on any Linux board. On a native-engine run the engine requests
  the lines itself and drives them from C (uAPI v2), and this backend hands them over
  (:meth:`GpiodLines.hand_over`); libgpiod drives them on lean-client runs. ``chip``
  names the device (``/dev/gpiochip0`` on a Pi 1-4; on a Pi 5 the header is
  ``/dev/gpiochip4`` on kernels before 6.6.45 and ``/dev/gpiochip0`` after).

Every backend also records each edge with its CLOCK_MONOTONIC time, so the software side of
every edge is kept with the run. Pins are BCM numbers (rpi) or line offsets (gpiod). Edges
the native engine drove arrive as its column buffers (:meth:`_EdgeLog.add_edge_buffers`)
and stay bytes on their way to a binary chunk (:meth:`GpioLines.edge_buffers`); they
become Python lists only for a reader that asks for lists (``edges``, ``edge_columns``).

Two ways to mark an event: ``toggle`` (the default, as in the paper) inverts the line, so
every event is an edge; ``pulse`` raises the line and ``settle`` lowers every raised line
once the agent has handled what arrived together. A scope measuring rising-edge delays
needs pulses: with toggles, one lost message puts a subscriber's line out of phase with
the publisher's and its rising edges stop matching.
"""

from __future__ import annotations

import os
import statistics
import threading
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from mqttbed.core.binary_chunk import EdgeBuffers
from mqttbed.core.clock import monotonic_ns


class GpioUnavailable(RuntimeError):
    """The requested GPIO backend cannot work on this machine; the message says why and how."""


@runtime_checkable
class GpioLines(Protocol):
    """The output lines of one agent."""

    backend: str
    pulse_mode: bool  # raise a line per event and lower it in settle(), instead of toggling

    def setup(self, pins: list[int]) -> None:
        """Configure ``pins`` as outputs, driven low."""
        ...

    def toggle(self, pin: int) -> None:
        """Mark an event on ``pin``: invert it, or raise it in pulse mode (record the edge)."""
        ...

    def settle(self) -> None:
        """In pulse mode, lower every raised line (record the edges); else do nothing."""
        ...

    def edges(self) -> list[tuple[int, int, int]]:
        """Return and forget the recorded edges as ``(pin, t_ns, new_level)``."""
        ...

    def edge_columns(self) -> tuple[list[int], list[int], list[int]]:
        """Return and forget the recorded edges as (pins, times, new levels) columns."""
        ...

    def edge_buffers(self) -> EdgeBuffers:
        """Return and forget the recorded edges as column buffers (a binary chunk's)."""
        ...

    def close(self) -> None:
        """Release the lines."""
        ...


class _EdgeLog:
    """Levels and recorded edges shared by every backend."""

    def __init__(self) -> None:
        self._levels: dict[int, int] = {}
        self._edges: list[tuple[int, int, int]] = []
        # edges a native engine drove, as its (pin int32, t int64, level uint8) buffers
        self._edge_buffers: list[EdgeBuffers] = []
        # The MQTT loop records, the uploader takes: an edge must land in one batch only.
        self._lock = threading.Lock()
        self.pulse_mode = False
        self._raised: list[int] = []

    def _write(self, pin: int, level: int) -> None:
        """Drive ``pin`` to ``level`` on the hardware (nothing for virtual lines)."""

    def _flip(self, pin: int) -> int | None:
        """The level an event drives ``pin`` to; None when a pulse is already up."""
        if self.pulse_mode:
            if self._levels.get(pin, 0):
                return None
            self._raised.append(pin)
            level = 1
        else:
            level = self._levels.get(pin, 0) ^ 1
        self._levels[pin] = level
        return level

    def toggle(self, pin: int) -> None:
        level = self._flip(pin)
        if level is not None:
            self._write(pin, level)
            self._record(pin, level)

    def settle(self) -> None:
        if not self._raised:
            return
        raised, self._raised = self._raised, []
        for pin in raised:
            self._levels[pin] = 0
            self._write(pin, 0)
            self._record(pin, 0)

    def _record(self, pin: int, level: int) -> None:
        # No lock: list.append is atomic, and edges() swaps the list in one store, so an
        # edge appended meanwhile lands in the list it returns (the profile of the publish
        # loop showed this lock at ~17 % of the loop's time).
        self._edges.append((pin, monotonic_ns(), level))

    def add_edge_buffers(self, pin: bytes, t_ns: bytes, level: bytes) -> None:
        """Record edges a native engine drove on these lines, in time order, as its column
        buffers (native order: pin int32, t_ns int64, level uint8); kept as they are.

        ValueError, naming the column, when their lengths disagree."""
        self._edge_buffers.append(EdgeBuffers(pin, t_ns, level))  # atomic, as _record's

    def set_levels(self, levels: dict[int, int]) -> None:
        """Take the levels a native engine left the lines at (its edges are recorded)."""
        self._levels.update(levels)

    def _take(self) -> tuple[list[tuple[int, int, int]], list[EdgeBuffers]]:
        with self._lock:
            taken, self._edges = self._edges, []
            buffers, self._edge_buffers = self._edge_buffers, []
        return taken, buffers

    def edges(self) -> list[tuple[int, int, int]]:
        return list(zip(*self.edge_columns(), strict=True))

    def edge_columns(self) -> tuple[list[int], list[int], list[int]]:
        """Return and forget the recorded edges as (pins, times, new levels) columns."""
        taken, buffers = self._take()
        columns: tuple[list[int], list[int], list[int]] = ([], [], [])
        if taken:
            for column, values in zip(columns, zip(*taken, strict=True), strict=True):
                column.extend(values)
        for batch in buffers:
            lists = batch.as_lists()
            for column, name in zip(columns, ("pin", "t_ns", "level"), strict=True):
                column.extend(lists[name])
        return columns

    def edge_buffers(self) -> EdgeBuffers:
        """Return and forget the recorded edges as column buffers, those recorded in Python
        first (made bytes here), then the engine's (joined, one copy each)."""
        taken, buffers = self._take()
        if taken:
            pins, times, levels = zip(*taken, strict=True)
            buffers.insert(0, EdgeBuffers(array("i", pins).tobytes(),
                                          array("q", times).tobytes(),
                                          array("B", levels).tobytes()))
        if len(buffers) == 1:
            return buffers[0]
        return EdgeBuffers(*(b"".join(getattr(batch, name) for batch in buffers)
                             for name in ("pin", "t_ns", "level")))


class VirtualGpio(_EdgeLog):
    """Lines that exist only in memory; each toggle records its edge time."""

    backend = "virtual"

    def setup(self, pins: list[int]) -> None:
        for pin in pins:
            self._levels[pin] = 0

    def close(self) -> None:
        self._levels.clear()


class RpiGpio(_EdgeLog):
    """RPi.GPIO (or rpi-lgpio on a Pi 5), BCM numbering."""

    backend = "rpi"

    def __init__(self) -> None:
        super().__init__()
        devices = [p for p in ("/dev/gpiomem", *map(str, sorted(Path("/dev").glob("gpiochip*"))))
                   if os.path.exists(p)]
        if not devices or raspberry_pi_model() is None:
            found = (f"{DEVICE_TREE_MODEL} names no Raspberry Pi" if devices else
                     "no /dev/gpiomem or /dev/gpiochip* on this machine")
            raise GpioUnavailable(
                f"GPIO backend 'rpi' needs a Raspberry Pi: {found}. Run this agent on a Pi, "
                f"or use agents.gpio: gpiod (any Linux GPIO chip) or virtual.")
        try:
            import RPi.GPIO as GPIO  # noqa: N814 - the library's own spelling
        except ImportError:
            raise GpioUnavailable(
                "GPIO backend 'rpi' needs the RPi.GPIO module: pip install 'mqttbed[pi]' on a "
                "Raspberry Pi 1-4, or 'mqttbed[pi5]' (rpi-lgpio) on a Pi 5.") from None
        self._gpio: Any = GPIO

    def setup(self, pins: list[int]) -> None:
        self._gpio.setwarnings(False)
        self._gpio.setmode(self._gpio.BCM)
        for pin in pins:
            self._gpio.setup(pin, self._gpio.OUT, initial=self._gpio.LOW)
            self._levels[pin] = 0

    def _write(self, pin: int, level: int) -> None:
        self._gpio.output(pin, level)

    def close(self) -> None:
        self._gpio.cleanup(list(self._levels))
        self._levels.clear()


class GpiodLines(_EdgeLog):
    """libgpiod v2 on a GPIO character device.

    On a native-engine run the engine owns the lines instead (:meth:`hand_over`): the
    kernel gives a line to one request at a time (EBUSY), and the engine writes them with
    GPIO_V2_LINE_SET_VALUES right where it records each edge. This object then holds no
    request; its toggles (a calibration) go through the engine's, and :meth:`take_back`
    ends that when the run's session closes.
    """

    backend = "gpiod"

    def __init__(self, chip: str = "/dev/gpiochip0") -> None:
        super().__init__()
        if not os.path.exists(chip):
            present = ", ".join(map(str, sorted(Path("/dev").glob("gpiochip*")))) or "none"
            raise GpioUnavailable(
                f"GPIO backend 'gpiod' needs the GPIO device {chip}, which this machine does "
                f"not have (GPIO chips here: {present}). Run this agent on the board, set "
                "agents.gpio_chip, or use agents.gpio: virtual.")
        try:
            import gpiod
        except ImportError:
            raise GpioUnavailable("GPIO backend 'gpiod' needs the gpiod package (libgpiod v2 "
                                  "bindings): pip install 'mqttbed[agent]'") from None
        self._gpiod: Any = gpiod
        self.chip = chip
        self._request: Any = None
        self._driver: Callable[[int, int], None] | None = None  # the engine's line writer

    def setup(self, pins: list[int]) -> None:
        from gpiod.line import Direction, Value

        self._release()  # a request of an earlier run: the kernel would refuse a second
        self._value = (Value.INACTIVE, Value.ACTIVE)
        settings = self._gpiod.LineSettings(direction=Direction.OUTPUT,
                                            output_value=Value.INACTIVE)
        self._request = self._gpiod.request_lines(self.chip, consumer="mqttbed",
                                                  config={tuple(pins): settings})
        for pin in pins:
            self._levels[pin] = 0

    def hand_over(self, pins: list[int], write: Callable[[int, int], None]) -> None:
        """Another request drives ``pins`` now (the native engine's, which took them low):
        release this one's, and write through ``write(pin, level)`` until take_back()."""
        self._release()
        self._driver = write
        for pin in pins:
            self._levels[pin] = 0

    def take_back(self, levels: dict[int, int]) -> None:
        """The other request is gone; keep the levels it left the lines at."""
        self._driver = None
        self._levels.update(levels)

    @property
    def driven_elsewhere(self) -> bool:
        """Whether another request (the native engine's) drives the lines now."""
        return self._driver is not None

    def _write(self, pin: int, level: int) -> None:
        if self._driver is not None:
            self._driver(pin, level)
        else:
            self._request.set_value(pin, self._value[level])

    def _release(self) -> None:
        if self._request is not None:
            self._request.release()
            self._request = None

    def close(self) -> None:
        self._release()
        self._driver = None
        self._levels.clear()


BACKENDS = ("auto", "virtual", "rpi", "gpiod")
# Where Linux shows the board's name ("Raspberry Pi 4 Model B Rev 1.4") on a Pi.
DEVICE_TREE_MODEL = Path("/proc/device-tree/model")


def raspberry_pi_model() -> str | None:
    """This board's model if it is a Raspberry Pi, else None."""
    try:
        model = DEVICE_TREE_MODEL.read_bytes().rstrip(b"\0").decode(errors="replace").strip()
    except OSError:
        return None
    return model if model.startswith("Raspberry Pi") else None


def open_gpio(backend: str, chip: str = "/dev/gpiochip0") -> GpioLines:
    """Return the GPIO backend named ``backend``; GpioUnavailable says why it cannot work.

    ``auto`` is ``rpi`` on a Raspberry Pi and ``virtual`` anywhere else.
    """
    if backend == "auto":
        backend = "rpi" if raspberry_pi_model() else "virtual"
    if backend == "virtual":
        return VirtualGpio()
    if backend == "rpi":
        return RpiGpio()
    if backend == "gpiod":
        return GpiodLines(chip)
    raise ValueError(f"unknown GPIO backend {backend!r}; available: {', '.join(BACKENDS)}")


def toggle_cost_ns(gpio: GpioLines, pin: int, toggles: int = 2000) -> int:
    """Median cost of one toggle on ``pin`` in ns (an even count leaves the line as it was).

    The edges this records are dropped: they are a calibration, not part of a run.
    """
    costs = []
    for _ in range(toggles + toggles % 2):
        t0 = monotonic_ns()
        gpio.toggle(pin)
        costs.append(monotonic_ns() - t0)
        gpio.settle()
    gpio.edges()
    return int(statistics.median(costs))
