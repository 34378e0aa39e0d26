"""The $SYS sampler: numbers only, bounded memory, and the probes' words for failures."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from mqttbed.brokers.reachability import describe_connack
from mqttbed.instruments.sys_topics import SysTopicsSampler, SysTopicsUnavailable, numeric_value
from tests.conftest import wait_until
from tests.generic_support import free_port, own_mosquitto, refusing_broker

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("payload", "value"), [
    (b"42", 42.0), (b" 0.25\n", 0.25), (b"-3", -3.0), (b"1e3", 1000.0),
    (b"mosquitto version 2.0.11", None), (b"12 seconds", None), (b"nan", None),
    (b"inf", None), (b"\xff", None), (b"", None),
])
def test_only_finite_numbers_are_values(payload, value):
    assert numeric_value(payload) == value


def test_connack_codes_are_named_as_the_standard_names_them():
    assert describe_connack(5) == "5 not authorized"
    assert describe_connack(4) == "4 bad username or password"
    assert describe_connack(9) == "9 reserved, not a 3.1.1 return code"


@pytest.mark.integration  # Mosquitto
def test_memory_is_bounded_and_what_did_not_fit_is_counted(tmp_path):
    with own_mosquitto(tmp_path) as (_, port):
        sampler = SysTopicsSampler("127.0.0.1", port, max_samples=5)
        sampler.start()
        # the retained $SYS values come at once: more numbers than it keeps, and the version
        wait_until(lambda: sampler.dropped > 0 and "$SYS/broker/version" in sampler.texts(), 10,
                   "more than 5 numeric $SYS values, and $SYS/broker/version")
        samples = sampler.stop()
        assert sampler.stop() == samples   # twice: the same
    assert len(samples) == 5 and sampler.dropped > 0 and sampler.error is None
    assert sampler.texts()["$SYS/broker/version"].startswith("mosquitto version ")


def test_a_refusing_or_absent_broker_is_named():
    with refusing_broker(5) as port, pytest.raises(SysTopicsUnavailable,
                                                   match="CONNACK return code 5"):
        SysTopicsSampler("127.0.0.1", port).start()
    with pytest.raises(SysTopicsUnavailable, match="cannot connect to 127.0.0.1"):
        SysTopicsSampler("127.0.0.1", free_port()).start()


@pytest.mark.integration
def test_a_mosquitto_run_keeps_its_sys_counters_beside_the_run_and_they_count_the_messages(
        controller):
    from mqttbed.brokers.mosquitto.backend import MosquittoDeployment
    from mqttbed.campaigns.spec import parse_spec
    from mqttbed.controller.analysis import sys_topic_series
    from mqttbed.controller.db import RunRow
    from mqttbed.controller.storage import read_sys_samples
    from mqttbed.core.run_record import run_record

    spec = parse_spec({"name": "sys", "agents": {"count": 1},
                       "workload": {"subscribers": 2, "rate_hz": 400, "messages": 2000,
                                    "warmup_messages": 0}})
    campaign_id = controller.engine.create_campaign(spec)
    controller.engine.run_campaign(campaign_id)
    with controller.sessions() as s:
        (run,) = s.query(RunRow).filter_by(campaign_id=campaign_id).all()
    assert run.state == "done", run.reason
    broker = run_record(run.run_metadata, run.id).broker
    assert broker is not None
    sys_topics = broker.as_type(MosquittoDeployment).sys_topics
    assert sys_topics is not None and sys_topics.samples > 0
    samples = read_sys_samples(controller.layout, campaign_id, run.id)
    counter = sorted((s for s in samples if s.topic == "$SYS/broker/messages/received"),
                     key=lambda s: s.t_ns)
    received = [s.value for s in counter]
    # sys_interval 1 (Mosquitto sends every 1-2 s here): a 5 s run gives several updates,
    # and the counter never goes back
    assert len(received) >= 3 and received == sorted(received)
    # and it counts our messages: each update (taken at least a second after the one
    # before) counts at least every PUBLISH the agent sent before that earlier update
    # arrived here (same machine: the agent's send stamps and the arrivals are both
    # CLOCK_MONOTONIC); an update in the middle of the run has some before it
    events = pq.read_table(controller.layout.run_events(campaign_id, run.id),
                           columns=["kind", "t_pub_ns"]).to_pylist()
    sent = sorted(e["t_pub_ns"] for e in events if e["kind"] == "publish")
    sent_before = [sum(1 for t in sent if t < earlier.t_ns) for earlier in counter[:-1]]
    assert all(later.value >= n for later, n in zip(counter[1:], sent_before, strict=True))
    assert max(sent_before) > 0, (sent[0], [s.t_ns for s in counter])
    series = sys_topic_series(controller.layout, [run])[run.id]
    assert series["$SYS/broker/messages/received"].value == received
