"""Repetitions until confident: a point gets runs until its interval is narrow enough.

``repetitions: {min: 3, max: 10, until: {latency_us.p50: 50}}`` runs every point ``min``
times (interleaved: every point once, then again), then, round after round, one more run
of each point whose 95 % bootstrap interval (``analytics.confidence``) of a named figure
is still wider than its width, until it is narrow enough or the point has ``max`` runs.
The plain ``repetitions: 3`` stays what it was.

This module holds the spec's model and the pure decision (which points need another
run); the controller computes the intervals and queues the runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Figures with a bootstrap interval across runs (``*_ci`` in the points of stats.json).
UNTIL_FIGURES = ("latency_us.p50", "latency_us.p99", "sync_spread_us.p50")


class RepetitionsUntil(BaseModel):
    """``repetitions: {min, max, until}``: runs of each point until its interval is narrow."""

    model_config = ConfigDict(extra="forbid")
    min: int = Field(3, ge=2, le=10_000, description="runs of every point before any stops "
                                                    "(two at least: an interval needs two)")
    max: int = Field(ge=2, le=10_000, description="at most this many runs of a point; the "
                                                 "results name the points that hit it")
    until: dict[str, float] = Field(
        min_length=1, description="figure -> width: a point stops getting runs once the 95 % "
                                  "interval across its runs of every figure named is "
                                  "narrower than its width (µs); figures: "
                                  + ", ".join(UNTIL_FIGURES))

    @field_validator("until")
    @classmethod
    def _known_figures(cls, until: dict[str, float]) -> dict[str, float]:
        for figure, width in until.items():
            if figure not in UNTIL_FIGURES:
                raise ValueError(f"until.{figure}: no interval across runs for {figure!r}; "
                                 f"figures with one: {', '.join(UNTIL_FIGURES)}")
            if not math.isfinite(width) or width <= 0:
                raise ValueError(f"until.{figure}: width {width!r} must be a positive number")
        return until

    @model_validator(mode="after")
    def _min_within_max(self) -> RepetitionsUntil:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is more than max ({self.max})")
        return self


def first_repetitions(repetitions: int | RepetitionsUntil) -> int:
    """How many runs of every point are planned at the start."""
    return repetitions if isinstance(repetitions, int) else repetitions.min


def most_repetitions(repetitions: int | RepetitionsUntil) -> int:
    """The most runs a point may get."""
    return repetitions if isinstance(repetitions, int) else repetitions.max


def interval_width(interval: tuple[float, float] | None) -> float | None:
    """An interval's width; None without one (fewer than two runs with data)."""
    return None if interval is None else interval[1] - interval[0]


def narrow_enough(until: Mapping[str, float], widths: Mapping[str, float | None]) -> bool:
    """Whether every named figure's interval is narrower than its width (no interval: no)."""
    return all((width := widths.get(figure)) is not None and width < bound
               for figure, bound in until.items())


def points_needing_runs(repetitions: RepetitionsUntil, runs: Mapping[int, int],
                        widths: Mapping[int, Mapping[str, float | None]]) -> list[int]:
    """The points (by index, in order) that get one more run in the next round.

    ``runs``: each point's runs so far (failed ones too: a point whose runs fail does not
    get runs for ever); ``widths``: each point's interval widths by figure.
    """
    return [index for index in sorted(runs)
            if runs[index] < repetitions.max
            and not narrow_enough(repetitions.until, widths.get(index, {}))]
