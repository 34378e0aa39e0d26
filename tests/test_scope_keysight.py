"""Keysight InfiniiVision X driver, byte by byte against the 2000/3000/4000 X-Series
Programmer's Guide."""

from __future__ import annotations

import time

import pytest

from mqttbed.instruments.scope.base import Oscilloscope, ScopeReplyError
from mqttbed.instruments.scope.keysight import KeysightInfiniiVisionX
from mqttbed.instruments.scope.scripted import ScriptedTransport

pytestmark = pytest.mark.timeout(30)


def channel_setup(channel: int) -> list[tuple[str, None]]:
    """3.3 V logic on one channel: on, DC, 0.5 V/div, 1.65 V at the screen centre."""
    return [(f":CHANnel{channel}:DISPlay ON", None), (f":CHANnel{channel}:COUPling DC", None),
            (f":CHANnel{channel}:SCALe 0.5", None), (f":CHANnel{channel}:OFFSet 1.65", None)]


CONFIGURE_1_TO_2_3 = [
    *channel_setup(1), *channel_setup(2), *channel_setup(3),
    (":TIMebase:SCALe 5E-05", None),
    (":TIMebase:REFerence LEFT", None),
    (":TIMebase:POSition 0", None),
    (":TRIGger:MODE EDGE", None),
    (":TRIGger:SWEep NORMal", None),
    (":TRIGger:EDGE:SOURce CHANnel1", None),
    (":TRIGger:EDGE:SLOPe POSitive", None),
    (":TRIGger:EDGE:LEVel 1.65", None),
    (":MEASure:DEFine DELay,+1,+1", None),
]


def configured(*script, forever=None) -> tuple[KeysightInfiniiVisionX, ScriptedTransport]:
    transport = ScriptedTransport([*CONFIGURE_1_TO_2_3, *script], forever=forever)
    scope = KeysightInfiniiVisionX(transport, poll_interval_s=0.001)
    scope.configure(1, [2, 3], timebase_s_per_div=5e-5)
    return scope, transport


def test_the_driver_is_an_oscilloscope_of_the_keysight_dialect():
    scope = KeysightInfiniiVisionX(ScriptedTransport([
        ("*IDN?", "KEYSIGHT TECHNOLOGIES,DSOX3024T,MY00000000,07.50\n")]))
    assert isinstance(scope, Oscilloscope)
    assert scope.dialect == "keysight-x"
    assert scope.identify() == "KEYSIGHT TECHNOLOGIES,DSOX3024T,MY00000000,07.50"


def test_configure_sends_exactly_the_guides_channel_timebase_trigger_and_delay_commands():
    scope, transport = configured()
    assert transport.remaining == []
    assert scope.window_after_trigger_s == pytest.approx(9 * 5e-5)


def test_configure_for_falling_edges_defines_the_delay_on_falling_edges():
    transport = ScriptedTransport([
        *channel_setup(2), *channel_setup(4),
        (":TIMebase:SCALe 0.001", None), (":TIMebase:REFerence LEFT", None),
        (":TIMebase:POSition 0", None), (":TRIGger:MODE EDGE", None),
        (":TRIGger:SWEep NORMal", None), (":TRIGger:EDGE:SOURce CHANnel2", None),
        (":TRIGger:EDGE:SLOPe NEGative", None), (":TRIGger:EDGE:LEVel 1.4", None),
        (":MEASure:DEFine DELay,-1,-1", None),
    ])
    KeysightInfiniiVisionX(transport).configure(2, [4], timebase_s_per_div=1e-3, level_v=1.4,
                                                slope="negative")
    assert transport.remaining == []


def test_an_acquisition_is_single_then_run_bit_polled_until_clear_then_delay_per_subscriber():
    scope, transport = configured(
        (":SINGle", None), (":OPERegister:CONDition?", "+40"),  # arming: a round trip
        (":OPERegister:CONDition?", "+40"),  # Run (8) + Wait Trig (32)
        (":OPERegister:CONDition?", "+8"),
        (":OPERegister:CONDition?", "+0"),
        (":MEASure:DELay? CHANnel1,CHANnel2", "+87.0030E-06"),
        (":MEASure:DELay? CHANnel1,CHANnel3", "+120.000E-06"),
    )
    scope.arm_single()
    assert scope.wait_triggered(timeout_s=5.0) is True
    assert scope.edge_delays_s() == {2: pytest.approx(87.003e-6, abs=1e-12),
                                     3: pytest.approx(120e-6)}
    assert transport.remaining == []


def test_other_status_bits_do_not_count_as_running():
    scope, _ = configured((":OPERegister:CONDition?", "+2048"))  # overload bit only
    assert scope.wait_triggered(timeout_s=0) is True


def test_the_invalid_measurement_value_means_no_edge_and_reads_as_none():
    scope, _ = configured((":MEASure:DELay? CHANnel1,CHANnel2", "+9.9E+37"),
                          (":MEASure:DELay? CHANnel1,CHANnel3", "+15.0000E-06"))
    assert scope.edge_delays_s() == {2: None, 3: pytest.approx(15e-6)}


def test_a_scope_that_keeps_running_times_out_as_false_within_the_timeout():
    scope, transport = configured((":SINGle", None), (":OPERegister:CONDition?", "+8"),
                                  forever=(":OPERegister:CONDition?", "+8"))
    scope.arm_single()
    started = time.monotonic()
    assert scope.wait_triggered(timeout_s=0.05) is False
    assert 0.05 <= time.monotonic() - started < 1.0
    assert set(transport.sent[len(CONFIGURE_1_TO_2_3) + 1:]) == {":OPERegister:CONDition?"}


def test_an_unreadable_status_register_is_a_scope_reply_error():
    scope, _ = configured((":OPERegister:CONDition?", "RUN"))
    with pytest.raises(ScopeReplyError, match="'RUN'"):
        scope.wait_triggered(timeout_s=0)


def test_a_bad_slope_is_refused_before_anything_is_sent():
    transport = ScriptedTransport([])
    with pytest.raises(ValueError, match="slope 'EITHER'.*POS.*NEG"):
        KeysightInfiniiVisionX(transport).configure(1, [2], timebase_s_per_div=1e-4,
                                                    slope="EITHER")
    assert transport.sent == []
