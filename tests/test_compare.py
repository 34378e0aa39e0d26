"""Comparing two campaigns' results point by point."""

from __future__ import annotations

from datetime import UTC, datetime

from mqttbed.analytics.compare import compare_results
from mqttbed.analytics.results import CampaignStats, results_model


def results(campaign_id: str, points: list[tuple[dict, float, list | None]]) -> CampaignStats:
    """Results with one point per (params, latency p50, its interval)."""
    return results_model(()).model_validate({
        "campaign": {"id": campaign_id, "name": f"name-{campaign_id}"},
        "generated_at": datetime.now(UTC), "runs": [],
        "points": [{"point_index": i, "params": params, "backend": "mosquitto", "runs": 3,
                    "runs_failed": 0, "run_ids": [], "sections": {},
                    "latency_us": {"count": 10, "p50": p50, "p99": 2 * p50, "p50_ci": ci,
                                   "p99_ci": None},
                    "sync_spread_us": {"count": 0}}
                   for i, (params, p50, ci) in enumerate(points)]})


def test_points_match_by_params_and_intervals_say_overlap_or_disjoint():
    first = results("a", [({"n": 2}, 100.0, [90.0, 110.0]), ({"n": 10}, 200.0, [190.0, 210.0]),
                          ({"n": 50}, 300.0, None)])
    second = results("b", [({"n": 10}, 260.0, [240.0, 280.0]), ({"n": 2}, 105.0, [95.0, 115.0]),
                           ({"n": 99}, 1.0, None)])
    comparison = compare_results(first, second)
    by_n = {p.params["n"]: p for p in comparison.points}
    assert sorted(by_n) == [2, 10]
    assert by_n[10].first_point_index == 1 and by_n[10].second_point_index == 0
    p50 = {n: next(f for f in p.figures if f.figure == "latency p50 µs") for n, p in by_n.items()}
    assert p50[2].difference == 5.0 and p50[2].intervals_overlap is True
    assert p50[10].difference == 60.0 and p50[10].intervals_overlap is False
    p99 = next(f for f in by_n[2].figures if f.figure == "latency p99 µs")
    assert p99.difference == 10.0 and p99.intervals_overlap is None   # no p99 intervals
    spread = next(f for f in by_n[2].figures if f.figure == "spread p50 µs")
    assert spread.first is None and spread.difference is None
    assert comparison.only_in_first == [{"n": 50}] and comparison.only_in_second == [{"n": 99}]
    assert comparison.first.name == "name-a" and comparison.second.id == "b"


def test_touching_intervals_overlap():
    first = results("a", [({}, 100.0, [90.0, 110.0])])
    second = results("b", [({}, 120.0, [110.0, 130.0])])
    (point,) = compare_results(first, second).points
    assert point.figures[0].intervals_overlap is True
