"""Figures a backend adds to the campaign report, built from plain point figures.

The report hands a backend's ``report_figures`` a :class:`FigurePoint` per sweep point:
its parameters and every numeric figure of the results by dotted name
(``latency_us.mean``, ``sections.mqtt_st.reconvergence_s.p50``); the backend returns
Plotly figures (data + layout dicts) keyed by the element id the report gives them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PlotlyFigure = dict[str, Any]
# Parameters that never make an x axis or a curve's name.
NOT_SWEPT = ("broker.backend", "scenario")


@dataclass(frozen=True)
class FigurePoint:
    """One sweep point as a backend's report figures see it."""

    point_index: int
    backend: str
    params: Mapping[str, Any]
    figures: Mapping[str, float | None]


# (points, the campaign's spec as a dict) -> figures by element id
ReportFigures = Callable[[Sequence[FigurePoint], Mapping[str, Any]], dict[str, PlotlyFigure]]


def point_label(params: Mapping[str, Any], backend: str, show_backend: bool) -> str:
    """A point's name in a legend: its swept values (and backend, where several are)."""
    parts = [f"{k.split('.')[-1]}={v}" for k, v in params.items() if k != "broker.backend"]
    if show_backend:
        parts.insert(0, backend)
    return ", ".join(parts) or "all runs"


def numeric_axis(params: Sequence[Mapping[str, Any]]) -> str | None:
    """The swept parameter to put on an x axis: the first one with numbers only (a
    switch like broker.acceleration is not a number, though Python's bool is an int)."""
    keys = [k for k in (params[0] if params else {}) if k not in NOT_SWEPT]
    for key in keys:
        if all(isinstance(v := p.get(key), int | float) and not isinstance(v, bool)
               for p in params):
            return key
    return None


def series_key(params: Mapping[str, Any], backend: str, x_key: str | None) -> str:
    """Which curve a point belongs to: everything but the x parameter (without a numeric
    parameter the x axis names the points, and there is one curve per backend)."""
    if x_key is None:
        return backend
    rest = {k: v for k, v in params.items() if k not in (x_key, "broker.backend")}
    name = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in rest.items())
    return backend + (f" ({name})" if name else "")


def scalar_versus_parameter(points: Sequence[FigurePoint],
                            value: Callable[[FigurePoint], float | None],
                            spread: Callable[[FigurePoint], float | None],
                            title: str, unit: str) -> PlotlyFigure:
    """A per-point number (± its spread) against the swept parameter; a curve per the
    rest of the point's parameters (e.g. one per placement and publisher count)."""
    x_key = numeric_axis([p.params for p in points])
    curves: dict[str, list[FigurePoint]] = {}
    for point in points:
        if value(point) is not None:
            curves.setdefault(series_key(point.params, point.backend, x_key), []).append(point)
    data = []
    for name, members in curves.items():
        if x_key:
            members.sort(key=lambda m: m.params[x_key])
        data.append({"type": "scatter", "mode": "lines+markers", "name": name,
                     "x": [m.params[x_key] if x_key else point_label(m.params, m.backend, False)
                           for m in members],
                     "y": [value(m) for m in members],
                     "error_y": {"type": "data", "array": [spread(m) or 0 for m in members]}})
    return {"data": data, "layout": {"title": {"text": title},
                                     "yaxis": {"title": {"text": unit}},
                                     "xaxis": {"title": {"text": x_key or "sweep point"}}}}


def flat_figures(document: Mapping[str, Any], prefix: str = "") -> dict[str, float | None]:
    """Every number of a (JSON-like) results block by dotted name; bools and text left out."""
    found: dict[str, float | None] = {}
    for key, value in document.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found |= flat_figures(value, name + ".")
        elif value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
            found[name] = value
    return found
