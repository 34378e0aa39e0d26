"""The report's figures of retained state (``workload.retained``).

Shown when a point has a ``retained`` section: how soon each late subscriber held every
topic's latest value (from its SUBSCRIBE written, and from its SUBACK), with the exact
accounting (latest values delivered, stale, missing, duplicated, without the RETAIN
flag) in the title; and, over the points, the holding time and the broker's memory per
retained topic against the number of topics. A campaign without it reports as before.
"""

from __future__ import annotations

from typing import Any

from mqttbed.analytics.results import PointStats
from mqttbed.core.sections import Distribution


def retained_report_figures(points: list[PointStats], labels: dict[int, str]
                            ) -> dict[str, dict[str, Any]]:
    """The report's plots (by element id) of the points' retained state; none without."""
    held = [p for p in points if p.retained is not None and p.retained.subscribers]
    if not held:
        return {}
    return {"plot-retained-hold": _holding(held, labels),
            "plot-retained-topics": _versus_topics(held, labels)}


def _bars(name: str, x: list[str], values: list[Distribution]) -> dict[str, Any]:
    """p50 bars whose error bar reaches up to the p99, in ms."""
    def ms(value: float | None) -> float | None:
        return None if value is None else value / 1000.0

    return {"type": "bar", "name": f"{name} p50 (bar to p99)", "x": x,
            "y": [ms(d.p50) for d in values],
            "error_y": {"type": "data", "symmetric": False,
                        "array": [0 if d.p50 is None or d.p99 is None
                                  else (d.p99 - d.p50) / 1000.0 for d in values],
                        "arrayminus": [0] * len(values)}}


def _holding(points: list[PointStats], labels: dict[int, str]) -> dict[str, Any]:
    """Per point: the subscribers' time to hold the whole state, from SUBSCRIBE and from
    SUBACK; the exact counts in the title."""
    names = [labels[p.point_index] for p in points]
    notes = []
    for point, name in zip(points, names, strict=True):
        r = point.retained
        assert r is not None
        notes.append(f"{name}: {r.delivered_latest} of {r.expected} latest values held, "
                     f"{r.stale} stale, {r.missing} missing, {r.duplicates} duplicated, "
                     f"{r.without_retain_flag} without RETAIN, {r.live} live; "
                     f"{r.subscribers_holding_all} "
                     f"of {r.subscribers} subscribers held all")
    data = [_bars("SUBSCRIBE → all held", names,
                  [p.retained.hold_from_subscribe_us for p in points if p.retained]),
            _bars("SUBACK → all held", names,
                  [p.retained.hold_from_suback_us for p in points if p.retained])]
    return {"data": data, "layout": {
        "title": {"text": "Retained state: time until a late subscriber holds every topic's "
                          "latest value<br><sub>" + "<br>".join(notes) + "</sub>"},
        "barmode": "group", "yaxis": {"title": {"text": "ms"}},
        "margin": {"t": 60 + 18 * len(notes)}}}


def _versus_topics(points: list[PointStats], labels: dict[int, str]) -> dict[str, Any]:
    """Holding time (p50, p99) and the broker's RSS per retained topic against the topics
    a run set (a point's runs pooled: its topics over its runs)."""
    ordered = sorted(points, key=lambda p: _topics_per_run(p))
    x = [_topics_per_run(p) for p in ordered]
    text = [labels[p.point_index] for p in ordered]

    def line(name: str, values: list[float | None], **extra: Any) -> dict[str, Any]:
        return {"type": "scatter", "mode": "lines+markers", "name": name, "x": x,
                "y": values, "text": text, **extra}

    holds = [p.retained.hold_from_subscribe_us for p in ordered if p.retained]
    data = [line("hold p50", [None if d.p50 is None else d.p50 / 1000.0 for d in holds]),
            line("hold p99", [None if d.p99 is None else d.p99 / 1000.0 for d in holds]),
            line("broker RSS per topic", [p.retained.rss_per_topic_bytes for p in ordered
                                          if p.retained], yaxis="y2")]
    return {"data": data, "layout": {
        "title": {"text": "Retained state against the number of topics"},
        "xaxis": {"title": {"text": "retained topics"}, "type": "log"},
        "yaxis": {"title": {"text": "ms from SUBSCRIBE"}},
        "yaxis2": {"title": {"text": "bytes per topic"}, "overlaying": "y", "side": "right"}}}


def _topics_per_run(point: PointStats) -> float:
    retained = point.retained
    if retained is None or not point.runs:
        return 0.0
    return retained.topics / point.runs
