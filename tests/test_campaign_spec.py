"""Campaign specs: validation messages name the field and the value; sweeps expand."""

from __future__ import annotations

import pytest

from mqttbed.campaigns.spec import (
    builtin_spec_path,
    expand_points,
    load_spec,
    parse_spec,
    plan_runs,
    spec_from_text,
)
from mqttbed.core.errors import SpecError

QUICKSTART_TEXT = """
name: quickstart
broker: {backend: mosquitto}
workload:
  publishers: 1
  subscribers: 10
  topic: bench/sync
  payload_bytes: 64
  rate_hz: 100
  messages: 500
  qos: 0
  warmup_messages: 20
sweep:
  workload.subscribers: [2, 10, 50]
repetitions: 3
"""


def spec_with(**sections):
    data = {"name": "t", "workload": {"subscribers": 2}}
    for key, value in sections.items():
        data[key] = value
    return data


def test_the_issue_example_parses_with_its_values():
    spec = spec_from_text(QUICKSTART_TEXT)
    assert spec.workload.subscribers == 10
    assert spec.workload.rate_hz == 100
    assert spec.sweep == {"workload.subscribers": [2, 10, 50]}
    assert spec.repetitions == 3
    assert spec.broker.backend == "mosquitto"


def test_json_text_is_accepted_too():
    spec = spec_from_text('{"name": "j", "workload": {"subscribers": 3}}')
    assert spec.workload.subscribers == 3


def test_unknown_key_is_rejected_naming_the_field_and_value():
    with pytest.raises(SpecError, match=r"workload\.subscriberz: unknown key \(value 5\)"):
        parse_spec(spec_with(workload={"subscriberz": 5}))


def test_unknown_top_level_key_is_rejected():
    with pytest.raises(SpecError, match=r"repetition: unknown key"):
        parse_spec({"name": "t", "repetition": 3})


def test_bad_value_names_the_field_and_the_value():
    with pytest.raises(SpecError, match=r"workload\.rate_hz: bad value -5"):
        parse_spec(spec_with(workload={"rate_hz": -5}))


def test_payload_smaller_than_the_timestamp_header_is_rejected():
    with pytest.raises(SpecError, match=r"workload\.payload_bytes: bad value 8"):
        parse_spec(spec_with(workload={"payload_bytes": 8}))


def test_qos_must_be_0_1_or_2():
    with pytest.raises(SpecError, match=r"workload\.qos: bad value 3"):
        parse_spec(spec_with(workload={"qos": 3}))


def test_warmup_must_leave_messages_to_measure():
    with pytest.raises(SpecError, match=r"warmup_messages \(500\) must be less than messages"):
        parse_spec(spec_with(workload={"messages": 500, "warmup_messages": 500}))


def test_wildcard_publish_topic_is_rejected():
    with pytest.raises(SpecError, match=r"workload\.topic: bad value 'a/#'"):
        parse_spec(spec_with(workload={"topic": "a/#"}))


def test_unknown_backend_lists_the_available_ones():
    with pytest.raises(SpecError, match=r"unknown broker backend 'rabbit'.*mosquitto"):
        parse_spec(spec_with(broker={"backend": "rabbit"}))


def test_unknown_backend_option_is_named():
    with pytest.raises(SpecError, match=r"max_queued_mesages"):
        parse_spec(spec_with(broker={"backend": "mosquitto", "max_queued_mesages": 10}))


def test_sweep_over_a_field_that_does_not_exist_is_rejected():
    with pytest.raises(SpecError, match=r"sweep key 'workload\.subs'.*has no field 'subs'"):
        parse_spec(spec_with(sweep={"workload.subs": [1, 2]}))


def test_bad_swept_value_names_the_point_and_the_value():
    with pytest.raises(SpecError,
                       match=r"sweep point \(workload\.subscribers=-1\): workload\.subscribers: "
                             r"bad value -1"):
        parse_spec(spec_with(sweep={"workload.subscribers": [2, -1]}))


def test_missing_name_is_reported():
    with pytest.raises(SpecError, match=r"name: required field is missing"):
        parse_spec({"workload": {}})


def test_missing_file_is_named(tmp_path):
    with pytest.raises(SpecError, match=r"nope\.yaml.*does not exist"):
        load_spec(tmp_path / "nope.yaml")


def test_sweep_expands_to_the_cross_product_with_params():
    spec = parse_spec(spec_with(sweep={"workload.subscribers": [2, 10],
                                       "workload.payload_bytes": [64, 256, 1024]}))
    points = expand_points(spec)
    assert len(points) == 6
    assert [p.index for p in points] == list(range(6))
    assert points[0].params == {"workload.subscribers": 2, "workload.payload_bytes": 64}
    assert points[5].params == {"workload.subscribers": 10, "workload.payload_bytes": 1024}
    assert points[5].spec.workload.subscribers == 10
    assert points[5].spec.workload.payload_bytes == 1024
    assert points[5].spec.sweep == {}


def test_no_sweep_is_one_point_with_empty_params():
    points = expand_points(parse_spec(spec_with()))
    assert len(points) == 1 and points[0].params == {}


def test_repetitions_are_interleaved_across_points():
    spec = parse_spec(spec_with(sweep={"workload.subscribers": [2, 10, 50]}, repetitions=2))
    runs = plan_runs(spec)
    assert [(r.point.index, r.repetition) for r in runs] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]


@pytest.mark.parametrize("name, points, repetitions", [
    ("quickstart", 3, 3), ("sync-spread", 5, 20), ("scope-sync-spread", 5, 1),
    ("time-sync", 3, 3), ("cloud-edge", 5, 1), ("message-mix", 2, 1),
    ("impairment-demo", 4, 1), ("mqtt-st-networked", 12, 1), ("mqtt-st-budget", 4, 1),
    ("mqtt-st-local", 24, 1), ("mqtt-st-local-budget", 24, 1), ("transports", 22, 3)])
def test_builtin_campaigns_load(name, points, repetitions):
    spec = load_spec(builtin_spec_path(name))
    assert len(expand_points(spec)) == points
    assert spec.repetitions == repetitions


def test_sync_spread_reproduces_the_papers_subscriber_counts():
    spec = load_spec(builtin_spec_path("sync-spread"))
    assert spec.sweep == {"workload.subscribers": [2, 10, 20, 50, 100]}
    assert spec.workload.publishers == 1


def test_unknown_builtin_lists_the_library():
    with pytest.raises(SpecError, match=r"quickstart"):
        builtin_spec_path("nope")


def test_scenarios_are_crossed_with_the_sweep_and_named_in_params():
    spec = parse_spec({
        "name": "cmp",
        "scenarios": [
            {"name": "idle", "workload.publishers": 0, "workload.subscribers": 0,
             "workload.min_window_s": 30},
            {"name": "50+50", "workload.publishers": 50, "workload.subscribers": 50,
             "workload.messages": 3, "workload.warmup_messages": 0},
        ],
        "sweep": {"workload.qos": [0, 1]},
    })
    points = expand_points(spec)
    assert [p.params for p in points] == [
        {"scenario": "idle", "workload.qos": 0}, {"scenario": "idle", "workload.qos": 1},
        {"scenario": "50+50", "workload.qos": 0}, {"scenario": "50+50", "workload.qos": 1}]
    assert points[0].spec.workload.min_window_s == 30 and points[0].spec.workload.publishers == 0
    assert points[3].spec.workload.publishers == 50 and points[3].spec.workload.qos == 1
    assert points[3].spec.scenarios == []


def test_scenario_with_an_unknown_field_is_rejected_naming_it():
    with pytest.raises(SpecError, match=r"scenario 'x' key 'workload\.pubs'.*no field 'pubs'"):
        parse_spec({"name": "t", "scenarios": [{"name": "x", "workload.pubs": 1}]})


def test_scenario_needs_a_name():
    with pytest.raises(SpecError, match=r"scenario 0 needs a 'name'"):
        parse_spec({"name": "t", "scenarios": [{"workload.publishers": 1}]})


def test_scope_channels_must_differ():
    with pytest.raises(SpecError, match=r"a scope channel watches one line only"):
        parse_spec(spec_with(measurement={"scope": {"resource": "virtual", "channels": {
            "publisher": 1, "subscribers": [1, 2]}}}))


def test_scope_subscriber_selector_must_be_a_rank_or_first_last():
    with pytest.raises(SpecError, match=r"subscriber 'middle': use a rank"):
        parse_spec(spec_with(measurement={"scope": {"resource": "virtual", "channels": {
            "publisher": 1, "subscribers": {"middle": 2}}}}))


def test_unknown_scope_dialect_is_named():
    with pytest.raises(SpecError, match=r"measurement\.scope\.dialect: bad value 'tek'"):
        parse_spec(spec_with(measurement={"scope": {"resource": "virtual", "dialect": "tek"}}))


def test_an_idle_drain_longer_than_the_drain_is_refused_naming_both():
    with pytest.raises(SpecError, match=r"timing: drain_idle_s 2\.0 is longer than drain_s 1\.0"):
        parse_spec(spec_with(timing={"drain_s": 1, "drain_idle_s": 2}))
    timing = parse_spec(spec_with(timing={"drain_s": 30, "drain_idle_s": 2})).timing
    assert (timing.drain_s, timing.drain_idle_s) == (30, 2)
