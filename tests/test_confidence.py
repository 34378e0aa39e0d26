"""Bootstrap intervals over runs, from quantile sketches, against the raw-value bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

from mqttbed.analytics import confidence
from mqttbed.analytics.confidence import _BATCH, bootstrap_interval
from mqttbed.analytics.figures import SKETCH_LEVELS, QuantileSketch


def _runs(seed: int, medians: list[float], sizes: list[int]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.lognormal(np.log(m), 0.3, size=n) for m, n in zip(medians, sizes, strict=True)]


def _sketch(values: np.ndarray) -> QuantileSketch:
    return QuantileSketch(len(values), list(np.quantile(values, SKETCH_LEVELS)))


def _raw_bootstrap(runs: list[np.ndarray], quantile: float, resamples: int,
                   seed: int) -> tuple[float, float]:
    """The same resamples of runs (same generator, same draws), pooled from raw values."""
    rng = np.random.default_rng(seed)
    estimates = []
    for start in range(0, resamples, _BATCH):
        picks = rng.integers(0, len(runs), size=(min(_BATCH, resamples - start), len(runs)))
        estimates += [np.quantile(np.concatenate([runs[i] for i in row]), quantile)
                      for row in picks]
    low, high = np.quantile(estimates, [0.025, 0.975])
    return float(low), float(high)


@pytest.mark.parametrize("quantile", [0.5, 0.99])
def test_sketch_bootstrap_matches_the_bootstrap_on_raw_values(quantile):
    runs = _runs(1, medians=[150, 170, 160, 210, 155], sizes=[4000, 3500, 5000, 4200, 3900])
    expected = _raw_bootstrap(runs, quantile, resamples=400, seed=7)
    got = bootstrap_interval([_sketch(r) for r in runs], quantile, resamples=400, seed=7)
    assert got == pytest.approx(expected, rel=0.01)


def test_the_interval_is_seeded_and_holds_the_runs_between_their_extremes():
    runs = _runs(2, medians=[100, 120, 140], sizes=[2000, 2000, 2000])
    sketches = [_sketch(r) for r in runs]
    first = bootstrap_interval(sketches, 0.5)
    assert first == bootstrap_interval(sketches, 0.5)
    medians = [np.median(r) for r in runs]
    assert min(medians) <= first[0] < first[1] <= max(medians)


def test_runs_that_agree_give_a_narrow_interval_and_runs_that_differ_a_wide_one():
    agree = [_sketch(r) for r in _runs(3, [150] * 5, [3000] * 5)]
    differ = [_sketch(r) for r in _runs(3, [100, 150, 200, 250, 300], [3000] * 5)]
    narrow, wide = bootstrap_interval(agree, 0.5), bootstrap_interval(differ, 0.5)
    assert narrow[1] - narrow[0] < 0.1 * (wide[1] - wide[0])


def test_fewer_than_two_runs_with_values_give_no_interval():
    one = _sketch(_runs(4, [150], [100])[0])
    assert bootstrap_interval([one], 0.5) is None
    assert bootstrap_interval([one, QuantileSketch(0, [])], 0.5) is None
    assert bootstrap_interval([], 0.99) is None


@pytest.mark.parametrize("quantile", [0.0005, 0.01, 0.5, 0.99, 0.999])
def test_the_crossing_window_gives_the_interval_of_the_whole_grid(quantile, monkeypatch):
    same = [_sketch(r) for r in _runs(5, [150] * 4, [3000] * 4)]
    apart = [_sketch(r) for r in _runs(6, [100, 160, 400], [500, 4000, 2500])]
    # runs whose values do not overlap at all: no grid point is below for all of them
    disjoint = [_sketch(r) for r in _runs(7, [10, 1000], [1000, 1000])]
    windowed = [bootstrap_interval(s, quantile, resamples=500) for s in (same, apart, disjoint)]
    monkeypatch.setattr(confidence, "_crossing_window", lambda grid, cdfs, q: (grid, cdfs))
    whole = [bootstrap_interval(s, quantile, resamples=500) for s in (same, apart, disjoint)]
    assert windowed == whole
