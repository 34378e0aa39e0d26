"""Binary chunks from an agent to a real controller: the native engine's column buffers
posted as bytes, split on ``chunk_events``, retried and re-queued in order, and stored
as the very rows (same schema, same live figures) the JSON path stores."""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.agents.native import engine as native
from mqttbed.agents.uploader import ChunkUploader
from mqttbed.campaigns.spec import parse_spec
from mqttbed.core.binary_chunk import (
    CONTENT_TYPE,
    BinaryBatch,
    Coded,
    Const,
    EdgeBuffers,
    Null,
    Raw,
)
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import ClientAssignment, Role

STATIC = {"agent_id": "a1", "clock_offset_ns": 0, "clock_offset_uncertainty_ns": 0}


def publishes(first: int, rows: int) -> BinaryBatch:
    """``rows`` publish events of seqs ``first``..., publisher and topic by client code."""
    seqs = array("q", range(first, first + rows)).tobytes()
    clients = array("i", [seq % 2 for seq in range(first, first + rows)]).tobytes()
    return BinaryBatch(rows, {
        "kind": Const("publish"), "publisher": Coded(clients, ("pub-0", "pub-1")),
        "seq": Raw("int64", seqs), "receiver": Null(), "topic": Coded(clients, ("t/0", "t/1")),
        "payload_bytes": Coded(clients, (64, 128)), "qos": Coded(clients, (0, 1)),
        "warmup": Raw("bool", bytes(rows)), "t_intended_ns": Raw("int64", seqs),
        "t_pub_ns": Raw("int64", seqs), "t_recv_ns": Null(), "clock_source": Const("user"),
        "t_recv_user_ns": Null()})


class Flaky(httpx.BaseTransport):
    """Real HTTP to the controller, except the posts numbered in ``fail`` (0 = first):
    those get no answer (``"drop"``) or a 503, without reaching it."""

    def __init__(self, fail: dict[int, str]):
        self._real = httpx.HTTPTransport()
        self._fail = fail
        self.posts: list[str] = []   # content-type of each post, sent or not

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        number = len(self.posts)
        self.posts.append(request.headers["content-type"])
        if self._fail.get(number) == "drop":
            raise httpx.ConnectError("dropped by the test", request=request)
        if self._fail.get(number) == "503":
            return httpx.Response(503, json={"detail": "busy"}, request=request)
        return self._real.handle_request(request)

    def close(self) -> None:
        self._real.close()


@contextlib.contextmanager
def uploader_to(controller, campaign_name: str, chunk_events: int = 100,
                transport: httpx.BaseTransport | None = None, **options
                ) -> Iterator[tuple[ChunkUploader, str, str]]:
    campaign_id = controller.engine.create_campaign(parse_spec({"name": campaign_name}))
    run_id = f"{campaign_id}-r0000"
    token = controller.engine.ctx.agent_token
    with httpx.Client(base_url=controller.url, transport=transport,
                      headers={"authorization": f"Bearer {token}"}) as http:
        yield (ChunkUploader(http, run_id=run_id, agent_id="a1", static_columns=STATIC,
                             chunk_events=chunk_events, interval_s=60, **options),
               campaign_id, run_id)


def stored_files(controller, campaign_id: str, run_id: str) -> list[Path]:
    return sorted(controller.layout.run_events(campaign_id, run_id).glob("*.parquet"))


def test_binary_batches_go_as_binary_chunks_of_bounded_size_after_the_json_ones(controller):
    transport = Flaky({})
    with uploader_to(controller, "bin", transport=transport) as (uploader, campaign_id, run_id):
        uploader.record(("subscribe", None, None, "sub-0", "t/#", 0, 0, False, None, None, 5,
                         "user", 5))
        for first, rows in ((0, 120), (120, 50), (170, 40)):
            uploader.record_binary(publishes(first, rows))
        assert uploader.buffered == 211
        assert uploader.close() == 4
        assert uploader.buffered == 0
    assert transport.posts == ["application/json"] + [CONTENT_TYPE] * 3
    files = stored_files(controller, campaign_id, run_id)
    assert [f.name for f in files] == [f"a1-{seq:06d}.parquet" for seq in range(4)]
    seqs = [pq.read_table(f)["seq"].to_pylist() for f in files]
    assert seqs == [[None], list(range(100)), list(range(100, 200)), list(range(200, 210))]
    table = pq.read_table(files[2])
    assert table.column("publisher").to_pylist()[:2] == ["pub-0", "pub-1"]
    assert table.column("qos").to_pylist()[:2] == [0, 1]
    assert set(table.column("agent_id").to_pylist()) == {"a1"}


def test_an_unanswered_binary_chunk_is_requeued_in_order_and_sent_by_the_next_flush(controller):
    transport = Flaky({1: "drop"})   # the second chunk's only attempt gets no answer
    with uploader_to(controller, "requeue", transport=transport,
                     retry_for_s=0.05) as (uploader, campaign_id, run_id):
        uploader.record_binary(publishes(0, 150))
        uploader.record_binary(publishes(150, 100))
        with pytest.raises(RuntimeError, match=r"chunk 1 upload failed for 0 s \(1 attempts\): "
                                               r"ConnectError: dropped by the test"):
            uploader.update_constants({})   # flushes: chunk 0 stored, chunk 1 not
        assert uploader.chunks_sent == 1 and uploader.buffered == 150
        uploader.record_binary(publishes(250, 10))
        assert uploader.close() == 3
    files = stored_files(controller, campaign_id, run_id)
    seqs = [pq.read_table(f)["seq"].to_pylist() for f in files]
    assert seqs == [list(range(100)), list(range(100, 200)), list(range(200, 260))]


def test_a_busy_controller_gets_the_same_binary_chunk_again(controller):
    transport = Flaky({0: "503"})
    with uploader_to(controller, "busy", transport=transport) as (uploader, campaign_id, run_id):
        uploader.record_binary(publishes(0, 30))
        assert uploader.close() == 1
        assert uploader.retries == 1
    assert transport.posts == [CONTENT_TYPE, CONTENT_TYPE]
    (file,) = stored_files(controller, campaign_id, run_id)
    assert pq.read_table(file)["seq"].to_pylist() == list(range(30))


def test_a_refused_binary_chunk_ends_the_uploads_and_keeps_its_events(controller):
    with uploader_to(controller, "refused") as (uploader, _campaign_id, run_id):
        batch = publishes(0, 5)
        batch.columns["topic"] = Coded(array("i", [0, 1, 2, 0, 1]).tobytes(), ("t/0", "t/1"))
        uploader.record_binary(batch)
        with pytest.raises(RuntimeError, match=r"chunk 0 upload refused: HTTP 422: binary "
                                               r"chunk: segment 0: column 'topic': code 2 is "
                                               r"outside its dictionary \(0\.\.1\)"):
            uploader.close()
        assert uploader.buffered == 5 and uploader.retries == 0
    token = controller.engine.ctx.agent_token
    response = httpx.post(f"{controller.url}/agent/v1/runs/{run_id}/binary-chunks",
                          content=b"{}", headers={"authorization": f"Bearer {token}",
                                                  "content-type": "application/json"})
    assert response.status_code == 415 and CONTENT_TYPE in response.json()["detail"]


# -- end to end: the native engine's events, both ways --------------------------------------

def fan_out() -> list[ClientAssignment]:
    pub = ClientAssignment(client_id="pub-0", role=Role.PUBLISHER, topic="bin/x", qos=1,
                           gpio_pin=2, payload_bytes=100, rate_hz=500, messages=60,
                           warmup_messages=3)
    subs = [ClientAssignment(client_id=f"sub-{j}", role=Role.SUBSCRIBER, topic="bin/#", qos=1,
                             gpio_pin=3 + j, warmup_messages=3, expected_messages=60,
                             subscribe_rank=j) for j in range(2)]
    return [pub, *subs]


def run_closed(session: MqttSession) -> None:
    """Connect ``session``, run it (5 s at most), close it."""
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + 5_000_000_000, abort=lambda: False)
    finally:
        session.close()


def ordered(table: pa.Table) -> pa.Table:
    return table.sort_by([("kind", "ascending"), ("receiver", "ascending"),
                          ("seq", "ascending"), ("topic", "ascending")])


@pytest.mark.integration  # Mosquitto
def test_native_events_stored_from_binary_chunks_equal_the_json_paths(broker, controller,
                                                                      monkeypatch):
    """One engine run recorded as binary batches, its GPIO edges kept as the engine's
    bytes; the same engine tables also turned into the list path's columns (the session's
    own code for them) and its edges into a JSON chunk's lists. Both uploaded, both
    stored: equal rows, equal edges, equal schemas, equal live figures; and the edges are
    the engine's edge table, every one of them."""
    tables: list[tuple[int, dict[str, bytes]]] = []
    take_bytes = native.Engine.take_bytes

    def keeping(engine: native.Engine, table: int, columns: Sequence[str] | None = None
                ) -> tuple[int, dict[str, bytes]]:
        rows, taken = take_bytes(engine, table, columns)
        if rows:
            tables.append((table, taken))
        return rows, taken

    monkeypatch.setattr(native.Engine, "take_bytes", keeping)
    binary: list[BinaryBatch] = []
    gpio = VirtualGpio()
    session = MqttSession(broker, fan_out(), gpio, lambda _e: None,
                          record_binary=binary.append)
    run_closed(session)
    assert session.counts() == (60, 120)
    native_session = session._native
    assert native_session is not None
    to_lists = {native.T_PUBLISH: native_session._publish_columns,
                native.T_DELIVERY: native_session._delivery_columns,
                native.T_SUBSCRIBE: native_session._subscribe_columns}
    lists = [to_lists[table](native.as_lists(table, columns)) for table, columns in tables
             if table in to_lists]
    # the engine's edge table as the engine's own list conversion reads it
    engine_edges: dict[str, list[int]] = {"pin": [], "t": [], "level": []}
    for table, columns in tables:
        if table == native.T_EDGE:
            for name, values in native.as_lists(table, columns).items():
                engine_edges[name].extend(values)
    edges = gpio.edge_buffers()
    assert edges.rows == 60 + 120   # a toggle per publish and per delivery

    stored = []
    for name, record in (("via-binary", "binary"), ("via-json", "lists")):
        transport = Flaky({})
        handed = [edges]   # the GPIO log hands its edges over once
        with uploader_to(controller, name, chunk_events=50, transport=transport,
                         edges=lambda handed=handed: handed.pop() if handed else EdgeBuffers()
                         ) as (uploader, campaign_id, run_id):
            for batch in binary if record == "binary" else lists:
                (uploader.record_binary if record == "binary" else uploader.record_columns)(
                    batch)  # type: ignore[operator]
            uploader.close()
        assert set(transport.posts) == {CONTENT_TYPE if record == "binary"
                                        else "application/json"}
        files = stored_files(controller, campaign_id, run_id)
        edge_files = sorted((controller.layout.gpio_edges / f"campaign_id={campaign_id}"
                             / f"run_id={run_id}").glob("*.parquet"))
        assert [f.name for f in edge_files] == ["a1-000000.parquet"]   # with the first
        stored.append((pa.concat_tables(pq.read_table(f) for f in files),
                       controller.live.tally(campaign_id, run_id).figures(),
                       pq.read_table(edge_files[0])))
    (via_binary, live_binary, edges_binary), (via_json, live_json, edges_json) = stored
    assert edges_binary.schema.equals(edges_json.schema)
    assert edges_binary.equals(edges_json)
    assert edges_binary.to_pydict() == {"agent_id": ["a1"] * 180, "pin": engine_edges["pin"],
                                        "t_ns": engine_edges["t"],
                                        "level": engine_edges["level"]}
    assert sorted(set(engine_edges["pin"])) == [2, 3, 4]
    assert via_binary.num_rows == 60 + 120 + 2
    assert via_binary.schema.equals(via_json.schema)
    assert ordered(via_binary).equals(ordered(via_json))
    assert set(via_binary["clock_source"].to_pylist()) <= {"user", "kernel"}
    assert (live_binary.messages_sent, live_binary.deliveries, live_binary.chunks) == \
        (live_json.messages_sent, live_json.deliveries, live_json.chunks) == (57, 114, 4)
    assert list(live_binary.latency.counts) == list(live_json.latency.counts)
    assert list(live_binary.send_lag.counts) == list(live_json.send_lag.counts)


@pytest.mark.integration  # Mosquitto
def test_deliveries_from_a_foreign_publisher_index_go_the_list_way_named_one_at_a_time(broker):
    """A publisher index beyond any dictionary (another agent's, 2**21): that drain's
    deliveries are named one at a time on the list path; the rest stay binary."""
    foreign = 1 << 21
    clients = fan_out()[:2]
    clients[0] = clients[0].model_copy(update={"publisher_index": foreign, "messages": 20})
    clients[1] = clients[1].model_copy(update={"expected_messages": 20})
    binary: list[BinaryBatch] = []
    lists: list[dict[str, list]] = []
    session = MqttSession(broker, clients, VirtualGpio(), lambda _e: None,
                          record_binary=binary.append, record_columns=lists.append)
    run_closed(session)
    assert session.counts() == (20, 20)
    kinds = [batch.columns["kind"] for batch in binary]
    assert {kind.value for kind in kinds if isinstance(kind, Const)} == {"publish", "subscribe"}
    assert sum(b.rows for b in binary if b.columns["kind"] == Const("publish")) == 20
    publishers = [name for batch in lists for name in batch["publisher"]]
    assert publishers == [f"pub-{foreign}"] * 20
    assert {kind for batch in lists for kind in batch["kind"]} == {"delivery"}


def test_a_binary_chunk_posted_twice_is_stored_once(controller):
    from mqttbed.core.binary_chunk import encode_chunk

    campaign_id = controller.engine.create_campaign(parse_spec({"name": "twice"}))
    run_id = f"{campaign_id}-r0000"
    body = encode_chunk(run_id=run_id, agent_id="a1", seq=0, batches=[publishes(0, 7)],
                        constants=STATIC)
    headers = {"authorization": f"Bearer {controller.engine.ctx.agent_token}",
               "content-type": CONTENT_TYPE}
    url = f"{controller.url}/agent/v1/runs/{run_id}/binary-chunks"
    answers = [httpx.post(url, content=body, headers=headers).json() for _ in range(2)]
    assert answers == [{"stored": True}, {"stored": False}]
    (file,) = stored_files(controller, campaign_id, run_id)
    assert pq.read_table(file).num_rows == 7
    other = httpx.post(f"{controller.url}/agent/v1/runs/{campaign_id}-r0001/binary-chunks",
                       content=body, headers=headers)
    assert other.status_code == 422 and other.json()["detail"] == "run id mismatch"
