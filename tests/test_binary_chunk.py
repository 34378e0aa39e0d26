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
    BinaryBatch,
    Coded,
    Const,
    Null,
    Raw,
    decode_chunk,
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


def read_back(data: bytes) -> dict[str, list]:
    return {name: column.to_pylist() for name, column in event_arrays(decode_chunk(data)).items()}


def test_every_column_kind_comes_back_as_the_event_schemas_values_and_types():
    data = encoded(deliveries(), subscriptions(), edges={"pin": [2], "t_ns": [9], "level": [1]},
                   edges_until_ns=10)
    chunk = decode_chunk(data)
    assert (chunk.header.run_id, chunk.header.agent_id, chunk.header.seq, chunk.rows) == \
        ("c1-r0000", "a1", 4, 5)
    assert chunk.header.constants == CONSTANTS
    assert chunk.header.edges == {"pin": [2], "t_ns": [9], "level": [1]}
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


def rebuilt(header: dict, body: bytes, version: int = 1) -> bytes:
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
    with pytest.raises(ValueError, match=r"binary chunk version 2 is not supported"):
        decode_chunk(rebuilt(header, body, version=2))
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


def test_the_agents_side_encodes_without_pyarrow_or_numpy():
    """Agents install neither: building, slicing and encoding a chunk (and the uploader
    and the native session that do it) must not import them."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "import mqttbed.agents.native_session, mqttbed.agents.uploader\n"
        "from mqttbed.core.binary_chunk import BinaryBatch, Raw, Const, encode_chunk\n"
        "batch = BinaryBatch(2, {'seq': Raw('int64', bytes(16)), 'kind': Const('publish')})\n"
        "encode_chunk(run_id='r', agent_id='a', seq=0, batches=[batch.sliced(0, 1)],\n"
        "             constants={})\n"
        "print(sorted({'pyarrow', 'numpy'} & set(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"
