"""Shared subscriptions (workload.shared): the assignments, and the native engine's run
through a real Mosquitto 2.0.11, where every message of a QoS 1 stream reaches exactly one
member of each group, at MQTT 5 and in Mosquitto's 3.1.1 form alike."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.assignments import plan_assignments
from mqttbed.core.broker_access import MqttProtocol
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.errors import SpecError
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role
from tests.generic_support import MOSQUITTO, own_mosquitto

MESSAGES = 90
WARMUP = 3

needs_mosquitto = pytest.mark.skipif(not Path(MOSQUITTO).exists(),
                                     reason="Mosquitto 2.0.11 is not installed")


def shared_spec(protocol: MqttProtocol = "5", groups: int = 1, subscribers: int = 3,
                **shared) -> dict:
    return {"name": "shared", "broker": {"backend": "mosquitto"}, "workload": {
        "publishers": 1, "subscribers": subscribers, "topic": "shared/stream", "qos": 1,
        "rate_hz": 300, "messages": MESSAGES, "warmup_messages": WARMUP,
        "protocol": protocol, "shared": {"group": "workers", "groups": groups, **shared}}}


def clients_of(spec: dict) -> list[ClientAssignment]:
    plans = plan_assignments(parse_spec(spec), "r1", "c1", Endpoint(host="127.0.0.1", port=1),
                             ["agent-0"])
    return plans["agent-0"].clients


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    with own_mosquitto(tmp_path_factory.mktemp("shared")) as (_, port):
        yield Endpoint(host="127.0.0.1", port=port)


def run(endpoint: Endpoint, clients: list[ClientAssignment], protocol: MqttProtocol
        ) -> tuple[MqttSession, list]:
    events: list = []
    session = MqttSession(endpoint, clients, VirtualGpio(), events.append, protocol=protocol)
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        # the members wait out the drain: none knows its share before the run
        session.run(start, start + 1_500_000_000, abort=lambda: False,
                    t_publish_end_ns=start + 1_000_000_000)
    finally:
        session.close()
    return session, events


# -- the assignments ------------------------------------------------------------------------


def test_members_are_dealt_over_the_groups_round_robin():
    subscribers = [c for c in clients_of(shared_spec(groups=2, subscribers=5))
                   if c.role == Role.SUBSCRIBER]
    assert [c.topic for c in subscribers] == [
        f"$share/workers-{j % 2}/shared/stream" for j in range(5)]
    # a member may be handed any of the stream: it expects all, and waits out the drain
    assert {c.expected_messages for c in subscribers} == {MESSAGES}


def test_a_broker_without_shared_subscriptions_is_refused_naming_it():
    spec = shared_spec()
    spec["broker"] = {"backend": "forkpipe"}
    with pytest.raises(SpecError, match=r"workload.shared: broker forkpipe has shared "
                                        r"subscriptions \(\$share/GROUP/FILTER\) at no MQTT"):
        parse_spec(spec)


# -- through Mosquitto --------------------------------------------------------------------


@needs_mosquitto
@pytest.mark.integration  # Mosquitto
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_each_message_reaches_exactly_one_member_of_the_group(mosquitto, protocol):
    clients = clients_of(shared_spec(protocol))
    session, events = run(mosquitto, clients, protocol)
    assert session.native
    deliveries = [e for e in events if e[0] == "delivery"]
    by_seq = Counter(e[2] for e in deliveries)
    # every message once, at one member: none lost, none twice
    assert sorted(by_seq) == list(range(MESSAGES))
    assert set(by_seq.values()) == {1}
    members = Counter(e[3] for e in deliveries)
    # Mosquitto deals a group's messages round-robin: every member takes part
    assert set(members) == {"sub-0", "sub-1", "sub-2"}
    assert sum(members.values()) == MESSAGES
    assert {e[4] for e in deliveries} == {"shared/stream"}   # the topic published to
    subscribed = {(e[3], e[4]) for e in events if e[0] == "subscribe"}
    assert subscribed == {(f"sub-{j}", "$share/workers-0/shared/stream") for j in range(3)}


@needs_mosquitto
@pytest.mark.integration  # Mosquitto
def test_two_groups_each_receive_the_whole_stream_once(mosquitto):
    clients = clients_of(shared_spec("5", groups=2, subscribers=4))
    _, events = run(mosquitto, clients, "5")
    group_of = {f"sub-{j}": j % 2 for j in range(4)}
    per_group = Counter((group_of[e[3]], e[2]) for e in events if e[0] == "delivery")
    assert sorted(per_group) == [(g, k) for g in (0, 1) for k in range(MESSAGES)]
    assert set(per_group.values()) == {1}


# -- the analysis (real Spark) --------------------------------------------------------------


def campaign_stats(spark, root: Path, events: list, shape: str | None) -> Any:
    """The results of one run of these raw events (one agent, its clock the controller's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mqttbed.agents.native_session import RAW_COLUMNS
    from mqttbed.analytics.stats import RunInfo, compute_campaign_stats
    from mqttbed.core.events import arrow_schema

    rows = [{**dict(zip(RAW_COLUMNS, event, strict=True)), "agent_id": "agent-0",
             "clock_offset_ns": 0, "clock_offset_uncertainty_ns": 0} for event in events]
    directory = root / "events" / "campaign_id=c1" / "run_id=r1"
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()),
                   directory / "agent-0-000000.parquet")
    return compute_campaign_stats(
        spark, events_path=root / "events", samples_path=root / "samples",
        campaign={"id": "c1"}, runs=[RunInfo("r1", 0, {}, 0, "done", "mosquitto",
                                             warmup_messages=WARMUP, shape=shape)])


@needs_mosquitto
@pytest.mark.integration  # Mosquitto, Spark
def test_the_shared_section_counts_each_message_once_per_group(mosquitto, spark, tmp_path):
    clients = clients_of(shared_spec("5"))
    _, events = run(mosquitto, clients, "5")
    deliveries = [e for e in events if e[0] == "delivery" and not e[7]]
    # one message lost (its only copy dropped), one duplicated at a second member
    lost, twice = deliveries[10], deliveries[20]
    other = next(m for m in ("sub-0", "sub-1", "sub-2") if m != twice[3])
    late = (*twice[:3], other, *twice[4:10], twice[10] + 1000, twice[11], twice[12] + 1000)
    events = [e for e in events if e is not lost] + [late]
    stats = campaign_stats(spark, tmp_path, events, "shared")
    run_figures = stats.runs[0]
    measured = MESSAGES - WARMUP
    # the group, not each member, is due every message: no per-member expectation
    assert (run_figures.deliveries_expected, run_figures.deliveries_received,
            run_figures.lost, run_figures.duplicates, run_figures.deliveries_unexpected) == (
        measured, measured - 1, 1, 1, 0)
    group = run_figures.shared.groups["$share/workers-0"]
    assert (group.members, group.expected, group.delivered, group.lost, group.duplicated,
            group.extra_copies) == (3, measured, measured - 1, 1, 1, 1)
    first_taker = Counter(e[3] for e in events if e[0] == "delivery" and not e[7]
                          and e is not late)
    assert {m: f.deliveries for m, f in group.by_member.items()} == dict(first_taker)
    shares = [f.deliveries / (measured - 1) for f in group.by_member.values()]
    assert (group.share_min, group.share_max) == (min(shares), max(shares))
    assert group.fairness == pytest.approx(
        sum(first_taker.values()) ** 2 / (3 * sum(v * v for v in first_taker.values())))
    assert all(f.latency_us.count == f.deliveries and f.latency_us.p50 > 0
               for f in group.by_member.values())
    assert stats.points[0].shared == run_figures.shared.model_copy()
    assert run_figures.topic_tree is None
