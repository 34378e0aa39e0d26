"""Drift across repetitions: does one point's per-run median trend over the campaign?

Runs of a point are pooled as if they were exchangeable; a machine that slowly warms up,
fills its disk or loses a neighbour's load breaks that. Before pooling, each point's
per-run medians, in the order the runs were made, get a Mann-Kendall trend test:
Kendall's S (concordant minus discordant pairs of (run order, median)) with its exact
two-sided p-value under no trend, from the distribution of permutation inversions
(Mahonian numbers; ties count as neither pair; past 60 runs the normal approximation).
Pure Python: no SciPy on the controller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

DRIFT_ALPHA = 0.05
EXACT_UP_TO = 60   # runs; past it the normal approximation (the exact table grows as n^3)
METHOD = ("Mann-Kendall trend test of the point's per-run medians in run order: Kendall's "
          "S and tau, exact two-sided p-value under no trend (permutation distribution; "
          "normal approximation past 60 runs); "
          f"drifting when p < {DRIFT_ALPHA}")


def kendall_s(values: Sequence[float]) -> int:
    """Concordant minus discordant pairs of (position, value); ties count as neither."""
    return sum((b > a) - (b < a) for i, a in enumerate(values) for b in values[i + 1:])


@cache
def _inversion_counts(n: int) -> tuple[int, ...]:
    """How many permutations of n items have k inversions, for k = 0 .. n(n-1)/2."""
    counts = [1]
    for m in range(2, n + 1):   # insert item m: it adds 0 .. m-1 inversions
        grown = [0] * (len(counts) + m - 1)
        for k, ways in enumerate(counts):
            for extra in range(m):
                grown[k + extra] += ways
        counts = grown
    return tuple(counts)


def mann_kendall(values: Sequence[float]) -> tuple[float, float] | None:
    """(Kendall's tau, exact two-sided p-value) of a trend in ``values`` over their order;
    None with fewer than three values (no test)."""
    n = len(values)
    if n < 3:
        return None
    pairs = n * (n - 1) // 2
    s = kendall_s(values)
    if n > EXACT_UP_TO:   # the normal approximation, continuity-corrected
        z = (abs(s) - 1) / math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
        return s / pairs, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))
    counts = _inversion_counts(n)
    total = sum(counts)
    # S of a permutation with k inversions is pairs - 2k; P(|S| >= |s|) under no trend
    extreme = sum(ways for k, ways in enumerate(counts) if abs(pairs - 2 * k) >= abs(s))
    return s / pairs, min(1.0, extreme / total)
