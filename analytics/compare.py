"""Two campaigns side by side: per matching sweep point, the key figures and their intervals.

Points match when their swept parameters are equal (``params``, the backend included when
it is swept). For each of latency p50, latency p99 and spread p50 the comparison gives
both values with their 95 % intervals across runs, the difference (second minus first)
and whether the two intervals overlap. Overlapping intervals do not prove the campaigns
equal, and disjoint ones are a strong hint, not a test at a stated level: the comparison
says what the intervals say and no more.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mqttbed.analytics.results import CampaignStats, Interval, PointStats

# (name shown, block of the point, statistic, its interval)
COMPARED = (("latency p50 µs", "latency_us", "p50", "p50_ci"),
            ("latency p99 µs", "latency_us", "p99", "p99_ci"),
            ("spread p50 µs", "sync_spread_us", "p50", "p50_ci"))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FigureComparison(_Frozen):
    """One figure of one matched point in both campaigns."""

    figure: str
    first: float | None
    first_ci: Interval | None
    second: float | None
    second_ci: Interval | None
    difference: float | None = Field(description="second minus first")
    intervals_overlap: bool | None = Field(
        description="null unless both campaigns have an interval (two or more runs)")


class PointComparison(_Frozen):
    params: dict[str, Any]
    first_point_index: int
    second_point_index: int
    first_runs: int
    second_runs: int
    figures: list[FigureComparison]


class CampaignName(_Frozen):
    id: str
    name: str | None


class Comparison(_Frozen):
    """Two campaigns' results, point by matching point."""

    first: CampaignName
    second: CampaignName
    points: list[PointComparison]
    only_in_first: list[dict[str, Any]] = Field(description="params of unmatched points")
    only_in_second: list[dict[str, Any]]


def compare_results(first: CampaignStats, second: CampaignStats) -> Comparison:
    """Compare ``second`` against ``first`` at every sweep point both have."""
    second_by_params = {_key(p): p for p in second.points}
    matched, only_first = [], []
    for point in first.points:
        other = second_by_params.pop(_key(point), None)
        if other is None:
            only_first.append(point.params)
        else:
            matched.append(_compare_point(point, other))
    return Comparison(
        first=CampaignName(id=first.campaign.id, name=first.campaign.name),
        second=CampaignName(id=second.campaign.id, name=second.campaign.name),
        points=matched, only_in_first=only_first,
        only_in_second=[p.params for p in second_by_params.values()])


def _key(point: PointStats) -> str:
    return json.dumps(point.params, sort_keys=True, default=str)


def _compare_point(first: PointStats, second: PointStats) -> PointComparison:
    figures = []
    for name, block, stat, interval in COMPARED:
        a, b = getattr(first, block), getattr(second, block)
        value_a, value_b = getattr(a, stat), getattr(b, stat)
        ci_a, ci_b = getattr(a, interval), getattr(b, interval)
        figures.append(FigureComparison(
            figure=name, first=value_a, first_ci=ci_a, second=value_b, second_ci=ci_b,
            difference=None if value_a is None or value_b is None else value_b - value_a,
            intervals_overlap=None if ci_a is None or ci_b is None
            else ci_a[0] <= ci_b[1] and ci_b[0] <= ci_a[1]))
    return PointComparison(params=first.params, first_point_index=first.point_index,
                           second_point_index=second.point_index, first_runs=first.runs,
                           second_runs=second.runs, figures=figures)
