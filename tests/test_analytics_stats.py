"""Campaign stats from Spark match an independent plain-Python computation.

The dataset is built by hand: two points of two done runs and one failed run each side,
a point whose only run failed, two publishers, three subscribers with exact, ``+`` and
``#`` filters, warm-up messages, losses, duplicates, reordering, clock offsets on two
agents, a delivery whose publish record is missing, plus another campaign and an
unlisted run that must not leak in. The reference figures below are computed from the
same rows with loops and numpy, following the definitions in mqttbed.analytics.figures.
Each publisher is a stream of a message mix of its own: a stream's reference figures are
those of the rows of its publishers (and every subscription).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("pyspark")

from mqttbed.analytics.confidence import bootstrap_interval  # noqa: E402
from mqttbed.analytics.connections import ConnectTimes  # noqa: E402
from mqttbed.analytics.figures import SKETCH_LEVELS, QuantileSketch  # noqa: E402
from mqttbed.analytics.results_files import write_stats  # noqa: E402
from mqttbed.analytics.series import TIMELINE_BIN_S  # noqa: E402
from mqttbed.analytics.stats import (  # noqa: E402
    RunInfo,
    StreamInfo,
    compute_campaign_stats,
)
from mqttbed.analytics.topics import topic_filter_regex  # noqa: E402
from mqttbed.controller.analysis import pooled_generators  # noqa: E402
from mqttbed.core.events import EVENT_COLUMNS, arrow_schema  # noqa: E402
from mqttbed.core.protocol import GeneratorReport  # noqa: E402
from mqttbed.core.run_record import RunRecord  # noqa: E402
from mqttbed.core.sections import (  # noqa: E402
    Agreed,
    BackendSection,
    Distribution,
    SectionBlock,
)

CAMPAIGN = "camp-1"
T0 = 5_000_000_000_000
MS = 1_000_000
WARMUP = 2
MESSAGES = 10
TOPICS = {"pub-0": "plant/line1/temp", "pub-1": "plant/line2/temp"}
# Clock offsets: corrected time = raw time - offset.
OFFSETS = {"pub-0": 0, "pub-1": -40_000, "sub-0": 0, "sub-1": 2_500_000, "sub-2": 0}
SUBSCRIPTIONS = [("sub-0", "plant/line1/temp"), ("sub-1", "plant/+/temp"), ("sub-2", "plant/#"),
                 ("sub-0", "other/#")]

# The message mix: a stream per publisher, named apart from its topic.
STREAMS = (StreamInfo("line1", TOPICS["pub-0"], 100, ("pub-0",)),
           StreamInfo("line2", TOPICS["pub-1"], 65_536, ("pub-1",)))

# Each run's connections, phase by phase (ns, Done.connections): r1's over TLS, r2's
# plain, one of them without a CONNACK; r3's agents timed none; r4 failed after timing its.
CONNECTS = {
    "r1": tuple(ConnectTimes(tcp_ns=90_000 + 7_000 * i, tls_ns=1_100_000 + 50_000 * i,
                             connack_ns=300_000 + 11_000 * i) for i in range(5)),
    "r2": (ConnectTimes(tcp_ns=70_000, connack_ns=250_000), ConnectTimes(tcp_ns=75_000),
           ConnectTimes(tcp_ns=80_000, connack_ns=900_000)),
    "r4": (ConnectTimes(tcp_ns=60_000, connack_ns=5_000_000),),
}

RUNS = [
    RunInfo("r1", 0, {"qos": 1}, 0, "done", "mosquitto", warmup_messages=WARMUP,
            streams=STREAMS, connections=CONNECTS["r1"]),
    # r2's second agent could not keep its publishers' rate
    RunInfo("r2", 0, {"qos": 1}, 1, "done", "mosquitto", warmup_messages=WARMUP,
            streams=STREAMS, generator=pooled_generators(RunRecord(generators={
                "agent-1": GeneratorReport(
                    open_loop_publishers=1, requested_msgs_per_s=100, achieved_msgs_per_s=99,
                    send_lag_max_ns=2_000_000, mqtt_client="lean", kernel_deliveries=40,
                    nofile_limit=1024),
                "agent-2": GeneratorReport(
                    open_loop_publishers=1, requested_msgs_per_s=100, achieved_msgs_per_s=60,
                    send_lag_max_ns=90_000_000, publishers_behind=["pub-1"], rate_kept=False,
                    mqtt_client="lean", kernel_deliveries=2, user_deliveries=1,
                    nofile_limit=4096)})), connections=CONNECTS["r2"]),
    RunInfo("r3", 1, {"qos": 2}, 0, "done", "mosquitto", warmup_messages=WARMUP,
            streams=STREAMS),
    RunInfo("r4", 1, {"qos": 2}, 1, "failed", "mosquitto", reason="agent sub-1 lost",
            warmup_messages=WARMUP, streams=STREAMS, connections=CONNECTS["r4"]),
    RunInfo("r5", 2, {"qos": 0}, 0, "failed", "mosquitto", reason="broker did not start",
            streams=STREAMS),
]


# -- the hand-made dataset ------------------------------------------------------------


def test_a_run_that_failed_before_its_first_publish_leaves_the_others_analysed(spark, tmp_path):
    # its agents subscribed, then it failed (an agent lost): events, but no start time.
    # Collected facts dropped a null start's key, and the analysis of every run failed.
    _write_events(tmp_path / "events", "camp-cut", "y1", _run_rows(5))
    _write_events(tmp_path / "events", "camp-cut", "y2",
                  [r for r in _run_rows(6) if r["kind"] == "subscribe"])
    stats = compute_campaign_stats(
        spark, events_path=tmp_path / "events", samples_path=tmp_path / "no-samples",
        campaign={"id": "camp-cut"}, runs=[RunInfo("y1", 0, {}, 0, "done", "mosquitto"),
                                           RunInfo("y2", 0, {}, 1, "failed", "mosquitto")])
    done, failed = sorted(stats.runs, key=lambda run: run.run_id)
    assert done.deliveries_received > 0 and done.latency_us.count > 0
    assert failed.deliveries_received == 0 and failed.latency_us.count == 0
    assert stats.points[0].latency_us.count == done.latency_us.count
    assert set(stats.series.latency_timeline) == {"y1"}


def _row(kind: str, agent: str, **fields: Any) -> dict[str, Any]:
    row = dict.fromkeys(EVENT_COLUMNS)
    row.update(kind=kind, agent_id=agent, payload_bytes=64, qos=1, warmup=False,
               clock_source="user", clock_offset_ns=OFFSETS[agent],
               clock_offset_uncertainty_ns=1000)
    row.update(fields)
    return row


def _run_rows(seed: int, *, subscriptions=SUBSCRIPTIONS, lost=(), duplicated=(),
              late=None, unrecorded_publishes=()) -> list[dict[str, Any]]:
    """Rows of one run; latencies random, anomalies named by (publisher, seq, receiver)."""
    late = late or {}
    rng = np.random.default_rng(seed)
    rows = []
    for rank, (receiver, topic_filter) in enumerate(subscriptions):
        rows.append(_row("subscribe", receiver, receiver=receiver, topic=topic_filter,
                         t_recv_ns=T0 + rank * 10 * MS + OFFSETS[receiver]))
    receivers = {r for r, _ in subscriptions}
    for p, publisher in enumerate(TOPICS):
        topic = TOPICS[publisher]
        for seq in range(MESSAGES):
            # pub-1 runs 15 ms ahead, so the two streams interleave out of seq order.
            sent = T0 + 100 * MS + seq * 10 * MS - p * 15 * MS   # controller clock
            t_pub = sent + OFFSETS[publisher]
            # The publisher falls behind its open-loop schedule, more with every message.
            t_intended = t_pub - seq * 7_000 - p * 50_000
            warmup = seq < WARMUP
            if (publisher, seq) not in unrecorded_publishes:
                rows.append(_row("publish", publisher, publisher=publisher, seq=seq,
                                 topic=topic, warmup=warmup, t_intended_ns=t_intended,
                                 t_pub_ns=t_pub))
            for receiver in sorted(receivers):
                if not any(_matches(f, topic) for r, f in subscriptions if r == receiver):
                    continue
                key = (publisher, seq, receiver)
                latency = late.get(key, int(rng.integers(150_000, 900_000)))
                if key in lost:
                    continue
                t_recv = sent + latency + OFFSETS[receiver]
                for extra in ((0, 35 * MS) if key in duplicated else (0,)):
                    rows.append(_row("delivery", receiver, publisher=publisher, seq=seq,
                                     receiver=receiver, topic=topic, warmup=warmup,
                                     t_intended_ns=t_intended, t_pub_ns=t_pub,
                                     t_recv_ns=t_recv + extra))
    return rows


def _samples(seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    recv = sent = 10_000
    rows = []
    for k in range(5):
        recv += int(rng.integers(1_000, 50_000))
        sent += int(rng.integers(1_000, 90_000))
        rows.append({"t_ns": T0 + k * 200 * MS, "cpu_percent": float(rng.uniform(1, 40)),
                     "rss_bytes": int(rng.integers(5_000_000, 9_000_000)),
                     "bytes_recv": recv, "bytes_sent": sent, "processes": 1})
    return rows


def _dataset() -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    events = {
        # r1: three lost, one lost warm-up delivery, a duplicate arriving 35 ms late.
        "r1": _run_rows(1, lost={("pub-0", 5, "sub-1"), ("pub-1", 3, "sub-2"),
                                       ("pub-0", 8, "sub-2"), ("pub-0", 0, "sub-0")},
                        duplicated={("pub-0", 4, "sub-0")}),
        # r2: seq 5 overtaken by seq 6, an overlapping filter for sub-2, a delivered
        # message whose publish record is missing, a duplicated warm-up delivery.
        "r2": _run_rows(2, subscriptions=[*SUBSCRIPTIONS, ("sub-2", "plant/line2/temp")],
                        late={("pub-1", 5, "sub-2"): 12 * MS},
                        unrecorded_publishes={("pub-1", 7)},
                        duplicated={("pub-1", 1, "sub-1")}),
        # r3: only two subscribers.
        "r3": _run_rows(3, subscriptions=SUBSCRIPTIONS[:2]),
        # r4 failed after a few messages.
        "r4": [r for r in _run_rows(4) if r["seq"] is None or r["seq"] < 4],
    }
    samples = {"r1": _samples(11), "r2": _samples(12), "r3": _samples(13)}
    return events, samples


def _write(root: Path, campaign: str, run_id: str, name: str, table: Any) -> None:
    directory = root / f"campaign_id={campaign}" / f"run_id={run_id}"
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / name)


def _write_events(root: Path, campaign: str, run_id: str, rows: list[dict]) -> None:
    # One file per agent, as the controller stores uploaded chunks.
    by_agent = defaultdict(list)
    for row in rows:
        by_agent[row["agent_id"]].append(row)
    for agent, agent_rows in by_agent.items():
        _write(root, campaign, run_id, f"{agent}-000000.parquet",
               pa.Table.from_pylist(agent_rows, schema=arrow_schema()))


def _write_samples(root: Path, campaign: str, run_id: str, rows: list[dict]) -> None:
    schema = pa.schema([("t_ns", pa.int64()), ("cpu_percent", pa.float64()),
                        ("rss_bytes", pa.int64()), ("bytes_recv", pa.int64()),
                        ("bytes_sent", pa.int64()), ("processes", pa.int32())])
    _write(root, campaign, run_id, "samples.parquet", pa.Table.from_pylist(rows, schema=schema))


# -- the reference computation ----------------------------------------------------------


def _matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic matching, level by level."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels, topic_levels = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(filter_levels):
        if level == "#":
            return True
        if i >= len(topic_levels) or level not in ("+", topic_levels[i]):
            return False
    return len(filter_levels) == len(topic_levels)


def _reference_run(rows: list[dict]) -> dict[str, Any]:
    """Counts and raw value lists of one run, by the definitions, in plain Python."""
    pubs = [r for r in rows if r["kind"] == "publish" and not r["warmup"]]
    deliveries = [r for r in rows if r["kind"] == "delivery" and not r["warmup"]]
    suback: dict[str, int] = {}
    filters: set[tuple[str, str]] = set()
    for r in rows:
        if r["kind"] == "subscribe":
            filters.add((r["receiver"], r["topic"]))
            t = r["t_recv_ns"] - r["clock_offset_ns"]
            suback[r["receiver"]] = min(t, suback.get(r["receiver"], t))
    expected = {(p["publisher"], p["seq"], receiver) for p in pubs
                for receiver, f in filters if _matches(f, p["topic"])}
    unique: dict[tuple, dict] = {}
    for d in sorted(deliveries, key=lambda d: d["t_recv_ns"]):
        unique.setdefault((d["publisher"], d["seq"], d["receiver"]), d)
    published = {(p["publisher"], p["seq"]): p for p in pubs}

    reordered = 0
    streams: dict[tuple, list[dict]] = defaultdict(list)
    for d in deliveries:
        streams[(d["receiver"], d["publisher"])].append(d)
    for stream in streams.values():
        highest = None
        for d in sorted(stream, key=lambda d: (d["t_recv_ns"], d["seq"])):
            reordered += highest is not None and d["seq"] < highest
            highest = d["seq"] if highest is None else max(highest, d["seq"])

    arrival, departure, latency, from_intended = {}, {}, {}, []
    for key, d in unique.items():
        arrival[key] = d["t_recv_ns"] - d["clock_offset_ns"]
        p = published.get(key[:2])
        departure[key] = p["t_pub_ns"] - p["clock_offset_ns"] if p else d["t_pub_ns"]
        intended = p["t_intended_ns"] - p["clock_offset_ns"] if p else d["t_intended_ns"]
        latency[key] = (arrival[key] - departure[key]) / 1000
        from_intended.append((arrival[key] - intended) / 1000)
    send_lag = [(p["t_pub_ns"] - p["t_intended_ns"]) / 1000 for p in pubs]

    jitter_std = []
    for receiver in {k[2] for k in unique}:
        values = [v for k, v in latency.items() if k[2] == receiver]
        if len(values) >= 2:
            jitter_std.append(np.std(values, ddof=1))
    rfc = []
    for receiver, publisher in {(k[2], k[0]) for k in unique}:
        stream = sorted((d for k, d in unique.items() if k[2] == receiver and k[0] == publisher),
                        key=lambda d: (d["t_recv_ns"], d["seq"]))
        if len(stream) < 2:
            continue
        j = 0.0
        for prev, cur in zip(stream, stream[1:], strict=False):
            diff = (cur["t_recv_ns"] - prev["t_recv_ns"]) - (cur["t_pub_ns"] - prev["t_pub_ns"])
            j += (abs(diff) - j) / 16
        rfc.append(j / 1000)

    order = sorted(suback, key=lambda r: (suback[r], r))
    spread, first_last = [], []
    for message in {k[:2] for k in unique}:
        times = {k[2]: t for k, t in arrival.items() if k[:2] == message}
        if len(times) >= 2:
            spread.append((max(times.values()) - min(times.values())) / 1000)
        if len(order) >= 2 and order[0] in times and order[-1] in times:
            first_last.append((times[order[-1]] - times[order[0]]) / 1000)

    received = sum(key in expected for key in unique)
    span_s = (max(arrival.values()) - min(arrival.values())) / 1e9 if arrival else 0
    publication = []
    for publisher in {p["publisher"] for p in pubs}:
        times = [p["t_pub_ns"] for p in pubs if p["publisher"] == publisher]
        if len(times) >= 2:
            publication.append((len(times) - 1) / ((max(times) - min(times)) / 1e9))
    return {
        "counts": {"messages_sent": len(pubs), "deliveries_expected": len(expected),
                   "deliveries_received": received,
                   "deliveries_unexpected": len(unique) - received,
                   "lost": len(expected) - received,
                   "duplicates": len(deliveries) - len(unique), "reordered": reordered},
        "latency": list(latency.values()), "jitter_std": jitter_std, "rfc": rfc,
        "from_intended": from_intended, "send_lag": send_lag,
        "spread": spread, "first_last": first_last,
        "throughput": [received / span_s] if span_s > 0 else [],
        "publication": publication,
        # each unique delivery's send time, and the run's first measured publish
        "departures": list(departure.values()),
        "first_publish": min((p["t_pub_ns"] - p["clock_offset_ns"] for p in pubs),
                             default=None),
    }


COUNTS = ("messages_sent", "deliveries_expected", "deliveries_received",
          "deliveries_unexpected", "lost", "duplicates", "reordered")


def _reference_broker(samples_by_run: list[list[dict]]) -> dict[str, Any]:
    cpu_mean, cpu_max, rss, recv, sent = [], [], [], [], []
    for samples in samples_by_run:
        if not samples:
            continue
        duration_s = (samples[-1]["t_ns"] - samples[0]["t_ns"]) / 1e9
        cpu_mean.append(np.mean([s["cpu_percent"] for s in samples]))
        cpu_max.append(max(s["cpu_percent"] for s in samples))
        rss.append(max(s["rss_bytes"] for s in samples))
        recv.append((samples[-1]["bytes_recv"] - samples[0]["bytes_recv"]) / 1000 / duration_s)
        sent.append((samples[-1]["bytes_sent"] - samples[0]["bytes_sent"]) / 1000 / duration_s)
    return {
        "samples": sum(len(s) for s in samples_by_run),
        "cpu_percent_mean": _mean(cpu_mean), "cpu_percent_std": _std(cpu_mean),
        "cpu_percent_max": max(cpu_max, default=None),
        "rss_bytes_max": max(rss, default=None), "rss_bytes_std": _std(rss),
        "net_recv_kb_per_s": _mean(recv), "net_recv_kb_per_s_std": _std(recv),
        "net_sent_kb_per_s": _mean(sent), "net_sent_kb_per_s_std": _std(sent),
    }


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _std(values: list[float]) -> float | None:
    return float(np.std(values, ddof=1)) if len(values) >= 2 else None


def _summary(values: list[float], percentiles: tuple[str, ...]) -> dict[str, float | None]:
    out = {"count": len(values), "mean": _mean(values), "std": _std(values)}
    for name in percentiles:
        q = {"p50": 50, "p90": 90, "p99": 99, "p999": 99.9}[name]
        out[name] = float(np.percentile(values, q)) if values else None
    out["max"] = float(max(values)) if values else None
    return out


def _reference_figures(parts: list[dict], samples_by_run: list[list[dict]]) -> dict[str, Any]:
    """Pool the reference parts of some runs into the figures of one level."""
    def pooled(name: str) -> list[float]:
        return [v for part in parts for v in part[name]]

    counts = {name: sum(part["counts"][name] for part in parts) for name in COUNTS}
    return {
        **counts,
        "latency_us": _summary(pooled("latency"), ("p50", "p90", "p99", "p999")),
        "latency_from_intended_us": _summary(pooled("from_intended"),
                                             ("p50", "p90", "p99", "p999")),
        "send_lag_us": _summary(pooled("send_lag"), ("p50", "p90", "p99", "p999")),
        "jitter_us": {"std": _mean(pooled("jitter_std")), "rfc3550": _mean(pooled("rfc"))},
        "sync_spread_us": _summary(pooled("spread"), ("p50", "p99")),
        "first_last_spread_us": _summary(pooled("first_last"), ("p50", "p99")),
        "throughput_msgs_per_s": _mean(pooled("throughput")),
        "throughput_msgs_per_s_std": _std(pooled("throughput")),
        "publication_msgs_per_s": _mean(pooled("publication")),
        "publication_msgs_per_s_std": _std(pooled("publication")),
        "broker": _reference_broker(samples_by_run),
    }


def _stream_rows(rows: list[dict], stream: StreamInfo) -> list[dict]:
    """The rows a stream's figures come from: its publishers' messages, every subscription."""
    return [r for r in rows if r["kind"] == "subscribe" or r["publisher"] in stream.publishers]


def _reference_stream(parts: list[dict], stream: StreamInfo) -> dict[str, Any]:
    """Pool the reference parts (of one stream's rows) into the stream's figures."""
    def pooled(name: str) -> list[float]:
        return [v for part in parts for v in part[name]]

    everything = ("p50", "p90", "p99", "p999")
    return {"payload_bytes": stream.payload_bytes,
            **{name: sum(part["counts"][name] for part in parts) for name in COUNTS},
            "latency_us": _summary(pooled("latency"), everything),
            "latency_from_intended_us": _summary(pooled("from_intended"), everything),
            "send_lag_us": _summary(pooled("send_lag"), everything),
            "sync_spread_us": _summary(pooled("spread"), ("p50", "p99"))}


def _flat(document: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in document.items():
        if isinstance(value, dict) and key != "params":
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _assert_figures(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    actual_flat = _flat(actual)
    expected_flat = _flat(expected)
    # approx cannot take None with a relative tolerance: nulls must match exactly.
    nulls = {key for key, value in expected_flat.items() if value is None}
    assert {key for key in expected_flat if actual_flat[key] is None} == nulls
    compared = {key: actual_flat[key] for key in expected_flat if key not in nulls}
    numbers = {key: value for key, value in expected_flat.items() if key not in nulls}
    assert compared == pytest.approx(numbers, rel=1e-9, abs=1e-6)


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    events, samples = _dataset()
    for run_id, rows in events.items():
        _write_events(root / "events", CAMPAIGN, run_id, rows)
    for run_id, rows in samples.items():
        _write_samples(root / "samples", CAMPAIGN, run_id, rows)
    # Same run id in another campaign, and an unlisted run: neither may be read.
    _write_events(root / "events", "camp-other", "r1",
                  _run_rows(99, lost={("pub-0", 2, "sub-0")}))
    _write_samples(root / "samples", "camp-other", "r1", _samples(99))
    _write_events(root / "events", CAMPAIGN, "r9", _run_rows(9))
    return root, events, samples


class ProbeLinks(SectionBlock):
    up: Agreed = None
    flaps: int = 0


class ProbeNode(SectionBlock):
    cpu: float | None = None


class ProbeSection(BackendSection):
    """A backend's own figures, as a test backend declares them."""

    key = "probe"
    title = "Probe"
    packets: int = 0
    load: float | None = None
    delay_ns: Distribution = Distribution()
    root: Agreed = None
    links: ProbeLinks | None = None
    nodes: dict[str, ProbeNode] = {}


PROBE_RECORDS = {"r1": {"packets": [40.0], "load": [0.5, 1.5], "delay_ns": [10.0, 20.0, 30.0],
                        "root": [2.0], "links.up": [3.0], "links.flaps": [1.0],
                        "nodes.0.cpu": [10.0], "nodes.10.cpu": [30.0]},
                 "r2": {"packets": [60.0], "load": [4.0], "delay_ns": [100.0, 5.0],
                        "root": [1.0], "links.up": [3.0], "links.flaps": [2.0],
                        "nodes.0.cpu": [20.0], "gone.figure": [1.0]},
                 "r4": {"packets": [7.0], "delay_ns": [1.0]}}


# Issue 24's aim: all figures of a campaign from a handful of Spark jobs (today: the
# subscriptions and clocks, the per-delivery rows, every grouped figure), whatever the
# number of figures, runs, streams or sections; before the fused pass it was ~40.
MAX_ANALYSIS_JOBS = 5
ANALYSIS_JOB_GROUP = "test-analytics-stats"


@pytest.fixture(scope="module")
def analysis_jobs(spark, dataset):
    """The Spark jobs the analysis of the ``results`` fixture ran (filled by it), each
    named by its first stage."""
    return []


@pytest.fixture(scope="module")
def results(spark, dataset, analysis_jobs):
    root, _, _ = dataset
    context = spark.sparkContext
    context.setJobGroup(ANALYSIS_JOB_GROUP, "compute_campaign_stats under test")
    for run_id, records in PROBE_RECORDS.items():
        rows = [{"section": "probe", "figure": f, "value": v}
                for f, values in records.items() for v in values]
        _write(root / "records", CAMPAIGN, run_id, "probe.parquet", pa.Table.from_pylist(
            rows, schema=pa.schema([("section", pa.string()), ("figure", pa.string()),
                                    ("value", pa.float64())])))
    try:
        return compute_campaign_stats(
            spark, events_path=root / "events", samples_path=root / "samples",
            records_path=root / "records", section_types=[ProbeSection],
            campaign={"id": CAMPAIGN, "name": "unit", "spec": {"repetitions": 2}}, runs=RUNS)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        tracker = context.statusTracker()
        for job_id in sorted(tracker.getJobIdsForGroup(ANALYSIS_JOB_GROUP)):
            stages = [tracker.getStageInfo(s) for s in tracker.getJobInfo(job_id).stageIds]
            analysis_jobs.append(f"job {job_id}: {stages[0].name if stages else '?'}")


@pytest.fixture(scope="module")
def stats(results):
    """The results as their JSON document, for comparing with the plain-Python reference."""
    return results.model_dump(mode="json")


# -- tests ----------------------------------------------------------------------------


@pytest.mark.parametrize(("topic_filter", "topic", "matches"), [
    ("plant/line1/temp", "plant/line1/temp", True),
    ("plant/line1/temp", "plant/line1/temp/x", False),
    ("plant/+/temp", "plant/line2/temp", True),
    ("plant/+/temp", "plant/temp", False),
    ("plant/#", "plant", True),
    ("plant/#", "plant/a/b/c", True),
    ("plant/#", "plants/a", False),
    ("+/+", "/finance", True),
    ("#", "$SYS/broker/load", False),
    ("+/broker/load", "$SYS/broker/load", False),
    ("$SYS/#", "$SYS/broker/load", True),
    ("a.b/(c)", "a.b/(c)", True),
    ("a.b/(c)", "axb/(c)", False),
])
def test_topic_filter_regex_follows_mqtt_matching(topic_filter, topic, matches):
    import re

    assert bool(re.search(topic_filter_regex(topic_filter), topic)) is matches
    assert _matches(topic_filter, topic) is matches


def test_every_run_figure_matches_the_reference(stats, dataset):
    _, events, samples = dataset
    runs = {run["run_id"]: run for run in stats["runs"]}
    assert list(runs) == ["r1", "r2", "r3", "r4", "r5"]
    for info in RUNS:
        parts = [_reference_run(events.get(info.run_id, []))]
        expected = _reference_figures(parts, [samples.get(info.run_id, [])])
        _assert_figures(runs[info.run_id], expected)
        assert runs[info.run_id]["state"] == info.state
        assert runs[info.run_id]["reason"] == info.reason
    # a run that did not finish has figures of what arrived before it ended: partial
    assert {run_id: run["partial"] for run_id, run in runs.items()} == {
        "r1": False, "r2": False, "r3": False, "r4": True, "r5": True}


def test_one_analysis_is_a_handful_of_spark_jobs(results, analysis_jobs):
    # streams, sections, a wildcard filter and failed runs included (see the dataset)
    assert results.runs and 1 <= len(analysis_jobs) <= MAX_ANALYSIS_JOBS, analysis_jobs


def test_a_run_whose_generator_fell_behind_is_flagged_in_its_point_and_run(stats):
    points = {point["point_index"]: point for point in stats["points"]}
    assert points[0]["rate_not_kept_runs"] == ["r2"]
    assert points[1]["rate_not_kept_runs"] == []
    runs = {run["run_id"]: run for run in stats["runs"]}
    assert runs["r1"]["generator"] is None   # no report: nothing claimed either way
    assert runs["r2"]["generator"] == {
        "requested_msgs_per_s": 200.0, "achieved_msgs_per_s": 159.0, "send_lag_max_us": 90_000.0,
        "messages_unsent": 0, "publishers_behind": ["pub-1"], "rate_kept": False,
        "mqtt_client": "lean", "deliveries_kernel_stamped": 42, "deliveries_user_stamped": 1,
        "receive_clock": "kernel", "nofile_limit": 1024}


def test_connection_figures_pool_every_connection_of_a_points_done_runs(stats):
    points = {p["point_index"]: p for p in stats["points"]}
    runs = {r["run_id"]: r for r in stats["runs"]}
    pooled = points[0]["connections"]
    assert (pooled["connections"], pooled["without_connack"]) == (8, 1)
    connack_us = [c.connack_ns / 1e3 for c in CONNECTS["r1"] + CONNECTS["r2"]
                  if c.connack_ns is not None]
    assert pooled["connack_us"]["count"] == 7
    assert pooled["connack_us"]["p50"] == pytest.approx(float(np.percentile(connack_us, 50)))
    assert pooled["connack_us"]["p99"] == pytest.approx(float(np.percentile(connack_us, 99)))
    assert pooled["connack_us"]["max"] == 900.0
    assert pooled["tls_handshake_us"]["count"] == 5   # r1's only: r2 spoke plain TCP
    assert pooled["tcp_connect_us"]["count"] == 8
    assert (runs["r1"]["connections"]["connections"], runs["r2"]["connections"]["connections"]) \
        == (5, 3)
    assert runs["r2"]["connections"]["tls_handshake_us"]["p50"] is None
    # r3 timed none, r4 did not finish: r4 has its own figures, its point none
    assert runs["r3"]["connections"] is None and points[1]["connections"] is None
    assert runs["r4"]["connections"]["connack_us"]["max"] == 5_000.0
    assert runs["r5"]["connections"] is None and points[2]["connections"] is None


def test_points_pool_done_runs_only(stats, dataset):
    _, events, samples = dataset
    points = {point["point_index"]: point for point in stats["points"]}
    assert sorted(points) == [0, 1, 2]
    for index, point in points.items():
        done = [r.run_id for r in RUNS if r.point_index == index and r.state == "done"]
        parts = [_reference_run(events[run_id]) for run_id in done]
        expected = _reference_figures(parts, [samples.get(run_id, []) for run_id in done])
        _assert_figures(point, expected)
        assert point["runs"] == len(done)
        assert point["run_ids"] == done
    assert points[1]["runs_failed"] == 1
    assert points[0]["params"] == {"qos": 1}
    # a point with a run that did not finish pools fewer runs than planned: partial
    assert [points[i]["partial"] for i in (0, 1, 2)] == [False, True, True]


def test_each_stream_of_the_mix_matches_the_reference_of_its_publishers_rows(stats, dataset):
    _, events, _ = dataset
    runs = {run["run_id"]: run for run in stats["runs"]}
    for info in RUNS:
        assert list(runs[info.run_id]["streams"]) == ["line1", "line2"]
        for stream in STREAMS:
            part = _reference_run(_stream_rows(events.get(info.run_id, []), stream))
            _assert_figures(runs[info.run_id]["streams"][stream.name],
                            _reference_stream([part], stream))
            assert runs[info.run_id]["streams"][stream.name]["topic"] == stream.topic
    for point in stats["points"]:
        for stream in STREAMS:
            parts = [_reference_run(_stream_rows(events[run_id], stream))
                     for run_id in point["run_ids"]]
            _assert_figures(point["streams"][stream.name], _reference_stream(parts, stream))


def test_the_streams_add_up_to_their_run_and_the_planted_anomalies_land_in_theirs(stats):
    runs = {run["run_id"]: run for run in stats["runs"]}
    for run in runs.values():
        for count in ("messages_sent", "deliveries_expected", "deliveries_received", "lost",
                      "duplicates", "reordered", "deliveries_unexpected"):
            assert sum(s[count] for s in run["streams"].values()) == run[count]
        assert sum(s["latency_us"]["count"] for s in run["streams"].values()) == \
            run["latency_us"]["count"]
    line1, line2 = runs["r1"]["streams"]["line1"], runs["r1"]["streams"]["line2"]
    # r1: pub-0 (line1) lost two measured deliveries and duplicated one; pub-1 lost one.
    assert (line1["lost"], line1["duplicates"], line2["lost"], line2["duplicates"]) == \
        (2, 1, 1, 0)
    assert (line1["topic"], line2["payload_bytes"]) == ("plant/line1/temp", 65_536)
    # r2: the unrecorded publish of (pub-1, 7) is line2's.
    assert runs["r2"]["streams"]["line2"]["deliveries_unexpected"] == 2


def test_stream_intervals_and_cdfs_pool_the_streams_rows_of_the_points_runs(results, dataset):
    _, events, _ = dataset
    point0 = results.points[0]
    for stream in STREAMS:
        per_run = [_reference_run(_stream_rows(events[run_id], stream))
                   for run_id in point0.run_ids]
        sketches = [QuantileSketch(len(part["latency"]),
                                   list(np.quantile(part["latency"], SKETCH_LEVELS)))
                    for part in per_run]
        figures = point0.streams[stream.name]
        assert figures.latency_us.p50_ci == pytest.approx(bootstrap_interval(sketches, 0.5))
        assert figures.latency_us.p99_ci == pytest.approx(bootstrap_interval(sketches, 0.99))
        latencies = [v for part in per_run for v in part["latency"]]
        assert results.series.stream_latency_cdf_us["0"][stream.name] == pytest.approx(
            list(np.percentile(latencies, np.arange(101))))
    assert results.points[1].streams["line1"].latency_us.p50_ci is None   # one done run
    assert "2" not in results.series.stream_latency_cdf_us   # no done run


def test_anomalies_are_counted_where_they_were_planted(stats):
    runs = {run["run_id"]: run for run in stats["runs"]}
    r1, r2, r3 = runs["r1"], runs["r2"], runs["r3"]
    # 8 measured messages per publisher; pub-0 to 3 receivers, pub-1 to 2.
    assert r1["messages_sent"] == 16 and r1["deliveries_expected"] == 40
    assert r1["lost"] == 3 and r1["duplicates"] == 1
    assert r1["reordered"] == 1   # the late duplicate of seq 4 arrives after seq 7
    # The overlapping filter of sub-2 adds no expected delivery; the unrecorded publish
    # of (pub-1, 7) is not expected, so its two deliveries are unexpected.
    assert r2["deliveries_expected"] == 38 and r2["deliveries_unexpected"] == 2
    assert r2["lost"] == 0 and r2["duplicates"] == 0 and r2["reordered"] == 1
    assert r3["first_last_spread_us"]["mean"] is not None
    point2 = next(p for p in stats["points"] if p["point_index"] == 2)
    assert point2["runs"] == 0 and point2["runs_failed"] == 1
    assert point2["messages_sent"] == 0 and point2["latency_us"]["p50"] is None
    assert point2["broker"]["cpu_percent_mean"] is None
    assert runs["r4"]["broker"]["samples"] == 0


def test_all_deliveries_lost_gives_expected_counts_and_null_figures(spark, tmp_path):
    rows = [r for r in _run_rows(5) if r["kind"] != "delivery"]
    _write_events(tmp_path / "events", "camp-lost", "x1", rows)
    stats = compute_campaign_stats(
        spark, events_path=tmp_path / "events", samples_path=tmp_path / "no-samples",
        campaign={"id": "camp-lost"}, runs=[RunInfo("x1", 0, {}, 0, "done", "mosquitto")])
    for level in (stats.runs[0], stats.points[0]):
        assert level.deliveries_expected == 40
        assert level.lost == 40 and level.deliveries_received == 0
        assert level.duplicates == 0 and level.reordered == 0
        assert level.latency_us.count == 0
        assert {v for k, v in level.latency_us if k != "count"} == {None}
        assert level.jitter_us.std is None and level.jitter_us.rfc3550 is None
        assert {v for k, v in level.sync_spread_us if k != "count"} == {None}
        assert level.throughput_msgs_per_s is None
        assert level.broker.rss_bytes_max is None
        assert level.send_lag_us.count == 16   # the publishes were sent all the same


def test_stats_json_is_the_model_and_parquet_columns_come_from_its_types(results, tmp_path):
    json_path, parquet_path = write_stats(results, tmp_path / "out")
    assert type(results).model_validate_json(json_path.read_bytes()) == results
    document = json.loads(json_path.read_text())
    assert set(document["campaign"]) == {"id", "name", "spec"}
    assert set(document["points"][0]["latency_us"]) == {
        "count", "mean", "std", "p50", "p90", "p99", "p999", "max", "p50_ci", "p99_ci"}

    table = pq.read_table(parquet_path)
    rows = table.to_pylist()
    assert [row["level"] for row in rows].count("point") == len(results.points)
    assert [row["level"] for row in rows].count("run") == len(results.runs)
    r1 = next(row for row in rows if row["run_id"] == "r1")
    assert r1["latency_us_p99"] == pytest.approx(results.runs[0].latency_us.p99)
    assert json.loads(r1["params"]) == {"qos": 1}
    point0 = next(row for row in rows if row["level"] == "point" and row["point_index"] == 0)
    assert (point0["latency_us_p50_ci_lo"], point0["latency_us_p50_ci_hi"]) == \
        results.points[0].latency_us.p50_ci
    assert point0["sections_probe_packets"] == 100
    types = {field.name: str(field.type) for field in table.schema}
    # Typed by the model, whatever the values: a column of nulls keeps its type.
    assert types["latency_us_p50"] == types["latency_us_p99_ci_hi"] == "double"
    assert types["lost"] == types["point_index"] == "int64"
    assert types["clock_flagged"] == "bool" and types["scope_acquisitions"] == "int64"
    assert types["time_sync_worst_max_abs_error_us"] == "double"
    assert types["sections_probe_delay_ns_p50"] == "double"
    # The streams of the mix are rows of their own, typed like a level's figures.
    assert "streams" not in types and types["stream"] == "string"
    assert types["payload_bytes"] == "int64" and types["topic"] == "string"
    streams = [row for row in rows if row["level"] == "run_stream" and row["run_id"] == "r1"]
    assert [row["stream"] for row in streams] == ["line1", "line2"]
    line1 = results.runs[0].streams["line1"]
    assert streams[0]["latency_us_p99"] == pytest.approx(line1.latency_us.p99)
    assert (streams[0]["lost"], streams[0]["payload_bytes"]) == (line1.lost, 100)
    assert streams[0]["point_index"] == 0 and streams[0]["repetition"] == 0
    point_streams = [row for row in rows if row["level"] == "point_stream"]
    assert len(point_streams) == 2 * len(results.points)
    assert point_streams[0]["latency_us_p50_ci_lo"] == \
        results.points[0].streams["line1"].latency_us.p50_ci[0]
    assert all(row["stream"] is None for row in rows if row["level"] in ("point", "run"))


def test_a_backend_section_pools_its_records_per_run_and_point(results):
    runs = {run.run_id: run for run in results.runs}
    r1 = runs["r1"].sections.probe
    assert r1.packets == 40 and r1.load == 1.0
    assert r1.delay_ns.count == 3 and r1.delay_ns.p50 == 20.0 and r1.delay_ns.max == 30.0
    pooled = [10.0, 20.0, 30.0, 100.0, 5.0]
    point0 = results.points[0].sections.probe
    assert point0.packets == 100
    assert point0.load == pytest.approx(np.mean([0.5, 1.5, 4.0]))
    assert point0.delay_ns.p50 == pytest.approx(np.percentile(pooled, 50))
    assert point0.delay_ns.p99 == pytest.approx(np.percentile(pooled, 99))
    assert point0.delay_ns.std == pytest.approx(np.std(pooled, ddof=1))
    # Agreed: the value of every run, none where they differ; blocks pool like fields.
    assert r1.root == 2 and point0.root is None
    assert r1.links == ProbeLinks(up=3, flaps=1) and point0.links == ProbeLinks(up=3, flaps=3)
    assert point0.nodes == {"0": ProbeNode(cpu=15.0), "10": ProbeNode(cpu=30.0)}
    assert list(point0.nodes) == ["0", "10"]   # keys in numeric order
    assert point0.flat_figures()["nodes.10.cpu"] == 30.0
    # r4 failed: its records are in its run entry, not in its point.
    assert runs["r4"].sections.probe.packets == 7
    assert runs["r4"].sections.probe.links is None and runs["r4"].sections.probe.nodes == {}
    assert results.points[1].sections.probe is None
    assert runs["r3"].sections.probe is None


def test_point_intervals_are_the_bootstrap_over_its_runs(results, dataset):
    _, events, _ = dataset
    point0, point1 = results.points[0], results.points[1]
    per_run = [_reference_run(events[run_id]) for run_id in point0.run_ids]

    def sketches(name: str) -> list[QuantileSketch]:
        return [QuantileSketch(len(part[name]), list(np.quantile(part[name], SKETCH_LEVELS)))
                for part in per_run]

    assert point0.latency_us.p50_ci == pytest.approx(
        bootstrap_interval(sketches("latency"), 0.5))
    assert point0.latency_us.p99_ci == pytest.approx(
        bootstrap_interval(sketches("latency"), 0.99))
    assert point0.sync_spread_us.p50_ci == pytest.approx(
        bootstrap_interval(sketches("spread"), 0.5))
    low, high = point0.latency_us.p50_ci
    assert low <= high
    # One done run: no interval across repetitions.
    assert point1.runs == 1 and point1.latency_us.p50_ci is None


def test_latency_cdf_per_point_is_the_quantiles_of_its_done_runs(stats, dataset):
    _, events, _ = dataset
    cdf = stats["series"]["latency_cdf_us"]
    for point in stats["points"]:
        latencies = [v for run_id in point["run_ids"]
                     for v in _reference_run(events[run_id])["latency"]]
        if not latencies:
            assert str(point["point_index"]) not in cdf
            continue
        expected = np.percentile(latencies, np.arange(101))
        assert cdf[str(point["point_index"])] == pytest.approx(list(expected))


def test_latency_timeline_counts_every_unique_delivery_of_the_run(stats, dataset):
    _, events, _ = dataset
    timeline = stats["series"]["latency_timeline"]
    for run in RUNS:
        if run.run_id not in events:
            continue
        series = timeline[run.run_id]
        assert sum(series["deliveries"]) == len(_reference_run(events[run.run_id])["latency"])
        assert series["t_s"] == sorted(series["t_s"]) and series["t_s"][0] >= 0
        assert all(p50 <= p99 for p50, p99 in zip(series["p50_us"], series["p99_us"],
                                                 strict=True))
        # by hand: each unique delivery in the bin of its send time, counted from the
        # run's first measured publish (offset-corrected)
        reference = _reference_run(events[run.run_id])
        t0 = reference["first_publish"]
        per_bin = Counter(math.floor((departure - t0) / (TIMELINE_BIN_S * 1e9))
                          for departure in reference["departures"])
        assert dict(zip([round(t / TIMELINE_BIN_S) for t in series["t_s"]],
                        series["deliveries"], strict=True)) == dict(per_bin)


def test_delivery_resumption_after_a_fault_by_the_definition(spark, dataset):
    root, events, _ = dataset
    fault_ns = T0 + 100 * MS + 45 * MS   # controller clock, between messages 4 and 5
    runs = [RunInfo("r1", 0, {}, 0, "done", "mqtt-st", warmup_messages=WARMUP,
                    fault_at_ns=fault_ns, fault_at_s=1.5, fault="killed broker 0",
                    streams=STREAMS),
            RunInfo("r3", 1, {}, 0, "done", "mqtt-st", warmup_messages=WARMUP)]
    stats = compute_campaign_stats(spark, events_path=root / "events",
                                   samples_path=root / "samples",
                                   campaign={"id": CAMPAIGN}, runs=runs)
    # By hand: each receiver's first arrival of a message sent after the fault.
    rows = [r for r in events["r1"] if not r["warmup"]]
    sent = {(r["publisher"], r["seq"]): r["t_pub_ns"] - r["clock_offset_ns"]
            for r in rows if r["kind"] == "publish"}
    first_after: dict[str, int] = {}
    for d in (r for r in rows if r["kind"] == "delivery"):
        if sent[(d["publisher"], d["seq"])] > fault_ns:
            arrival = d["t_recv_ns"] - d["clock_offset_ns"]
            first_after[d["receiver"]] = min(arrival, first_after.get(d["receiver"], arrival))
    expected_s = (max(first_after.values()) - fault_ns) / 1e9
    run1, run3 = stats.runs
    assert run1.fault.faults == ["r1: killed broker 0"] and run1.fault.at_s == 1.5
    assert run1.fault.delivery_resumed_s.count == 1
    assert run1.fault.delivery_resumed_s.max == pytest.approx(expected_s, rel=1e-9)
    assert run1.fault.receivers_not_resumed == 0 and len(first_after) == 3
    assert run3.fault is None and stats.points[1].fault is None
    assert stats.points[0].fault.delivery_resumed_s.p50 == pytest.approx(expected_s, rel=1e-9)


def test_a_receiver_cut_off_by_the_fault_is_counted(spark, dataset):
    root, events, _ = dataset
    last_sent = max(r["t_pub_ns"] - r["clock_offset_ns"] for r in events["r3"]
                    if r["kind"] == "publish")
    stats = compute_campaign_stats(
        spark, events_path=root / "events", samples_path=root / "samples",
        campaign={"id": CAMPAIGN},
        runs=[RunInfo("r3", 0, {}, 0, "done", "mqtt-st", warmup_messages=WARMUP,
                      fault_at_ns=last_sent, fault="killed broker 1")])
    run = stats.runs[0]
    # Nothing was sent after the fault: nobody resumed, and no resumption time is made up.
    assert run.fault.receivers_not_resumed == 2
    assert run.fault.delivery_resumed_s.count == 0 and run.fault.delivery_resumed_s.max is None


def test_hdr_export_values_are_each_done_runs_reference_values_in_ns(spark, dataset):
    """The HdrHistogram export's values (tests/test_hdr_export.py reads its logs) are the
    plain-Python definitions' latencies and spreads of each run, value for value, in ns."""
    from mqttbed.analytics.hdr_export import run_values

    root, events, _ = dataset
    done = [run for run in RUNS if run.state == "done"]
    values = run_values(spark, root / "events", CAMPAIGN, done)
    assert sorted(values) == sorted((run.run_id, figure) for run in done
                                    for figure in ("latency_us", "sync_spread_us"))
    for run in done:
        reference = _reference_run(events[run.run_id])
        for figure, name in (("latency_us", "latency"), ("sync_spread_us", "spread")):
            expected = sorted(round(v * 1000) for v in reference[name])
            assert expected, (run.run_id, figure)
            assert sorted(values[(run.run_id, figure)].tolist()) == expected, (run.run_id, figure)


def test_quantiles_by_rank_give_the_same_results_to_the_bit(spark, dataset, results,
                                                             monkeypatch):
    """A campaign of RANKED_FROM_EVENTS stored events or more takes its quantiles by rank
    (no group's values gathered in one buffer), and from HELD_IN_MEMORY_BELOW_ROWS on
    holds its events and per-delivery rows on disk only; both lowered to 0, this small
    campaign takes those paths, and every figure, sketch, interval and series is the
    same."""
    import mqttbed.analytics.datasets as datasets_module
    import mqttbed.analytics.stats as stats_module

    root, _, _ = dataset
    monkeypatch.setattr(stats_module, "RANKED_FROM_EVENTS", 0)
    monkeypatch.setattr(datasets_module, "HELD_IN_MEMORY_BELOW_ROWS", 0)
    ranked = compute_campaign_stats(
        spark, events_path=root / "events", samples_path=root / "samples",
        records_path=root / "records", section_types=[ProbeSection],
        campaign={"id": CAMPAIGN, "name": "unit", "spec": {"repetitions": 2}}, runs=RUNS)
    gathered, by_rank = (r.model_dump(mode="json", exclude={"generated_at"})
                         for r in (results, ranked))
    assert by_rank == gathered

    def p99s(node: Any) -> Iterator[Any]:
        if isinstance(node, dict):
            yield from ([node["p99"]] if "p99" in node else [])
            for value in node.values():
                yield from p99s(value)
        elif isinstance(node, list):
            for value in node:
                yield from p99s(value)

    assert sum(v is not None for v in p99s(by_rank)) >= 10  # the quantiles were compared


# -- run partials ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def kept_partials(spark, dataset) -> dict[str, Any]:
    """Each run's partial of the module's dataset as kept beside the run (JSON), computed
    once: a fingerprint holds the data files' names, sizes and times, not where they are,
    so a copy of the dataset made with its times takes them too."""
    from mqttbed.analytics.stats import compute_run_partial

    root, _, _ = dataset
    return {run.run_id: json.loads(json.dumps(compute_run_partial(
        spark, events_path=root / "events", samples_path=root / "samples",
        records_path=root / "records", section_types=[ProbeSection], campaign_id=CAMPAIGN,
        run=run).to_json())) for run in RUNS}


def _read_partials(kept: dict[str, Any]) -> dict[str, Any]:
    """Fresh partials from the kept JSON, for a test to alter."""
    from mqttbed.analytics.partials import RunPartial

    return {run_id: RunPartial.from_json(document) for run_id, document in kept.items()}


def _with_partials(spark, root: Path, partials: dict[str, Any], runs=RUNS):
    return compute_campaign_stats(
        spark, events_path=root / "events", samples_path=root / "samples",
        records_path=root / "records", section_types=[ProbeSection],
        campaign={"id": CAMPAIGN, "name": "unit", "spec": {"repetitions": 2}}, runs=runs,
        partials=partials)


def test_results_merged_from_run_partials_are_the_whole_analysis_to_the_bit(
        spark, dataset, results, kept_partials):
    """Each run's own figures computed alone when it ended (through JSON, as they are
    kept), then the campaign's analysis of the pooled figures only: the same document,
    every figure, sketch, interval, stream, section and series."""
    root, _, _ = dataset
    partials = _read_partials(kept_partials)
    # r5 failed before it stored anything: no groups, as in the whole analysis
    assert [r for r, partial in partials.items() if partial.groups] == ["r1", "r2", "r3", "r4"]
    assert {key[1] for partial in partials.values() for key in partial.groups} == {"run"}
    merged = _with_partials(spark, root, partials)
    whole, by_parts = (r.model_dump(mode="json", exclude={"generated_at"})
                       for r in (results, merged))
    assert by_parts == whole
    assert by_parts["series"]["latency_timeline"], "the timelines were compared"
    assert by_parts["points"][0]["connections"], "the connection figures were compared"


def test_a_partial_gives_its_runs_own_figures_and_never_a_points(spark, dataset, results,
                                                                  kept_partials):
    """The merge reads a run's own figures from its partial, not from the events: a
    partial altered on purpose (same fingerprint) shows in its run, while the point pools
    the events as before."""
    root, _, _ = dataset
    partials = _read_partials(kept_partials)
    key = ("distribution", "run", "r1", None, "latency_us")
    found = partials["r1"].groups[key]
    partials["r1"].groups[key] = type(found)(**{**found.__dict__, "max": 1e9})
    merged = _with_partials(spark, root, partials)
    run = {r.run_id: r for r in merged.runs}["r1"]
    before = {r.run_id: r for r in results.runs}["r1"]
    assert run.latency_us.max == 1e9 != before.latency_us.max
    assert merged.points[0].latency_us.max == results.points[0].latency_us.max


def test_a_partial_whose_run_or_data_changed_is_ignored(spark, dataset, results, tmp_path,
                                                        kept_partials):
    """A partial holds while its run's RunInfo, its data files and the analysis code are
    what it was computed from; otherwise the run's figures are computed again."""
    import dataclasses
    import shutil

    root, _, _ = dataset
    copy = tmp_path / "data"
    shutil.copytree(root, copy)   # with the files' times: the partials still hold
    partials = _read_partials(kept_partials)
    for run_id, partial in partials.items():   # marked: a figure read from one shows
        key = ("distribution", "run", run_id, None, "latency_us")
        if key in partial.groups:
            found = partial.groups[key]
            partial.groups[key] = type(found)(**{**found.__dict__, "max": 1e9})
    # an event file of r1 rewritten later (same rows), r2 told another warm-up
    event_file = min((copy / "events" / f"campaign_id={CAMPAIGN}" / "run_id=r1").glob("*.parquet"))
    written = event_file.stat()
    os.utime(event_file, ns=(written.st_atime_ns, written.st_mtime_ns + 1_000_000_000))
    runs = [dataclasses.replace(run, warmup_messages=WARMUP + 1) if run.run_id == "r2" else run
            for run in RUNS]
    stale = _with_partials(spark, copy, partials, runs)
    by_id = {r.run_id: r for r in stale.runs}
    before = {r.run_id: r for r in results.runs}
    assert by_id["r1"].latency_us.max == before["r1"].latency_us.max != 1e9
    assert by_id["r2"].latency_us.max is not None
    assert by_id["r2"].latency_us.max == before["r2"].latency_us.max != 1e9  # computed again
    # a run whose partial still holds takes it
    untouched = [r for r in partials if r not in ("r1", "r2")
                 and ("distribution", "run", r, None, "latency_us") in partials[r].groups]
    assert untouched
    assert by_id[untouched[0]].latency_us.max == 1e9
