"""Capacity search end to end: real brokers, real agents, real Spark.

A search on Mosquitto and on the fork/pipe broker, each under a CPU budget of 0.05 cores
(``broker.cpu_limit``), finds a capacity; each probe's figures are held to stats.json and
its decisions replayed. Then, for Mosquitto, the found rate and 1.2x it are run by hand
as a plain campaign (a sweep, two runs of each, interleaved) and judged by the same SLO:
1.2x the found rate must fail every time, and the found rate meet the SLO in at least one
of its two runs (both are printed). Fork/pipe is not checked by hand (see the test).

Why a budget: on a 2-core machine an unbudgeted broker outruns the agents (the search
would end generator-limited), so the budget makes the broker saturate first, at a rate
the agents keep. The budget confines the broker to one CPU (``brokers/cpu_budget.py``):
spread over two, fork/pipe's processes were throttled long before it used its quota
(the kernel's 5 ms quota slices), and its median drifted through the bound over
~90-140 Hz, too wide a boundary for this check.

Why ``latency_us.p50 <= 2000`` and long probes: under a quota, Mosquitto near its
capacity is bistable. A run either keeps every delivery fast (p50 ~0.1 ms) or, once a
stall puts it behind, stays throttled for the rest of the run (p50 tens to hundreds of
ms): measured with 10 s runs, 3 of 3 at 800 Hz and 2 of 3 at 880 Hz fell behind, while
560 and 640 Hz never did and 720 Hz did once in 2. Which mode a run ends in is chance,
and the longer the run the likelier a stall: with probes of ~1 s (800 messages) one
search accepted 872 Hz twice, then both runs by hand at 872 Hz failed (p50 23 and 52
ms); with 3 s probes and a saturation bound (p99 <= 400 ms) 1.2x the found rate passed
once by hand. So each probe lasts ~10 s near capacity (Mosquitto 8,000 messages, fork/pipe
1,600), long enough that a rate where the broker can fall behind does so, and the bound
is the median: the fraction of a run spent behind, not how far behind. The found value
is confirmed twice (three runs in all): a value that passes by chance one time in two
rarely passes three times.

Measured with this test as it stands (10 s probes, two confirmations, 2026-11-27, load
1-2): Mosquitto found 648.4 Hz twice; by hand 648.4 Hz passed all four runs (p50 68-137
us), 778.1 Hz failed all four (p50 11 ms to 1.1 s). With one confirmation, Mosquitto
passed both times (594.6 Hz found), fork/pipe once in two.
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
WORKLOAD = {"publishers": 1, "subscribers": 10, "payload_bytes": 64, "warmup_messages": 50}
# per probe: ~10 s near capacity (Mosquitto ~750 Hz, fork/pipe ~170 Hz); see above
MESSAGES = {"mosquitto": 8000, "forkpipe": 1600}

# the first probe: below capacity, near enough to take few probes (fork/pipe: a process
# per client and per subscription, under the same 0.05 cores, saturates far lower)
LOW = {"mosquitto": 500, "forkpipe": 100}

needs_cgroups = pytest.mark.skipif(cpu_budget_unavailable() is not None,
                                   reason=f"{cpu_budget_unavailable()}")


def spec_for(backend: str, **extra: object) -> dict[str, object]:
    return {"name": f"capacity-{backend}", "broker": {"backend": backend, "cpu_limit": 0.05},
            "workload": {**WORKLOAD, "messages": MESSAGES[backend]}, "agents": {"count": 2},
            "timing": {"drain_s": 1},
            **extra}


@pytest.mark.system
@pytest.mark.integration
@pytest.mark.timeout(900)
@needs_cgroups
@pytest.mark.parametrize("backend", ["mosquitto", "forkpipe"])
def test_a_capacity_search_finds_a_capacity_whose_interval_holds_when_rerun(tmp_path, backend):
    search = {"parameter": "workload.rate_hz", "low": LOW[backend], "high": 20_000, "slo": SLO,
              "resolution": 0.15, "confirmations": 2, "max_probes": 14}
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

        if backend == "forkpipe":
            # Not checked by hand in CI: fork/pipe's band, where one run passes and the next
            # fails, is as wide as the check's 1.2x. Measured here (2026-11-27, 10 s
            # probes): of four searches the check passed three; in the fourth, 168.2 Hz
            # accepted twice in the search failed twice by hand (p50 39 and 21 ms); in a
            # passing one 154.2 Hz, accepted three times, passed once in two by hand and
            # 185 Hz failed once at p50 2.25 ms, a hair over the bound. An open defect of
            # this check (issue 25); Mosquitto's margins were wide in all four.
            return
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
