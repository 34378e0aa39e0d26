"""Repetitions until confident, read from a campaign's runs: who gets another run, and the
results block that says why each point stopped, with a drift check of each point's runs.

The decision is :mod:`mqttbed.campaigns.repetitions`'s; the intervals are the points'
bootstrap intervals computed by the analysis over the done runs (the numbers stats.json
shows); the drift test is :mod:`mqttbed.analytics.drift`'s. Everything is derived from the
stored runs, so a controller that restarts mid-campaign goes on from them.
"""

from __future__ import annotations

from collections.abc import Sequence

from mqttbed.analytics.drift import DRIFT_ALPHA, METHOD, mann_kendall
from mqttbed.analytics.results import (
    DriftCheck,
    PointRepetitions,
    PointStats,
    RepetitionsResults,
    RunStats,
)
from mqttbed.campaigns.repetitions import (
    RepetitionsUntil,
    interval_width,
    narrow_enough,
    points_needing_runs,
)
from mqttbed.controller.db import RunRow


def point_widths(point: PointStats, until: RepetitionsUntil) -> dict[str, float | None]:
    """The widths of the point's intervals of the figures ``until`` names: figure
    ``D.S`` (e.g. ``latency_us.p50``) has its interval in ``D.S_ci`` of the point."""
    widths = {}
    for figure in until.until:
        distribution, statistic = figure.split(".")
        interval = getattr(getattr(point, distribution), f"{statistic}_ci")
        widths[figure] = interval_width(interval)
    return widths


def runs_per_point(rows: Sequence[RunRow]) -> dict[int, int]:
    """Each point's runs (latest attempts), whatever their state."""
    counts: dict[int, int] = {}
    for row in rows:
        counts[row.point_index] = counts.get(row.point_index, 0) + 1
    return counts


def next_round(until: RepetitionsUntil, rows: Sequence[RunRow], points: Sequence[PointStats]
               ) -> list[int]:
    """The points that get one more run now (in point order)."""
    widths = {p.point_index: point_widths(p, until) for p in points}
    return points_needing_runs(until, runs_per_point(rows), widths)


def drift_check(runs: Sequence[RunStats]) -> DriftCheck:
    """Mann-Kendall trend of the point's per-run p50 latency, in the order the runs were
    made (their repetition numbers)."""
    ordered = sorted((r for r in runs if r.state == "done" and r.latency_us.p50 is not None),
                     key=lambda r: r.repetition)
    medians = [r.latency_us.p50 for r in ordered if r.latency_us.p50 is not None]
    tested = mann_kendall(medians)
    if tested is None:
        return DriftCheck(medians=medians)
    tau, p_value = tested
    return DriftCheck(medians=medians, tau=tau, p_value=p_value, drifting=p_value < DRIFT_ALPHA)


def repetitions_results(until: RepetitionsUntil, rows: Sequence[RunRow],
                        points: Sequence[PointStats], runs: Sequence[RunStats]
                        ) -> RepetitionsResults:
    """The ``repetitions`` block of a campaign's results."""
    counts = runs_per_point(rows)
    summaries = []
    for point in points:
        widths = point_widths(point, until)
        count = counts.get(point.point_index, 0)
        stopped = ("narrow" if narrow_enough(until.until, widths)
                   else "max" if count >= until.max else "unfinished")
        summaries.append(PointRepetitions(
            point_index=point.point_index, runs=count, stopped=stopped, widths=widths,
            drift=drift_check([r for r in runs if r.point_index == point.point_index])))
    return RepetitionsResults(
        min=until.min, max=until.max, until=dict(until.until), points=summaries,
        hit_max=[p.point_index for p in summaries if p.stopped == "max"], drift_method=METHOD)
