"""What the ``mqtt-st`` backend adds to a campaign report: the paper's Fig. 6."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mqttbed.core.report_figures import FigurePoint, PlotlyFigure, scalar_versus_parameter

LOCALITY_KEY = "broker.locality_percent"


def locality_figures(points: Sequence[FigurePoint], spec: Mapping[str, Any]
                     ) -> dict[str, PlotlyFigure]:
    """Mean latency (ms) against locality, a curve per point series, and the
    ``benchmark`` (cloud) points averaged over their broker's locations; nothing when the
    campaign does not sweep locality."""
    if not any(LOCALITY_KEY in p.params for p in points):
        return {}
    default = spec.get("workload", {}).get("placement")
    placement = {sc.get("name"): sc.get("workload.placement", default)
                 for sc in spec.get("scenarios", [])}

    def mean_ms(point: FigurePoint) -> float | None:
        mean = point.figures.get("latency_us.mean")
        return None if mean is None else mean / 1e3

    figure = scalar_versus_parameter(points, mean_ms, lambda p: None,
                                     "End-to-end latency against locality (mean over "
                                     "deliveries)", "ms")
    cloud: dict[float, list[float]] = {}
    for point in points:
        where = placement.get(point.params.get("scenario"), default)
        if where == "benchmark" and (ms := mean_ms(point)) is not None:
            cloud.setdefault(point.params[LOCALITY_KEY], []).append(ms)
    if cloud and max(len(v) for v in cloud.values()) > 1:   # several locations to average
        x = sorted(cloud)
        figure["data"].append({"type": "scatter", "mode": "lines+markers",
                               "name": "cloud, mean over its locations", "x": x,
                               "y": [sum(cloud[k]) / len(cloud[k]) for k in x],
                               "line": {"dash": "dash"}})
    return {"plot-locality": figure}
