"""Load at scale: 1,000 publishers and 1,000 subscribers in one run, through the controller,
two agent processes and a real Mosquitto; and a generator that cannot keep its rate says so.

Correctness only (exact counts, flags, processes gone): how fast is in bench/.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import psutil
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.assignments import plan_assignments
from mqttbed.controller.controller import create_controller
from mqttbed.controller.db import RunRow
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import LocalHost
from mqttbed.core.settings import Settings

pytestmark = pytest.mark.integration  # Mosquitto, agent processes

CLIENTS = 1_000
MESSAGES = 3


def _our_processes() -> set[int]:
    """Live processes this test process started (agents and brokers are our children)."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}


@pytest.mark.system
def test_a_thousand_publishers_and_a_thousand_subscribers_deliver_exactly_and_leave_nothing():
    spec = parse_spec({
        "name": "scale",
        "workload": {"publishers": CLIENTS, "subscribers": CLIENTS, "topics": "per-publisher",
                     "topic": "scale/t", "rate_hz": 5, "messages": MESSAGES,
                     "warmup_messages": 1, "qos": 1},
        "agents": {"count": 2},
        "timing": {"setup_timeout_s": 120, "drain_s": 2.0}})
    before = _our_processes()
    with tempfile.TemporaryDirectory() as tmp, \
            create_controller(Settings(data_dir=Path(tmp))) as ctl:
        campaign_id = ctl.engine.create_campaign(spec)
        status = ctl.engine.run_campaign(campaign_id)
        table = ds.dataset(ctl.layout.events, partitioning="hive").to_table()
        with ctl.sessions() as s:
            run = s.query(RunRow).filter_by(campaign_id=campaign_id).one()
            metadata, reason = run.run_metadata, run.reason
    assert status == "done", reason
    counts = metadata["delivery_counts"]
    assert len(counts) == 2   # two agent processes shared the 2,000 clients
    assert sum(c["published"] for c in counts.values()) == CLIENTS * MESSAGES
    assert sum(c["received"] for c in counts.values()) == CLIENTS * MESSAGES
    deliveries = table.filter(pc.field("kind") == "delivery")
    assert deliveries.num_rows == CLIENTS * MESSAGES   # no loss, no duplicate at QoS 1
    pairs = {(p, r) for p, r in zip(deliveries["publisher"].to_pylist(),
                                    deliveries["receiver"].to_pylist(), strict=True)}
    assert pairs == {(f"pub-{i}", f"sub-{i}") for i in range(CLIENTS)}
    assert set(deliveries["clock_source"].to_pylist()) == {"kernel"}
    generators = metadata["generators"].values()
    assert all(g["mqtt_client"] == "native" and g["nofile_limit"] >= 2 * CLIENTS
               for g in generators)
    limits = metadata["broker"]["limits"]
    assert limits["max_connections"] == -1 and limits["nofile"] >= 2 * CLIENTS
    # every agent and the broker are gone (only processes this test started are looked at)
    assert _our_processes() - before == set()


def test_a_rate_the_generator_cannot_keep_is_flagged():
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(), LocalHost())
    try:
        # 50 publishers at 100 kHz each (5 M messages/s) cannot be kept by one Python loop
        spec = parse_spec({"name": "impossible", "workload": {
            "publishers": 50, "subscribers": 1, "rate_hz": 100_000, "messages": 400,
            "warmup_messages": 0, "topic": "rate/impossible"}})
        clients = plan_assignments(spec, "r", "c", endpoint, ["a"])["a"].clients
        session = MqttSession(endpoint, clients, VirtualGpio(), lambda _e: None)
        try:
            session.connect(timeout_s=10)
            start = monotonic_ns() + 20_000_000
            session.run(start, start + 20_000_000_000, abort=lambda: False)
            report, (sent, received) = session.generator_report(), session.counts()
        finally:
            session.close()
    finally:
        backend.teardown()
    assert (sent, received) == (50 * 400, 50 * 400)   # every message still went out
    assert report.rate_kept is False and report.messages_unsent == 0
    assert report.requested_msgs_per_s == 50 * 100_000
    assert report.achieved_msgs_per_s < 0.95 * report.requested_msgs_per_s
    assert len(report.publishers_behind) == 50
