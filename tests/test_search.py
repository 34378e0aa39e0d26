"""The capacity search's decisions, spec and SLO parsing: no broker, no Spark.

A synthetic "broker" stands in for the runs: its p99 jumps past the SLO above a capacity
C, and the search, fed its verdicts, must end with an interval that contains C.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttbed.analytics.results import Generator, RunStats
from mqttbed.campaigns.search import (
    SLO_FIGURES,
    Probe,
    SearchSpec,
    StopReason,
    Verdict,
    decide,
    judge,
    parse_slo_term,
)
from mqttbed.campaigns.spec import plan_runs, probe_point, spec_from_text
from mqttbed.core.errors import SpecError

SLO = ["latency_us.p99 <= 2000", "lost == 0"]


def search_spec(**changes: object) -> SearchSpec:
    fields: dict[str, object] = {"parameter": "workload.rate_hz", "low": 100,
                                 "high": 100_000, "slo": SLO}
    fields.update(changes)
    return SearchSpec.model_validate(fields)


def run_search(search: SearchSpec, broker, *, integer: bool = False):
    """Drive the search against ``broker(value) -> (figures, rate_kept)`` to its end."""
    terms = search.terms()
    probes: list[Probe] = []
    while True:
        decision = decide(search, probes, integer=integer)
        if decision.next_value is None:
            return decision, probes
        figures, rate_kept = broker(decision.next_value)
        verdict, why = judge(terms, figures, rate_kept)
        probes.append(Probe(decision.next_value, verdict, why, figures))
        assert len(probes) <= search.max_probes


def jumping_broker(capacity: float):
    """p99 of 300 µs up to ``capacity``, 50 ms above it (a saturated queue)."""
    def broker(value: float):
        return {"latency_us.p99": 300.0 if value <= capacity else 50_000.0, "lost": 0.0}, True
    return broker


def test_every_slo_figure_is_a_number_of_a_runs_results():
    def annotation_at(model, path):
        for part in path.split("."):
            model = model.model_fields[part].annotation
            args = [a for a in getattr(model, "__args__", ()) if a is not type(None)]
            model = args[0] if args else model
        return model
    for path in SLO_FIGURES:
        assert annotation_at(RunStats, path) in (int, float), path
    assert annotation_at(RunStats, "generator.rate_kept") is bool  # judged apart, not an SLO
    assert "rate_kept" in Generator.model_fields


@pytest.mark.parametrize(("text", "expected"), [
    ("latency_us.p99 <= 2000", ("latency_us.p99", "<=", 2000.0)),
    ("lost==0", ("lost", "==", 0.0)),
    (" throughput_msgs_per_s > 1.5e3 ", ("throughput_msgs_per_s", ">", 1500.0)),
])
def test_slo_terms_parse(text, expected):
    term = parse_slo_term(text)
    assert (term.figure, term.op, term.bound) == expected


@pytest.mark.parametrize(("slo", "named"), [
    (["latency_us.p98 <= 2000"], "unknown figure 'latency_us.p98'"),
    (["lost = 0"], "is not '<figure> <op> <number>'"),
    (["lost == zero"], "is not '<figure> <op> <number>'"),
    (["generator.rate_kept == 1"], "always checked"),
])
def test_a_bad_slo_term_is_a_spec_error_naming_its_index_and_text(slo, named):
    text = ("{name: c, search: {parameter: workload.rate_hz, low: 100, high: 1000, "
            f"slo: [lost == 0, {slo[0]!r}]}}}}")
    with pytest.raises(SpecError) as caught:
        spec_from_text(text)
    assert "search.slo[1]" in str(caught.value)
    assert slo[0] in str(caught.value) and named in str(caught.value)


@pytest.mark.parametrize(("extra", "named"), [
    ("search: {parameter: workload.rate_hz, low: 100, high: 1000000, slo: [lost == 0]}",
     "search.high (1e+06)"),
    ("search: {parameter: workload.topic, low: 1, high: 10, slo: [lost == 0]}",
     "'workload.topic' is 'bench/sync'"),
    ("search: {parameter: workload.nope, low: 1, high: 10, slo: [lost == 0]}",
     "workload has no field 'nope'"),
    ("search: {parameter: workload.rate_hz, low: 500, high: 100, slo: [lost == 0]}",
     "low (500) must be below high (100)"),
    ("repetitions: 3\nsearch: {parameter: workload.rate_hz, low: 1, high: 10, slo: [lost == 0]}",
     "leave sweep, scenarios and repetitions out"),
])
def test_a_bad_search_is_refused_at_load(extra, named):
    with pytest.raises(SpecError, match=None) as caught:
        spec_from_text(f"name: c\n{extra}\n")
    assert named in str(caught.value)


def test_a_search_plans_only_its_first_probe_at_low():
    spec = spec_from_text("name: c\nsearch: {parameter: workload.rate_hz, low: 150, "
                          "high: 5000, slo: [lost == 0]}\n")
    [first] = plan_runs(spec)
    assert first.point.params == {"workload.rate_hz": 150.0}
    assert first.point.spec.workload.rate_hz == 150.0 and first.point.spec.search is None
    assert probe_point(spec, 2400.0, 3).spec.workload.rate_hz == 2400.0


def test_an_integer_parameter_is_probed_in_whole_numbers():
    spec = spec_from_text("name: c\nsearch: {parameter: workload.publishers, low: 1, "
                          "high: 40, slo: ['latency_us.p99 <= 2000']}\n")
    assert spec.search is not None
    decision, probes = run_search(spec.search, jumping_broker(13), integer=True)
    assert all(p.value == int(p.value) for p in probes)
    assert decision.interval == (13, 14)
    assert probe_point(spec, 13.0, 0).spec.workload.publishers == 13


def test_judge_names_the_failed_term_and_its_measured_value():
    terms = search_spec().terms()
    verdict, why = judge(terms, {"latency_us.p99": 2500.0, "lost": 0.0}, True)
    assert verdict == Verdict.REJECTED and "latency_us.p99 <= 2000 failed" in why
    assert "latency_us.p99 = 2500" in why and "lost" not in why
    verdict, why = judge(terms, {"latency_us.p99": None, "lost": 0.0}, True)
    assert verdict == Verdict.REJECTED and "not measured" in why
    assert judge(terms, {"latency_us.p99": 10.0, "lost": 0.0}, True)[0] == Verdict.ACCEPTED
    assert judge(terms, {"latency_us.p99": 10.0, "lost": 0.0}, None)[0] == Verdict.ACCEPTED
    verdict, why = judge(terms, {"latency_us.p99": 10.0, "lost": 0.0}, True, "broker died")
    assert verdict == Verdict.REJECTED and "broker died" in why


def test_a_generator_that_lags_is_never_read_as_a_broker_limit():
    terms = search_spec().terms()
    # a huge p99 with the generator behind: the backlog is the generator's
    verdict, why = judge(terms, {"latency_us.p99": 90_000.0, "lost": 5.0}, False)
    assert verdict == Verdict.GENERATOR_LIMITED and "rate_kept" in why

    def broker(value: float):   # the broker would hold to 30 000; the generator stops at 5000
        return ({"latency_us.p99": 300.0 if value <= 30_000 else 9e4, "lost": 0.0},
                value <= 5000)
    decision, probes = run_search(search_spec(), broker)
    assert decision.stop == StopReason.GENERATOR_LIMITED
    assert decision.capacity is not None and 5000 * 0.95 <= decision.capacity <= 5000
    assert decision.interval[1] is None   # no broker bound found
    assert not any(p.verdict == Verdict.REJECTED for p in probes)


def test_the_search_brackets_geometrically_then_bisects_then_confirms():
    decision, probes = run_search(search_spec(), jumping_broker(3000))
    values = [p.value for p in probes]
    assert values[:6] == [100, 200, 400, 800, 1600, 3200]   # bracketing by 2x
    assert decision.stop == StopReason.RESOLUTION
    low, high = decision.interval
    assert low is not None and high is not None and low <= 3000 < high
    assert high <= low * 1.05
    assert values.count(decision.capacity) == 2   # once found, once confirmed


def test_a_confirmation_that_fails_moves_the_capacity_down():
    seen: dict[float, int] = {}

    def flaky(value: float):   # the first run at a value near the edge passes, later ones not
        seen[value] = seen.get(value, 0) + 1
        ok = value <= 2800 or (value <= 3000 and seen[value] == 1)
        return {"latency_us.p99": 300.0 if ok else 9e4, "lost": 0.0}, True
    decision, probes = run_search(search_spec(), flaky)
    assert decision.stop == StopReason.RESOLUTION
    assert decision.capacity is not None and decision.capacity <= 2800
    assert any(p.verdict == Verdict.REJECTED and
               any(q.value == p.value and q.verdict == Verdict.ACCEPTED for q in probes)
               for p in probes)


def test_the_search_ends_at_low_and_at_high():
    decision, _ = run_search(search_spec(), jumping_broker(50))
    assert decision.stop == StopReason.LOW_REJECTED and decision.capacity is None
    assert decision.interval == (None, 100)
    decision, probes = run_search(search_spec(), jumping_broker(1e9))
    assert decision.stop == StopReason.HIGH_ACCEPTED and decision.capacity == 100_000
    assert decision.interval == (100_000, None) and probes[-1].value == 100_000


def test_max_probes_bounds_the_search():
    decision, probes = run_search(search_spec(max_probes=5), jumping_broker(3000))
    assert len(probes) == 5 and decision.stop == StopReason.MAX_PROBES
    assert decision.capacity == 1600 and decision.interval == (1600, None)


@settings(max_examples=300, deadline=None)
@given(capacity=st.floats(min_value=100, max_value=99_000),
       resolution=st.sampled_from([0.01, 0.05, 0.2]),
       growth=st.sampled_from([1.5, 2.0, 4.0]),
       confirmations=st.integers(0, 2))
def test_property_the_interval_contains_the_capacity(capacity, resolution, growth,
                                                     confirmations):
    search = search_spec(resolution=resolution, growth=growth, confirmations=confirmations,
                         max_probes=200)
    decision, probes = run_search(search, jumping_broker(capacity))
    low, high = decision.interval
    assert decision.stop == StopReason.RESOLUTION
    assert low is not None and high is not None
    assert low <= capacity < high
    # within the resolution, up to the 4-digit rounding of the probe values
    assert high <= low * (1 + resolution) * (1 + 1e-3) or high == min(
        v for v in (p.value for p in probes) if v > low)
    # and cheaply: bracketing + bisection + confirmations, no wandering
    bound = (math.log(1000) / math.log(growth) + 2
             + math.log2(math.log(growth) / math.log1p(resolution)) + 2 + confirmations)
    assert len(probes) <= bound


@settings(max_examples=200, deadline=None)
@given(verdicts=st.lists(st.sampled_from(list(Verdict)), min_size=1, max_size=40))
def test_property_any_verdicts_end_the_search_within_max_probes(verdicts):
    """Whatever the runs say (noise, contradictions), the search ends, within its bound."""
    search = search_spec(max_probes=len(verdicts))
    probes: list[Probe] = []
    for verdict in verdicts:
        decision = decide(search, probes)
        if decision.next_value is None:
            break
        assert search.low <= decision.next_value <= search.high
        probes.append(Probe(decision.next_value, verdict, "", {}))
    final = decide(search, probes)
    assert final.next_value is None and final.stop is not None
    low, high = final.interval
    if low is not None and high is not None:
        assert low < high
