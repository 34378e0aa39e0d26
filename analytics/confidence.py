"""Confidence intervals across repetitions: a percentile bootstrap over runs.

The unit of repetition is the run, so the runs are what is resampled: each resample draws
the point's runs with replacement, pools their values (each run weighted by how many
values it has) and takes the percentile of the pool. Runs are summarised by quantile
sketches (:data:`mqttbed.analytics.figures.SKETCH_LEVELS`) computed by Spark, so the
resampling needs no raw values on the driver: a resample's pooled CDF is the
count-weighted mean of its runs' CDFs, each interpolated linearly from its sketch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mqttbed.analytics.figures import SKETCH_LEVELS, QuantileSketch
from mqttbed.analytics.results import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE_LEVEL

if TYPE_CHECKING:  # numpy is imported where it is used: only the analytics extra has it
    from numpy.typing import NDArray

_BATCH = 250  # resamples evaluated at once: bounds memory to batch x grid floats


def bootstrap_interval(sketches: Sequence[QuantileSketch], quantile: float, *,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       level: float = CONFIDENCE_LEVEL) -> tuple[float, float] | None:
    """The ``level`` interval of the pooled ``quantile`` across runs; None with < 2 runs."""
    import numpy as np

    runs = [s for s in sketches if s.count > 0]
    if len(runs) < 2:
        return None
    levels = np.asarray(SKETCH_LEVELS)
    grid = np.unique(np.concatenate([np.asarray(s.quantiles) for s in runs]))
    cdfs = np.vstack([np.interp(grid, np.asarray(s.quantiles), levels, left=0.0, right=1.0)
                      for s in runs])
    grid, cdfs = _crossing_window(grid, cdfs, quantile)
    counts = np.asarray([s.count for s in runs], dtype=float)
    rng = np.random.default_rng(seed)
    estimates = []
    for start in range(0, resamples, _BATCH):
        batch = min(_BATCH, resamples - start)
        picks = rng.integers(0, len(runs), size=(batch, len(runs)))
        weights = np.zeros((batch, len(runs)))
        np.add.at(weights, (np.arange(batch)[:, None], picks), 1.0)
        weights *= counts
        pooled = (weights @ cdfs) / weights.sum(axis=1, keepdims=True)
        estimates.append(_inverse(pooled, grid, quantile))
    values = np.concatenate(estimates)
    tail = (1.0 - level) / 2
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def _crossing_window(grid: NDArray[Any], cdfs: NDArray[Any], quantile: float
                     ) -> tuple[NDArray[Any], NDArray[Any]]:
    """The part of ``grid`` (and the runs' ``cdfs`` over it) where any resample's pooled
    CDF can cross ``quantile``: a pooled CDF is a weighted mean of the runs' CDFs, so it
    is below ``quantile`` where every run's is, and reaches it where every run's does.
    The window keeps the last grid point below for every run and the first reached by
    every run, so :func:`_inverse` finds the same two grid points around each crossing as
    on the whole grid, at a fraction of the cost (the grid is every run's 1,001 sketch
    values; the window only those between the runs' own ``quantile``, a few when the
    runs agree)."""
    import numpy as np

    below = int(np.all(cdfs < quantile, axis=0).sum())      # a prefix: CDFs rise
    reached = int(np.all(cdfs >= quantile, axis=0).sum())   # a suffix
    start, stop = max(below - 1, 0), len(grid) - max(reached - 1, 0)
    return grid[start:stop], cdfs[:, start:stop]


def _inverse(cdfs: NDArray[Any], grid: NDArray[Any], quantile: float) -> NDArray[Any]:
    """Per row of non-decreasing ``cdfs`` over ``grid``: the x where the CDF reaches
    ``quantile``, linearly interpolated between grid points."""
    import numpy as np

    above = (cdfs < quantile).sum(axis=1)
    upper = np.clip(above, 1, len(grid) - 1) if len(grid) > 1 else np.zeros_like(above)
    lower = np.maximum(upper - 1, 0)
    rows = np.arange(cdfs.shape[0])
    f0, f1 = cdfs[rows, lower], cdfs[rows, upper]
    x0, x1 = grid[lower], grid[upper]
    rising = f1 > f0
    fraction = np.where(rising, (quantile - f0) / np.where(rising, f1 - f0, 1.0), 1.0)
    x = x0 + np.clip(fraction, 0.0, 1.0) * (x1 - x0)
    return np.where(above == 0, grid[0], x)
