"""The files of a campaign's results: ``stats.json`` and ``stats.parquet``.

``stats.json`` is the results model's JSON. ``stats.parquet`` is derived from the model,
one flat row per point and per run (column ``level``): nested blocks are joined with "_"
(``latency_us_p99``, ``sections_hardware_latency_publish_packets``), an interval is two
columns (``latency_us_p50_ci_lo``, ``_hi``), and mappings and lists are JSON text. Every
column's type comes from the model's field types, not from the values, so a column has
the same type in every campaign whether or not it holds any value.

Both files carry the results document's ``schema_version`` (``stats.parquet`` in its
schema's metadata). A file of another version is not read as this one: :func:`read_stats`
and :func:`read_stats_parquet` raise :class:`StaleResults`, naming both versions and the
command that recomputes the file (``mqttbed analyze``), which thus upgrades it.

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
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from mqttbed.analytics.figures import POINT_LEVEL, RUN_LEVEL
from mqttbed.analytics.results import SCHEMA_VERSION, CampaignStats, StreamFigures
from mqttbed.core.errors import MqttbedError

if TYPE_CHECKING:
    import pyarrow as pa

STATS_JSON = "stats.json"
STATS_PARQUET = "stats.parquet"
STREAM_LEVEL_SUFFIX = "_stream"
_LEADING = (("level", "string"), ("campaign_id", "string"), ("stream", "string"))
_LEADING_DOCS = ("the row's level: point, run, point_stream or run_stream",
                 "the campaign's id", "a message mix's stream (its rows' levels end in "
                 "_stream); null on a point's or run's own row")
# A level's streams are rows of their own, not a JSON column.
_STREAMS_FIELD = "streams"
# What a stream row repeats of its point or run, to be found by.
_STREAM_ROW_KEYS = ("point_index", "run_id", "repetition")
# Where stats.parquet keeps the schema version, in its Arrow schema's metadata.
PARQUET_SCHEMA_VERSION_KEY = b"mqttbed.stats.schema_version"
# The results files written before the document had a version (its first shape).
UNVERSIONED = 1


class StaleResults(MqttbedError):
    """A results file of another schema version than this mqttbed's results document."""

    def __init__(self, path: Path, version: int, campaign_id: str | None):
        self.path, self.version, self.campaign_id = path, version, campaign_id
        which = campaign_id or "<campaign>"
        if version < SCHEMA_VERSION:
            how = f"recompute it from the campaign's events: mqttbed analyze {which}"
        else:
            how = (f"read it with a newer mqttbed, or recompute it with this one: "
                   f"mqttbed analyze {which}")
        super().__init__(f"{path} holds results of schema version {version}; this mqttbed "
                         f"reads version {SCHEMA_VERSION}: {how} (with --data-dir of its "
                         "data dir)")


class _Head(BaseModel):
    """What a results file says of itself before it is read as the document."""

    model_config = ConfigDict(extra="ignore")
    schema_version: int = UNVERSIONED
    campaign: dict[str, Any] = {}


def read_stats(path: Path, model: type[CampaignStats]) -> CampaignStats:
    """The results document in a ``stats.json`` file, if it is of this schema version
    (else :class:`StaleResults`, saying how to upgrade it)."""
    raw = path.read_bytes()
    try:
        head = _Head.model_validate_json(raw)
    except ValidationError:
        head = _Head()  # not even a document: the model's own error below says why
    if head.schema_version != SCHEMA_VERSION:
        campaign_id = head.campaign.get("id")
        raise StaleResults(path, head.schema_version,
                           campaign_id if isinstance(campaign_id, str) else None)
    return model.model_validate_json(raw)


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
    schema = pa.schema([(name, arrow[kind]) for name, kind in columns.items()],
                       metadata={PARQUET_SCHEMA_VERSION_KEY: str(stats.schema_version)})
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
    """The rows of a ``stats.parquet`` file (for tests and exports), if it is of this
    schema version (else :class:`StaleResults`)."""
    return read_stats_table(path).to_pylist()


def read_stats_table(path: Path) -> pa.Table:
    """A ``stats.parquet`` file as an Arrow table, if it is of this schema version (else
    :class:`StaleResults`)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    version = int((table.schema.metadata or {}).get(PARQUET_SCHEMA_VERSION_KEY, UNVERSIONED))
    if version != SCHEMA_VERSION:
        campaign_ids = set(table.column("campaign_id").to_pylist()) \
            if "campaign_id" in table.column_names else set()
        raise StaleResults(path, version, campaign_ids.pop() if len(campaign_ids) == 1
                           else None)
    return table


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
    for column, kind, _path, _field in _leaves(model, prefix):
        yield column, kind


def _leaves(model: type[BaseModel], prefix: str = "", path: str = ""
            ) -> Iterator[tuple[str, str, str, FieldInfo]]:
    """(column, kind, dotted path in the document, field) of every leaf of ``model``."""
    for name, field in model.model_fields.items():
        if name == _STREAMS_FIELD and not prefix:
            continue
        annotation = _unwrap(field.annotation)
        column, dotted = prefix + name, f"{path}{name}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _leaves(annotation, f"{column}_", f"{dotted}.")
        elif _is_interval(annotation):
            yield f"{column}_lo", "float", f"{dotted}[0]", field
            yield f"{column}_hi", "float", f"{dotted}[1]", field
        elif annotation is bool:
            yield column, "bool", dotted, field
        elif annotation is int:
            yield column, "int", dotted, field
        elif annotation is float:
            yield column, "float", dotted, field
        else:  # str, datetime, and mappings or lists as JSON text
            yield column, "string", dotted, field


class StatsColumn(NamedTuple):
    """One column of ``stats.parquet``, for its reference page and readers."""

    name: str
    kind: str                    # string, int, float or bool
    levels: tuple[str, ...]      # the row levels that fill it (point, run, point_stream ...)
    path: str                    # where the value sits in stats.json's point, run or stream
    description: str             # the field's own, or "" (its path then says what it is)


def stats_columns(stats_type: type[CampaignStats]) -> list[StatsColumn]:
    """Every column of a ``stats.parquet`` written from ``stats_type``, in file order."""
    stream_levels = (POINT_LEVEL + STREAM_LEVEL_SUFFIX, RUN_LEVEL + STREAM_LEVEL_SUFFIX)
    found: dict[str, StatsColumn] = {
        name: StatsColumn(name, kind, (*(POINT_LEVEL, RUN_LEVEL), *stream_levels), name,
                          doc)
        for (name, kind), doc in zip(_LEADING, _LEADING_DOCS, strict=True)}
    for model, levels in ((_item_type(stats_type, "points"), (POINT_LEVEL,)),
                          (_item_type(stats_type, "runs"), (RUN_LEVEL,)),
                          (StreamFigures, stream_levels)):
        for name, kind, path, field in _leaves(model):
            if name in found:
                seen = found[name]
                found[name] = seen._replace(levels=(*seen.levels, *levels))
            else:
                found[name] = StatsColumn(name, kind, levels, path, field.description or "")
    for key in _STREAM_ROW_KEYS:   # a stream's rows repeat these of their point or run
        if key in found:
            found[key] = found[key]._replace(levels=(*found[key].levels, *stream_levels))
    return list(found.values())


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
