"""The retained block of the results, from a real run's events (the engine through a real
Mosquitto), with anomalies a broker could cause written into a copy: a stale value, a
duplicate and a missing one are each counted, and the retained rows stay out of latency."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from mqttbed.analytics.stats import RunInfo, compute_campaign_stats  # noqa: E402
from mqttbed.core.events import EVENT_COLUMNS, arrow_schema  # noqa: E402
from tests.test_retained_engine import (  # noqa: E402
    AFTER_S,
    SUBSCRIBERS,
    TOPICS,
    UPDATES,
    mosquitto_endpoint,
    retained_run,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
CAMPAIGN = "retained-results"


def _write(root: Path, run_id: str, rows: list[dict[str, Any]]) -> None:
    events = [{**dict.fromkeys(EVENT_COLUMNS), "agent_id": "agent", "clock_offset_ns": 0,
               "clock_offset_uncertainty_ns": 0,
               **{k: v for k, v in row.items() if k in EVENT_COLUMNS}} for row in rows]
    directory = root / f"campaign_id={CAMPAIGN}" / f"run_id={run_id}"
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(events, schema=arrow_schema()),
                   directory / "events.parquet")


def _with_anomalies(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """sub-0: one value delivered twice; sub-1: topic 7's latest value replaced by its
    first (stale, and the latest missing); sub-2: topic 9's value never came."""
    deliveries = [r for r in rows if r["kind"] == "delivery"]
    of = {(r["receiver"], r["topic"]): r for r in deliveries}
    first_set = min((r for r in rows if r["kind"] == "publish" and r["topic"].endswith("/7")),
                    key=lambda r: r["seq"])
    stale = {**of[("sub-1", "retained/q1/7")], "seq": first_set["seq"],
             "t_pub_ns": first_set["t_pub_ns"]}
    dropped = (of[("sub-1", "retained/q1/7")], of[("sub-2", "retained/q1/9")])
    kept = [r for r in rows if not any(r is d for d in dropped)]
    return [*kept, stale, of[("sub-0", "retained/q1/3")]]


def test_retained_section_counts_what_subscribers_held(spark, tmp_path):
    with mosquitto_endpoint(tmp_path) as endpoint:
        rows, _ = retained_run(endpoint, 1, "retained/q1")
    events = tmp_path / "events"
    _write(events, "clean", rows)
    _write(events, "faulty", _with_anomalies(rows))
    runs = [RunInfo(run_id, index, {"run": run_id}, 0, "done", "mosquitto", shape="retained")
            for index, run_id in enumerate(("clean", "faulty"))]
    stats = compute_campaign_stats(spark, events_path=events, samples_path=tmp_path / "none",
                                   campaign={"id": CAMPAIGN}, runs=runs)
    clean, faulty = (run.retained for run in stats.runs)
    assert clean is not None and faulty is not None
    assert (clean.topics, clean.values_set, clean.subscribers) == (
        TOPICS, TOPICS * UPDATES, SUBSCRIBERS)
    assert (clean.expected, clean.delivered_latest, clean.missing, clean.stale,
            clean.duplicates, clean.without_retain_flag + clean.live) == (
        TOPICS * SUBSCRIBERS, TOPICS * SUBSCRIBERS, 0, 0, 0, 0)
    assert clean.subscribers_holding_all == SUBSCRIBERS
    hold = clean.hold_from_subscribe_us
    assert hold.count == SUBSCRIBERS and hold.p50 is not None and hold.p50 > 0
    assert clean.hold_from_suback_us.count == SUBSCRIBERS
    waited = clean.subscribe_after_set_us
    assert waited.count == SUBSCRIBERS and waited.max is not None
    assert waited.p50 is not None and waited.p50 >= AFTER_S * 1e6
    assert (faulty.delivered_latest, faulty.missing, faulty.stale, faulty.duplicates) == (
        TOPICS * SUBSCRIBERS - 2, 2, 1, 1)
    assert faulty.subscribers_holding_all == 1
    # retained values have no latency: none of their rows enters the delivery figures
    for run in stats.runs:
        assert run.latency_us.count == 0
        assert (run.messages_sent, run.deliveries_expected, run.deliveries_received) == (0, 0, 0)
    point = stats.points[0]
    assert point.retained is not None and point.retained.subscribers == SUBSCRIBERS
