"""Capacity search: the highest value of one parameter at which a service level holds.

A search campaign (``search:`` in the spec) runs one probe at a time and chooses each next
probe from the ones before: first *bracketing* (geometric steps up from ``low`` until a
probe is rejected or ``high`` is reached), then *bisection* (the geometric mean of the
highest accepted and the lowest rejected value) until the two are within ``resolution`` of
each other, then *confirmation* (the highest accepted value is run again, ``confirmations``
times; one rejection there rejects it and the bisection goes on below it). ``max_probes``
bounds the whole.

Each probe gets a verdict from its run's figures (the run figures of
``analytics.results``): ``accepted`` when every SLO term holds, ``rejected`` when one does
not (or the run failed), ``generator-limited`` when the load generator could not keep the
rate it was asked for. A generator-limited probe says nothing about the broker: it is an
upper bound of what this testbed can *test*, never a broker limit, and a search that ends
against it reports the capacity as *at least* the highest accepted value.

This module is pure: no broker, no Spark, no database. The controller feeds it the probes
so far (:func:`decide`) and runs what it asks for.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The figures of a run an SLO term may name: numbers of ``analytics.results.RunStats``
# (tests/test_search.py checks each resolves to a number there). ``generator.rate_kept``
# is not among them: it is always checked, and judged as the generator's, not the broker's.
_DISTRIBUTIONS = ("latency_us", "latency_from_intended_us", "send_lag_us", "sync_spread_us",
                  "first_last_spread_us")
_STATISTICS = ("mean", "std", "p50", "p90", "p99", "p999", "max")
SLO_FIGURES: tuple[str, ...] = (
    "messages_sent", "deliveries_expected", "deliveries_received", "deliveries_unexpected",
    "lost", "duplicates", "reordered",
    *(f"{d}.{s}" for d in _DISTRIBUTIONS for s in _STATISTICS),
    "jitter_us.std", "jitter_us.rfc3550",
    "throughput_msgs_per_s", "publication_msgs_per_s",
    "broker.cpu_percent_mean", "broker.cpu_percent_max", "broker.rss_bytes_max",
    "broker.net_recv_kb_per_s", "broker.net_sent_kb_per_s",
    "generator.requested_msgs_per_s", "generator.achieved_msgs_per_s",
    "generator.send_lag_max_us", "generator.messages_unsent",
)

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
    "==": operator.eq, "!=": operator.ne,
}
_TERM = re.compile(r"\s*(?P<figure>[A-Za-z_][\w.]*)\s*(?P<op><=|>=|==|!=|<|>)\s*"
                   r"(?P<bound>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*")


class Verdict(StrEnum):
    """What one probe says of the broker at its value."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    GENERATOR_LIMITED = "generator-limited"


class StopReason(StrEnum):
    """Why a search ended."""

    RESOLUTION = "resolution"                  # accepted and rejected values within it
    HIGH_ACCEPTED = "high-accepted"            # the SLO held up to ``high``: capacity >= high
    LOW_REJECTED = "low-rejected"              # the SLO failed at ``low``: capacity < low
    GENERATOR_LIMITED = "generator-limited"    # the generator, not the broker, bounded it
    MAX_PROBES = "max-probes"                  # ``max_probes`` ran out first


@dataclass(frozen=True)
class SloTerm:
    """One term of a service level: ``<figure path> <op> <number>``."""

    figure: str
    op: str
    bound: float
    text: str

    def holds(self, value: float) -> bool:
        """Whether a measured value meets this term."""
        return _OPERATORS[self.op](value, self.bound)


def parse_slo_term(text: str) -> SloTerm:
    """Parse ``latency_us.p99 <= 2000``; raise ValueError naming what is wrong."""
    match = _TERM.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not '<figure> <op> <number>' with op one of "
                         f"{', '.join(_OPERATORS)} (e.g. 'latency_us.p99 <= 2000')")
    figure = match["figure"]
    if figure not in SLO_FIGURES:
        hint = ("generator.rate_kept is always checked; leave it out" if
                figure == "generator.rate_kept" else
                f"figures: {', '.join(SLO_FIGURES)}")
        raise ValueError(f"{text!r}: unknown figure {figure!r}; {hint}")
    bound = float(match["bound"])
    if not math.isfinite(bound):
        raise ValueError(f"{text!r}: the bound must be a finite number")
    return SloTerm(figure=figure, op=match["op"], bound=bound, text=text.strip())


class SearchSpec(BaseModel):
    """``search:``: find the highest ``parameter`` value in [low, high] meeting the SLO."""

    model_config = ConfigDict(extra="forbid")
    parameter: str = Field(description="the dotted path searched over, e.g. workload.rate_hz "
                                       "(a numeric field the sweep could override)")
    low: float = Field(gt=0, description="the first probe; bracketing starts here")
    high: float = Field(gt=0, description="the highest value probed")
    slo: list[str] = Field(min_length=1, max_length=32,
                           description="terms '<figure> <op> <number>' over a run's figures "
                                       "(e.g. 'latency_us.p99 <= 2000', 'lost == 0'), all of "
                                       "which must hold; the generator keeping its rate is "
                                       "always checked besides, as the generator's verdict")
    growth: float = Field(2.0, gt=1, le=100,
                          description="bracketing: each probe this many times the last "
                                      "accepted one, until a rejection or high")
    resolution: float = Field(0.05, gt=0, le=1,
                              description="stop bisecting once the lowest rejected value is "
                                          "within this fraction above the highest accepted")
    confirmations: int = Field(1, ge=0, le=10,
                               description="extra runs of the highest accepted value once "
                                           "the interval is narrow; one rejection rejects it")
    max_probes: int = Field(24, ge=1, le=200,
                            description="at most this many probe runs (the search's runs)")

    @field_validator("slo")
    @classmethod
    def _terms_parse(cls, slo: list[str]) -> list[str]:
        for n, text in enumerate(slo):
            try:
                parse_slo_term(text)
            except ValueError as exc:
                raise ValueError(f"search.slo[{n}]: {exc}") from None
        return slo

    @model_validator(mode="after")
    def _low_below_high(self) -> SearchSpec:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        return self

    def terms(self) -> list[SloTerm]:
        """The SLO as parsed terms, in the spec's order."""
        return [parse_slo_term(text) for text in self.slo]


@dataclass(frozen=True)
class Probe:
    """One probe run as the search sees it: its value, its verdict and why."""

    value: float
    verdict: Verdict
    why: str
    figures: Mapping[str, float | None]   # the figures its SLO named, as measured
    run_id: str = ""


def judge(terms: Sequence[SloTerm], figures: Mapping[str, float | None],
          rate_kept: bool | None, failed: str | None = None) -> tuple[Verdict, str]:
    """A probe's verdict and why, from its run's figures.

    ``rate_kept`` False makes it generator-limited whatever the SLO says (its latency is
    the generator's backlog as much as the broker's). ``failed``, the reason of a run
    that did not finish, rejects it. A figure the run did not measure (None) fails its
    term: an SLO on latency with no delivery is not met.
    """
    if rate_kept is False:
        return Verdict.GENERATOR_LIMITED, ("the load generator did not keep the requested "
                                           "rate (generator.rate_kept false)")
    if failed is not None:
        return Verdict.REJECTED, f"the run failed: {failed}"
    broken = []
    for term in terms:
        value = figures.get(term.figure)
        if value is None:
            broken.append(f"{term.text} failed: {term.figure} not measured")
        elif not term.holds(value):
            broken.append(f"{term.text} failed: {term.figure} = {value:g}")
    if broken:
        return Verdict.REJECTED, "; ".join(broken)
    shown = ", ".join(f"{t.figure} = {figures.get(t.figure):g}" for t in terms)
    return Verdict.ACCEPTED, f"every SLO term held ({shown})"


@dataclass(frozen=True)
class Decision:
    """What the search says after the probes so far: the next value, or why it ended.

    ``capacity`` is the highest accepted value (None if none); ``interval`` the capacity's
    bounds, ``(highest accepted, lowest rejected)``, either None where nothing bounds it
    (a capacity above ``high``, or below ``low``).
    """

    next_value: float | None
    stop: StopReason | None
    capacity: float | None
    interval: tuple[float | None, float | None]
    phase: str   # bracketing, bisection, confirmation, done


def value_verdicts(probes: Sequence[Probe]) -> dict[float, Verdict]:
    """Each probed value's verdict over all its probes: one rejection rejects it, else one
    generator-limited probe limits it, else it is accepted."""
    verdicts: dict[float, Verdict] = {}
    for probe in probes:
        before = verdicts.get(probe.value)
        if before is None or _rank(probe.verdict) > _rank(before):
            verdicts[probe.value] = probe.verdict
    return verdicts


def _rank(verdict: Verdict) -> int:
    return {Verdict.ACCEPTED: 0, Verdict.GENERATOR_LIMITED: 1, Verdict.REJECTED: 2}[verdict]


def decide(search: SearchSpec, probes: Sequence[Probe], *, integer: bool = False) -> Decision:
    """The next probe's value from the probes so far, or why the search has ended.

    ``integer``: the parameter takes whole numbers (e.g. ``workload.publishers``), so
    values are rounded and the interval cannot narrow below 1.
    """
    if not probes:
        return Decision(_round(search.low, integer), None, None, (None, None), "bracketing")
    verdicts = value_verdicts(probes)
    rejected = [v for v, verdict in verdicts.items() if verdict == Verdict.REJECTED]
    limited = [v for v, verdict in verdicts.items() if verdict == Verdict.GENERATOR_LIMITED]
    upper = min(rejected + limited, default=None)
    broker_bound = upper is not None and upper in rejected
    # an accepted value above a rejection is noise at the boundary: the lowest rejection
    # bounds the capacity (the SLO must hold at the capacity every time)
    accepted = [v for v, verdict in verdicts.items() if verdict == Verdict.ACCEPTED
                and (upper is None or v < upper)]
    capacity = max(accepted, default=None)
    interval = (capacity, upper if broker_bound else None)

    def stop(reason: StopReason) -> Decision:
        return Decision(None, reason, capacity, interval, "done")

    if capacity is None:
        if upper is not None and not broker_bound:
            return stop(StopReason.GENERATOR_LIMITED)
        return stop(StopReason.LOW_REJECTED)
    if len(probes) >= search.max_probes:
        return stop(StopReason.MAX_PROBES)
    if upper is None:   # bracketing: nothing rejected yet
        if capacity >= search.high:
            return stop(StopReason.HIGH_ACCEPTED)
        step = _round(min(capacity * search.growth, search.high), integer)
        if step > capacity:
            return Decision(step, None, capacity, interval, "bracketing")
        return stop(StopReason.HIGH_ACCEPTED)
    middle = _round(math.sqrt(capacity * upper), integer)
    narrow = upper <= capacity * (1 + search.resolution) or not capacity < middle < upper
    if not narrow:
        return Decision(middle, None, capacity, interval, "bisection")
    runs_at_capacity = sum(1 for p in probes if p.value == capacity)
    if runs_at_capacity < 1 + search.confirmations:
        return Decision(capacity, None, capacity, interval, "confirmation")
    return stop(StopReason.RESOLUTION if broker_bound else StopReason.GENERATOR_LIMITED)


def _round(value: float, integer: bool) -> float:
    """A probe value as it is run: whole for an integer parameter, else 4 significant
    digits (a rate of 3162.3 Hz, not 3162.2776601683795)."""
    if integer:
        return float(max(1, round(value)))
    return float(f"{value:.4g}")
