"""The files of a campaign's results: ``stats.json`` and ``stats.parquet``.

``stats.json`` is the results model's JSON. ``stats.parquet`` is derived from the model,
one flat row per point and per run (column ``level``): nested blocks are joined with "_"
(``latency_us_p99``, ``sections_hardware_latency_publish_packets``), an interval is two
columns (``latency_us_p50_ci_lo``, ``_hi``), and mappings and lists are JSON text. Every
column's type comes from the model's field types, not from the values, so a column has
the same type in every campaign whether or not it holds any value.

The streams of a message mix are rows of their own (level ``point_stream`` or
``run_stream``, the stream's name in column ``stream``) with their point's or run's
identifying columns and the stream's figures under the same column names as a level's
(``latency_us_p99``, ``lost``; ``topic`` and ``payload_bytes`` besides).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mqttbed.analytics.figures import POINT_LEVEL, RUN_LEVEL
from mqttbed.analytics.results import CampaignStats, StreamFigures

STATS_JSON = "stats.json"
STATS_PARQUET = "stats.parquet"
STREAM_LEVEL_SUFFIX = "_stream"
_LEADING = (("level", "string"), ("campaign_id", "string"), ("stream", "string"))
# A level's streams are rows of their own, not a JSON column.
_STREAMS_FIELD = "streams"
# What a stream row repeats of its point or run, to be found by.
_STREAM_ROW_KEYS = ("point_index", "run_id", "repetition")


def write_stats(stats: CampaignStats, out_dir: Path) -> tuple[Path, Path]:
    """Write ``stats.json`` and ``stats.parquet`` into ``out_dir``; return both paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, parquet_path = out_dir / STATS_JSON, out_dir / STATS_PARQUET
    _atomic_text(json_path, stats.model_dump_json(indent=2) + "\n")

    point_type = _item_type(type(stats), "points")
    run_type = _item_type(type(stats), "runs")
    columns = dict(_LEADING)
    for model in (point_type, run_type, StreamFigures):
        for name, kind in _columns(model):
            columns.setdefault(name, kind)
    arrow: dict[str, pa.DataType] = {"string": pa.string(), "int": pa.int64(),
                                     "float": pa.float64(), "bool": pa.bool_()}
    schema = pa.schema([(name, arrow[kind]) for name, kind in columns.items()])
    rows = []
    for level, entries in ((POINT_LEVEL, stats.points), (RUN_LEVEL, stats.runs)):
        for entry in entries:
            rows += _level_rows(level, stats.campaign.id, entry)
    tmp = parquet_path.with_name(f".{parquet_path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    tmp.replace(parquet_path)
    return json_path, parquet_path


def _level_rows(level: str, campaign_id: str, entry: BaseModel) -> list[dict[str, Any]]:
    """The row of a point or run, then one row per stream of its message mix."""
    head = {"level": level, "campaign_id": campaign_id}
    keys = {key: getattr(entry, key) for key in _STREAM_ROW_KEYS if hasattr(entry, key)}
    return [{**head, **_flat(entry)}] + [
        {**head, "level": level + STREAM_LEVEL_SUFFIX, "stream": name, **keys, **_flat(figures)}
        for name, figures in getattr(entry, _STREAMS_FIELD).items()]


def read_stats_parquet(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``stats.parquet`` file (for tests and exports)."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _item_type(model: type[BaseModel], field: str) -> type[BaseModel]:
    (item,) = typing.get_args(model.model_fields[field].annotation)
    return item


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> X."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _is_interval(annotation: Any) -> bool:
    return typing.get_origin(annotation) is tuple


def _columns(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(column, kind) of every leaf field of ``model``, in field order."""
    for name, field in model.model_fields.items():
        if name == _STREAMS_FIELD and not prefix:
            continue
        annotation = _unwrap(field.annotation)
        column = prefix + name
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _columns(annotation, f"{column}_")
        elif _is_interval(annotation):
            yield f"{column}_lo", "float"
            yield f"{column}_hi", "float"
        elif annotation is bool:
            yield column, "bool"
        elif annotation is int:
            yield column, "int"
        elif annotation is float:
            yield column, "float"
        else:  # str, datetime, and mappings or lists as JSON text
            yield column, "string"


def _flat(model: BaseModel | None, model_type: type[BaseModel] | None = None,
          prefix: str = "") -> dict[str, Any]:
    """The leaf values of ``model`` under the names :func:`_columns` gives them."""
    if model_type is None:
        assert model is not None  # a caller without a model names its type
        model_type = type(model)
    flat: dict[str, Any] = {}
    for name, field in model_type.model_fields.items():
        if name == _STREAMS_FIELD and not prefix:
            continue
        annotation = _unwrap(field.annotation)
        column = prefix + name
        value = None if model is None else getattr(model, name)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            flat.update(_flat(value, annotation, f"{column}_"))
        elif _is_interval(annotation):
            flat[f"{column}_lo"], flat[f"{column}_hi"] = value if value else (None, None)
        elif value is None or isinstance(value, bool | int | float | str):
            flat[column] = value
        else:
            flat[column] = json.dumps(_plain(value), sort_keys=True, default=str)
    return flat


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
