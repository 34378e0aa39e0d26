"""Chunked uploads from an agent to the agent API of a real controller."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import httpx
import pyarrow.dataset as ds
import pytest

from mqttbed.agents.uploader import ChunkUploader
from mqttbed.campaigns.spec import parse_spec
from mqttbed.core.host import LocalHost

STATIC = {"agent_id": "a1", "clock_offset_ns": 0,
          "clock_offset_uncertainty_ns": 0}


def publish_event(seq: int):
    return ("publish", "pub-0", seq, None, "t", 64, 0, False, seq * 10, seq * 10 + 1, None,
            "user", None)


@contextlib.contextmanager
def uploader_to(controller, campaign_name: str) -> Iterator[tuple[ChunkUploader, str, str]]:
    """An uploader of agent a1 to a new campaign's first run on ``controller`` (100-event
    chunks, no timed flush); yields it with the campaign and run ids."""
    campaign_id = controller.engine.create_campaign(parse_spec({"name": campaign_name}))
    run_id = f"{campaign_id}-r0000"
    token = controller.engine.ctx.agent_token
    with httpx.Client(base_url=controller.url,
                      headers={"authorization": f"Bearer {token}"}) as http:
        yield (ChunkUploader(http, run_id=run_id, agent_id="a1", static_columns=STATIC,
                             chunk_events=100, interval_s=60), campaign_id, run_id)


def test_events_arrive_in_chunks_of_bounded_size_in_order(controller):
    with uploader_to(controller, "up") as (uploader, campaign_id, run_id):
        uploader.start()
        for seq in range(250):
            uploader.record(publish_event(seq))
        assert uploader.close() == 3
    table = ds.dataset(controller.layout.run_events(campaign_id, run_id)).to_table()
    assert sorted(table["seq"].to_pylist()) == list(range(250))
    assert set(table["agent_id"].to_pylist()) == {"a1"}


def test_unreachable_controller_keeps_the_events_and_says_why():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", LocalHost().free_port()))
        port = s.getsockname()[1]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
        uploader = ChunkUploader(http, run_id="r", agent_id="a1", static_columns=STATIC,
                                 chunk_events=10, interval_s=60, retry_for_s=0.25)
        for seq in range(25):
            uploader.record(publish_event(seq))
        with pytest.raises(RuntimeError, match=r"chunk 0 upload failed for 0 s \(2 attempts\): "
                                               r"ConnectError"):
            uploader.close()
    # tried at once and after 0.1 s of backoff; the next, 0.2 s later, would pass the budget
    assert uploader.buffered == 25 and uploader.chunks_sent == 0 and uploader.retries == 1


def test_a_chunk_the_controller_cannot_store_is_not_retried(controller):
    """A 4xx says retrying cannot help: the upload ends at once, naming the answer."""
    token = controller.engine.ctx.agent_token
    with httpx.Client(base_url=controller.url,
                      headers={"authorization": f"Bearer {token}"}) as http:
        uploader = ChunkUploader(http, run_id="no-such-run", agent_id="a1",
                                 static_columns=STATIC, chunk_events=10, interval_s=60)
        uploader.record(publish_event(0))
        with pytest.raises(RuntimeError, match="chunk 0 upload refused: HTTP 404: no run "
                                               "'no-such-run'"):
            uploader.close()
    assert uploader.buffered == 1 and uploader.retries == 0


def test_a_new_clock_estimate_goes_with_the_events_recorded_after_it_only(controller):
    with uploader_to(controller, "drift") as (uploader, campaign_id, run_id):
        for seq in range(5):
            uploader.record(publish_event(seq))
        uploader.update_constants({"clock_offset_ns": 7_000,
                                   "clock_offset_uncertainty_ns": 900})
        for seq in range(5, 8):
            uploader.record(publish_event(seq))
        assert uploader.close() == 2   # the update flushed the first five on their own
    table = ds.dataset(controller.layout.run_events(campaign_id, run_id)).to_table()
    by_seq = sorted(zip(table["seq"].to_pylist(), table["clock_offset_ns"].to_pylist(),
                        table["clock_offset_uncertainty_ns"].to_pylist(), strict=True))
    assert by_seq == [(seq, 0, 0) for seq in range(5)] + [(seq, 7_000, 900)
                                                        for seq in range(5, 8)]
