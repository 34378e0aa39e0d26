"""Figure blocks a broker backend adds to the results: the contract of brokers and analytics.

A backend that measures something of its own (the FPGA model's pipeline latency, packets
at a P4 switch, a spanning tree's re-convergence) declares a :class:`BackendSection`
subclass and, after each run, hands over *records*: per figure, the raw values of that
run. The engine stores them beside the events; analytics pools them per run and per sweep
point like every other figure (percentiles over all the values of a point's runs, never
medians of per-run percentiles), by the type of each field of the section:

- :class:`Distribution` field: the distribution of the figure of the same name;
- ``int`` field: the sum of that figure's values (e.g. one value per run: its count);
- ``float`` field: the mean of that figure's values;
- :data:`Agreed` field (an int): the value every record gave, None where they differ
  (e.g. the index of a tree's root: one per run, the same in each run of a point);
- a :class:`SectionBlock` field: a group of such figures, named ``field.figure`` in the
  records (e.g. ``links.blocked``);
- a ``dict[str, SectionBlock]`` field: one group per key, named ``field.key.figure``
  (e.g. ``brokers.0.cpu_percent_mean``, a block per broker of the run).

Units go in the field names (``_ns``, ``_us``, ``_bytes``), as everywhere in the results.
"""

from __future__ import annotations

import types
import typing
from enum import StrEnum
from typing import Annotated, Any, ClassVar

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
    AGREED = "agreed"


# An int every record of the level agrees on (None where they differ, or none was kept).
Agreed = Annotated[int | None, FigureKind.AGREED]


class SectionBlock(BaseModel):
    """A named group of figures inside a section (one level deep)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


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
        """Each figure (dotted below a block; ``*`` for a dict's keys) and how it is
        aggregated, from the field's type."""
        return _figure_kinds(cls, "")

    @classmethod
    def from_figures(cls, figures: dict[str, Any]) -> BackendSection:
        """The section from its aggregated figures by dotted name (missing ones default)."""
        return cls(**_nest(cls, figures, ""))

    def flat_figures(self) -> dict[str, Any]:
        """Every figure's value by dotted name (a dict's keys in place of ``*``)."""
        return _flatten(self, "")


def _figure_kinds(model: type[BaseModel], prefix: str) -> dict[str, FigureKind]:
    kinds: dict[str, FigureKind] = {}
    for name, field in model.model_fields.items():
        where = f"{model.__name__}.{name}"
        block, keyed = _block_of(field.annotation)
        if block is not None:
            kinds |= _figure_kinds(block, f"{prefix}{name}.{'*.' if keyed else ''}")
        else:
            kinds[prefix + name] = _kind_of(field.annotation, field.metadata, where)
    return kinds


def _block_of(annotation: object) -> tuple[type[SectionBlock] | None, bool]:
    """(the block type, whether keyed by a dict) of a field, or (None, False)."""
    target = _unoptional(annotation)
    if isinstance(target, type) and issubclass(target, SectionBlock):
        return target, False
    if typing.get_origin(target) is dict:
        value = typing.get_args(target)[1]
        if isinstance(value, type) and issubclass(value, SectionBlock):
            return value, True
    return None, False


def _nest(model: type[BaseModel], figures: dict[str, Any], prefix: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        block, keyed = _block_of(field.annotation)
        if block is None:
            if prefix + name in figures:
                values[name] = figures[prefix + name]
        elif keyed:
            head = f"{prefix}{name}."
            keys = sorted({k[len(head):].split(".", 1)[0] for k in figures if k.startswith(head)},
                          key=lambda k: (len(k), k))
            values[name] = {key: block(**_nest(block, figures, f"{head}{key}."))
                            for key in keys}
        elif any(k.startswith(f"{prefix}{name}.") for k in figures):
            values[name] = block(**_nest(block, figures, f"{prefix}{name}."))
    return values


def _flatten(model: BaseModel, prefix: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SectionBlock):
            flat |= _flatten(value, f"{prefix}{name}.")
        elif isinstance(value, dict):
            for key, block in value.items():
                flat |= _flatten(block, f"{prefix}{name}.{key}.")
        else:
            flat[prefix + name] = value
    return flat


def _unoptional(annotation: object) -> object:
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    return next((a for a in args if a is not type(None)), annotation) if args else annotation


def _kind_of(annotation: object, metadata: list[Any], where: str) -> FigureKind:
    if FigureKind.AGREED in metadata:
        return FigureKind.AGREED
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    target = next((a for a in args if a is not type(None)), annotation) if args else annotation
    if isinstance(target, type) and issubclass(target, Distribution):
        return FigureKind.DISTRIBUTION
    if target is int:
        return FigureKind.SUM
    if target is float:
        return FigureKind.MEAN
    raise TypeError(f"{where}: a section field is a Distribution, an int (sum), a float "
                    f"(mean), Agreed, or a SectionBlock (or a dict of them), not "
                    f"{annotation!r}")
