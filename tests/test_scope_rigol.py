"""Rigol DS1000Z driver, byte by byte against the MSO1000Z/DS1000Z Programming Guide."""

from __future__ import annotations

import time

import pytest

from mqttbed.instruments.scope.base import Oscilloscope, ScopeReplyError
from mqttbed.instruments.scope.rigol import RigolDS1000Z
from mqttbed.instruments.scope.scripted import ScriptedTransport

pytestmark = pytest.mark.timeout(30)


def channel_setup(channel: int) -> list[tuple[str, None]]:
    """3.3 V logic on one channel: on, DC, 0.5 V/div, 1.65 V at the centre."""
    return [(f":CHANnel{channel}:DISPlay ON", None), (f":CHANnel{channel}:COUPling DC", None),
            (f":CHANnel{channel}:SCALe 0.5", None), (f":CHANnel{channel}:OFFSet -1.65", None)]


CONFIGURE_1_TO_2_3 = [
    *channel_setup(1), *channel_setup(2), *channel_setup(3),
    (":TIMebase:MAIN:SCALe 5E-05", None),
    (":TIMebase:MAIN:OFFSet 0.00025", None),  # 5 divisions: trigger 1 division from the left
    (":TRIGger:MODE EDGE", None),
    (":TRIGger:EDGe:SOURce CHANnel1", None),
    (":TRIGger:EDGe:SLOPe POSitive", None),
    (":TRIGger:EDGe:LEVel 1.65", None),
    (":MEASure:ITEM RDELay,CHANnel1,CHANnel2", None),
    (":MEASure:ITEM RDELay,CHANnel1,CHANnel3", None),
]


def configured(*script, forever=None) -> tuple[RigolDS1000Z, ScriptedTransport]:
    transport = ScriptedTransport([*CONFIGURE_1_TO_2_3, *script], forever=forever)
    scope = RigolDS1000Z(transport, poll_interval_s=0.001)
    scope.configure(1, [2, 3], timebase_s_per_div=5e-5)
    return scope, transport


def test_the_driver_is_an_oscilloscope_of_the_rigol_dialect():
    scope = RigolDS1000Z(ScriptedTransport([("*IDN?", "RIGOL TECHNOLOGIES,DS1104Z,X,1\n")]))
    assert isinstance(scope, Oscilloscope)
    assert scope.dialect == "rigol-ds1000z"
    assert scope.identify() == "RIGOL TECHNOLOGIES,DS1104Z,X,1"


def test_configure_sends_exactly_the_guides_channel_timebase_trigger_and_delay_commands():
    scope, transport = configured()
    assert transport.remaining == []
    assert scope.window_after_trigger_s == pytest.approx(11 * 5e-5)


def test_configure_for_falling_edges_uses_the_negative_slope_and_fdelay():
    transport = ScriptedTransport([
        *channel_setup(4), *channel_setup(2),
        (":TIMebase:MAIN:SCALe 0.0002", None), (":TIMebase:MAIN:OFFSet 0.001", None),
        (":TRIGger:MODE EDGE", None), (":TRIGger:EDGe:SOURce CHANnel4", None),
        (":TRIGger:EDGe:SLOPe NEGative", None), (":TRIGger:EDGe:LEVel 1.2", None),
        (":MEASure:ITEM FDELay,CHANnel4,CHANnel2", None),
        (":MEASure:ITEM? FDELay,CHANnel4,CHANnel2", "1.234567e-04"),
    ])
    scope = RigolDS1000Z(transport)
    scope.configure(4, [2], timebase_s_per_div=2e-4, level_v=1.2, slope="NEG")
    assert scope.edge_delays_s() == {2: pytest.approx(1.234567e-4)}
    assert transport.remaining == []


def test_an_acquisition_is_single_then_status_polled_until_stop_then_rdelay_per_subscriber():
    scope, transport = configured(
        (":SINGle", None), (":TRIGger:STATus?", "WAIT"),  # arming: status round trip
        (":TRIGger:STATus?", "WAIT"), (":TRIGger:STATus?", "TD"), (":TRIGger:STATus?", "STOP"),
        (":MEASure:ITEM? RDELay,CHANnel1,CHANnel2", "8.700300e-05"),
        (":MEASure:ITEM? RDELay,CHANnel1,CHANnel3", "1.200000e-04"),
    )
    scope.arm_single()
    assert scope.wait_triggered(timeout_s=5.0) is True
    delays = scope.edge_delays_s()
    assert delays == {2: pytest.approx(87.003e-6, abs=1e-12), 3: pytest.approx(120e-6)}
    assert transport.remaining == []


def test_the_invalid_measurement_value_means_no_edge_and_reads_as_none():
    scope, _ = configured((":MEASure:ITEM? RDELay,CHANnel1,CHANnel2", "9.9E37"),
                          (":MEASure:ITEM? RDELay,CHANnel1,CHANnel3", "4.000000e-05"))
    assert scope.edge_delays_s() == {2: None, 3: pytest.approx(4e-5)}


def test_a_scope_that_keeps_waiting_times_out_as_false_within_the_timeout():
    scope, transport = configured((":SINGle", None), (":TRIGger:STATus?", "WAIT"),
                                  forever=(":TRIGger:STATus?", "WAIT"))
    scope.arm_single()
    started = time.monotonic()
    assert scope.wait_triggered(timeout_s=0.05) is False
    assert 0.05 <= time.monotonic() - started < 1.0
    assert set(transport.sent[len(CONFIGURE_1_TO_2_3) + 1:]) == {":TRIGger:STATus?"}


def test_a_zero_timeout_polls_the_status_exactly_once():
    scope, transport = configured((":TRIGger:STATus?", "WAIT"))
    assert scope.wait_triggered(timeout_s=0) is False
    assert transport.remaining == []


def test_a_reply_that_is_not_a_number_is_a_scope_reply_error_quoting_it():
    scope, _ = configured((":MEASure:ITEM? RDELay,CHANnel1,CHANnel2", "ERR"))
    with pytest.raises(ScopeReplyError, match="'ERR'"):
        scope.edge_delays_s()


@pytest.mark.parametrize("publisher, subscribers, kwargs, fix", [
    (1, [1, 2], {}, "distinct"),
    (1, [5], {}, "1 to 4"),
    (1, [], {}, "at least one"),
    (1, [2], {"slope": "UP"}, "POS"),
    (1, [2], {"level_v": 5.0}, "3.3"),
    (1, [2], {"timebase_s_per_div": 1e-12}, "timebase_scale"),
])
def test_a_bad_configuration_is_refused_before_anything_is_sent(publisher, subscribers, kwargs,
                                                                fix):
    transport = ScriptedTransport([])
    options = {"timebase_s_per_div": 1e-4, **kwargs}
    with pytest.raises(ValueError, match=fix):
        RigolDS1000Z(transport).configure(publisher, subscribers, **options)
    assert transport.sent == []


def test_measuring_before_configuring_is_an_error():
    with pytest.raises(RuntimeError, match="configure"):
        RigolDS1000Z(ScriptedTransport([])).edge_delays_s()


def test_close_closes_the_transport():
    transport = ScriptedTransport([])
    RigolDS1000Z(transport).close()
    assert transport.closed
