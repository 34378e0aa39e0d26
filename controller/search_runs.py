"""A capacity search's runs read back as probes: what each one said, and what comes next.

The decisions are :mod:`mqttbed.campaigns.search`'s; this module turns the campaign's
stored runs and their figures (``RunStats`` from the analysis, the numbers ``stats.json``
shows) into the probes those decisions take, in the order the runs were made. Everything
is derived from the database and the analysis, never from memory, so a controller that
restarts mid-search picks it up where its runs left it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mqttbed.analytics.results import RunStats, SearchProbe, SearchResults, figure_at
from mqttbed.campaigns.search import Decision, Probe, StopReason, decide, judge
from mqttbed.campaigns.spec import CampaignSpec, search_is_integer
from mqttbed.controller.db import RunRow
from mqttbed.controller.states import RunState

# The runs a search reads as probes; an interrupted run (cancelled) says nothing.
PROBE_STATES = (RunState.DONE, RunState.FAILED)


def replay(spec: CampaignSpec, rows: Sequence[RunRow], figures: Mapping[str, RunStats]
           ) -> tuple[list[tuple[Probe, str]], Decision]:
    """The probes of a search's ended runs (each with the phase that chose it), in ordinal
    order, and the decision after them. ``rows`` are the latest attempts; ``figures`` the
    done runs' figures by run id."""
    search = spec.search
    assert search is not None
    terms, integer = search.terms(), search_is_integer(spec)
    probes: list[Probe] = []
    phases: list[str] = []
    for row in sorted(rows, key=lambda r: r.ordinal):
        if row.state not in PROBE_STATES:
            continue
        phases.append(decide(search, probes, integer=integer).phase)
        stats = figures.get(row.id)
        measured = {t.figure: (figure_at(stats, t.figure) if stats is not None else None)
                    for t in terms}
        rate_kept = stats.generator.rate_kept if stats and stats.generator else None
        failed = row.reason or "no reason given" if row.state == RunState.FAILED else None
        verdict, why = judge(terms, measured, rate_kept, failed)
        probes.append(Probe(float(row.params[search.parameter]), verdict, why, measured,
                            run_id=row.id))
    return list(zip(probes, phases, strict=True)), decide(search, probes, integer=integer)


def next_point_index(rows: Sequence[RunRow], value: float, parameter: str) -> tuple[int, int]:
    """(point index, repetition) of a probe at ``value``: a value probed before is the same
    point again (a confirmation pools with it); a new value is a new point."""
    same = [r for r in rows if float(r.params[parameter]) == value]
    if same:
        return same[0].point_index, len({r.ordinal for r in same})
    return max((r.point_index for r in rows), default=-1) + 1, 0


def conclusion(decision: Decision, parameter: str) -> str:
    """The capacity in words, with what bounded it."""
    low, high = decision.interval
    match decision.stop:
        case StopReason.RESOLUTION:
            return (f"capacity {low:g}: the SLO held at {parameter} = {low:g} on every run "
                    f"and failed at {high:g}")
        case StopReason.HIGH_ACCEPTED:
            return f"capacity at least {low:g}: the SLO held up to the search's high"
        case StopReason.LOW_REJECTED:
            return f"capacity below {high:g}: the SLO failed at the search's low"
        case StopReason.GENERATOR_LIMITED:
            if low is None:
                return ("no capacity found: the load generator could not keep the rate even "
                        "at the search's low (not a broker limit)")
            return (f"capacity at least {low:g}: above it the load generator could not keep "
                    "the rate, so the generator, not the broker, bounded the search")
        case _:
            shown = "none accepted" if low is None else f"at least {low:g}"
            return (f"capacity {shown}; the search ran out of probes (max_probes) before the "
                    "interval was narrow")


def search_results(spec: CampaignSpec, rows: Sequence[RunRow],
                   figures: Mapping[str, RunStats]) -> SearchResults | None:
    """The ``search`` block of a campaign's results; None for a campaign without search."""
    if spec.search is None:
        return None
    probes, decision = replay(spec, rows, figures)
    return SearchResults(
        parameter=spec.search.parameter, slo=list(spec.search.slo),
        capacity=decision.capacity, interval=decision.interval,
        stop_reason=str(decision.stop) if decision.stop else "unfinished",
        conclusion=(conclusion(decision, spec.search.parameter) if decision.stop
                    else "the search did not finish: its campaign ended first"),
        probes=[SearchProbe(run_id=p.run_id, value=p.value, phase=phase,
                            verdict=str(p.verdict), why=p.why, figures=dict(p.figures))
                for p, phase in probes])
