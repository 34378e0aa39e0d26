"""The virtual scope: a SCPI server over TCP that speaks the Rigol DS1000Z dialect.

It stands in for a real scope on one machine: agents' virtual GPIO lines are *fed* to its
channels as edges, and the :class:`~mqttbed.instruments.scope.rigol.RigolDS1000Z` driver
talks to it through pyvisa-py as it would to a DS1000Z's raw SCPI socket (port 5555) on
the LAN: ``TCPIP0::127.0.0.1::<port>::SOCKET``, newline-terminated, several commands per
connection, several clients at once.

Signals
    ``feed(channel, edges)`` adds ``(t_ns, level)`` pairs: at CLOCK_MONOTONIC time ``t_ns``
    the line goes to ``level`` (0 or 1). Edges may come in any order, from any thread, late
    and in batches; every line starts low. A pair that does not change the level is not an
    edge. ``advance(horizon_ns)`` promises that every edge at or before ``horizon_ns`` has
    been fed: the scope decides nothing about a time the horizon has not reached.

Time resolution
    Edges are kept as CLOCK_MONOTONIC nanoseconds and measured to 1 ns. There is no analog
    front end (no rise time, noise, probe, bandwidth limit, or threshold crossing: vertical
    settings and the trigger level are stored and read back but do not change what is
    measured) and no sample-rate quantisation. Delay replies carry 7 significant digits
    (``%.6e``, the instrument's format), so delays above 10 ms come back coarser than 1 ns.

Acquisition (``:SINGle``)
    The scope is armed at the moment it executes ``:SINGle`` (CLOCK_MONOTONIC now, from
    :func:`mqttbed.core.clock.monotonic_ns`), with the timebase and trigger settings of
    that moment. It triggers on the first edge of the trigger slope (``:TRIGger:EDGe:SLOPe``
    POSitive, NEGative or RFALl) on the trigger source at or after the arm time; an edge
    before arming never triggers. The record is the screen: 12 divisions of
    ``:TIMebase:MAIN:SCALe``, centred ``:TIMebase:MAIN:OFFSet`` after the trigger (the
    RigolDS1000Z driver puts the trigger one division from the left edge, leaving 11
    divisions after it). The acquisition completes once the horizon has reached the end of
    the record. ``:TRIGger:STATus?`` answers WAIT while armed and untriggered, TD once
    triggered while the record is still filling, then STOP; STOP too before any
    ``:SINGle`` and after ``:STOP``, which abandons an unfinished acquisition.

Measurements (``:MEASure:ITEM? RDELay|FDELay,CHANnel<a>,CHANnel<b>``)
    Only on a completed acquisition: the first rising (RDELay) or falling (FDELay) edge of
    A and of B between the trigger and the end of the record (pre-trigger edges are not
    used); the reply is ``t_B - t_A`` in seconds as ``%.6e`` (``t_B - t_trigger`` when A is
    the trigger source with the same slope, as the driver sets it up). 9.9E37 when either channel
    has no such edge there, a channel is off, or no acquisition has completed; also for
    the other DS1000Z items, which are recognised but not modelled. Both sources must be
    given: the guide's fallback to ``:MEASure:SETup:DSA/DSB`` is not modelled.

Other commands: ``*IDN?``, ``*RST``, ``*CLS``, ``*OPC?``, ``:SYSTem:ERRor?``, ``:STOP``,
the set and query forms of :CHANnel<n>:DISPlay/COUPling/SCALe/OFFSet,
:TIMebase[:MAIN]:SCALe/OFFSet, :TRIGger:MODE/SWEep and :TRIGger:EDGe:SOURce/SLOPe/LEVel,
and ``:MEASure:ITEM`` (turns an item on; no screen to show it on). Anything else queues
``-113,"Undefined header"`` and is otherwise ignored, as the instrument does.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mqttbed.core.clock import monotonic_ns
from mqttbed.instruments.scope.controls import (
    Boolean,
    Choice,
    Numeric,
    Validator,
    scpi_short_form,
)
from mqttbed.instruments.scope.scpi_server import ScpiError, ScpiInstrument, ScpiTcpServer

IDENTITY = "RIGOL TECHNOLOGIES,DS1104Z-VIRTUAL,MQTTBED0001,00.04.04"
CHANNELS = range(1, 5)
HORIZONTAL_DIVISIONS = 12
INVALID = "9.9E37"
_CHANNEL_SOURCE = Choice(*(f"CHANnel{n}" for n in CHANNELS))
# The DS1000Z guide's :MEASure:ITEM items; only the two delays are modelled.
_ITEMS = Choice(
    "VMAX", "VMIN", "VPP", "VTOP", "VBASe", "VAMP", "VAVG", "VRMS", "OVERshoot", "PREShoot",
    "MARea", "MPARea", "PERiod", "FREQuency", "RTIMe", "FTIMe", "PWIDth", "NWIDth", "PDUTy",
    "NDUTy", "RDELay", "FDELay", "RPHase", "FPHase", "TVMAX", "TVMIN", "PSLEWrate",
    "NSLEWrate", "VUPper", "VMID", "VLOWer", "VARIance", "PVRMs", "PPULses", "NPULses",
    "PEDGes", "NEDGes")
_DELAY_ITEMS = {"RDELay": 1, "FDELay": 0}  # item -> the level its edges go to
_DISPLAY = ":CHANnel<n>:DISPlay"
_SCALE = ":TIMebase[:MAIN]:SCALe"
_OFFSET = ":TIMebase[:MAIN]:OFFSet"
_SWEEP = ":TRIGger:SWEep"
_SOURCE = ":TRIGger:EDGe:SOURce"
_SLOPE = ":TRIGger:EDGe:SLOPe"


@dataclass(frozen=True)
class _Setting:
    template: str
    validator: Validator
    default: Any
    per_channel: bool = False


# (guide template, accepted values, value after *RST)
_SETTINGS = [
    _Setting(_DISPLAY, Boolean(), False, per_channel=True),  # *RST: only CH1 on
    _Setting(":CHANnel<n>:COUPling", Choice("AC", "DC", "GND"), "DC", per_channel=True),
    _Setting(":CHANnel<n>:SCALe", Numeric(1e-3, 10.0), 1.0, per_channel=True),
    _Setting(":CHANnel<n>:OFFSet", Numeric(-100.0, 100.0), 0.0, per_channel=True),
    _Setting(_SCALE, Numeric(5e-9, 50.0), 1e-6),
    _Setting(_OFFSET, Numeric(-300.0, 5000.0), 0.0),
    _Setting(":TRIGger:MODE", Choice("EDGE"), "EDGE"),
    _Setting(_SWEEP, Choice("AUTO", "NORMal", "SINGle"), "AUTO"),
    _Setting(_SOURCE, _CHANNEL_SOURCE, "CHANnel1"),
    _Setting(_SLOPE, Choice("POSitive", "NEGative", "RFALl"), "POSitive"),
    _Setting(":TRIGger:EDGe:LEVel", Numeric(-100.0, 100.0), 0.0),
]


@dataclass
class _Acquisition:
    """One single acquisition: armed at ``arm_ns``, with the settings of that moment."""

    arm_ns: int
    source: int
    slope: str
    record_end_ns: int  # end of the record, relative to the trigger
    trigger_ns: int | None = None
    complete: bool = False


class VirtualScope(ScpiInstrument):
    """A virtual Rigol DS1000Z on 127.0.0.1 whose four channels are fed with GPIO edges."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__()
        self._server = ScpiTcpServer(self.execute_line, host, port)
        self.port: int = self._server.port
        self.resource = f"TCPIP0::{host}::{self.port}::SOCKET"
        self._order = itertools.count()
        self._edges: dict[int, list[tuple[int, int, int]]] = {n: [] for n in CHANNELS}
        self._horizon_ns: int | None = None
        self._settings: dict[tuple[str, int | None], Any] = {}
        self._acquisition: _Acquisition | None = None
        self.arms = 0       # :SINGle commands received
        self.completed = 0  # acquisitions that completed
        self._reset()
        self.on("*IDN", lambda args, n: IDENTITY, query=True)
        self.on("*OPC", lambda args, n: "1", query=True)
        self.on("*RST", lambda args, n: self._reset())
        self.on(":SINGle", lambda args, n: self._arm())
        self.on(":STOP", lambda args, n: self._stop())
        self.on(":TRIGger:STATus", lambda args, n: self._status(), query=True)
        self.on(":MEASure:ITEM", self._measure_on)
        self.on(":MEASure:ITEM", self._measure, query=True)
        for setting in _SETTINGS:
            self.on(setting.template, self._setter(setting))
            self.on(setting.template, self._getter(setting), query=True)

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> VirtualScope:
        """Start serving on the port; returns self."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Disconnect clients and stop the server threads."""
        self._server.stop()

    def stop_answering(self) -> None:
        """Simulate a hung instrument: connections stay open, no command is answered."""
        self._server.stop_answering()

    def __enter__(self) -> VirtualScope:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- signals --------------------------------------------------------------------------

    def feed(self, channel: int, edges: list[tuple[int, int]]) -> None:
        """Add edges ``(t_ns, new level 0/1)`` on ``channel``, in any order."""
        if channel not in CHANNELS:
            raise ValueError(f"channel {channel!r} does not exist; use 1 to 4")
        checked = []
        for t_ns, level in edges:
            if level not in (0, 1):
                raise ValueError(f"edge level {level!r} at {t_ns} ns: use 0 or 1")
            checked.append((int(t_ns), int(level)))
        with self.lock:
            for t_ns, level in checked:
                bisect.insort(self._edges[channel], (t_ns, next(self._order), level))

    def advance(self, horizon_ns: int) -> None:
        """Promise that every edge at or before ``horizon_ns`` has been fed."""
        with self.lock:
            if self._horizon_ns is None or horizon_ns > self._horizon_ns:
                self._horizon_ns = int(horizon_ns)

    # -- state ----------------------------------------------------------------------------

    def _reset(self, *_: object) -> None:
        self._settings = {
            (s.template, n): (n == 1 if s.template == _DISPLAY else s.default)
            for s in _SETTINGS for n in (CHANNELS if s.per_channel else [None])}
        self._acquisition = None

    def _setting(self, template: str, channel: int | None = None) -> Any:
        return self._settings[(template, channel)]

    def _setter(self, setting: _Setting) -> Callable[[list[str], list[int]], None]:
        def set_value(arguments: list[str], suffixes: list[int]) -> None:
            key = (setting.template, self._channel(suffixes) if setting.per_channel else None)
            if len(arguments) != 1:
                raise ScpiError(-109 if not arguments else -108,
                                "Missing parameter" if not arguments else "Parameter not allowed")
            value = _parse(setting.validator, arguments[0])
            if setting.template == _OFFSET \
                    and value < -HORIZONTAL_DIVISIONS / 2 * self._setting(_SCALE):
                raise ScpiError(-222, "Data out of range")  # below -Screen/2
            self._settings[key] = value

        return set_value

    def _getter(self, setting: _Setting) -> Callable[[list[str], list[int]], str]:
        def get_value(arguments: list[str], suffixes: list[int]) -> str:
            key = (setting.template, self._channel(suffixes) if setting.per_channel else None)
            return _reply(setting.validator, self._settings[key])

        return get_value

    @staticmethod
    def _channel(suffixes: list[int]) -> int:
        if not suffixes or suffixes[0] not in CHANNELS:
            raise ScpiError(-114, "Header suffix out of range")
        return suffixes[0]

    # -- acquisition ----------------------------------------------------------------------

    def _arm(self) -> None:
        now = monotonic_ns()
        self.arms += 1
        scale_ns = round(self._setting(_SCALE) * 1e9)
        centre_ns = round(self._setting(_OFFSET) * 1e9)
        self._settings[(_SWEEP, None)] = "SINGle"
        self._acquisition = _Acquisition(
            arm_ns=now, source=_channel_number(self._setting(_SOURCE)),
            slope=self._setting(_SLOPE),
            record_end_ns=centre_ns + HORIZONTAL_DIVISIONS // 2 * scale_ns)
        for edges in self._edges.values():  # keep only the level from before arming
            keep_from = max(0, bisect.bisect_left(edges, (now,)) - 1)
            del edges[:keep_from]

    def _stop(self) -> None:
        if self._acquisition is not None and not self._acquisition.complete:
            self._acquisition = None

    def _status(self) -> str:
        acquisition = self._acquisition
        if acquisition is None:
            return "STOP"
        if not acquisition.complete and self._horizon_ns is not None:
            if acquisition.trigger_ns is None:
                levels = {"POSitive": (1,), "NEGative": (0,), "RFALl": (0, 1)}[acquisition.slope]
                acquisition.trigger_ns = self._first_edge(
                    acquisition.source, levels, acquisition.arm_ns, self._horizon_ns)
            if acquisition.trigger_ns is not None and \
                    self._horizon_ns >= acquisition.trigger_ns + acquisition.record_end_ns:
                acquisition.complete = True
                self.completed += 1
        if acquisition.complete:
            return "STOP"
        return "WAIT" if acquisition.trigger_ns is None else "TD"

    def _first_edge(self, channel: int, levels: tuple[int, ...], start_ns: int,
                    end_ns: int) -> int | None:
        """Time of the first change to one of ``levels`` on ``channel`` in [start, end]."""
        edges = self._edges[channel]
        index = bisect.bisect_left(edges, (start_ns,))
        previous = edges[index - 1][2] if index > 0 else 0
        for t_ns, _, level in edges[index:]:
            if t_ns > end_ns:
                return None
            if level != previous and level in levels:
                return t_ns
            previous = level
        return None

    # -- measurements ---------------------------------------------------------------------

    def _measure_on(self, arguments: list[str], suffixes: list[int]) -> None:
        self._measurement_request(arguments)

    def _measure(self, arguments: list[str], suffixes: list[int]) -> str:
        item, sources = self._measurement_request(arguments)
        acquisition = self._acquisition
        if item not in _DELAY_ITEMS or len(sources) != 2 or acquisition is None:
            return INVALID
        self._status()  # brings the acquisition up to the horizon
        if not acquisition.complete or acquisition.trigger_ns is None:
            return INVALID
        if not all(self._setting(_DISPLAY, n) for n in sources):
            return INVALID
        start = acquisition.trigger_ns
        end = acquisition.trigger_ns + acquisition.record_end_ns
        level = (_DELAY_ITEMS[item],)
        t_a, t_b = (self._first_edge(n, level, start, end) for n in sources)
        if t_a is None or t_b is None:
            return INVALID
        return f"{(t_b - t_a) / 1e9:.6e}"

    def _measurement_request(self, arguments: list[str]) -> tuple[str, list[int]]:
        if not arguments:
            raise ScpiError(-109, "Missing parameter")
        if len(arguments) > 3:
            raise ScpiError(-108, "Parameter not allowed")
        item = _parse(_ITEMS, arguments[0])
        sources = [_channel_number(_parse(_CHANNEL_SOURCE, a)) for a in arguments[1:]]
        if item in _DELAY_ITEMS and len(sources) != 2:
            # The guide falls back to :MEASure:SETup:DSA/DSB, which is not modelled.
            raise ScpiError(-109, "Missing parameter")
        return item, sources



def _channel_number(source: str) -> int:
    match = re.search(r"(\d+)$", source)
    assert match is not None
    return int(match.group(1))


def _parse(validator: Validator, text: str) -> Any:
    """An argument as the instrument reads it; SCPI errors for what it would refuse."""
    value: Any = text.strip().strip('"')
    if isinstance(validator, Numeric):
        try:
            value = float(value)
        except ValueError:
            raise ScpiError(-104, "Data type error") from None
    try:
        return validator.check(value)
    except ValueError:
        if isinstance(validator, Numeric):
            raise ScpiError(-222, "Data out of range") from None
        raise ScpiError(-224, "Illegal parameter value") from None


def _reply(validator: Validator, value: Any) -> str:
    """A setting as the DS1000Z reports it: ``%.6e``, ``1``/``0``, short mnemonics."""
    if isinstance(validator, Numeric):
        return f"{value:.6e}"
    if isinstance(validator, Boolean):
        return "1" if value else "0"
    return scpi_short_form(value)
