"""A fresh Spark session's first analysis, done on a tiny campaign before anything waits on it.

The first analysis in a JVM pays for class loading, Spark's code generation and the JIT:
measured here on the quickstart's 93,000 rows at load 5-8, 44.4 s cold against 16.1 s for
the third call, and 14.4 s when a one-run campaign had been analysed first
(2026-11-27). So a controller that starts Spark for a campaign
(:mod:`mqttbed.controller.lifecycle`) also analyses a synthetic campaign of two runs
(one publisher, two subscribers, 200 messages at 1 kHz, broker samples at 10 Hz) right
after the session is up, on the same niced thread, while the first run deploys. Its
results are thrown away; only the session's warmth is kept, so the real campaign's
analysis after its last run is a warm one. The rows are written and read through the same
storage layout and analysis as a campaign's
(:func:`~mqttbed.controller.storage.write_event_chunk`,
:func:`~mqttbed.analytics.stats.compute_campaign_stats`) in a temporary data dir, removed
afterwards.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqttbed.controller.storage import DataLayout, write_broker_samples, write_event_chunk
from mqttbed.core.backends import section_types
from mqttbed.core.events import ClockSource, EventKind, publisher_client_id, subscriber_client_id
from mqttbed.core.samples import BrokerResourceSample

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from mqttbed.analytics.results import CampaignStats
    from mqttbed.analytics.stats import RunInfo

log = logging.getLogger("mqttbed.analysis")

CAMPAIGN_ID = "warm-up"
RUNS = 2
MESSAGES = 200
SUBSCRIBERS = 2
WARMUP_MESSAGES = 10
RATE_HZ = 1000
TOPIC = "warm-up/t"
PAYLOAD_BYTES = 64
AGENTS = ("warm-up-pub", "warm-up-subs")
NS = 1_000_000_000


def warm_up_analysis(spark: SparkSession) -> CampaignStats:
    """Analyse the synthetic campaign on ``spark``; return its results (for a test to check
    that the pipeline really ran: every message delivered to both subscribers)."""
    from mqttbed.analytics.stats import compute_campaign_stats

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mqttbed-warm-up-") as tmp:
        layout = DataLayout(Path(tmp))
        runs = [_write_run(layout, repetition) for repetition in range(RUNS)]
        stats = compute_campaign_stats(
            spark, events_path=layout.events, samples_path=layout.broker_samples,
            records_path=layout.backend_records, section_types=section_types(),
            campaign={"id": CAMPAIGN_ID, "name": CAMPAIGN_ID, "spec": {}}, runs=runs)
    log.info("Spark warmed up on a synthetic campaign in %.1f s", time.perf_counter() - began)
    return stats


def _write_run(layout: DataLayout, repetition: int) -> RunInfo:
    """One run's rows as its agents would upload them: a publisher agent, a subscriber
    agent (SUBACKs, then the deliveries in arrival order), and the broker's samples."""
    from mqttbed.analytics.stats import RunInfo

    run_id = f"{CAMPAIGN_ID}-r{repetition:04d}"
    t0 = (1_000 + 60 * repetition) * NS
    intended = [t0 + seq * (NS // RATE_HZ) for seq in range(MESSAGES)]
    sent = [t + 20_000 + 1_000 * (seq % 7) for seq, t in enumerate(intended)]
    publisher = publisher_client_id(0)
    warmup = [seq < WARMUP_MESSAGES for seq in range(MESSAGES)]
    _write(layout, run_id, AGENTS[0], {
        "kind": [EventKind.PUBLISH.value] * MESSAGES, "publisher": [publisher] * MESSAGES,
        "seq": list(range(MESSAGES)), "receiver": [None] * MESSAGES,
        "t_intended_ns": intended, "t_pub_ns": sent, "t_recv_ns": [None] * MESSAGES,
        "warmup": warmup})
    arrivals = sorted((sent[seq] + 100_000 + 9_000 * rank + 3_000 * (seq % 11), seq, rank)
                      for seq in range(MESSAGES) for rank in range(SUBSCRIBERS))
    subscribed = [t0 - 2 * NS + rank * 3_000_000 for rank in range(SUBSCRIBERS)]
    _write(layout, run_id, AGENTS[1], {
        "kind": [EventKind.SUBSCRIBE.value] * SUBSCRIBERS
        + [EventKind.DELIVERY.value] * len(arrivals),
        "publisher": [None] * SUBSCRIBERS + [publisher] * len(arrivals),
        "seq": [None] * SUBSCRIBERS + [seq for _, seq, _ in arrivals],
        "receiver": [subscriber_client_id(rank) for rank in range(SUBSCRIBERS)]
        + [subscriber_client_id(rank) for _, _, rank in arrivals],
        "t_intended_ns": [None] * SUBSCRIBERS + [intended[seq] for _, seq, _ in arrivals],
        "t_pub_ns": [None] * SUBSCRIBERS + [sent[seq] for _, seq, _ in arrivals],
        "t_recv_ns": subscribed + [t for t, _, _ in arrivals],
        # deliveries stamped by the kernel, 40 us before the agent's own clock read
        "t_recv_user_ns": [t + 40_000 for t in subscribed]
        + [t + 40_000 for t, _, _ in arrivals],
        "clock_source": [ClockSource.USER.value] * SUBSCRIBERS
        + [ClockSource.KERNEL.value] * len(arrivals),
        "warmup": [False] * SUBSCRIBERS + [warmup[seq] for _, seq, _ in arrivals]})
    seconds = MESSAGES // RATE_HZ + 1
    write_broker_samples(layout, CAMPAIGN_ID, run_id, [
        BrokerResourceSample(t_ns=t0 + tenth * NS // 10, cpu_percent=20.0 + tenth % 3,
                             rss_bytes=8_000_000 + 4096 * tenth,
                             bytes_recv=tenth * 100 * PAYLOAD_BYTES,
                             bytes_sent=tenth * 100 * PAYLOAD_BYTES * SUBSCRIBERS, processes=1)
        for tenth in range(10 * seconds)])
    same_clock = {"offset_ns": 0, "uncertainty_ns": 0, "method": "same-clock",
                  "discipline": "none", "discipline_error_ns": None,
                  "probe_uncertainty_ns": None}
    return RunInfo(run_id, 0, {"workload.subscribers": SUBSCRIBERS}, repetition, "done",
                   "mosquitto", warmup_messages=WARMUP_MESSAGES,
                   agent_clocks={agent: same_clock for agent in AGENTS},
                   generator={"requested_msgs_per_s": float(RATE_HZ),
                              "achieved_msgs_per_s": float(RATE_HZ), "send_lag_max_us": 26.0,
                              "messages_unsent": 0, "publishers_behind": [],
                              "rate_kept": True, "mqtt_client": "native",
                              "deliveries_kernel_stamped": MESSAGES * SUBSCRIBERS,
                              "deliveries_user_stamped": 0})


def _write(layout: DataLayout, run_id: str, agent_id: str, columns: dict[str, list[Any]]
           ) -> None:
    rows = len(columns["kind"])
    columns = {**columns, "topic": [TOPIC] * rows, "qos": [0] * rows,
               "payload_bytes": [0 if kind == EventKind.SUBSCRIBE.value else PAYLOAD_BYTES
                                 for kind in columns["kind"]]}
    write_event_chunk(layout, CAMPAIGN_ID, run_id, agent_id, 0, columns,
                      {"agent_id": agent_id, "clock_source": ClockSource.USER.value,
                       "clock_offset_ns": 0, "clock_offset_uncertainty_ns": 10_000})
