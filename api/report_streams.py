"""The report's view of a message mix: a row per stream of each point, a CDF per stream.

Shown when a campaign's points have streams (``workload.streams``); a campaign without
them reports exactly as before.
"""

from __future__ import annotations

from typing import Any

from mqttbed.analytics.results import CampaignStats, PointStats
from mqttbed.analytics.series import CDF_LEVELS


def stream_rows(points: list[tuple[str, PointStats]]) -> list[dict[str, Any]]:
    """A row per stream of each (label, point): what it sent and how it was delivered."""
    return [{"label": label, "stream": name, "figures": figures}
            for label, point in points for name, figures in point.streams.items()]


def stream_latency_cdf(stats: CampaignStats, labels: dict[int, str]) -> dict[str, Any] | None:
    """The latency CDF of each stream of each point (one curve each), or None without
    streams. Curves of one stream share a dash style, so streams read apart across points."""
    cdfs = stats.series.stream_latency_cdf_us
    if not cdfs:
        return None
    names = list(dict.fromkeys(name for point in stats.points for name in point.streams))
    dashes = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
    data = []
    for point in stats.points:
        for name, quantiles in cdfs.get(str(point.point_index), {}).items():
            figures = point.streams.get(name)
            size = f", {figures.payload_bytes:,} B" if figures is not None else ""
            label = f"{labels[point.point_index]}: {name}{size}" if len(cdfs) > 1 \
                else f"{name}{size}"
            data.append({"type": "scatter", "mode": "lines", "name": label, "x": quantiles,
                         "y": CDF_LEVELS,
                         "line": {"dash": dashes[names.index(name) % len(dashes)]}})
    return {"data": data, "layout": {
        "title": {"text": "Latency CDF per stream of the message mix"},
        "xaxis": {"title": {"text": "latency (µs)"}, "type": "log"},
        "yaxis": {"title": {"text": "fraction of the stream's deliveries"}}}}
