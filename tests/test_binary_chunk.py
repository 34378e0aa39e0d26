"""The binary chunk codec (core/binary_chunk.py): what the agent encodes, the controller
reads back as the event schema's Arrow columns, and every malformed chunk is refused
with the column or field at fault named."""

from __future__ import annotations

import json
import struct
from array import array

import pyarrow as pa
import pytest

from mqttbed.core.binary_chunk import (
    VERSION,
    BinaryBatch,
    Coded,
    Const,
    EdgeBuffers,
    Null,
    Raw,
    decode_chunk,
    edge_arrays,
    encode_chunk,
    event_arrays,
)

CONSTANTS = {"agent_id": "a1", "clock_offset_ns": 5, "clock_offset_uncertainty_ns": 1}
CLIENTS = ("pub-0", "pub-1", "sub-0")
TOPICS = ("t/0", "t/1", "t/#")


def ints(code: str, values: list[int]) -> bytes:
    return array(code, values).tobytes()


def deliveries() -> BinaryBatch:
    """Three delivery rows using every column kind: raw int64/int32/uint8/bool, dict codes
    of both widths (strings and numbers), null, const."""
    return BinaryBatch(3, {
        "kind": Const("delivery"), "publisher": Coded(ints("i", [1, 0, 1]), CLIENTS),
        "seq": Raw("int64", ints("q", [7, 8, 2**40])),
        "receiver": Coded(ints("i", [2, 2, 2]), CLIENTS),
        "topic": Coded(ints("i", [1, 0, 1]), TOPICS),
        "payload_bytes": Coded(ints("i", [1, 0, 1]), (64, 1000)),
        "qos": Raw("uint8", bytes([0, 1, 2])), "warmup": Raw("bool", bytes([1, 0, 0])),
        "t_intended_ns": Raw("int64", ints("q", [10, 20, 30])),
        "t_pub_ns": Raw("int64", ints("q", [11, 21, 31])),
        "t_recv_ns": Raw("int64", ints("q", [-5, 25, 35])),
        "clock_source": Coded(bytes([1, 0, 1]), ("user", "kernel"), "uint8"),
        "t_recv_user_ns": Null()})


def subscriptions() -> BinaryBatch:
    return BinaryBatch(2, {
        "kind": Const("subscribe"), "publisher": Null(), "seq": Null(),
        "receiver": Coded(ints("i", [2, 2]), CLIENTS), "topic": Coded(ints("i", [2, 0]), TOPICS),
        "payload_bytes": Const(0), "qos": Raw("uint8", bytes([1, 0])), "warmup": Const(False),
        "t_intended_ns": Null(), "t_pub_ns": Null(),
        "t_recv_ns": Raw("int64", ints("q", [3, 4])), "clock_source": Const("user"),
        "t_recv_user_ns": Raw("int64", ints("q", [3, 4]))})


def encoded(*batches: BinaryBatch, **envelope) -> bytes:
    fields = {"run_id": "c1-r0000", "agent_id": "a1", "seq": 4, "constants": CONSTANTS}
    return encode_chunk(batches=list(batches), **(fields | envelope))


def edges_of(pins: list[int], times: list[int], levels: list[int]) -> EdgeBuffers:
    return EdgeBuffers(ints("i", pins), ints("q", times), bytes(levels))


def edge_lists(chunk) -> dict[str, list[int]] | None:
    arrays = edge_arrays(chunk)
    return None if arrays is None else {name: a.to_pylist() for name, a in arrays.items()}


def read_back(data: bytes) -> dict[str, list]:
    return {name: column.to_pylist() for name, column in event_arrays(decode_chunk(data)).items()}


def test_every_column_kind_comes_back_as_the_event_schemas_values_and_types():
    data = encoded(deliveries(), subscriptions(), edges=edges_of([2], [9], [1]),
                   edges_until_ns=10)
    chunk = decode_chunk(data)
    assert (chunk.header.run_id, chunk.header.agent_id, chunk.header.seq, chunk.rows) == \
        ("c1-r0000", "a1", 4, 5)
    assert chunk.header.constants == CONSTANTS
    assert edge_lists(chunk) == {"pin": [2], "t_ns": [9], "level": [1]}
    assert chunk.header.edges_until_ns == 10
    arrays = event_arrays(chunk)
    assert {name: str(column.type) for name, column in arrays.items()} == {
        "kind": "string", "publisher": "string", "seq": "int64", "receiver": "string",
        "topic": "string", "payload_bytes": "int32", "qos": "int8", "warmup": "bool",
        "t_intended_ns": "int64", "t_pub_ns": "int64", "t_recv_ns": "int64",
        "clock_source": "string", "t_recv_user_ns": "int64"}
    assert {name: column.to_pylist() for name, column in arrays.items()} == {
        "kind": ["delivery"] * 3 + ["subscribe"] * 2,
        "publisher": ["pub-1", "pub-0", "pub-1", None, None],
        "seq": [7, 8, 2**40, None, None], "receiver": ["sub-0"] * 5,
        "topic": ["t/1", "t/0", "t/1", "t/#", "t/0"], "payload_bytes": [1000, 64, 1000, 0, 0],
        "qos": [0, 1, 2, 1, 0], "warmup": [True, False, False, False, False],
        "t_intended_ns": [10, 20, 30, None, None], "t_pub_ns": [11, 21, 31, None, None],
        "t_recv_ns": [-5, 25, 35, 3, 4],
        "clock_source": ["kernel", "user", "kernel", "user", "user"],
        "t_recv_user_ns": [None, None, None, 3, 4]}


def test_a_dictionary_shared_by_batches_is_sent_once():
    data = encoded(deliveries(), deliveries(), subscriptions())
    header = decode_chunk(data).header
    assert len(header.dictionaries) == 4   # clients, topics, sizes, clock sources
    assert sorted(map(tuple, header.dictionaries), key=len)[-1] in (CLIENTS, TOPICS)


def test_an_empty_chunk_and_an_empty_batch_decode_to_no_rows():
    assert decode_chunk(encoded()).rows == 0
    assert read_back(encoded()) == {}
    empty = deliveries().sliced(3, 3)
    assert empty.rows == 0
    assert all(values == [] for values in read_back(encoded(empty)).values())


def test_slices_are_views_that_read_back_as_those_rows_only():
    batch = deliveries()
    head, tail = batch.sliced(0, 1), batch.sliced(1, 3)
    assert (head.rows, tail.rows) == (1, 2)
    raw = tail.columns["seq"]
    assert isinstance(raw, Raw) and isinstance(raw.data, memoryview)  # no copy
    whole = read_back(encoded(batch))
    assert read_back(encoded(head, tail)) == whole
    assert read_back(encoded(tail))["seq"] == [8, 2**40]
    assert batch.sliced(2, 99).rows == 1


# -- malformed chunks: each refused with the field or column named ---------------------------

def header_and_body(data: bytes) -> tuple[dict, bytes]:
    length = struct.unpack_from("<I", data, 5)[0]
    return json.loads(data[9:9 + length]), data[9 + length:]


def rebuilt(header: dict, body: bytes, version: int = VERSION) -> bytes:
    text = json.dumps(header).encode()
    return b"MQBC" + struct.pack("<BI", version, len(text)) + text + body


def altered(change) -> bytes:
    header, body = header_and_body(encoded(deliveries()))
    change(header["segments"][0]["columns"], header)
    return rebuilt(header, body)


def test_a_truncated_chunk_names_what_is_cut_short():
    data = encoded(deliveries())
    with pytest.raises(ValueError, match=r"truncated: 6 bytes, the prefix alone is 9"):
        decode_chunk(data[:6])
    header, _ = header_and_body(data)
    with pytest.raises(ValueError, match=r"truncated: header length \d+ bytes, 10 follow"):
        decode_chunk(data[:19])
    # the body cut: the last column's bytes (clock_source's 3 codes) are missing one
    with pytest.raises(ValueError, match=r"segment 0: column 'clock_source' truncated: bytes "
                                         r"150\.\.153 of a 152-byte body"):
        decode_chunk(data[:-1])


def test_a_wrong_magic_or_version_is_refused_by_name():
    header, body = header_and_body(encoded(deliveries()))
    for version in (1, 3):   # version 1 carried its edges as JSON lists
        with pytest.raises(ValueError, match=rf"binary chunk version {version} is not "
                                             rf"supported \(this controller reads version 2\)"):
            decode_chunk(rebuilt(header, body, version=version))
    with pytest.raises(ValueError, match=r"not a binary chunk: magic b'\{\"ru'"):
        decode_chunk(json.dumps(header).encode())


def test_a_code_beyond_its_dictionary_names_the_column_and_the_code():
    batch = deliveries()
    batch.columns["topic"] = Coded(ints("i", [0, 3, 1]), TOPICS)
    with pytest.raises(ValueError, match=r"segment 0: column 'topic': code 3 is outside its "
                                         r"dictionary \(0\.\.2\)"):
        event_arrays(decode_chunk(encoded(batch)))
    batch.columns["topic"] = Coded(ints("i", [0, -1, 1]), TOPICS)
    with pytest.raises(ValueError, match=r"column 'topic': code -1 is outside"):
        event_arrays(decode_chunk(encoded(batch)))


def test_a_column_of_the_wrong_length_names_the_column_and_the_lengths():
    batch = deliveries()
    batch.columns["t_pub_ns"] = Raw("int64", ints("q", [1, 2]))
    with pytest.raises(ValueError, match=r"segment 0: column 't_pub_ns' holds 16 bytes; 3 "
                                         r"rows of 8 bytes need 24"):
        decode_chunk(encoded(batch))


def test_an_unknown_or_missing_column_is_named():
    batch = deliveries()
    batch.columns["colour"] = Const("red")
    with pytest.raises(ValueError, match=r"segment 0: unknown column 'colour'"):
        decode_chunk(encoded(batch))
    batch = deliveries()
    del batch.columns["t_pub_ns"]
    with pytest.raises(ValueError, match=r"segment 0: column 't_pub_ns' is missing"):
        decode_chunk(encoded(batch))
    batch = deliveries()
    del batch.columns["t_recv_user_ns"]   # optional: null, as in a JSON chunk
    assert "t_recv_user_ns" not in read_back(encoded(batch))   # the store fills in nulls
    assert read_back(encoded(batch, subscriptions()))["t_recv_user_ns"] == [None] * 3 + [3, 4]


def test_a_bad_kind_or_dictionary_reference_names_the_field():
    with pytest.raises(ValueError, match=r"segments\.0\.columns\.seq\.kind: Input should be"):
        decode_chunk(altered(lambda columns, _h: columns["seq"].update(kind="float16")))
    with pytest.raises(ValueError, match=r"column 'topic' uses dictionary 9; the chunk has 4"):
        decode_chunk(altered(lambda columns, _h: columns["topic"].update(dictionary=9)))
    with pytest.raises(ValueError, match=r"column 'topic' of kind dict needs codes"):
        decode_chunk(altered(lambda columns, _h: columns["topic"].pop("codes")))
    with pytest.raises(ValueError, match=r"header: agent_id: String should have at most 48"):
        decode_chunk(altered(lambda _c, header: header.update(agent_id="a" * 49)))


def test_values_that_do_not_fit_their_column_name_it():
    batch = deliveries()
    batch.columns["qos"] = Raw("int32", ints("i", [0, 1, 300]))   # qos is int8
    with pytest.raises(ValueError, match=r"segment 0: column 'qos': ArrowInvalid"):
        event_arrays(decode_chunk(encoded(batch)))
    batch = deliveries()
    batch.columns["payload_bytes"] = Coded(ints("i", [0, 0, 0]), ("big",))
    with pytest.raises(ValueError, match=r"column 'payload_bytes': Arrow"):
        event_arrays(decode_chunk(encoded(batch)))


def test_arrays_are_built_from_the_buffers_not_from_python_lists():
    arrays = event_arrays(decode_chunk(encoded(deliveries())))
    assert isinstance(arrays["t_recv_ns"], pa.Int64Array)
    assert arrays["t_recv_ns"].null_count == 0


# -- GPIO edges: binary columns behind the segments ------------------------------------------

EDGE_PINS, EDGE_TIMES, EDGE_LEVELS = [2, 3, 2, 65535], [-1, 2**62, 7, 8], [1, 1, 0, 1]


def test_edges_come_back_as_the_edge_files_types_built_on_the_bytes():
    chunk = decode_chunk(encoded(deliveries(), edges=edges_of(EDGE_PINS, EDGE_TIMES,
                                                              EDGE_LEVELS)))
    section = chunk.header.edges
    assert section is not None and section.rows == 4
    assert (section.pin.kind, section.t_ns.kind, section.level.kind) == \
        ("int32", "int64", "uint8")
    # behind the segment's columns: 3 delivery rows take 153 bytes of the body
    assert (section.pin.offset, section.t_ns.offset, section.level.offset) == \
        (153, 153 + 16, 153 + 16 + 32)
    arrays = edge_arrays(chunk)
    assert arrays is not None
    assert {name: str(a.type) for name, a in arrays.items()} == \
        {"pin": "int32", "t_ns": "int64", "level": "int8"}
    assert isinstance(arrays["t_ns"], pa.Int64Array) and arrays["t_ns"].null_count == 0
    assert edge_lists(chunk) == {"pin": EDGE_PINS, "t_ns": EDGE_TIMES, "level": EDGE_LEVELS}
    assert read_back(encoded(deliveries())) == \
        read_back(encoded(deliveries(), edges=edges_of([1], [1], [0])))   # events unchanged


def test_edges_without_events_and_no_edges_at_all():
    chunk = decode_chunk(encoded(edges=edges_of([5, 6], [10, 11], [1, 0]), edges_until_ns=12))
    assert chunk.rows == 0 and chunk.header.edges_until_ns == 12
    assert edge_lists(chunk) == {"pin": [5, 6], "t_ns": [10, 11], "level": [1, 0]}
    for edges in (None, EdgeBuffers()):   # nothing recorded: no section
        chunk = decode_chunk(encoded(deliveries(), edges=edges))
        assert chunk.header.edges is None and edge_arrays(chunk) is None


def test_edge_buffers_read_as_a_json_chunks_lists_and_refuse_unequal_columns():
    edges = edges_of(EDGE_PINS, EDGE_TIMES, EDGE_LEVELS)
    assert edges.rows == 4
    assert edges.as_lists() == {"pin": EDGE_PINS, "t_ns": EDGE_TIMES, "level": EDGE_LEVELS}
    with pytest.raises(ValueError, match=r"edges: column 't_ns' holds 24 bytes; 4 edges "
                                         r"\(level bytes\) of 8 bytes need 32"):
        EdgeBuffers(ints("i", EDGE_PINS), ints("q", EDGE_TIMES[:3]), bytes(EDGE_LEVELS))
    with pytest.raises(ValueError, match=r"edges: column 'pin' holds 12 bytes"):
        EdgeBuffers(ints("i", EDGE_PINS[:3]), ints("q", EDGE_TIMES), bytes(EDGE_LEVELS))


def with_edges(change) -> bytes:
    """A chunk of deliveries and edges whose header's edge section ``change`` alters."""
    header, body = header_and_body(encoded(deliveries(), edges=edges_of(
        EDGE_PINS, EDGE_TIMES, EDGE_LEVELS)))
    change(header["edges"])
    return rebuilt(header, body)


def test_edge_columns_of_the_wrong_length_name_the_column_and_the_lengths():
    with pytest.raises(ValueError, match=r"edges: column 'pin' holds 16 bytes; 5 edges of "
                                         r"4 bytes need 20"):
        decode_chunk(with_edges(lambda edges: edges.update(rows=5)))
    with pytest.raises(ValueError, match=r"edges: column 't_ns' holds 24 bytes; 4 edges of "
                                         r"8 bytes need 32"):
        decode_chunk(with_edges(lambda edges: edges["t_ns"].update(length=24)))


def test_an_edge_column_of_a_bad_kind_is_named():
    with pytest.raises(ValueError, match=r"edges: column 'pin' is int32, not 'int64'"):
        decode_chunk(with_edges(lambda edges: edges["pin"].update(kind="int64")))
    with pytest.raises(ValueError, match=r"edges: column 'level' is uint8, not 'bool'"):
        decode_chunk(with_edges(lambda edges: edges["level"].update(kind="bool")))
    with pytest.raises(ValueError, match=r"header: edges\.t_ns\.kind: Input should be"):
        decode_chunk(with_edges(lambda edges: edges["t_ns"].update(kind="float64")))


def test_a_malformed_edge_section_names_the_field():
    with pytest.raises(ValueError, match=r"header: edges\.level: Field required"):
        decode_chunk(with_edges(lambda edges: edges.pop("level")))
    with pytest.raises(ValueError, match=r"header: edges\.colour: Extra inputs"):
        decode_chunk(with_edges(lambda edges: edges.update(colour=[1])))
    with pytest.raises(ValueError, match=r"header: edges\.pin\.offset: Input should be "
                                         r"greater than or equal to 0"):
        decode_chunk(with_edges(lambda edges: edges["pin"].update(offset=-4)))
    # version 1's form: the edges as JSON lists
    with pytest.raises(ValueError, match=r"header: edges\.rows: Field required"):
        decode_chunk(with_edges(lambda edges: (edges.clear(), edges.update(
            pin=EDGE_PINS, t_ns=EDGE_TIMES, level=EDGE_LEVELS))))


def test_truncated_edges_name_the_column_cut_short():
    data = encoded(deliveries(), edges=edges_of(EDGE_PINS, EDGE_TIMES, EDGE_LEVELS))
    # the edges lie last: level's 4 bytes end the 205-byte body
    assert decode_chunk(data).body.nbytes == 153 + 16 + 32 + 4
    with pytest.raises(ValueError, match=r"edges: column 'level' truncated: bytes 201\.\.205 "
                                         r"of a 204-byte body"):
        decode_chunk(data[:-1])
    with pytest.raises(ValueError, match=r"edges: column 't_ns' truncated: bytes 169\.\.201 "
                                         r"of a 191-byte body"):
        decode_chunk(data[:-14])


def test_a_level_other_than_0_or_1_is_named():
    chunk = decode_chunk(encoded(edges=edges_of([2, 2], [1, 2], [1, 200])))
    with pytest.raises(ValueError, match=r"edges: column 'level': 200 is not a level "
                                         r"\(0 or 1\)"):
        edge_arrays(chunk)


def test_the_agents_side_encodes_without_pyarrow_or_numpy():
    """Agents install neither: building, slicing and encoding a chunk (and the uploader
    and the native session that do it) must not import them."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "import mqttbed.agents.native_session, mqttbed.agents.uploader\n"
        "from mqttbed.core.binary_chunk import BinaryBatch, Raw, Const, encode_chunk\n"
        "from mqttbed.core.binary_chunk import EdgeBuffers\n"
        "batch = BinaryBatch(2, {'seq': Raw('int64', bytes(16)), 'kind': Const('publish')})\n"
        "edges = EdgeBuffers(bytes(4), bytes(8), bytes(1))\n"
        "edges.as_lists()\n"
        "encode_chunk(run_id='r', agent_id='a', seq=0, batches=[batch.sliced(0, 1)],\n"
        "             constants={}, edges=edges)\n"
        "print(sorted({'pyarrow', 'numpy'} & set(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"
