"""The cloud-edge paper's withholding policies and its policy simulation (Figs. 8, 9).

The policy functions against hand-computed cases of the paper's Eqs. 1-6; the simulator on
constructed RTT traces, and on seeded ones for determinism, the policy ordering and the
shapes of the figures; the CLI, the API and the page.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from mqttbed.analytics.cloud_edge_results import PAPER
from mqttbed.analytics.cloud_edge_sim import (
    POLICIES,
    CloudEdgeScenario,
    LinkModel,
    Trace,
    simulate,
)
from mqttbed.core.withholding import (
    Withholding,
    WithholdingPolicy,
    congestion_persists_probability,
    conservative_sends,
    expected_latency_s,
    expected_next_latency_s,
    historic_sends,
    probabilistic_sends,
)

# The paper's published figures, copied into the repository (its header says from where),
# so a clean clone has them (in tests/figures/: .gitignore leaves every data/ folder out);
# the original lives in the workspace's shared/, beside the checkout, where one exists.
REFERENCE_FIGURES = Path(__file__).parent / "figures" / "cloud-edge-reference-figures.yaml"
SHARED_FIGURES = Path(__file__).resolve().parents[2] / "shared" / "reference-figures.yaml"
# Fig. 8's per-policy figures only: the ordering needs no sweep.
POLICIES_ONLY = dict(thresholds_l_s=(0.5,), query_periods_units=(1,))


# --- the policy functions (core.withholding) ------------------------------------------

def test_l_now_is_half_the_rtt_scaled_to_the_message():
    assert expected_latency_s(0.4) == pytest.approx(0.2)
    assert expected_latency_s(0.4, latency_scale=10) == pytest.approx(2.0)


def test_conservative_sends_below_half_threshold_or_after_the_timer():
    assert conservative_sends(0.24, threshold_l_s=0.5, sojourn_s=0, starvation_s=20)
    assert not conservative_sends(0.26, threshold_l_s=0.5, sojourn_s=0, starvation_s=20)
    assert not conservative_sends(9.0, threshold_l_s=0.5, sojourn_s=20, starvation_s=20)
    assert conservative_sends(9.0, threshold_l_s=0.5, sojourn_s=21, starvation_s=20)


def test_probabilistic_weighs_the_next_decision_by_the_chance_congestion_persists():
    # p = exp(-0.057 * (0 + 1)); send iff (1 - p)(L_now - 0.25) < 1, i.e. L_now < 18.298 s.
    p = math.exp(-0.057)
    assert congestion_persists_probability(0, 1, 0.057) == pytest.approx(p)
    assert expected_next_latency_s(20.0, 0.5, p) == pytest.approx(p * 20 + (1 - p) * 0.25)
    boundary = 0.25 + 1 / (1 - p)
    assert boundary == pytest.approx(18.298, abs=1e-3)
    assert probabilistic_sends(boundary - 0.01, 0.5, 0, 1, 0.057, starvation_s=20)
    assert not probabilistic_sends(boundary + 0.01, 0.5, 0, 1, 0.057, starvation_s=20)
    # After 10 s withheld p = exp(-0.627): the bar falls to 0.25 + 1/(1 - 0.5342) = 2.397 s.
    assert probabilistic_sends(2.39, 0.5, 10, 1, 0.057, starvation_s=20)
    assert not probabilistic_sends(2.41, 0.5, 10, 1, 0.057, starvation_s=20)
    assert probabilistic_sends(1e6, 0.5, 20.5, 1, 0.057, starvation_s=20)  # the timer


def test_historic_releases_as_the_sojourn_grows_without_a_timer():
    assert historic_sends(1.24, threshold_l_s=0.5, sojourn_s=0, query_period_s=1)
    assert not historic_sends(1.26, threshold_l_s=0.5, sojourn_s=0, query_period_s=1)
    assert historic_sends(4.24, threshold_l_s=0.5, sojourn_s=3, query_period_s=1)
    assert not historic_sends(4.26, threshold_l_s=0.5, sojourn_s=3, query_period_s=1)


def test_withholding_scales_l_now_and_threshold_alike_from_the_rtt():
    # RTT 0.6 s of the query, message 10x: L_now = 3 s against threshold_l/2 = 2.5 s.
    conservative = Withholding(WithholdingPolicy.CONSERVATIVE, threshold_l_s=0.5,
                               query_period_s=1, latency_scale=10)
    historic = Withholding(WithholdingPolicy.HISTORIC, threshold_l_s=0.5, query_period_s=1,
                           latency_scale=10)
    assert not conservative.sends_now(0.6, sojourn_s=0)
    assert conservative.sends_now(0.49, sojourn_s=0)
    assert historic.sends_now(0.6, sojourn_s=0)  # 3 < 1 + 2.5
    assert not historic.sends_now(0.8, sojourn_s=0)  # 4 > 3.5
    assert historic.sends_now(0.8, sojourn_s=1)  # 4 < 4.5


def test_every_policy_sends_without_an_estimate_and_only_two_have_a_timer():
    for policy in WithholdingPolicy:
        assert Withholding(policy).sends_now(None, sojourn_s=0)
    assert Withholding(WithholdingPolicy.BASELINE).sends_now(100.0, sojourn_s=0)
    timers = {p: Withholding(p, starvation_s=7).starvation_timer_s for p in WithholdingPolicy}
    assert timers == {"baseline": None, "conservative": 7, "probabilistic": 7,
                      "historic": None}


def test_a_bad_withholding_parameter_is_named():
    with pytest.raises(ValueError, match="threshold_l_s=0"):
        Withholding(threshold_l_s=0)
    with pytest.raises(ValueError, match="'sometimes'"):
        Withholding(policy="sometimes")


# --- the simulator on constructed traces --------------------------------------------------

def _burst_trace(scenario: CloudEdgeScenario, burst_rtt_s: float, first: int, last: int,
                 length: int = 60) -> Trace:
    """RTT 0.3 s everywhere but ``burst_rtt_s`` over units first..last."""
    rtt = np.full(length, 0.3)
    rtt[first:last + 1] = burst_rtt_s
    return Trace(scenario, rtt)


ONE_MESSAGE = CloudEdgeScenario(units=6)  # a single large message, at unit 5


def _latency(trace: Trace, policy: str, query_period_units: int = 1) -> float:
    withholding = trace.scenario.withholding(policy, 0.5, query_period_units)
    (latency,) = trace.withheld_s(withholding, query_period_units)
    return latency


def test_policies_on_a_burst_the_message_arrives_in():
    # Burst RTT 2.3 s over units 4..19: L_now = 11.5 s; normal 0.3 s: 1.5 s (+0.08 s sending).
    trace = _burst_trace(ONE_MESSAGE, 2.3, 4, 19)
    assert list(trace.arrivals) == [5]
    assert trace.baseline_s() == [pytest.approx(11.58)]
    # Conservative waits for the first normal RTT (unit 20's, known at 21): 16 s + 1.58 s.
    assert _latency(trace, "conservative") == pytest.approx(16 + 1.58)
    # Historic: 11.5 < 1 + 2.5 + ΔS first at ΔS = 9, still in the burst: 9 s + 11.58 s.
    assert _latency(trace, "historic") == pytest.approx(9 + 11.58)
    # Probabilistic (good): 11.5 s is under 0.25·10 + 1/(1 - e^-0.057) = 20.55 s: sent.
    assert _latency(trace, "probabilistic_good") == pytest.approx(11.58)
    # Clairvoyant: waiting 15 s for the burst's end saves nothing against 11.58 s now.
    assert trace.clairvoyant_s() == [pytest.approx(11.58)]


def test_clairvoyant_waits_out_a_burst_that_ends_soon():
    trace = _burst_trace(ONE_MESSAGE, 2.3, 4, 7)
    assert trace.clairvoyant_s() == [pytest.approx(3 + 1.58)]  # sent at unit 8
    assert _latency(trace, "conservative") == pytest.approx(4 + 1.58)  # knows unit 7 at 8


def test_the_starvation_timer_fires_between_queries():
    scenario = CloudEdgeScenario(units=6, starvation_s=10)
    trace = _burst_trace(scenario, 2.3, 0, 59)
    # TQ = 5: decisions at 5, 10, 15 (queries) and 16 (ΔS = 11 > D), not at the query at 20.
    assert _latency(trace, "conservative", query_period_units=5) == pytest.approx(11 + 11.58)
    assert _latency(trace, "conservative", query_period_units=1) == pytest.approx(11 + 11.58)


def test_the_broker_knows_the_last_query_not_the_current_unit():
    trace = _burst_trace(ONE_MESSAGE, 2.3, 4, 4)
    assert trace.latest_rtt_s(5, 1) == 2.3 and trace.latest_rtt_s(6, 1) == 0.3
    assert trace.latest_rtt_s(7, 5) == 2.3  # TQ 5: the query completed at 5 (unit 4)
    assert trace.latest_rtt_s(3, 5) is None  # no query completed yet
    # The message at 5 is held one unit for a burst that has already ended.
    assert _latency(trace, "conservative") == pytest.approx(1 + 1.58)
    assert trace.baseline_s() == [pytest.approx(1.58)]


def test_a_message_withheld_past_the_trace_is_an_error_not_a_wrong_number():
    trace = _burst_trace(ONE_MESSAGE, 50.0, 0, 29, length=30)
    with pytest.raises(RuntimeError, match="tail_units"):
        trace.withheld_s(ONE_MESSAGE.withholding("historic", 0.5, 1), 1)


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lengths of the runs of True and of False in ``mask`` (inner runs only)."""
    edges = np.flatnonzero(np.diff(mask.astype(int))) + 1
    lengths = np.diff(edges)
    starts_true = mask[edges[:-1]]
    return lengths[starts_true], lengths[~starts_true]


def test_the_link_model_draws_the_papers_bursts():
    rtt, congested = LinkModel().rtt_trace(200_000, np.random.default_rng(1))
    assert rtt.min() >= 0.15 and rtt[~congested].max() <= 0.45
    bursts, gaps = _runs(congested)
    assert bursts.min() == 10  # back-to-back bursts merge, so only the floor is exact
    # A burst starts with 10 % per uncongested unit: 9 calm units on average, 10 when at
    # least one (merged bursts hide the gaps of 0).
    assert gaps.mean() == pytest.approx(10, rel=0.05)
    # Mean burst 17.5 units: congested 17.5 / (17.5 + 9) of the time.
    assert congested.mean() == pytest.approx(17.5 / 26.5, abs=0.02)
    extra = rtt[congested] - 0.3  # one Exp(0.3) per burst, mean 3.3 s
    assert extra.mean() == pytest.approx(1 / 0.3, rel=0.1)


# --- the simulation on seeded traces ---------------------------------------------------

@pytest.fixture(scope="module")
def paper_run():
    """The paper's simulation as published: 5,000 units, every sweep."""
    return simulate(seed=0)


def test_the_same_seed_gives_the_same_document_and_another_seed_another():
    scenario = CloudEdgeScenario(units=600)
    first = simulate(seed=3, scenario=scenario)
    assert simulate(seed=3, scenario=scenario) == first
    assert simulate(seed=4, scenario=scenario).policies != first.policies


@pytest.mark.parametrize("seed", range(10))
def test_clairvoyant_is_no_slower_than_historic_and_historic_beats_baseline(seed):
    result = simulate(seed=seed, scenario=CloudEdgeScenario(**POLICIES_ONLY))
    policies = result.policies
    assert policies["clairvoyant"] <= policies["historic"] < policies["baseline"]
    assert min(policies.values()) == policies["clairvoyant"]


def test_the_figures_have_the_shapes_the_paper_describes(paper_run):
    claims = {c.key: c for c in paper_run.claims}
    assert set(claims) == {"clairvoyant_bound", "historic_saving", "conservative_threshold_l",
                           "conservative_beats_baseline", "probabilistic_beats_conservative",
                           "bad_lambda_costs", "conservative_shorter_tq",
                           "conservative_long_tq_no_better", "historic_every_tq"}
    assert [c.key for c in paper_run.claims if not c.holds] == []
    conservative = [p.mean_s for p in paper_run.threshold_l_sweep["conservative"]]
    assert conservative == sorted(conservative, reverse=True)  # larger threshold_l: lower
    by_tq = paper_run.tq_sweep["conservative"]
    at_half = [next(p.mean_s for p in by_tq[q] if p.x == 0.5) for q in sorted(by_tq)]
    assert at_half == sorted(at_half)  # longer TQ: higher latency


def test_the_paper_run_has_the_papers_size_and_a_saving_near_its_3_5_s(paper_run):
    assert paper_run.units == 5000 and paper_run.large_messages == 999
    assert set(paper_run.policies) == set(POLICIES)
    assert set(paper_run.threshold_l_sweep) == {"conservative", "probabilistic_good",
                                                "probabilistic_bad", "historic"}
    assert [p.x for p in paper_run.threshold_l_sweep["historic"]] == [0.3, 0.4, 0.5, 0.6, 0.7]
    assert sorted(paper_run.tq_sweep) == ["conservative", "historic"]
    assert sorted(paper_run.tq_sweep["historic"]) == [1, 2, 3, 4, 5]
    assert 1.5 < paper_run.historic_saving_s < 6.5  # paper: about 3.5 s
    assert 0.55 < paper_run.congested_fraction < 0.75


def test_bad_simulation_arguments_name_the_keyword():
    with pytest.raises(ValueError, match="units=0"):
        CloudEdgeScenario(units=0)
    with pytest.raises(ValueError, match="units=5: must exceed message_period_units"):
        CloudEdgeScenario(units=5)
    with pytest.raises(ValueError, match="seed=-1"):
        simulate(seed=-1)
    with pytest.raises(ValueError, match="tq_sweep_policies"):
        CloudEdgeScenario(tq_sweep_policies=("clairvoyant",))
    with pytest.raises(ValueError, match="burst_min_units=30, burst_max_units=25"):
        LinkModel(burst_min_units=30)


def test_the_simulators_defaults_are_the_papers_reference_figures():
    yaml = pytest.importorskip("yaml")
    paper = yaml.safe_load(REFERENCE_FIGURES.read_text())["cloud_edge_withholding"]
    simulation = paper["simulation"]
    scenario, link = CloudEdgeScenario(), LinkModel()
    assert PAPER.historic_saving_s == paper["findings"]["historic_policy_saving_s"]
    assert PAPER.threshold_l_s == scenario.threshold_l_s == paper["threshold_l_s"]
    assert PAPER.units == scenario.units == simulation["units"]
    assert PAPER.starvation_timer_s == scenario.starvation_s == simulation["starvation_timer_s"]
    assert (scenario.congestion_rate_good_per_s, scenario.congestion_rate_bad_per_s) == (
        simulation["probabilistic_lambda"]["good"], simulation["probabilistic_lambda"]["bad"])
    assert [link.rtt_min_s, link.rtt_max_s] == simulation["rtt_s"]
    assert link.burst_start_probability == simulation["burst"]["probability"]
    assert [link.burst_min_units, link.burst_max_units] == simulation["burst"]["duration_s"]
    assert link.burst_rate_per_s == simulation["burst"]["exponential_lambda"]
    assert link.large_latency_scale == simulation["large_latency_scale"]
    assert scenario.message_period_units == simulation["large_message_every_units"]


def test_the_copied_reference_figures_are_the_shared_ones_where_those_exist():
    yaml = pytest.importorskip("yaml")
    if not SHARED_FIGURES.is_file():
        # Outside the repository: a clone without the workspace's shared/ beside it has
        # only the copy, which the test above checks the simulator against.
        pytest.skip(f"no shared reference figures beside this checkout ({SHARED_FIGURES})")
    section = "cloud_edge_withholding"
    assert (yaml.safe_load(REFERENCE_FIGURES.read_text())[section]
            == yaml.safe_load(SHARED_FIGURES.read_text())[section]), (
        f"{REFERENCE_FIGURES.name} differs from {SHARED_FIGURES}'s {section}: copy it again")


# --- the CLI, the API and the page ---------------------------------------------------

def test_cli_json_has_policies_and_the_sweeps(capsys):
    from mqttbed.controller.cli import main

    assert main(["simulate", "cloud-edge", "--seed", "2", "--units", "600", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed["policies"]) == set(POLICIES)
    assert all(isinstance(v, float) for v in printed["policies"].values())
    assert set(printed["threshold_l_sweep"]) >= {"conservative", "historic"}
    assert printed["tq_sweep"]["historic"]["5"][0]["x"] == 0.3
    assert (printed["seed"], printed["units"]) == (2, 600)
    assert printed["paper"]["historic_saving_s"] == 3.5
    expected = simulate(seed=2, scenario=CloudEdgeScenario(units=600))
    assert printed["policies"] == expected.policies


def test_cli_tables_show_the_saving_beside_the_papers(capsys):
    from mqttbed.controller.cli import main

    assert main(["simulate", "cloud-edge", "--units", "600"]) == 0
    out = capsys.readouterr().out
    assert "historic saving against baseline" in out and "paper: about 3.5 s" in out
    assert "clairvoyant" in out and "probabilistic_bad" in out


@pytest.mark.parametrize("argv, option, message", [
    (["--units", "0"], "--units", "must be 1 or more"),
    (["--units", "-3"], "--units", "must be 0 or more"),
    (["--units", "many"], "--units", "must be an integer"),
    (["--seed", "-1"], "--seed", "must be 0 or more"),
    (["--units", "5"], "--units", "must exceed message_period_units"),
])
def test_cli_bad_arguments_name_the_option(capsys, argv, option, message):
    from mqttbed.controller.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["simulate", "cloud-edge", *argv])
    said = capsys.readouterr().err + str(exited.value.code)
    assert exited.value.code != 0 and option in said and message in said


@pytest.fixture
def app_client(tmp_path):
    from fastapi.testclient import TestClient

    from mqttbed.api.app import create_app
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.tokens import TokenRole, create_token
    from mqttbed.core.settings import Settings

    controller = create_controller(Settings(data_dir=tmp_path), controller_url="")
    client = TestClient(create_app(controller, run_campaigns=False))  # no lifespan: no worker
    client.tokens = {role: create_token(controller.sessions, role, TokenRole(role))
                     for role in ("user", "agent")}
    yield client
    controller.close()


def _bearer(client, role: str) -> dict[str, str]:
    return {"authorization": f"Bearer {client.tokens[role]}"}


def test_api_serves_the_document_to_users_only(app_client):
    path = "/api/v1/simulations/cloud-edge?seed=1&units=600"
    assert app_client.get(path).status_code == 401
    assert app_client.get(path, headers=_bearer(app_client, "agent")).status_code == 403
    answer = app_client.get(path, headers=_bearer(app_client, "user"))
    assert answer.status_code == 200
    expected = simulate(seed=1, scenario=CloudEdgeScenario(units=600))
    assert answer.json() == json.loads(expected.model_dump_json())


@pytest.mark.parametrize("query, named", [("units=0", "units"), ("seed=-1", "seed"),
                                          ("units=5", "units"), ("units=1000000", "units")])
def test_api_bad_arguments_are_422_naming_the_parameter(app_client, query, named):
    answer = app_client.get(f"/api/v1/simulations/cloud-edge?{query}",
                            headers=_bearer(app_client, "user"))
    assert answer.status_code == 422 and named in answer.text


def test_page_shows_our_figures_beside_the_papers(app_client):
    login = app_client.get("/simulations/cloud-edge?units=600", follow_redirects=False)
    assert login.status_code == 303 and login.headers["location"].startswith("/login")
    page = app_client.get("/simulations/cloud-edge?seed=1&units=600",
                          headers=_bearer(app_client, "user"))
    assert page.status_code == 200
    result = simulate(seed=1, scenario=CloudEdgeScenario(units=600))
    html = page.text
    assert f"{result.historic_saving_s:.2f}" in html and "3.5</strong> (paper)" in html
    assert f"{result.policies['clairvoyant']:.2f}" in html
    figures = json.loads(re.search(r"const FIGURES = (.*);\n", html).group(1))
    assert list(figures) == ["plot-policies", "plot-threshold-sweep", "plot-tq-sweep"]
    assert all(f'id="{plot}"' in html for plot in figures)
    ours, paper = figures["plot-policies"]["data"]
    assert ours["y"] == list(result.policies.values())
    assert paper["name"] == "paper: historic ≈ baseline − 3.5 s"
    assert paper["y"] == [pytest.approx(result.policies["baseline"] - 3.5)]
    curves = {trace["name"] for trace in figures["plot-tq-sweep"]["data"]}
    assert {"conservative (TQ 5 s)", "historic (TQ 1 s)"} <= curves
    assert html.count('class="l status done">yes') + html.count(">no</td>") == len(result.claims)
    assert '<script src="/static/plotly.min.js">' in html
