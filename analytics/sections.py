"""Backend sections: the records a backend kept of each run, pooled per run and point.

Records live in their own dataset (``backend_records``), partitioned like the events, one
row per value: ``section`` (the section's key), ``figure`` (a field of the section) and
``value``. Each level (a run, or a point's done runs) gets one instance of every section
type its runs have records of, filled as :class:`mqttbed.core.sections.BackendSection`
describes: distributions pooled over every value, sums, means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mqttbed.analytics.figures import LevelKey, Levels, _per_level
from mqttbed.analytics.passes import Aggregate, GroupKey, figure_rows
from mqttbed.core.sections import BackendSection, Distribution, FigureKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RECORDS_DDL = "section string, figure string, value double"

# (level, key) -> section key -> figure -> statistics
SectionStats = dict[LevelKey, dict[str, dict[str, dict[str, Any]]]]


def section_rows(records: DataFrame, levels: Levels) -> DataFrame:
    """The figure rows of every (section, figure) of the records per level."""
    return figure_rows(_per_level(records, levels), "section", sub="section")


def read_section_statistics(groups: dict[GroupKey, Aggregate]) -> SectionStats:
    """The aggregated :func:`section_rows`: statistics per level, section and figure."""
    result: SectionStats = {}
    for (family, level, key, section, figure), found in groups.items():
        if family != "section":
            continue
        assert section is not None  # a section row's sub is its section's name
        figures = result.setdefault((level, key), {}).setdefault(section, {})
        figures[figure] = {**found.distribution(), "sum": found.sum, "min": found.min}
    return result


def build_sections(stats: SectionStats, level: LevelKey,
                   section_types: Sequence[type[BackendSection]]) -> dict[str, BackendSection]:
    """The sections of one level, by key: those whose records reached it."""
    found = stats.get(level, {})
    sections = {}
    for section_type in section_types:
        figures = found.get(section_type.key)
        if figures is None:
            continue
        kinds = section_type.figure_kinds()
        values: dict[str, Any] = {}
        for name, figure in figures.items():
            pattern = _keyed_pattern(name, kinds)
            kind = kinds.get(name) or (kinds.get(pattern) if pattern is not None else None)
            if kind is None:
                continue  # a figure this version's section no longer has
            if kind is FigureKind.DISTRIBUTION:
                values[name] = Distribution(**{k: v for k, v in figure.items()
                                               if k in Distribution.model_fields})
            elif kind is FigureKind.SUM:
                values[name] = int(figure["sum"] or 0)
            elif kind is FigureKind.AGREED:
                agreed = figure["min"] is not None and figure["min"] == figure["max"]
                values[name] = int(figure["min"]) if agreed else None
            else:
                values[name] = figure["mean"]
        sections[section_type.key] = section_type.from_figures(values)
    return sections


def _keyed_pattern(name: str, kinds: dict[str, FigureKind]) -> str | None:
    """The ``field.*.figure`` pattern a ``field.key.figure`` name belongs to, if any."""
    parts = name.split(".")
    if len(parts) == 3:
        pattern = f"{parts[0]}.*.{parts[2]}"
        return pattern if pattern in kinds else None
    return None
