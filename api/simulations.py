"""``/api/v1/simulations``: the seed papers' simulations, and their report page's figures.

The cloud-edge policy simulation (:mod:`mqttbed.analytics.cloud_edge_sim`) as JSON and as
the page ``/simulations/cloud-edge`` (Figs. 8 and 9 with the paper's references beside).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from mqttbed.analytics.cloud_edge_results import CloudEdgeSimulation, SweepPoint
from mqttbed.api.deps import UserDep
from mqttbed.api.report import plotly_js_path, script_json, templates

router = APIRouter(prefix="/api/v1/simulations", tags=["simulations"], dependencies=[UserDep])

MAX_UNITS = 20_000  # 4x the paper, about 2 s of simulation: the most a request may ask
SeedQuery = Annotated[int, Query(ge=0, description="seed of the RTT trace")]
UnitsQuery = Annotated[int, Query(gt=0, le=MAX_UNITS, description="time units of 1 s")]
_AXIS_S = {"title": {"text": "mean large-message latency (s)"}}
# The colours of the paper's Figs. 8 and 9, so the two read side by side.
COLOURS = {"baseline": "#444444", "conservative": "#fd8d14", "probabilistic_good": "#c51605",
           "probabilistic_bad": "#000000", "historic": "#2e8b3a", "clairvoyant": "#c51605"}
_THRESHOLD_AXIS = {"title": {"text": "threshold_l (s)"}}


@lru_cache(maxsize=16)
def cloud_edge_result(seed: int, units: int) -> CloudEdgeSimulation:
    """The simulation for ``seed`` and ``units`` (cached: it is deterministic); 422 when
    ``units`` is too short for a message."""
    from mqttbed.analytics.cloud_edge_sim import CloudEdgeScenario, simulate

    try:
        scenario = CloudEdgeScenario(units=units)
    except ValueError as exc:
        raise HTTPException(422, f"units: {exc}") from None
    return simulate(seed=seed, scenario=scenario)


@router.get("/cloud-edge")
def cloud_edge(seed: SeedQuery = 0, units: UnitsQuery = 5000) -> CloudEdgeSimulation:
    """The cloud-edge paper's withholding simulation: mean 1 MB-message latency per policy
    (Fig. 8), over threshold_l and over the RTT query period TQ (Fig. 9), with the paper's
    statements checked."""
    return cloud_edge_result(seed, units)


def _line(name: str, points: list[SweepPoint], line: dict[str, Any]) -> dict[str, Any]:
    """A policy's curve over threshold_l with its 95 % error bars."""
    return {"type": "scatter", "mode": "lines+markers", "name": name, "line": line,
            "x": [p.x for p in points], "y": [p.mean_s for p in points],
            "error_y": {"type": "data", "array": [p.ci95_s for p in points]}}


def _level(name: str, xs: list[float], y: float, line: dict[str, Any]) -> dict[str, Any]:
    """A horizontal line across the threshold_l axis (a policy without threshold_l)."""
    return {"type": "scatter", "mode": "lines", "name": name, "x": [xs[0], xs[-1]],
            "y": [y, y], "line": line}


def cloud_edge_figures(result: CloudEdgeSimulation) -> dict[str, dict[str, Any]]:
    """Fig. 8 as bars and as curves over threshold_l, and Fig. 9, as Plotly figures."""
    names = list(result.policies)
    baseline = result.policies["baseline"]
    paper_name = f"paper: historic ≈ baseline − {result.paper.historic_saving_s} s"
    paper_historic = baseline - result.paper.historic_saving_s
    xs = [p.x for p in next(iter(result.threshold_l_sweep.values()))]
    bars = {"data": [
        {"type": "bar", "name": "ours (95 % CI)", "x": names,
         "y": [result.policies[n] for n in names], "marker": {"color": [COLOURS[n]
                                                                      for n in names]},
         "error_y": {"type": "data", "array": [result.policies_ci95_s[n] for n in names]}},
        {"type": "scatter", "mode": "markers", "x": ["historic"], "y": [paper_historic],
         "name": paper_name, "marker": {"symbol": "diamond-open", "size": 14,
                                        "color": "#175cd3", "line": {"width": 2}}}],
        "layout": {"title": {"text": f"Fig. 8: mean latency per policy (threshold_l "
                                     f"{result.threshold_l_s} s, TQ {result.query_period_s} s)"},
                   "yaxis": _AXIS_S}}
    baseline_level = _level("no withholding (baseline)", xs, baseline,
                            {"dash": "dash", "color": COLOURS["baseline"]})
    threshold_sweep = {"data": [
        baseline_level,
        _level("clairvoyant", xs, result.policies["clairvoyant"],
               {"dash": "dashdot", "color": COLOURS["clairvoyant"]}),
        *(_line(name, points, {"color": COLOURS[name]})
          for name, points in result.threshold_l_sweep.items()),
        _level(paper_name, xs, paper_historic, {"dash": "dot", "color": "#175cd3"})],
        "layout": {"title": {"text": f"Fig. 8: over threshold_l (TQ {result.query_period_s} s)"},
                   "xaxis": _THRESHOLD_AXIS, "yaxis": _AXIS_S}}
    tq_curves = []
    for name, by_tq in result.tq_sweep.items():
        longest = max(by_tq)
        for tq, points in sorted(by_tq.items()):
            # As in the paper: one colour per policy, the shorter TQ the thicker the line.
            width = 1 + 2.5 * (longest - tq) / max(longest - min(by_tq), 1)
            tq_curves.append(_line(f"{name} (TQ {tq} s)", points, {
                "color": COLOURS[name], "width": width,
                "dash": "dot" if name == "conservative" else "solid"}))
    tq_sweep = {"data": [baseline_level, *tq_curves],
                "layout": {"title": {"text": "Fig. 9: over threshold_l per RTT query period TQ"},
                           "xaxis": _THRESHOLD_AXIS, "yaxis": _AXIS_S}}
    return {"plot-policies": bars, "plot-threshold-sweep": threshold_sweep,
            "plot-tq-sweep": tq_sweep}


def render_cloud_edge(result: CloudEdgeSimulation, *, standalone: bool = False) -> str:
    """The simulation's report page."""
    figures = cloud_edge_figures(result)
    return templates().get_template("cloud_edge.html").render(
        r=result, figures=figures, figures_json=script_json(figures), standalone=standalone,
        plotly_inline=plotly_js_path().read_text() if standalone else None,
        max_units=MAX_UNITS)
