"""Declarative SCPI controls: declared once, written as the guide spells them, checked."""

from __future__ import annotations

import pytest

from mqttbed.instruments.scope.controls import (
    Boolean,
    Choice,
    Command,
    Control,
    Declaration,
    Numeric,
    Query,
    ScpiDriver,
)
from mqttbed.instruments.scope.keysight import KeysightInfiniiVisionX
from mqttbed.instruments.scope.rigol import RigolDS1000Z
from mqttbed.instruments.scope.scripted import ScriptedTransport, ScriptMismatch

pytestmark = pytest.mark.timeout(30)


class Bench(ScpiDriver):
    """A made-up instrument with one control of each kind."""

    timebase = Control(":TIMebase:SCALe", "Horizontal scale.", Numeric(1e-9, 50.0),
                       unit="s/div")
    channel_scale = Control(":CHANnel{channel}:SCALe", "Vertical scale.",
                            Numeric(1e-3, 10.0), unit="V/div", index=range(1, 5))
    slope = Control(":TRIGger:EDGe:SLOPe", "Trigger edge.", Choice("POSitive", "NEGative"))
    display = Control(":CHANnel{channel}:DISPlay", "Channel on.", Boolean(),
                      index=range(1, 5))
    single = Command(":SINGle", "One acquisition.")
    delay = Query(":MEASure:DELay? CHANnel{a},CHANnel{b}", "A delay.", parse=float)


def bench(*script, forever=None) -> tuple[Bench, ScriptedTransport]:
    transport = ScriptedTransport(script, forever=forever)
    return Bench(transport), transport


def test_setting_a_control_writes_the_guide_command_with_the_value():
    driver, transport = bench((":TIMebase:SCALe 0.0001", None), (":TIMebase:SCALe 5E-06", None))
    driver.timebase = 1e-4
    driver.timebase = 5e-6
    assert transport.remaining == []


def test_an_indexed_control_puts_the_index_into_the_header():
    driver, transport = bench((":CHANnel3:SCALe 0.5", None), (":CHANnel2:DISPlay ON", None),
                              (":CHANnel4:DISPlay OFF", None))
    driver.channel_scale[3] = 0.5
    driver.display[2] = True
    driver.display[4] = "off"
    assert transport.remaining == []


def test_reading_a_control_sends_its_query_and_parses_the_instruments_reply():
    driver, _ = bench((":TIMebase:SCALe?", "1.000000e-04"), (":TRIGger:EDGe:SLOPe?", "NEG"),
                      (":CHANnel1:DISPlay?", "1"), (":CHANnel2:SCALe?", "5.000000e-01"))
    assert driver.timebase == pytest.approx(1e-4)
    assert driver.slope == "NEGative"
    assert driver.display[1] is True
    assert driver.channel_scale[2] == pytest.approx(0.5)


def test_a_choice_takes_short_or_long_form_in_any_case_and_writes_the_guide_form():
    driver, transport = bench((":TRIGger:EDGe:SLOPe POSitive", None),
                              (":TRIGger:EDGe:SLOPe NEGative", None))
    driver.slope = "pos"
    driver.slope = "NEGATIVE"
    assert transport.remaining == []


def test_an_out_of_range_value_names_the_control_the_value_and_the_range_and_sends_nothing():
    driver, transport = bench()
    with pytest.raises(ValueError) as raised:
        driver.timebase = 100.0
    message = str(raised.value)
    assert "Bench.timebase" in message and ":TIMebase:SCALe" in message
    assert "100.0" in message
    assert "1E-09 to 50 s/div" in message
    assert transport.sent == []


def test_a_value_outside_a_choice_lists_the_allowed_values():
    driver, _ = bench()
    with pytest.raises(ValueError, match=r"Bench.slope.*'UP'.*one of POSitive, NEGative"):
        driver.slope = "UP"


def test_a_number_given_as_text_or_nan_is_refused():
    driver, _ = bench()
    with pytest.raises(ValueError, match="Bench.timebase.*'fast'"):
        driver.timebase = "fast"
    with pytest.raises(ValueError, match="Bench.timebase"):
        driver.timebase = float("nan")


def test_an_index_outside_its_range_is_refused_naming_the_index():
    driver, transport = bench()
    with pytest.raises(ValueError, match=r"Bench.channel_scale.*channel 5.*1 to 4"):
        driver.channel_scale[5] = 0.5
    assert transport.sent == []


def test_an_indexed_control_cannot_be_assigned_without_its_index():
    driver, _ = bench()
    with pytest.raises(AttributeError, match=r"channel_scale\[<channel>\]"):
        driver.channel_scale = 0.5


def test_an_unreadable_reply_is_an_error_that_quotes_it():
    driver, _ = bench((":TIMebase:SCALe?", "banana"))
    with pytest.raises(ValueError, match=r"Bench.timebase.*'banana'"):
        _ = driver.timebase


def test_commands_and_queries_fill_their_fields():
    driver, transport = bench((":SINGle", None),
                              (":MEASure:DELay? CHANnel1,CHANnel3", "+8.7E-05"))
    driver.single()
    assert driver.delay(a=1, b=3) == pytest.approx(8.7e-5)
    assert transport.remaining == []


def test_the_scripted_transport_fails_on_any_other_command():
    driver, _ = bench((":TIMebase:SCALe 0.0001", None))
    with pytest.raises(ScriptMismatch, match="0.0002"):
        driver.timebase = 2e-4


def test_a_declaration_without_a_doc_is_refused():
    with pytest.raises(ValueError, match="doc"):
        Control(":TIMebase:SCALe", " ", Numeric(0, 1))


@pytest.mark.parametrize("driver", [RigolDS1000Z, KeysightInfiniiVisionX])
def test_every_declaration_has_a_doc_its_attribute_name_and_a_command_of_its_own(driver):
    declared = {name: value for name, value in vars(driver).items()
                if isinstance(value, Declaration)}
    assert len(declared) >= 10
    for name, declaration in declared.items():
        assert declaration.name == name
        assert declaration.doc
    templates = [declaration.template for declaration in declared.values()]
    assert len(set(templates)) == len(templates)
