"""``GET /metrics``: the live tallies against hand-computed chunks, the Prometheus text a
controller serves, and a scrape while a real campaign runs against Mosquitto."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mqttbed.controller.documents import CampaignUpdate, ResultsReady, RunUpdate
from mqttbed.controller.live import (
    LATENCY_BUCKETS_S,
    FixedHistogram,
    LiveFigures,
    chunk_figures,
)
from mqttbed.controller.states import CampaignStatus, RunState
from mqttbed.controller.storage import DataLayout, write_broker_samples
from mqttbed.core.events import EVENT_COLUMNS
from mqttbed.core.protocol import ResultChunk
from mqttbed.core.samples import BrokerResourceSample

US = 1_000

# One row per event: the columns a test sets; the rest take these values.
DEFAULTS: dict[str, Any] = {
    "kind": "delivery", "agent_id": "a1", "publisher": "pub-0", "seq": 0, "receiver": None,
    "topic": "t/a", "payload_bytes": 64, "qos": 0, "warmup": False, "t_intended_ns": None,
    "t_pub_ns": None, "t_recv_ns": None, "clock_source": "user", "clock_offset_ns": 0,
    "clock_offset_uncertainty_ns": 0, "t_recv_user_ns": None, "retain": None}


def chunk(rows: list[dict[str, Any]], seq: int = 0, run_id: str = "c1-r0000",
          constants: dict[str, Any] | None = None) -> ResultChunk:
    constants = constants or {}
    columns = {name: [{**DEFAULTS, **row}[name] for row in rows]
               for name in EVENT_COLUMNS if name not in constants}
    return ResultChunk(run_id=run_id, agent_id="a1", seq=seq, columns=columns,
                       constants=constants)


def subscribe(receiver: str, topic_filter: str) -> dict[str, Any]:
    return {"kind": "subscribe", "receiver": receiver, "topic": topic_filter, "t_recv_ns": 5,
            "publisher": None, "seq": None}


def publish(topic: str, t_intended_ns: int | None, t_pub_ns: int, warmup: bool = False
            ) -> dict[str, Any]:
    return {"kind": "publish", "topic": topic, "t_intended_ns": t_intended_ns,
            "t_pub_ns": t_pub_ns, "warmup": warmup}


def delivery(latency_ns: int, receiver: str = "sub-0", warmup: bool = False
             ) -> dict[str, Any]:
    t_pub = 1_000_000_000
    return {"kind": "delivery", "receiver": receiver, "t_pub_ns": t_pub,
            "t_recv_ns": t_pub + latency_ns, "warmup": warmup}


# sub-0 takes t/a; sub-1 takes t/# and t/a (one delivery per message: MQTT 3.1.1 3.3.5);
# sub-2 takes a topic nobody publishes on.
SUBSCRIPTIONS = [subscribe("sub-0", "t/a"), subscribe("sub-1", "t/#"),
                 subscribe("sub-1", "t/a"), subscribe("sub-2", "other")]
# 3 measured publishes on t/a and 2 on t/b (one of them closed loop: no intended time),
# one warm-up publish: expected 3 x 2 + 2 x 1 = 8 deliveries.
PUBLISHES = [publish("t/a", 1000, 1000), publish("t/a", 2000, 2000 + 5 * US),
             publish("t/a", 3000, 3000 + 2000 * US), publish("t/b", 4000, 4000 + 20 * US),
             publish("t/b", None, 9000), publish("t/a", 0, 7 * 10**9, warmup=True)]
# 6 measured deliveries: 40 us, exactly 50 us (a bound: in its bucket), -1 us (clocks),
# 100 us, 3 ms, 20 s (above every bound); the warm-up one is left out.
LATENCIES_NS = [40 * US, 50 * US, -1 * US, 100 * US, 3000 * US, 20 * 10**9]
DELIVERIES = [delivery(n) for n in LATENCIES_NS] + [delivery(7 * US, warmup=True)]


def test_a_chunk_folds_into_hand_computed_counts_and_buckets():
    figures = chunk_figures(chunk(SUBSCRIPTIONS + PUBLISHES + DELIVERIES))
    assert figures.messages_sent == 5
    assert figures.sent_by_topic == {"t/a": 3, "t/b": 2}
    assert figures.deliveries == 6
    assert figures.subscriptions == {("sub-0", "t/a"), ("sub-1", "t/#"), ("sub-1", "t/a"),
                                     ("sub-2", "other")}
    cumulative = dict(figures.latency.cumulative())
    assert cumulative[0.00005] == 3          # -1 us, 40 us, 50 us
    assert cumulative[0.0001] == 4           # + 100 us
    assert cumulative[0.0025] == 4
    assert cumulative[0.005] == 5            # + 3 ms
    assert cumulative[10.0] == 5
    assert cumulative[math.inf] == 6         # + 20 s
    assert figures.latency.sum_ns == sum(LATENCIES_NS)
    assert figures.latency.max_ns == 20 * 10**9
    # send lags 0, 5 us, 2 ms, 20 us; the closed-loop publish has none
    lags = dict(figures.send_lag.cumulative())
    assert lags[0.00001] == 2 and lags[0.00005] == 3 and lags[0.001] == 3
    assert lags[0.005] == 4 and lags[math.inf] == 4
    assert figures.send_lag.sum_ns == (5 + 2000 + 20) * US
    assert figures.send_lag.max_ns == 2000 * US


def test_chunks_of_one_run_add_up_and_lost_is_expected_minus_received(tmp_path):
    live = LiveFigures(DataLayout(tmp_path))
    # a delivery chunk may come before the chunk with the subscriptions and publishes
    live.chunk_stored("c1", chunk(DELIVERIES, seq=0))
    (early,) = live.runs()
    assert early.deliveries == 6 and early.deliveries_expected == 0 and early.lost == 0
    live.chunk_stored("c1", chunk(PUBLISHES, seq=1))
    (no_subscriber_yet,) = live.runs()   # each topic's reach (none) is remembered ...
    assert no_subscriber_yet.messages_sent == 5 and no_subscriber_yet.deliveries_expected == 0
    live.chunk_stored("c1", chunk(SUBSCRIPTIONS, seq=2))   # ... until a subscription comes
    (run,) = live.runs()
    assert (run.campaign_id, run.run_id, run.chunks) == ("c1", "c1-r0000", 3)
    assert run.messages_sent == 5 and run.deliveries_expected == 8
    assert run.deliveries == 6 and run.lost == 2
    assert run.latency.count == 6 and run.send_lag.count == 4


def test_constant_columns_count_like_per_row_ones(tmp_path):
    rows = [{"receiver": "sub-0", "t_pub_ns": 10, "t_recv_ns": 10 + 80 * US}] * 4
    as_constants = chunk(rows, constants={"kind": "delivery", "warmup": False,
                                          "clock_offset_ns": 0})
    figures = chunk_figures(as_constants)
    assert figures.deliveries == 4
    assert dict(figures.latency.cumulative())[0.0001] == 4
    warm = chunk(rows, constants={"kind": "delivery", "warmup": True})
    assert chunk_figures(warm).deliveries == 0


def test_a_chunk_that_cannot_be_folded_is_left_out_not_refused(tmp_path, caplog):
    live = LiveFigures(DataLayout(tmp_path))
    broken = chunk([delivery(5)])
    broken.columns["t_recv_ns"] = ["late"]
    live.chunk_stored("c1", broken)   # no exception: the chunk is stored all the same
    assert live.runs() == []
    assert "left out of the live figures" in caplog.text


def test_run_states_the_last_broker_sample_and_analysis_times_follow_the_documents(tmp_path):
    now = [0]
    layout = DataLayout(tmp_path)
    live = LiveFigures(layout, kept_runs=2, clock=lambda: now[0])
    for ordinal in range(3):
        live.on_document(RunUpdate("c1", f"c1-r000{ordinal}", ordinal, 3, {}, 0,
                                   RunState.DEPLOYING))
    assert [r.run_id for r in live.runs()] == ["c1-r0001", "c1-r0002"]   # the oldest went
    # a run the controller did not see start (interrupted by a restart) gets no series
    live.on_document(RunUpdate("c1", "c1-r0000", 0, 3, {}, 0, RunState.INTERRUPTED))
    assert [r.run_id for r in live.runs()] == ["c1-r0001", "c1-r0002"]
    samples = [BrokerResourceSample(t_ns=t, cpu_percent=cpu, rss_bytes=rss, bytes_recv=t,
                                 bytes_sent=2 * t, processes=1)
               for t, cpu, rss in ((1, 10.0, 1000), (2, 150.0, 5000))]
    write_broker_samples(layout, "c1", "c1-r0002", samples)
    live.on_document(RunUpdate("c1", "c1-r0002", 2, 3, {}, 0, RunState.DONE))
    ended = live.runs()[-1]
    assert ended.state == RunState.DONE and ended.broker == samples[-1]
    # the broker of the run under way, read at each scrape
    live.running_broker = lambda: ("c1-r0001", samples[0])
    assert live.runs()[0].broker == samples[0]
    live.on_document(CampaignUpdate("c1", CampaignStatus.ANALYSING))
    now[0] = 12 * 10**9
    live.on_document(ResultsReady("c1", tmp_path / "s.json", tmp_path / "s.parquet",
                                  stats=None))  # type: ignore[arg-type]
    live.on_document(CampaignUpdate("c1", CampaignStatus.DONE))  # ends nothing more
    times = live.analysis_times()
    assert times.count == 1 and times.sum_ns == 12 * 10**9
    assert dict(times.cumulative())[10.0] == 0 and dict(times.cumulative())[20.0] == 1


def test_histogram_bounds_must_rise():
    with pytest.raises(ValueError, match=r"must rise strictly: \[0.1, 0.05\]"):
        FixedHistogram((0.1, 0.05))


# -- the text a controller serves ------------------------------------------------------


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples_of(family: Any, run_id: str | None = None, suffix: str = "") -> list[Any]:
    return [s for s in family.samples if s.name == family.name + suffix
            and (run_id is None or s.labels.get("run") == run_id)]


def check_histogram(family: Any, run_id: str | None) -> list[tuple[float, float]]:
    """The run's buckets, checked: cumulative, +Inf last and equal to _count; returned."""
    buckets = [(float(s.labels["le"]), s.value) for s in samples_of(family, run_id, "_bucket")]
    bounds = [b for b, _ in buckets]
    assert bounds == sorted(bounds) and bounds[-1] == math.inf
    counts = [c for _, c in buckets]
    assert counts == sorted(counts), f"buckets not cumulative: {buckets}"
    (count,) = samples_of(family, run_id, "_count")
    assert counts[-1] == count.value
    return buckets


def test_the_controller_serves_the_tallies_in_prometheus_text(tmp_path):
    from fastapi.testclient import TestClient

    from mqttbed.api.app import create_app
    from mqttbed.controller.controller import create_controller
    from mqttbed.controller.tokens import TokenRole, create_token
    from mqttbed.core.settings import Settings

    controller = create_controller(Settings(data_dir=tmp_path / "data"),
                                   controller_url="http://127.0.0.1:9")
    token = create_token(controller.sessions, "scraper", TokenRole.USER)
    agent_token = create_token(controller.sessions, "pi", TokenRole.AGENT)
    controller.live.chunk_stored("c1", chunk(SUBSCRIPTIONS + PUBLISHES + DELIVERIES))
    with TestClient(create_app(controller, run_campaigns=False)) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"authorization": "Bearer nope"}
                          ).status_code == 401
        assert client.get("/metrics", headers={"authorization": f"Bearer {agent_token}"}
                          ).status_code == 403
        answer = client.get("/metrics", headers={"authorization": f"Bearer {token}"})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    found = families(answer.text)
    (deliveries,) = samples_of(found["mqttbed_run_deliveries"], "c1-r0000", "_total")
    assert deliveries.value == 6 and deliveries.labels["campaign"] == "c1"
    (lost,) = samples_of(found["mqttbed_run_lost_deliveries"], "c1-r0000")
    assert lost.value == 2
    buckets = check_histogram(found["mqttbed_run_latency_seconds"], "c1-r0000")
    assert [b for b, _ in buckets] == [*LATENCY_BUCKETS_S, math.inf]
    assert dict(buckets)[0.005] == 5
    (total,) = samples_of(found["mqttbed_run_latency_seconds"], "c1-r0000", "_sum")
    assert total.value == pytest.approx(sum(LATENCIES_NS) / 1e9)
    runs = {s.labels["state"]: s.value for s in samples_of(found["mqttbed_runs"])}
    assert set(runs) == {str(s) for s in RunState} and sum(runs.values()) == 0
    (queued,) = samples_of(found["mqttbed_campaigns_queued"])
    assert queued.value == 0
    check_histogram(found["mqttbed_analysis_duration_seconds"], None)


# -- a scrape while a real campaign runs -------------------------------------------------

LIVE_SPEC = {"name": "metrics-live", "agents": {"count": 1},
             "workload": {"subscribers": 2, "rate_hz": 200, "messages": 1200,
                          "warmup_messages": 20}}


def scrape(http: Any) -> dict[str, Any]:
    answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    return families(answer.text)


def run_value(found: dict[str, Any], name: str, run_id: str, suffix: str = "") -> float | None:
    if name not in found:
        return None
    values = samples_of(found[name], run_id, suffix)
    return values[0].value if values else None


def run_state(found: dict[str, Any], run_id: str) -> str | None:
    states = [s.labels["state"] for s in samples_of(found["mqttbed_run_state"], run_id)]
    return states[0] if states else None


@pytest.mark.integration
@pytest.mark.system
@pytest.mark.parallel
def test_scrapes_while_a_campaign_runs_follow_its_deliveries_to_the_analysed_figures(
        tmp_path):
    from tests.conftest import Served

    served = Served(tmp_path / "data")
    while_running: list[tuple[float, float, float | None]] = []   # deliveries, rss, cpu
    with served.server:
        with served.client(token=None) as anonymous:
            assert anonymous.get("/metrics").status_code == 401
        with served.client() as http:
            campaign_id = http.post("/api/v1/campaigns", json=LIVE_SPEC).json()["id"]
            assert http.post(f"/api/v1/campaigns/{campaign_id}/start").status_code == 200
            run_id = f"{campaign_id}-r0000"
            deadline = time.monotonic() + 240
            while http.get(f"/api/v1/campaigns/{campaign_id}").json()["status"] != "done":
                assert time.monotonic() < deadline, "campaign did not finish in 240 s"
                found = scrape(http)
                if run_state(found, run_id) == "running":
                    while_running.append((
                        run_value(found, "mqttbed_run_deliveries", run_id, "_total") or 0,
                        run_value(found, "mqttbed_run_broker_resident_memory_bytes", run_id)
                        or 0,
                        run_value(found, "mqttbed_run_broker_cpu_ratio", run_id)))
                time.sleep(0.4)
            stats = http.get(f"/api/v1/campaigns/{campaign_id}/stats").json()
            final = scrape(http)
    # the counter grew between scrapes while the run measured, and never went back
    counts = [d for d, _, _ in while_running]
    assert counts == sorted(counts), counts
    assert len({c for c in counts if c > 0}) >= 2, f"no growth seen while running: {counts}"
    assert all(rss > 0 for _, rss, _ in while_running[1:]), while_running
    assert any(cpu is not None for _, _, cpu in while_running), while_running
    # at the end, the live counts are the analysed ones of the run (one machine: no
    # duplicates or unexpected deliveries from Mosquitto at QoS 0, so every copy counted
    # live is one unique expected delivery; the test says so rather than assume it)
    (analysed,) = stats["runs"]
    assert analysed["duplicates"] == 0 and analysed["deliveries_unexpected"] == 0, analysed
    assert run_state(final, run_id) == "done"
    assert run_value(final, "mqttbed_run_deliveries", run_id, "_total") == \
        analysed["deliveries_received"] > 0
    assert run_value(final, "mqttbed_run_messages_sent", run_id, "_total") == \
        analysed["messages_sent"] == 1180   # 20 warm-up
    assert run_value(final, "mqttbed_run_deliveries_expected", run_id, "_total") == \
        analysed["deliveries_expected"] == 2360
    assert run_value(final, "mqttbed_run_lost_deliveries", run_id) == analysed["lost"]
    # the latency histogram holds the analysed latencies: one agent, so both sides' clock
    # offsets are one and cancel; same count, same sum, p50 inside the bucket it names
    latency = final["mqttbed_run_latency_seconds"]
    buckets = check_histogram(latency, run_id)
    assert buckets[-1][1] == analysed["latency_us"]["count"]
    (total,) = samples_of(latency, run_id, "_sum")
    assert total.value == pytest.approx(
        analysed["latency_us"]["mean"] * analysed["latency_us"]["count"] / 1e6, rel=1e-6)
    half = buckets[-1][1] / 2
    lower = max([b for b, c in buckets if c < half], default=0.0)
    upper = min(b for b, c in buckets if c >= half)
    assert lower <= analysed["latency_us"]["p50"] / 1e6 <= upper, (buckets, analysed)
    check_histogram(final["mqttbed_run_send_lag_seconds"], run_id)
    (analyses,) = samples_of(final["mqttbed_analysis_duration_seconds"], None, "_count")
    assert analyses.value == 1
    runs = {s.labels["state"]: s.value for s in samples_of(final["mqttbed_runs"])}
    assert runs["done"] == 1 and sum(runs.values()) == 1


def test_stored_chunks_reach_the_live_figures_once_a_retried_upload_adds_nothing(controller):
    from mqttbed.campaigns.spec import parse_spec

    campaign_id = controller.engine.create_campaign(parse_spec(
        {"name": "uploads", "workload": {"subscribers": 1, "messages": 30}}))
    run_id = f"{campaign_id}-r0000"
    first = chunk(SUBSCRIPTIONS + PUBLISHES, seq=0, run_id=run_id)
    second = chunk(DELIVERIES, seq=1, run_id=run_id)
    assert controller.chunks.store(first) and controller.chunks.store(second)
    assert not controller.chunks.store(second)   # the agent's retry: stored once
    (run,) = controller.live.runs()
    assert (run.campaign_id, run.run_id, run.chunks) == (campaign_id, run_id, 2)
    assert run.deliveries == 6 and run.deliveries_expected == 8 and run.lost == 2
