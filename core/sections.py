"""Figure blocks a broker backend adds to the results: the contract of brokers and analytics.

A backend that measures something of its own (the FPGA model's pipeline latency, packets
at a P4 switch, a spanning tree's re-convergence) declares a :class:`BackendSection`
subclass and, after each run, hands over *records*: per figure, the raw values of that
run. The engine stores them beside the events; analytics pools them per run and per sweep
point like every other figure (percentiles over all the values of a point's runs, never
medians of per-run percentiles), by the type of each field of the section:

- :class:`Distribution` field: the distribution of the figure of the same name;
- ``int`` field: the sum of that figure's values (e.g. one value per run: its count);
- ``float`` field: the mean of that figure's values.

Units go in the field names (``_ns``, ``_us``, ``_bytes``), as everywhere in the results.
"""

from __future__ import annotations

import types
import typing
from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

# figure name -> the values one run gave for it
SectionRecords = dict[str, list[float]]


class Distribution(BaseModel):
    """Count, mean, sample std, exact percentiles (linear interpolation) and max of a figure.

    Every statistic is None when no value was measured (count 0).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    count: int = Field(0, ge=0, description="values the statistics are taken over")
    mean: float | None = None
    std: float | None = Field(None, description="sample standard deviation (n - 1)")
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    p999: float | None = None
    max: float | None = None


class FigureKind(StrEnum):
    """How analytics fills a section field from the records."""

    DISTRIBUTION = "distribution"
    SUM = "sum"
    MEAN = "mean"


class BackendSection(BaseModel):
    """A block of figures one broker backend adds to every run and point of the results."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # The key of the block under ``sections`` in the results (e.g. "hardware_latency").
    key: ClassVar[str]
    # Heading and explanation a report shows with the block.
    title: ClassVar[str]
    note: ClassVar[str] = ""

    @classmethod
    def figure_kinds(cls) -> dict[str, FigureKind]:
        """Each field's figure and how it is aggregated, from the field's type."""
        kinds = {}
        for name, field in cls.model_fields.items():
            kinds[name] = _kind_of(field.annotation, f"{cls.__name__}.{name}")
        return kinds


def _kind_of(annotation: object, where: str) -> FigureKind:
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    target = next((a for a in args if a is not type(None)), annotation) if args else annotation
    if isinstance(target, type) and issubclass(target, Distribution):
        return FigureKind.DISTRIBUTION
    if target is int:
        return FigureKind.SUM
    if target is float:
        return FigureKind.MEAN
    raise TypeError(f"{where}: a section field is a Distribution, an int (sum) or a float "
                    f"(mean), not {annotation!r}")
