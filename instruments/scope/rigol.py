"""Rigol DS1000Z / MSO1000Z series (DS1054Z, DS1104Z, ...): the ``rigol-ds1000z`` dialect.

Commands follow the *MSO1000Z/DS1000Z Programming Guide*, chapter 2 (Command System),
sections :CHANnel<n>, :TIMebase, :TRIGger, :MEASure and :SINGle. The DS1000Z screen is 12
horizontal and 8 vertical divisions. Simulator: :mod:`mqttbed.instruments.scope.virtual`.
"""

from __future__ import annotations

from mqttbed.instruments.scope.base import (
    LOGIC_CENTRE_V,
    LOGIC_SCALE_V_PER_DIV,
    ScopeDriver,
    check_level,
    parse_measurement,
)
from mqttbed.instruments.scope.controls import Boolean, Choice, Command, Control, Numeric, Query

_CHANNELS = range(1, 5)
_CHANNEL_SOURCES = Choice(*(f"CHANnel{n}" for n in _CHANNELS))


class RigolDS1000Z(ScopeDriver):
    """A Rigol DS1000Z-series scope measuring GPIO edge delays over an injected transport."""

    dialect = "rigol-ds1000z"
    CHANNELS = _CHANNELS
    HORIZONTAL_DIVISIONS = 12
    # The trigger sits one division in from the left edge rather than on it: a delay
    # measurement needs the threshold crossing inside the record, with samples either side.
    PRETRIGGER_DIVISIONS = 1

    channel_display = Control(
        ":CHANnel{channel}:DISPlay", "Whether the channel is on (acquired, shown, measurable).",
        Boolean(), index=_CHANNELS)
    channel_coupling = Control(
        ":CHANnel{channel}:COUPling", "Input coupling; DC keeps logic levels as they are.",
        Choice("AC", "DC", "GND"), index=_CHANNELS)
    channel_scale = Control(
        ":CHANnel{channel}:SCALe", "Vertical scale (range at probe ratio 1X).",
        Numeric(1e-3, 10.0), unit="V/div", index=_CHANNELS)
    # The offset is added to the signal for display: -1.65 V puts 1.65 V at the centre.
    channel_offset = Control(
        ":CHANnel{channel}:OFFSet", "Vertical offset added to the trace.",
        Numeric(-100.0, 100.0), unit="V", index=_CHANNELS)
    timebase_scale = Control(
        ":TIMebase:MAIN:SCALe", "Horizontal scale (1-2-5 steps on the instrument).",
        Numeric(5e-9, 50.0), unit="s/div")
    # Guide, :TIMebase[:MAIN]:OFFSet: the time of the screen centre relative to the trigger
    # point, -Screen/2 up to 1 s (or 5000 s at slow timebases); a positive offset moves the
    # trigger point left of centre.
    timebase_offset = Control(
        ":TIMebase:MAIN:OFFSet", "Time from the trigger point to the screen centre.",
        Numeric(-300.0, 5000.0), unit="s")
    trigger_mode = Control(
        ":TRIGger:MODE", "Trigger type (this driver only uses the edge trigger).",
        Choice("EDGE"))
    trigger_source = Control(
        ":TRIGger:EDGe:SOURce", "Channel the edge trigger watches.", _CHANNEL_SOURCES)
    trigger_slope = Control(
        ":TRIGger:EDGe:SLOPe", "Edge the trigger fires on (RFALl: either).",
        Choice("POSitive", "NEGative", "RFALl"))
    trigger_level = Control(
        ":TRIGger:EDGe:LEVel", "Voltage threshold of the edge trigger.",
        Numeric(-100.0, 100.0), unit="V")
    # Guide, :TRIGger:STATus?: TD (triggered), WAIT, RUN, AUTO or STOP; after :SINGle the
    # scope reads STOP once the single acquisition is complete.
    trigger_status = Query(":TRIGger:STATus?", "Acquisition state: TD, WAIT, RUN, AUTO, STOP.")
    single = Command(":SINGle", "Start one acquisition that stops after its trigger.")
    show_measurement = Command(
        ":MEASure:ITEM {item},CHANnel{source_a},CHANnel{source_b}",
        "Turn on a two-source measurement (shown on screen).")
    # Guide, :MEASure:ITEM?: the value in scientific notation; 9.9E37 when invalid (e.g.
    # no edge of that kind on a source within the screen).
    measure = Query(
        ":MEASure:ITEM? {item},CHANnel{source_a},CHANnel{source_b}",
        "Value of a two-source measurement, e.g. RDELay (rising-to-rising delay) in s.")

    def configure(self, publisher_channel: int, subscriber_channels: list[int], *,
                  timebase_s_per_div: float, level_v: float = 1.65,
                  slope: str = "POS") -> None:
        """Channels for 3.3 V logic, edge trigger on the publisher, delay items per
        subscriber."""
        level = check_level(level_v)
        timebase = type(self).timebase_scale.check(timebase_s_per_div)
        slope = self._remember(publisher_channel, subscriber_channels, slope)
        for channel in (publisher_channel, *subscriber_channels):
            self.channel_display[channel] = True
            self.channel_coupling[channel] = "DC"
            self.channel_scale[channel] = LOGIC_SCALE_V_PER_DIV
            self.channel_offset[channel] = -LOGIC_CENTRE_V
        self.timebase_scale = timebase
        self.timebase_offset = (self.HORIZONTAL_DIVISIONS / 2 - self.PRETRIGGER_DIVISIONS) \
            * timebase
        self.trigger_mode = "EDGE"
        self.trigger_source = f"CHANnel{publisher_channel}"
        self.trigger_slope = slope
        self.trigger_level = level
        for channel in subscriber_channels:
            self.show_measurement(item=self._delay_item(), source_a=publisher_channel,
                                  source_b=channel)
        self.window_after_trigger_s = \
            (self.HORIZONTAL_DIVISIONS - self.PRETRIGGER_DIVISIONS) * timebase

    def arm_single(self) -> None:
        """Start one single acquisition (``:SINGle``); return once the scope has armed.

        A write returns before the instrument has read it, so a status query follows: the
        scope answers it only after executing ``:SINGle``, and an edge after this returns
        is one the acquisition can trigger on.
        """
        self.single()
        self.trigger_status()

    def wait_triggered(self, timeout_s: float) -> bool:
        """Poll ``:TRIGger:STATus?`` until STOP (acquisition complete); False on timeout."""
        return self._poll(lambda: self.trigger_status().upper() == "STOP", timeout_s)

    def edge_delays_s(self) -> dict[int, float | None]:
        """``:MEASure:ITEM? RDELay`` (FDELay for falling edges) publisher -> each
        subscriber."""
        publisher = self._configured_publisher()
        delays: dict[int, float | None] = {}
        for channel in self.subscriber_channels:
            fields = {"item": self._delay_item(), "source_a": publisher, "source_b": channel}
            delays[channel] = parse_measurement(
                self.measure(**fields), asked=type(self).measure.command(**fields))
        return delays

    def _delay_item(self) -> str:
        # RDELay / FDELay: delay between the rising / falling edges of source A and B.
        return "RDELay" if self.slope == "POSitive" else "FDELay"
