"""GPIO lines an agent toggles on every publish and every receive.

The oscilloscope measures the time between these edges (seed 000, section 6.1). Real Pi
backends (RPi.GPIO / rpi-lgpio, libgpiod) plug in behind :class:`GpioLines`; off a Pi the
``virtual`` backend records every edge with its CLOCK_MONOTONIC time instead.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from mqttbed.core.clock import monotonic_ns


@runtime_checkable
class GpioLines(Protocol):
    """The output lines of one agent."""

    backend: str

    def setup(self, pins: list[int]) -> None:
        """Configure ``pins`` as outputs, driven low."""
        ...

    def toggle(self, pin: int) -> None:
        """Invert the level of ``pin``."""
        ...

    def edges(self) -> list[tuple[int, int, int]]:
        """Return and forget the recorded edges as ``(pin, t_ns, new_level)``."""
        ...

    def close(self) -> None:
        """Release the lines."""
        ...


class VirtualGpio:
    """Lines that exist only in memory; each toggle records its edge time."""

    backend = "virtual"

    def __init__(self) -> None:
        self._levels: dict[int, int] = {}
        self._edges: list[tuple[int, int, int]] = []

    def setup(self, pins: list[int]) -> None:
        for pin in pins:
            self._levels[pin] = 0

    def toggle(self, pin: int) -> None:
        level = self._levels.get(pin, 0) ^ 1
        self._levels[pin] = level
        self._edges.append((pin, monotonic_ns(), level))

    def edges(self) -> list[tuple[int, int, int]]:
        taken, self._edges = self._edges, []
        return taken

    def close(self) -> None:
        self._levels.clear()


def open_gpio(backend: str) -> GpioLines:
    """Return the GPIO backend named ``backend``."""
    if backend == "virtual":
        return VirtualGpio()
    raise ValueError(f"unknown GPIO backend {backend!r}; available here: virtual")
