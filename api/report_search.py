"""The report's view of a capacity search: the probe path and the SLO lines.

Two Plotly figures from the results' ``search`` block: the searched value probe after
probe, coloured by verdict, with the capacity's interval; and, per SLO term, the figure it
names against the searched value with the term's bound drawn as a line.
"""

from __future__ import annotations

from typing import Any

from mqttbed.analytics.results import SearchResults
from mqttbed.campaigns.search import parse_slo_term

VERDICT_COLOURS = {"accepted": "#2ca02c", "rejected": "#d62728",
                   "generator-limited": "#ff7f0e"}


def search_figures(search: SearchResults) -> dict[str, dict[str, Any]]:
    """The probe path and one SLO plot per term, keyed by element id."""
    figures: dict[str, dict[str, Any]] = {"plot-search-path": _probe_path(search)}
    for n, term in enumerate(search.slo):
        figures[f"plot-search-slo-{n}"] = _slo_plot(search, term)
    return figures


def _probe_path(search: SearchResults) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    order = list(range(1, len(search.probes) + 1))
    data.append({"type": "scatter", "mode": "lines", "name": "probe path",
                 "x": order, "y": [p.value for p in search.probes],
                 "line": {"color": "#999999"}, "showlegend": False})
    for verdict, colour in VERDICT_COLOURS.items():
        members = [(k, p) for k, p in zip(order, search.probes, strict=True)
                   if p.verdict == verdict]
        if members:
            data.append({"type": "scatter", "mode": "markers", "name": verdict,
                         "x": [k for k, _ in members], "y": [p.value for _, p in members],
                         "text": [f"{p.phase}: {p.why}" for _, p in members],
                         "marker": {"color": colour, "size": 10}})
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": end, "y1": end,
               "line": {"dash": "dot", "color": colour}}
              for end, colour in zip(search.interval, ("#2ca02c", "#d62728"), strict=True)
              if end is not None]
    return {"data": data, "layout": {
        "title": {"text": f"Capacity search: {search.parameter} per probe "
                          f"(dotted: the interval)"},
        "xaxis": {"title": {"text": "probe"}, "dtick": 1},
        "yaxis": {"title": {"text": search.parameter}, "type": "log"},
        "shapes": shapes}}


def _slo_plot(search: SearchResults, term: str) -> dict[str, Any]:
    parsed = parse_slo_term(term)
    figure, bound = parsed.figure, parsed.bound
    data = []
    for verdict, colour in VERDICT_COLOURS.items():
        members = [p for p in search.probes if p.verdict == verdict
                   and p.figures.get(figure) is not None]
        if members:
            data.append({"type": "scatter", "mode": "markers", "name": verdict,
                         "x": [p.value for p in members],
                         "y": [p.figures[figure] for p in members],
                         "marker": {"color": colour, "size": 10}})
    return {"data": data, "layout": {
        "title": {"text": f"SLO {term}"},
        "xaxis": {"title": {"text": search.parameter}, "type": "log"},
        "yaxis": {"title": {"text": figure}},
        "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": bound,
                    "y1": bound, "line": {"dash": "dash", "color": "#d62728"}}]}}
