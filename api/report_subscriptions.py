"""The report's figures of shared subscriptions and topic trees.

Shown when a point has a ``shared`` section (how each group's members shared the stream:
share and latency per member, Jain's fairness and the group's exact accounting in the
title) or a ``topic_tree`` section (per filter: deliveries against matches; over the
points: latency and broker CPU against the number of topics). A campaign without either
reports exactly as before.
"""

from __future__ import annotations

from typing import Any

from mqttbed.analytics.results import PointStats

_US = {"title": {"text": "µs"}}


def subscription_figures(points: list[PointStats], labels: dict[int, str]
                         ) -> dict[str, dict[str, Any]]:
    """The report's plots (by element id) of the points' shared groups and topic trees;
    none for points without either."""
    figures: dict[str, dict[str, Any]] = {}
    shared = [p for p in points if p.shared is not None and p.shared.groups]
    if shared:
        figures["plot-shared-shares"] = _shares(shared, labels)
        figures["plot-shared-latency"] = _member_latency(shared, labels)
    trees = [p for p in points if p.topic_tree is not None]
    if trees:
        figures["plot-tree-filters"] = _filter_accounting(trees, labels)
        figures["plot-tree-size"] = _versus_topics(trees, labels)
    return figures


def _group_label(labels: dict[int, str], point: PointStats, group: str) -> str:
    return f"{labels[point.point_index]} {group}"


def _shares(points: list[PointStats], labels: dict[int, str]) -> dict[str, Any]:
    """Each member's share of its group's stream, a bar group per (point, group)."""
    data, notes = [], []
    for point in points:
        assert point.shared is not None
        for group, figures in point.shared.groups.items():
            name = _group_label(labels, point, group)
            members = list(figures.by_member)
            data.append({"type": "bar", "name": name, "x": members,
                         "y": [figures.by_member[m].share for m in members],
                         "text": [f"{figures.by_member[m].deliveries}" for m in members]})
            fairness = "–" if figures.fairness is None else f"{figures.fairness:.3f}"
            notes.append(f"{name}: {figures.delivered} of {figures.expected} delivered, "
                         f"{figures.lost} lost, {figures.duplicated} duplicated, Jain "
                         f"{fairness}")
    return {"data": data, "layout": {
        "title": {"text": "Shared subscriptions: each member's share of its group's stream"
                          "<br><sub>" + "<br>".join(notes) + "</sub>"},
        "barmode": "group", "yaxis": {"title": {"text": "share of the messages delivered"}},
        "margin": {"t": 60 + 18 * len(notes)}}}


def _member_latency(points: list[PointStats], labels: dict[int, str]) -> dict[str, Any]:
    """Each member's latency p50 as a bar, its error bar up to p99."""
    data = []
    for point in points:
        assert point.shared is not None
        for group, figures in point.shared.groups.items():
            members = list(figures.by_member)
            latency = [figures.by_member[m].latency_us for m in members]
            data.append({"type": "bar", "name": _group_label(labels, point, group),
                         "x": members, "y": [d.p50 for d in latency],
                         "error_y": {"type": "data", "symmetric": False,
                                     "array": [0 if d.p50 is None or d.p99 is None
                                               else d.p99 - d.p50 for d in latency],
                                     "arrayminus": [0] * len(latency)}})
    return {"data": data, "layout": {
        "title": {"text": "Shared subscriptions: latency per member (p50, bar to p99)"},
        "barmode": "group", "yaxis": _US}}


def _filter_accounting(points: list[PointStats], labels: dict[int, str]) -> dict[str, Any]:
    """Per (point, filter): deliveries matched, delivered, lost and unexpected."""
    keys = [(point, topic_filter) for point in points if point.topic_tree is not None
            for topic_filter in point.topic_tree.filters]
    names = [f"{labels[point.point_index]} {topic_filter}" for point, topic_filter in keys]

    def counts(of: str) -> list[int]:
        return [getattr(point.topic_tree.filters[topic_filter], of)
                for point, topic_filter in keys if point.topic_tree is not None]

    return {"data": [{"type": "bar", "name": of, "x": names, "y": counts(of)}
                     for of in ("matched", "delivered", "lost", "unexpected", "duplicated")],
            "layout": {"title": {"text": "Topic tree: each filter's deliveries against what "
                                         "it matches (warm-up excluded)"},
                       "barmode": "group", "yaxis": {"title": {"text": "deliveries"}}}}


def _versus_topics(points: list[PointStats], labels: dict[int, str]) -> dict[str, Any]:
    """Latency (p50, p99) and broker CPU against the topics the publishers spread over."""
    ordered = sorted(points, key=lambda p: (p.topic_tree.topics_published or 0)
                     if p.topic_tree is not None else 0)
    topics = [p.topic_tree.topics_published if p.topic_tree is not None else None
              for p in ordered]
    text = [labels[p.point_index] for p in ordered]
    return {"data": [
        {"type": "scatter", "mode": "lines+markers", "name": "latency p50", "x": topics,
         "y": [p.latency_us.p50 for p in ordered], "text": text},
        {"type": "scatter", "mode": "lines+markers", "name": "latency p99", "x": topics,
         "y": [p.latency_us.p99 for p in ordered], "text": text},
        {"type": "scatter", "mode": "lines+markers", "name": "broker CPU % (mean)",
         "x": topics, "y": [p.broker.cpu_percent_mean for p in ordered], "text": text,
         "yaxis": "y2"}],
        "layout": {"title": {"text": "Topic tree: latency and broker CPU against the topics "
                                     "published to"},
                   "xaxis": {"title": {"text": "topics"}, "type": "log"},
                   "yaxis": _US,
                   "yaxis2": {"title": {"text": "CPU %"}, "overlaying": "y",
                              "side": "right"}}}
