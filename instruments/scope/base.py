"""What every oscilloscope driver offers, and the parts the dialects share.

The method is the seed paper's (section 6.1): the publisher's Raspberry Pi raises a GPIO
line when it sends a PUBLISH, each subscriber's when it receives one; a scope triggers on
the publisher's edge and measures the delay to each subscriber's edge.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from mqttbed.core.errors import MqttbedError
from mqttbed.instruments.scope.controls import Choice, ScpiDriver, Transport

# 3.3 V logic (Raspberry Pi GPIO) on 8 vertical divisions: 0.5 V/div centred on 1.65 V
# shows -0.35 V to 3.65 V, the whole swing with a little room either side.
LOGIC_SCALE_V_PER_DIV = 0.5
LOGIC_CENTRE_V = 1.65
LOGIC_HIGH_V = 3.3

# Both guides: a measurement that cannot be made returns 9.9E37 (Keysight "+9.9E+37").
INVALID_MEASUREMENT = 9.9e37

# The edge the trigger fires on and the delay measurement uses; short or long form.
SLOPES = Choice("POSitive", "NEGative")


class ScopeReplyError(MqttbedError):
    """The instrument answered something the driver cannot read; the message quotes it."""


@runtime_checkable
class Oscilloscope(Protocol):
    """A scope that measures GPIO edge delays from one publisher to its subscribers."""

    dialect: str

    def identify(self) -> str:
        """Return the instrument's ``*IDN?`` reply."""
        ...

    def configure(self, publisher_channel: int, subscriber_channels: list[int], *,
                  timebase_s_per_div: float, level_v: float = 1.65,
                  slope: str = "POS") -> None:
        """Set up channels, edge trigger on the publisher, timebase and delay measurements."""
        ...

    def arm_single(self) -> None:
        """Start one single acquisition; return once the instrument has armed (an edge
        after that can trigger it)."""
        ...

    def wait_triggered(self, timeout_s: float) -> bool:
        """Poll until the acquisition completed; False if ``timeout_s`` passed first."""
        ...

    def edge_delays_s(self) -> dict[int, float | None]:
        """Delay publisher edge -> each subscriber's edge in seconds; None where there is
        none."""
        ...

    def close(self) -> None:
        """Close the connection to the instrument."""
        ...


def parse_measurement(reply: str, asked: str) -> float | None:
    """A measurement reply in seconds, or None for the invalid-measurement value."""
    try:
        value = float(reply.strip())
    except ValueError:
        raise ScopeReplyError(f"{asked!r} was answered {reply!r}, not a number") from None
    if not math.isfinite(value) or abs(value) >= INVALID_MEASUREMENT * 0.99:
        return None
    return value


def check_channels(publisher: int, subscribers: list[int], channels: range) -> None:
    """Raise ValueError unless publisher and subscribers are distinct channels that exist."""
    every = [publisher, *subscribers]
    for channel in every:
        if isinstance(channel, bool) or not isinstance(channel, int) or channel not in channels:
            raise ValueError(f"channel {channel!r} does not exist; use {channels.start} to"
                             f" {channels.stop - 1}")
    if not subscribers:
        raise ValueError("no subscriber channels: give at least one channel to measure")
    if len(set(every)) != len(every):
        raise ValueError(f"channels must be distinct: publisher {publisher}, subscribers"
                         f" {subscribers}")


def check_level(level_v: float) -> float:
    """Raise ValueError unless the trigger level lies inside the 3.3 V logic swing."""
    if not 0.0 < float(level_v) < LOGIC_HIGH_V:
        raise ValueError(f"trigger level {level_v!r} V is outside 3.3 V logic; use a level"
                         f" between 0 and {LOGIC_HIGH_V} V, e.g. 1.65")
    return float(level_v)


class ScopeDriver(ScpiDriver, Oscilloscope):
    """Shared behaviour: identification, polling for completion, the configured channels."""

    dialect = "?"
    CHANNELS = range(1, 5)

    def __init__(self, transport: Transport, *, poll_interval_s: float = 0.01):
        super().__init__(transport)
        self.poll_interval_s = poll_interval_s
        self.publisher_channel: int | None = None
        self.subscriber_channels: list[int] = []
        self.slope = "POSitive"
        # Span of the record after the trigger point, known once configure() has run.
        self.window_after_trigger_s: float | None = None

    def identify(self) -> str:
        """Return the instrument's ``*IDN?`` reply."""
        return self.transport.query("*IDN?").strip()

    def close(self) -> None:
        """Close the transport."""
        self.transport.close()

    def _remember(self, publisher: int, subscribers: list[int], slope: str) -> str:
        check_channels(publisher, subscribers, self.CHANNELS)
        try:
            canonical = SLOPES.check(slope)
        except ValueError:
            raise ValueError(f"slope {slope!r} is not allowed; use POS (rising edges) or NEG"
                             " (falling edges)") from None
        self.publisher_channel = publisher
        self.subscriber_channels = list(subscribers)
        self.slope = canonical
        return canonical

    def _configured_publisher(self) -> int:
        if self.publisher_channel is None:
            raise RuntimeError(f"{type(self).__name__}: call configure() before measuring")
        return self.publisher_channel

    def _poll(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Ask ``done`` at least once, then every poll interval until ``timeout_s``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if done():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(self.poll_interval_s, remaining))
