"""Binary event chunks: the native engine's column buffers sent as bytes, never as lists.

A JSON chunk (:class:`~mqttbed.core.protocol.ResultChunk`) turns every event into Python
objects twice on the agent (a list per column, then JSON) and again on the controller. At
a million events a second that, not the engine, is the agent's CPU (issue 27's profile:
the engine 3 %, libpython and memmove the rest). A binary chunk carries the engine's
columns as they lie in its memory:

``MQBC`` (magic) · version byte · header length (uint32, little endian) · header (JSON) ·
body (the columns' buffers, concatenated)

The header holds what a JSON chunk's envelope holds (run id, agent id, seq, constants,
``edges_until_ns``) plus ``dictionaries`` (lists of values a ``dict`` column's codes
index), ``edges`` (the GPIO edges: ``rows`` and a raw descriptor per column, ``pin``
int32, ``t_ns`` int64, ``level`` uint8, into the body like an event column's) and
``segments``: each segment is one batch of rows (a drain of one engine table) with a
descriptor per event column, by kind:

- ``int64``, ``int32``, ``uint8``, ``bool``: one raw little-endian value per row
  (``bool``: one byte, 0 or 1), at ``offset`` in the body, ``length`` bytes;
- ``dict``: ``codes`` (``int32`` or ``uint8``) at ``offset``/``length``, one per row,
  each an index into ``dictionaries[dictionary]`` (strings, numbers or null): per-client
  values (publisher id, topic, payload size) keep the engine's client column as codes;
- ``null``: null on every row; ``const``: ``value`` on every row.

Segments let a chunk hold several drains without re-encoding any of them. The agent's
side (:class:`BinaryBatch`, :class:`EdgeBuffers`, :func:`encode_chunk`) is plain Python;
the controller's (:func:`decode_chunk`, :func:`event_arrays`, :func:`edge_arrays`)
validates everything and raises ValueError naming the column and the problem; pyarrow is
imported there only, lazily (agents have none). Version 2 added the binary ``edges``
(version 1 carried them as JSON lists).
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mqttbed.core.events import EVENT_COLUMNS, OPTIONAL_EVENT_COLUMNS, arrow_schema
from mqttbed.core.names import PlainName

MAGIC = b"MQBC"
VERSION = 2
CONTENT_TYPE = "application/vnd.mqttbed.chunk"
_PREFIX = struct.Struct("<4sBI")          # magic, version, header length
MAX_HEADER_BYTES = 16 << 20
_INT32 = 2**31 - 1

RawKind = Literal["int64", "int32", "uint8", "bool"]
CodeKind = Literal["int32", "uint8"]
WIDTHS: dict[str, int] = {"int64": 8, "int32": 4, "uint8": 1, "bool": 1}
Scalar = str | int | float | bool | None
Buffer = bytes | bytearray | memoryview
# A GPIO edge's columns and their raw kinds: the native engine's edge table as it lies.
EDGE_KINDS: dict[str, RawKind] = {"pin": "int32", "t_ns": "int64", "level": "uint8"}


# -- the agent's side: batches of columns as bytes -----------------------------------------

@dataclass(frozen=True)
class Raw:
    """One little-endian value per row (``bool``: one byte, 0 or 1)."""

    kind: RawKind
    data: Buffer

    def sliced(self, start: int, stop: int) -> Raw:
        width = WIDTHS[self.kind]
        return Raw(self.kind, memoryview(self.data)[start * width:stop * width])


@dataclass(frozen=True)
class Coded:
    """One code per row indexing ``values`` (a tuple kept whole: chunks share it by
    identity, so a chunk's header lists it once however many batches use it)."""

    codes: Buffer
    values: tuple[Scalar, ...]
    code_kind: CodeKind = "int32"

    def sliced(self, start: int, stop: int) -> Coded:
        width = WIDTHS[self.code_kind]
        return Coded(memoryview(self.codes)[start * width:stop * width], self.values,
                     self.code_kind)


@dataclass(frozen=True)
class Null:
    """Null on every row."""

    def sliced(self, start: int, stop: int) -> Null:
        return self


@dataclass(frozen=True)
class Const:
    """``value`` on every row."""

    value: Scalar

    def sliced(self, start: int, stop: int) -> Const:
        return self


Column = Raw | Coded | Null | Const


@dataclass(frozen=True)
class BinaryBatch:
    """Rows of event columns as buffers: what the native session hands the uploader."""

    rows: int
    columns: dict[str, Column] = field(default_factory=dict)

    def sliced(self, start: int, stop: int) -> BinaryBatch:
        """Rows ``start`` to ``stop`` (views on the same bytes, no copy)."""
        stop = min(stop, self.rows)
        return BinaryBatch(max(0, stop - start),
                           {name: column.sliced(start, stop)
                            for name, column in self.columns.items()})


@dataclass(frozen=True)
class EdgeBuffers:
    """GPIO edges as column buffers, one value per edge in native (little-endian) order:
    ``pin`` int32, ``t_ns`` int64 (CLOCK_MONOTONIC), ``level`` uint8 (the new level)."""

    pin: Buffer = b""
    t_ns: Buffer = b""
    level: Buffer = b""

    def __post_init__(self) -> None:
        rows = memoryview(self.level).nbytes
        for name in ("pin", "t_ns"):
            size = memoryview(getattr(self, name)).nbytes
            width = WIDTHS[EDGE_KINDS[name]]
            if size != rows * width:
                raise ValueError(f"edges: column {name!r} holds {size} bytes; {rows} edges "
                                 f"(level bytes) of {width} bytes need {rows * width}")

    @property
    def rows(self) -> int:
        return memoryview(self.level).nbytes

    def as_lists(self) -> dict[str, list[int]]:
        """The edges as a JSON chunk's ``edges`` (one list per column)."""
        formats = {"int32": "i", "int64": "q", "uint8": "B"}
        return {name: memoryview(getattr(self, name)).cast(  # type: ignore[call-overload]
                    formats[kind]).tolist() for name, kind in EDGE_KINDS.items()}


def encode_chunk(*, run_id: str, agent_id: str, seq: int, batches: Sequence[BinaryBatch],
                 constants: dict[str, Any], edges: EdgeBuffers | None = None,
                 edges_until_ns: int | None = None) -> bytes:
    """One binary chunk of ``batches`` (one segment each) and ``edges`` (behind the
    segments in the body); buffers are copied once."""
    if sys.byteorder != "little":  # the engine's columns are in native order
        raise RuntimeError("binary chunks are little endian; this machine is not")
    dictionaries: list[tuple[Scalar, ...]] = []
    dictionary_of: dict[int, int] = {}     # id(values) -> its index in dictionaries
    body: list[Buffer] = []
    offset = 0
    segments = []
    for batch in batches:
        described: dict[str, dict[str, Any]] = {}
        for name, column in batch.columns.items():
            if isinstance(column, (Raw, Coded)):
                data = column.data if isinstance(column, Raw) else column.codes
                length = memoryview(data).nbytes
                body.append(data)
                entry: dict[str, Any] = {"offset": offset, "length": length}
                offset += length
                if isinstance(column, Raw):
                    entry["kind"] = column.kind
                else:
                    index = dictionary_of.get(id(column.values))
                    if index is None:
                        index = dictionary_of[id(column.values)] = len(dictionaries)
                        dictionaries.append(column.values)
                    entry.update(kind="dict", codes=column.code_kind, dictionary=index)
            elif isinstance(column, Const):
                entry = {"kind": "const", "value": column.value}
            else:
                entry = {"kind": "null"}
            described[name] = entry
        segments.append({"rows": batch.rows, "columns": described})
    edge_section: dict[str, Any] | None = None
    if edges is not None and edges.rows:
        edge_section = {"rows": edges.rows}
        for name, kind in EDGE_KINDS.items():
            data = getattr(edges, name)
            length = memoryview(data).nbytes
            body.append(data)
            edge_section[name] = {"kind": kind, "offset": offset, "length": length}
            offset += length
    header = json.dumps({"run_id": run_id, "agent_id": agent_id, "seq": seq,
                         "constants": constants, "edges": edge_section,
                         "edges_until_ns": edges_until_ns,
                         "dictionaries": dictionaries, "segments": segments},
                        separators=(",", ":")).encode()
    return b"".join([_PREFIX.pack(MAGIC, VERSION, len(header)), header, *body])


# -- the controller's side: validate, then Arrow ------------------------------------------

class ColumnDescriptor(BaseModel):
    """How one column of one segment is stored (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["int64", "int32", "uint8", "bool", "dict", "null", "const"]
    offset: int = Field(0, ge=0)
    length: int = Field(0, ge=0)
    codes: CodeKind | None = None
    dictionary: int | None = Field(None, ge=0)
    value: Scalar = None


class Segment(BaseModel):
    """One batch of rows of a binary chunk."""

    model_config = ConfigDict(extra="forbid")
    rows: int = Field(ge=0, le=_INT32)
    columns: dict[str, ColumnDescriptor]


class EdgeColumnDescriptor(BaseModel):
    """Where one column of a chunk's GPIO edges lies in its body."""

    model_config = ConfigDict(extra="forbid")
    kind: RawKind
    offset: int = Field(ge=0)
    length: int = Field(ge=0)


class EdgeSection(BaseModel):
    """The GPIO edges of a binary chunk: ``rows`` edges, a raw column each of ``pin``
    (int32), ``t_ns`` (int64) and ``level`` (uint8)."""

    model_config = ConfigDict(extra="forbid")
    rows: int = Field(ge=0, le=_INT32)
    pin: EdgeColumnDescriptor
    t_ns: EdgeColumnDescriptor
    level: EdgeColumnDescriptor


class BinaryChunkHeader(BaseModel):
    """The JSON header of a binary chunk."""

    model_config = ConfigDict(extra="forbid")
    run_id: PlainName
    agent_id: PlainName = Field(max_length=48)
    seq: int = Field(ge=0, le=_INT32)
    constants: dict[str, Scalar] = {}
    edges: EdgeSection | None = None
    edges_until_ns: int | None = None
    dictionaries: list[list[Scalar]] = []
    segments: list[Segment]


@dataclass(frozen=True)
class DecodedChunk:
    """A validated binary chunk: its header and its body (columns read by offset)."""

    header: BinaryChunkHeader
    body: memoryview

    @property
    def rows(self) -> int:
        return sum(segment.rows for segment in self.header.segments)


def decode_chunk(data: Buffer) -> DecodedChunk:
    """Parse and check a binary chunk; ValueError names the field or column at fault."""
    view = memoryview(data).cast("B")
    if view.nbytes < _PREFIX.size:
        raise ValueError(f"binary chunk truncated: {view.nbytes} bytes, the prefix alone "
                         f"is {_PREFIX.size}")
    magic, version, header_bytes = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise ValueError(f"not a binary chunk: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise ValueError(f"binary chunk version {version} is not supported (this "
                         f"controller reads version {VERSION})")
    if header_bytes > MAX_HEADER_BYTES or _PREFIX.size + header_bytes > view.nbytes:
        raise ValueError(f"binary chunk truncated: header length {header_bytes} bytes, "
                         f"{view.nbytes - _PREFIX.size} follow the prefix")
    try:
        header = BinaryChunkHeader.model_validate_json(
            bytes(view[_PREFIX.size:_PREFIX.size + header_bytes]))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in exc.errors()[:5])
        raise ValueError(f"binary chunk header: {problems}") from None
    body = view[_PREFIX.size + header_bytes:]
    for number, segment in enumerate(header.segments):
        _check_segment(header, number, segment, body.nbytes)
    if header.edges is not None:
        _check_edges(header.edges, body.nbytes)
    return DecodedChunk(header, body)


def _check_edges(edges: EdgeSection, body_bytes: int) -> None:
    for name, kind in EDGE_KINDS.items():
        column: EdgeColumnDescriptor = getattr(edges, name)
        if column.kind != kind:
            raise ValueError(f"edges: column {name!r} is {kind}, not {column.kind!r}")
        width = WIDTHS[kind]
        if column.length != edges.rows * width:
            raise ValueError(f"edges: column {name!r} holds {column.length} bytes; "
                             f"{edges.rows} edges of {width} bytes need {edges.rows * width}")
        if column.offset + column.length > body_bytes:
            raise ValueError(f"edges: column {name!r} truncated: bytes {column.offset}.."
                             f"{column.offset + column.length} of a {body_bytes}-byte body")


def _check_segment(header: BinaryChunkHeader, number: int, segment: Segment,
                   body_bytes: int) -> None:
    where = f"segment {number}"
    names = set(segment.columns)
    missing = set(EVENT_COLUMNS) - names - set(header.constants) - OPTIONAL_EVENT_COLUMNS
    unknown = names - set(EVENT_COLUMNS)
    if unknown:
        raise ValueError(f"{where}: unknown column {sorted(unknown)[0]!r} (event columns: "
                         f"{', '.join(EVENT_COLUMNS)})")
    if missing:
        raise ValueError(f"{where}: column {sorted(missing)[0]!r} is missing")
    for name, column in segment.columns.items():
        if column.kind in ("null", "const"):
            continue
        if column.kind == "dict":
            if column.codes is None or column.dictionary is None:
                raise ValueError(f"{where}: column {name!r} of kind dict needs codes and "
                                 f"dictionary")
            if column.dictionary >= len(header.dictionaries):
                raise ValueError(f"{where}: column {name!r} uses dictionary "
                                 f"{column.dictionary}; the chunk has "
                                 f"{len(header.dictionaries)}")
        width = WIDTHS[column.codes if column.kind == "dict" and column.codes else column.kind]
        if column.length != segment.rows * width:
            raise ValueError(f"{where}: column {name!r} holds {column.length} bytes; "
                             f"{segment.rows} rows of {width} bytes need "
                             f"{segment.rows * width}")
        if column.offset + column.length > body_bytes:
            raise ValueError(f"{where}: column {name!r} truncated: bytes {column.offset}.."
                             f"{column.offset + column.length} of a {body_bytes}-byte body")


def event_arrays(chunk: DecodedChunk) -> dict[str, Any]:
    """The chunk's varying columns as Arrow arrays of the event schema's types (the
    columns a JSON chunk would carry; its constants stay in the header).

    ValueError names the column when a value does not fit (a code beyond its dictionary,
    a number too large for the column's type, a dictionary of the wrong type).
    """
    import pyarrow as pa

    target: dict[str, Any] = {field.name: field.type for field in arrow_schema()}
    names = [n for n in EVENT_COLUMNS
             if any(n in s.columns for s in chunk.header.segments)]
    pieces: dict[str, list[Any]] = {name: [] for name in names}
    dictionaries: dict[tuple[int, str], Any] = {}
    for number, segment in enumerate(chunk.header.segments):
        for name in names:
            column = segment.columns.get(name)
            kind = target[name]
            where = f"segment {number}: column {name!r}"
            try:
                if column is None:   # an optional column this segment leaves out
                    value = chunk.header.constants.get(name)
                    piece = (pa.nulls(segment.rows, kind) if value is None
                             else pa.repeat(pa.scalar(value, kind), segment.rows))
                else:
                    piece = _arrow_column(chunk, segment.rows, column, kind, dictionaries,
                                          where)
            except (pa.ArrowException, OverflowError, TypeError) as exc:
                raise ValueError(f"{where}: {type(exc).__name__}: {exc}") from None
            pieces[name].append(piece)
    return {name: (pa.concat_arrays(parts) if parts else pa.array([], target[name]))
            for name, parts in pieces.items()}


def edge_arrays(chunk: DecodedChunk) -> dict[str, Any] | None:
    """The chunk's GPIO edges as Arrow arrays of the edges file's types (``pin`` int32,
    ``t_ns`` int64, ``level`` int8), built on the body's bytes; None when it has none.

    ValueError names the column when a level is not 0 or 1.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    edges = chunk.header.edges
    if edges is None:
        return None
    types = {"int32": pa.int32(), "int64": pa.int64(), "uint8": pa.uint8()}
    arrays: dict[str, Any] = {}
    for name, kind in EDGE_KINDS.items():
        column: EdgeColumnDescriptor = getattr(edges, name)
        data = pa.py_buffer(chunk.body[column.offset:column.offset + column.length])
        arrays[name] = pa.Array.from_buffers(types[kind], edges.rows, [None, data])
    if edges.rows:
        highest = pc.max(arrays["level"]).as_py()
        if highest > 1:
            raise ValueError(f"edges: column 'level': {highest} is not a level (0 or 1)")
    arrays["level"] = arrays["level"].cast(pa.int8())
    return arrays


def _arrow_column(chunk: DecodedChunk, rows: int, column: ColumnDescriptor, kind: Any,
                  dictionaries: dict[tuple[int, str], Any], where: str) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.kind == "null":
        return pa.nulls(rows, kind)
    if column.kind == "const":
        return (pa.nulls(rows, kind) if column.value is None
                else pa.repeat(pa.scalar(column.value, kind), rows))
    buffers: Any = {"int64": pa.int64(), "int32": pa.int32(), "uint8": pa.uint8(),
                    "bool": pa.uint8()}     # bool: a byte per row, made Arrow's bits below
    data = pa.py_buffer(chunk.body[column.offset:column.offset + column.length])
    if column.kind != "dict":
        raw = pa.Array.from_buffers(buffers[column.kind], rows, [None, data])
        if column.kind == "bool":
            return pc.not_equal(raw, pa.scalar(0, pa.uint8()))
        return raw.cast(kind)
    assert column.codes is not None and column.dictionary is not None  # _check_segment
    codes = pa.Array.from_buffers(buffers[column.codes], rows, [None, data])
    values = chunk.header.dictionaries[column.dictionary]
    if rows:
        extremes: Any = pc.min_max(codes)
        low, high = extremes["min"].as_py(), extremes["max"].as_py()
        if low < 0 or high >= len(values):
            bad = low if low < 0 else high
            raise ValueError(f"{where}: code {bad} is outside its dictionary "
                             f"(0..{len(values) - 1})")
    key = (column.dictionary, str(kind))
    if key not in dictionaries:
        dictionaries[key] = pa.array(values, kind)
    return dictionaries[key].take(codes)
