"""Keysight InfiniiVision 2000/3000/4000 X-Series: the ``keysight-x`` dialect.

Commands follow the *Keysight InfiniiVision 2000/3000/4000 X-Series Oscilloscopes
Programmer's Guide*: :CHANnel<n>, :TIMebase, :TRIGger[:EDGE], :MEASure (:MEASure:DEFine,
:MEASure:DELay), Root commands (:SINGle, :OPERegister:CONDition) and the chapter
"Synchronizing Acquisitions" (polling synchronization with timeout). The screen is 10
horizontal and 8 vertical divisions.

There is no Keysight simulator in this package: the virtual scope speaks the Rigol dialect
only, so this driver is covered by byte-level protocol tests alone.
"""

from __future__ import annotations

from mqttbed.instruments.scope.base import (
    LOGIC_CENTRE_V,
    LOGIC_SCALE_V_PER_DIV,
    ScopeDriver,
    ScopeReplyError,
    check_level,
    parse_measurement,
)
from mqttbed.instruments.scope.controls import Boolean, Choice, Command, Control, Numeric, Query

_CHANNELS = range(1, 5)


def _register_value(reply: str) -> int:
    try:
        return int(reply.strip())
    except ValueError:
        raise ScopeReplyError(f"a status register was answered {reply!r}, not an integer") \
            from None


class KeysightInfiniiVisionX(ScopeDriver):
    """A Keysight InfiniiVision X-Series scope measuring GPIO edge delays."""

    dialect = "keysight-x"
    CHANNELS = _CHANNELS
    HORIZONTAL_DIVISIONS = 10
    # :TIMebase:REFerence LEFT puts the reference point one division in from the left
    # edge; with :TIMebase:POSition 0 the trigger is there, with nine divisions after it.
    PRETRIGGER_DIVISIONS = 1
    # Operation Status Condition Register, bit 3 "Run": set while the scope is not stopped.
    RUN_BIT = 1 << 3

    channel_display = Control(
        ":CHANnel{channel}:DISPlay", "Whether the channel is on (acquired, shown, measurable).",
        Boolean(), index=_CHANNELS)
    channel_coupling = Control(
        ":CHANnel{channel}:COUPling", "Input coupling; DC keeps logic levels as they are.",
        Choice("AC", "DC"), index=_CHANNELS)
    channel_scale = Control(
        ":CHANnel{channel}:SCALe", "Vertical scale (range at probe ratio 1:1).",
        Numeric(1e-3, 5.0), unit="V/div", index=_CHANNELS)
    # Unlike the Rigol's, Keysight's offset is the voltage shown at the screen centre.
    channel_offset = Control(
        ":CHANnel{channel}:OFFSet", "Voltage at the vertical centre of the screen.",
        Numeric(-100.0, 100.0), unit="V", index=_CHANNELS)
    # The fastest timebase depends on the model's bandwidth; the scope clamps to it.
    timebase_scale = Control(
        ":TIMebase:SCALe", "Horizontal scale.", Numeric(1e-10, 50.0), unit="s/div")
    timebase_reference = Control(
        ":TIMebase:REFerence", "Where the reference (trigger) point sits on screen.",
        Choice("LEFT", "CENTer", "RIGHt"))
    timebase_position = Control(
        ":TIMebase:POSition", "Time from the trigger event to the reference point.",
        Numeric(-500.0, 500.0), unit="s")
    trigger_mode = Control(
        ":TRIGger:MODE", "Trigger type (this driver only uses the edge trigger).",
        Choice("EDGE"))
    # AUTO would force a trigger when no edge comes; NORMal waits for a real one.
    trigger_sweep = Control(
        ":TRIGger:SWEep", "Whether the scope may trigger without an edge.",
        Choice("AUTO", "NORMal"))
    trigger_source = Control(
        ":TRIGger:EDGE:SOURce", "Channel the edge trigger watches.",
        Choice(*(f"CHANnel{n}" for n in _CHANNELS)))
    trigger_slope = Control(
        ":TRIGger:EDGE:SLOPe", "Edge the trigger fires on.",
        Choice("POSitive", "NEGative", "EITHer", "ALTernate"))
    trigger_level = Control(
        ":TRIGger:EDGE:LEVel", "Voltage threshold of the edge trigger.",
        Numeric(-100.0, 100.0), unit="V")
    # Guide, :MEASure:DEFine DELay,<edge_spec1>,<edge_spec2>: <slope><occurrence>, "+1" is
    # the first rising edge counted from the left of the display; it defines the edges the
    # :MEASure:DELay? query uses (not the front panel's auto-edge delay).
    define_delay_edges = Command(
        ":MEASure:DEFine DELay,{edge},{edge}", "Edges the delay query measures between.")
    single = Command(":SINGle", "Start one acquisition (forces NORMal sweep on X-Series).")
    operation_condition = Query(
        ":OPERegister:CONDition?", "Operation Status Condition Register (bit 3: running).",
        parse=_register_value)
    # Guide, :MEASure:DELay?: t(edge_spec2 on source2) - t(edge_spec1 on source1) in s;
    # +9.9E+37 when it cannot be measured.
    measure_delay = Query(
        ":MEASure:DELay? CHANnel{source_a},CHANnel{source_b}",
        "Delay from source 1's defined edge to source 2's, in s.")

    def configure(self, publisher_channel: int, subscriber_channels: list[int], *,
                  timebase_s_per_div: float, level_v: float = 1.65,
                  slope: str = "POS") -> None:
        """Channels for 3.3 V logic, edge trigger on the publisher, delay edge definition."""
        level = check_level(level_v)
        timebase = type(self).timebase_scale.check(timebase_s_per_div)
        slope = self._remember(publisher_channel, subscriber_channels, slope)
        for channel in (publisher_channel, *subscriber_channels):
            self.channel_display[channel] = True
            self.channel_coupling[channel] = "DC"
            self.channel_scale[channel] = LOGIC_SCALE_V_PER_DIV
            self.channel_offset[channel] = LOGIC_CENTRE_V
        self.timebase_scale = timebase
        self.timebase_reference = "LEFT"
        self.timebase_position = 0.0
        self.trigger_mode = "EDGE"
        self.trigger_sweep = "NORMal"
        self.trigger_source = f"CHANnel{publisher_channel}"
        self.trigger_slope = slope
        self.trigger_level = level
        self.define_delay_edges(edge="+1" if slope == "POSitive" else "-1")
        self.window_after_trigger_s = \
            (self.HORIZONTAL_DIVISIONS - self.PRETRIGGER_DIVISIONS) * timebase

    def arm_single(self) -> None:
        """Start one single acquisition (``:SINGle``); return once the scope has armed.

        The status query after it is answered only once ``:SINGle`` has been executed (a
        write returns before the instrument has read it).
        """
        self.single()
        self.operation_condition()

    def wait_triggered(self, timeout_s: float) -> bool:
        """Poll ``:OPERegister:CONDition?`` until the Run bit clears (the single acquisition
        is done, as in the guide's polling-with-timeout example); False on timeout."""
        return self._poll(lambda: not self.operation_condition() & self.RUN_BIT, timeout_s)

    def edge_delays_s(self) -> dict[int, float | None]:
        """``:MEASure:DELay? CHANnel<p>,CHANnel<s>`` for each subscriber."""
        publisher = self._configured_publisher()
        delays: dict[int, float | None] = {}
        for channel in self.subscriber_channels:
            fields = {"source_a": publisher, "source_b": channel}
            delays[channel] = parse_measurement(
                self.measure_delay(**fields), asked=type(self).measure_delay.command(**fields))
        return delays
