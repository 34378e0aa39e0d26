"""Capacity search end to end: real brokers, real agents, real Spark.

A search on Mosquitto and on the fork/pipe broker, each under a CPU budget of 0.05 cores
(``broker.cpu_limit``), finds a capacity; then the found rate and 1.2x it are run by hand
as a plain campaign (a sweep, two runs of each, interleaved) and judged by the same SLO.

Why the SLO is ``latency_us.p50 <= 2000`` and ``lost == 0`` under a budget: on a 2-core
machine an unbudgeted broker outruns the Python side of the agents (the search would end
generator-limited), so the budget makes the broker saturate first, at a rate the agents
keep. Past saturation its queue grows for the whole run, and the median delivery goes
from ~0.1 ms to tens of ms: a sharp boundary. p99 is not: a CPU quota stalls a busy
broker for the rest of each 100 ms period well before it saturates, and other processes
reach the tail first (measured: p99 24 to 52 ms at 250 Hz, far below capacity).

What is not sharp here is the capacity itself: a quota is a ceiling, not a guarantee, and
on a 2-core machine shared with other work the broker gets less than its 0.05 cores while
others are busy. Measured with Mosquitto: one search found 565.7 Hz (616.9 rejected),
another, under more load, 733.6 Hz (accepted twice) whose re-run by hand then failed
with p50 27.6 ms; a third found 616.9 Hz (672.7 rejected), and by hand both 616.9 and
740.3 Hz then met the SLO twice (p50 69 and 81 µs): the load had dropped. So the check by
hand is: 1.2x the found rate fails every time, and the found rate meets the SLO in at
least one of its two runs; both are printed. On this shared machine it is an open
defect of the set-up, not of the search, that the Mosquitto case fails when the load
changes between the search and the check: of two runs of this test, one failed so, the
other passed (733.6 Hz found; by hand 733.6 passed once and failed once, 880.3 failed
twice). Fork/pipe, whose boundary is at 130-140 Hz, passed: found 129.7, re-run 129.7
passed twice and 155.6 failed twice.
"""

from __future__ import annotations

import pytest

from mqttbed.analytics.results import figure_at
from mqttbed.brokers.cpu_budget import cpu_budget_unavailable
from mqttbed.campaigns.search import Verdict, judge, parse_slo_term
from mqttbed.campaigns.spec import CampaignSpec, parse_spec
from mqttbed.controller.analysis import load_results
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.search_runs import replay
from mqttbed.core.settings import Settings

SLO = ["latency_us.p50 <= 2000", "lost == 0"]
WORKLOAD = {"publishers": 1, "subscribers": 10, "payload_bytes": 64, "messages": 800,
            "warmup_messages": 50}

# the first probe: below capacity, near enough to take few probes (fork/pipe: a process
# per client and per subscription, under the same 0.05 cores, saturates far lower)
LOW = {"mosquitto": 200, "forkpipe": 50}

needs_cgroups = pytest.mark.skipif(cpu_budget_unavailable() is not None,
                                   reason=f"{cpu_budget_unavailable()}")


def spec_for(backend: str, **extra: object) -> dict[str, object]:
    return {"name": f"capacity-{backend}", "broker": {"backend": backend, "cpu_limit": 0.05},
            "workload": dict(WORKLOAD), "agents": {"count": 2}, "timing": {"drain_s": 1},
            **extra}


@pytest.mark.system
@pytest.mark.integration
@pytest.mark.timeout(900)
@needs_cgroups
@pytest.mark.parametrize("backend", ["mosquitto", "forkpipe"])
def test_a_capacity_search_finds_a_capacity_whose_interval_holds_when_rerun(tmp_path, backend):
    search = {"parameter": "workload.rate_hz", "low": LOW[backend], "high": 20_000, "slo": SLO,
              "resolution": 0.15, "confirmations": 1, "max_probes": 14}
    terms = [parse_slo_term(text) for text in SLO]
    with create_controller(Settings(data_dir=tmp_path / "data")) as controller:
        campaign_id = controller.engine.create_campaign(
            parse_spec(spec_for(backend, search=search)))
        assert controller.run_campaign(campaign_id) == "done"
        stats = load_results(controller.layout, campaign_id)
        with controller.sessions() as s:
            rows = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        assert stats is not None and stats.search is not None
        found = stats.search
        print(f"{backend}: {found.conclusion}; probes "
              f"{[(p.value, p.verdict) for p in found.probes]}")
        assert found.stop_reason == "resolution", found.conclusion
        capacity, rejected = found.interval
        assert capacity is not None and rejected is not None and capacity == found.capacity
        assert rejected <= capacity * 1.15 * 1.001
        # the figures judged are the numbers stats.json shows for those runs ...
        runs = {r.run_id: r for r in stats.runs}
        assert len(found.probes) == len(rows) == len(runs)
        for probe in found.probes:
            for term in terms:
                assert probe.figures[term.figure] == figure_at(runs[probe.run_id], term.figure)
        # ... and replaying the decisions on them chooses the very runs that ran
        with controller.sessions() as s:
            stored = CampaignSpec.model_validate(s.get(CampaignRow, campaign_id).spec)
        replayed, decision = replay(stored, rows, runs)
        assert [p.value for p, _ in replayed] == [p.value for p in found.probes]
        assert decision.capacity == capacity and decision.stop == "resolution"

        # by hand: the found rate and 1.2x it, as a plain campaign
        check_rates = [capacity, round(capacity * 1.2, 1)]
        plain_id = controller.engine.create_campaign(parse_spec(
            spec_for(backend, sweep={"workload.rate_hz": check_rates}, repetitions=2)))
        assert controller.run_campaign(plain_id) == "done"
        plain = load_results(controller.layout, plain_id)
    assert plain is not None
    verdicts: dict[float, list[tuple[Verdict, str]]] = {rate: [] for rate in check_rates}
    for run in plain.runs:
        figures = {t.figure: figure_at(run, t.figure) for t in terms}
        rate_kept = run.generator.rate_kept if run.generator else None
        verdicts[run.params["workload.rate_hz"]].append(judge(terms, figures, rate_kept))
    print(f"{backend}: re-run by hand: {verdicts}")
    assert [v for v, _ in verdicts[check_rates[1]]] == [Verdict.REJECTED] * 2, verdicts
    assert Verdict.ACCEPTED in [v for v, _ in verdicts[check_rates[0]]], verdicts
