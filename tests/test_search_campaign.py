"""Capacity search end to end: real brokers, real agents, real Spark.

A search on Mosquitto under a CPU budget of 0.05 cores (``broker.cpu_limit``) ends by
resolution with a capacity confirmed on three runs; each probe's figures are the run
figures stats.json shows, and replaying the decisions on the stored runs chooses the very
runs that ran. A search on amqtt, which saturates on its own CPU with no budget, resolves
the same way, each verdict the SLO judged on its run's stats.json figures. Issue 25's
by-hand check (the found rate and 1.2x it re-run in a plain campaign) is measured by
bench/capacity_rerun.py, not asserted: on this 2-core machine it is chance. In clean-clone
CI runs the found rate failed by hand once (p50 51 ms), and once a search found 2,828 Hz
(3,084 Hz rejected once) and 1.2x it, 3,393.6 Hz, passed (p50 11.8 ms) where 3,700 Hz had
failed 4 of 4.

Why the by-hand check is not asserted on Mosquitto either: under a quota Mosquitto
is bistable near capacity (below), and measured here the band of rates where one run
passes and the next fails is about as wide as 1.2x. With the settings below (10 s probes,
two confirmations), 2026-11-27: Mosquitto found 648.4 Hz twice and 594.6 Hz once; by hand
the found rate passed 6 of 6 runs, and 1.2x it failed 5 of 6 (the sixth, 713.5 Hz in a
clean-clone CI run, kept p50 at 82 us while its twin fell behind to 344 ms). Fixed rates,
three 10 s runs each (2026-11-27, quiet machine): 560 Hz passed 3 of 3, 640 Hz 1 of 3,
720 Hz 1 of 3, 800 and 880 Hz 0 of 3; the same with a 20 ms CFS period instead of 100 ms,
or with ``cpu.cfs_burst_us`` equal to the quota, was no sharper. amqtt has no quota to
throttle it: above its capacity its queue grows for the whole run, below it the queue
stays empty, so the figures usually jump (p50 0.3-0.9 ms at 3,084 Hz, 134-142 ms at
3,700 Hz), but where that edge lies moves from run to run with the agents' own CPU.
The fork/pipe broker under the same quota behaves like Mosquitto (1.2x failed 4 of 4, the
found rate passed 1 of 2 and 2 of 2); its search is not in this tier (it took 146 s of
the 30 minutes CI has).

Why a budget: on a 2-core machine an unbudgeted broker outruns the agents (the search
would end generator-limited), so the budget makes the broker saturate first, at a rate
the agents keep. The budget confines the broker to one CPU (``brokers/cpu_budget.py``):
spread over two, fork/pipe's processes were throttled long before it used its quota
(the kernel's 5 ms quota slices), and its median drifted through the bound over
~90-140 Hz.

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
"""

from __future__ import annotations

import pytest

from mqttbed.analytics.results import SearchResults, figure_at
from mqttbed.brokers.cpu_budget import cpu_budget_unavailable
from mqttbed.campaigns.search import parse_slo_term
from mqttbed.campaigns.spec import CampaignSpec, parse_spec
from mqttbed.controller.analysis import load_results
from mqttbed.controller.controller import Controller, create_controller
from mqttbed.controller.db import CampaignRow, RunRow
from mqttbed.controller.search_runs import replay
from mqttbed.core.settings import Settings

SLO = ["latency_us.p50 <= 2000", "lost == 0"]
WORKLOAD = {"publishers": 1, "subscribers": 10, "payload_bytes": 64, "warmup_messages": 50}
# per probe: ~10 s near capacity (Mosquitto ~750 Hz, fork/pipe ~170 Hz); see above
MESSAGES = {"mosquitto": 8000, "forkpipe": 1600}

# the first probe: below capacity, near enough to take few probes (fork/pipe: a process
# per client and per subscription, under the same 0.05 cores, saturates far lower);
# Mosquitto at 500 Hz was rejected once in clean-clone CI (2026-11-27: the search then
# ends "low-rejected"), so its first probe is 400 Hz
LOW = {"mosquitto": 400, "forkpipe": 100}

needs_cgroups = pytest.mark.skipif(cpu_budget_unavailable() is not None,
                                   reason=f"{cpu_budget_unavailable()}")


def spec_for(backend: str, **extra: object) -> dict[str, object]:
    return {"name": f"capacity-{backend}", "broker": {"backend": backend, "cpu_limit": 0.05},
            "workload": {**WORKLOAD, "messages": MESSAGES[backend]}, "agents": {"count": 2},
            "timing": {"drain_s": 1},
            **extra}


def checked_search(controller: Controller, campaign_id: str, slo: list[str], name: str
                   ) -> SearchResults:
    """Run the search campaign and check what every resolved search must show: it ended by
    resolution; its interval is (capacity, the rejected value just above, within the
    resolution); each probe's figures are the numbers stats.json shows for its run; replaying
    the decisions on those runs (``replay``, the search's own judge) chooses the very runs
    that ran with the same verdicts and capacity; and the capacity held on every one of its
    runs (the probe and its two confirmations)."""
    terms = [parse_slo_term(text) for text in slo]
    assert controller.run_campaign(campaign_id) == "done"
    stats = load_results(controller.layout, campaign_id)
    with controller.sessions() as s:
        rows = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
        stored = CampaignSpec.model_validate(s.get(CampaignRow, campaign_id).spec)
    assert stats is not None and stats.search is not None
    found = stats.search
    print(f"{name}: {found.conclusion}; probes {[(p.value, p.verdict) for p in found.probes]}")
    assert found.stop_reason == "resolution", found.conclusion
    capacity, rejected = found.interval
    assert capacity is not None and rejected is not None and capacity == found.capacity
    assert capacity < rejected <= capacity * 1.15 * 1.001
    runs = {r.run_id: r for r in stats.runs}
    assert len(found.probes) == len(rows) == len(runs)
    for probe in found.probes:
        for term in terms:
            assert probe.figures[term.figure] == figure_at(runs[probe.run_id], term.figure)
    replayed, decision = replay(stored, rows, runs)
    assert [(p.value, p.verdict) for p, _ in replayed] == [(p.value, p.verdict)
                                                           for p in found.probes]
    assert decision.capacity == capacity and decision.stop == "resolution"
    at_capacity = [p.verdict for p in found.probes if p.value == capacity]
    assert len(at_capacity) >= 3 and set(at_capacity) == {"accepted"}, found.probes
    assert any(p.verdict == "rejected" and p.value == rejected for p in found.probes)
    return found


@pytest.mark.system
@pytest.mark.integration
@pytest.mark.timeout(900)
@needs_cgroups
def test_a_capacity_search_confirms_a_capacity_judged_on_the_results_own_figures(tmp_path):
    backend = "mosquitto"
    search = {"parameter": "workload.rate_hz", "low": LOW[backend], "high": 20_000, "slo": SLO,
              "resolution": 0.15, "confirmations": 2, "max_probes": 14}
    with create_controller(Settings(data_dir=tmp_path / "data")) as controller:
        campaign_id = controller.engine.create_campaign(
            parse_spec(spec_for(backend, search=search)))
        checked_search(controller, campaign_id, SLO, backend)
        # Not asserted here: that the found rate and 1.2x it, re-run by hand, pass and fail
        # (under a quota Mosquitto is bistable near capacity; see the docstring);
        # bench/capacity_rerun.py measures it on amqtt.


# amqtt: one Python process (one core at most), no budget; its queue grows without bound
# above its capacity (measured 1 -> 10 subscribers: p50 0.3-0.7 ms at 1,700-3,000 Hz, 113 ms at
# 3,200 Hz, 760 ms at 4,800 Hz), so the bound is set between the two: 20 ms
AMQTT_SLO = ["latency_us.p50 <= 20000", "lost == 0"]
AMQTT_MESSAGES = 15_000   # ~5 s per probe near capacity (~3,000 Hz)


@pytest.mark.system
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_a_capacity_search_on_amqtt_resolves_on_the_figures_its_results_show(tmp_path):
    """A broker that saturates on its own CPU, with no budget: the search brackets and
    bisects to its resolution, every verdict is the SLO judged on the figures stats.json
    shows for that run, and the capacity was confirmed. The by-hand re-run of issue 25
    (the found rate and 1.2x it) is measured by bench/capacity_rerun.py, not asserted
    here: on 2 shared cores it is a matter of chance (see that bench's docstring)."""
    search = {"parameter": "workload.rate_hz", "low": 2000, "high": 20_000, "slo": AMQTT_SLO,
              "resolution": 0.15, "confirmations": 2, "max_probes": 14}
    spec: dict[str, object] = {
        "name": "capacity-amqtt", "broker": {"backend": "amqtt"},
        "workload": {**WORKLOAD, "messages": AMQTT_MESSAGES}, "agents": {"count": 2},
        "timing": {"drain_s": 1}}
    with create_controller(Settings(data_dir=tmp_path / "data")) as controller:
        campaign_id = controller.engine.create_campaign(parse_spec({**spec, "search": search}))
        checked_search(controller, campaign_id, AMQTT_SLO, "amqtt")
