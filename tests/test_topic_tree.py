"""Topic trees (workload.topic_tree): the assignments' exact expectations, and the native
engine's publishers spreading their messages over 1,000 topics through a real Mosquitto
2.0.11, each subscriber receiving exactly what its wildcard filter matches."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.analytics.topics import topic_filter_regex
from mqttbed.campaigns.shapes import TopicTree, tree_messages_matching, tree_topic
from mqttbed.campaigns.spec import parse_spec
from mqttbed.controller.assignments import plan_assignments
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.errors import SpecError
from mqttbed.core.protocol import ClientAssignment, Endpoint, PublishedTree, Role
from tests.generic_support import MOSQUITTO, own_mosquitto

ROOT = "tree/t"
FILTERS = ["+/3/+", "#", "+/+/3", "7/#"]
MESSAGES = 1200   # per publisher: more than the tree's 1,000 topics, so it wraps around

needs_mosquitto = pytest.mark.skipif(not Path(MOSQUITTO).exists(),
                                     reason="Mosquitto 2.0.11 is not installed")


def tree_spec(**tree) -> dict:
    return {"name": "tree", "broker": {"backend": "mosquitto"}, "workload": {
        "publishers": 2, "subscribers": len(FILTERS), "topic": ROOT, "qos": 1,
        "rate_hz": 2000, "messages": MESSAGES, "warmup_messages": 10,
        "topic_tree": {"levels": 3, "fanout": 10, "filters": FILTERS, **tree}}}


def clients_of(spec: dict) -> list[ClientAssignment]:
    plans = plan_assignments(parse_spec(spec), "r1", "c1", Endpoint(host="127.0.0.1", port=1),
                             ["agent-0"])
    return plans["agent-0"].clients


def matches(topic_filter: str, topic: str) -> bool:
    return re.match(topic_filter_regex(topic_filter), topic) is not None


# -- the assignments ------------------------------------------------------------------------


def test_publishers_start_apart_and_subscribers_expect_what_their_filter_matches():
    clients = clients_of(tree_spec())
    publishers = [c for c in clients if c.role == Role.PUBLISHER]
    assert [c.topic_tree for c in publishers] == [
        PublishedTree(levels=3, fanout=10, first=0), PublishedTree(levels=3, fanout=10,
                                                                   first=500)]
    tree = TopicTree(levels=3, fanout=10, filters=FILTERS)
    for subscriber in (c for c in clients if c.role == Role.SUBSCRIBER):
        topic_filter = FILTERS[subscriber.subscribe_rank]
        assert subscriber.topic == f"{ROOT}/{topic_filter}"
        # counted by walking every message's topic: the digit count agrees
        walked = sum(matches(subscriber.topic, tree_topic(tree, ROOT, (p.first + k) % 1000))
                     for p in (c.topic_tree for c in publishers) if p is not None
                     for k in range(MESSAGES))
        assert subscriber.expected_messages == walked > 0


@pytest.mark.parametrize(("levels", "fanout", "topic_filter"), [
    (1, 7, "#"), (1, 7, "3"), (2, 5, "+/4"), (2, 5, "4/+"), (3, 4, "1/#"), (3, 4, "+/+/+"),
    (2, 5, "+"), (2, 5, "9/+"), (2, 5, "03/1")])
def test_the_digit_count_agrees_with_a_walk_over_every_message(levels, fanout, topic_filter):
    tree = TopicTree(levels=levels, fanout=fanout)
    for first, messages in ((0, 1), (3, tree.topics), (tree.topics - 2, 3 * tree.topics + 5)):
        walked = sum(matches(f"r/{topic_filter}", tree_topic(tree, "r", (first + k)
                                                               % tree.topics))
                     for k in range(messages))
        assert tree_messages_matching(tree, topic_filter, first, messages) == walked


def test_a_tree_with_the_lean_client_is_refused_naming_workload_client():
    clients = clients_of(tree_spec())
    with pytest.raises(ValueError, match=r"workload.topic_tree: .* set workload.client to "
                                         r"'native'"):
        MqttSession(Endpoint(host="127.0.0.1", port=1), clients, VirtualGpio(), print,
                    mqtt_client="lean")


# -- through Mosquitto --------------------------------------------------------------------


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    with own_mosquitto(tmp_path_factory.mktemp("tree")) as (_, port):
        yield Endpoint(host="127.0.0.1", port=port)


@needs_mosquitto
@pytest.mark.integration  # Mosquitto
def test_each_subscriber_receives_exactly_what_its_filter_matches(mosquitto):
    clients = clients_of(tree_spec())
    events: list = []
    session = MqttSession(mosquitto, clients, VirtualGpio(), events.append)
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + 10_000_000_000, abort=lambda: False)
    finally:
        session.close()
    assert session.native
    tree = TopicTree(levels=3, fanout=10, filters=FILTERS)
    firsts = {c.client_id: c.topic_tree.first for c in clients if c.topic_tree is not None}
    published = {(e[1], e[2]): e[4] for e in events if e[0] == "publish"}
    # every publish event names the topic its message went to
    assert published == {(p, k): tree_topic(tree, ROOT, (first + k) % tree.topics)
                         for p, first in firsts.items() for k in range(MESSAGES)}
    assert len(set(published.values())) == tree.topics
    for subscriber in (c for c in clients if c.role == Role.SUBSCRIBER):
        got = sorted((e[1], e[2], e[4]) for e in events
                     if e[0] == "delivery" and e[3] == subscriber.client_id)
        due = sorted((p, k, topic) for (p, k), topic in published.items()
                     if matches(subscriber.topic, topic))
        assert got == due, subscriber.topic   # nothing missing, nothing extra, none twice
        assert len(got) == subscriber.expected_messages


def test_a_tree_asked_of_the_python_clients_is_refused_before_the_run():
    spec = tree_spec()
    spec["workload"]["client"] = "paho"
    with pytest.raises(SpecError, match=r"workload.topic_tree .* workload.client 'paho'"):
        parse_spec(spec)


@needs_mosquitto
@pytest.mark.integration  # Mosquitto, Spark
def test_the_tree_section_counts_each_filter_against_what_it_matches(mosquitto, spark,
                                                                      tmp_path):
    from tests.test_shared_subscriptions import campaign_stats

    clients = clients_of(tree_spec(fanout=5))   # 125 topics
    events: list = []
    session = MqttSession(mosquitto, clients, VirtualGpio(), events.append)
    try:
        session.connect(timeout_s=10)
        start = monotonic_ns() + 20_000_000
        session.run(start, start + 10_000_000_000, abort=lambda: False)
    finally:
        session.close()
    # one delivery of the "#" subscriber dropped: lost to its filter only
    dropped = next(e for e in events if e[0] == "delivery" and e[3] == "sub-1" and not e[7])
    events.remove(dropped)
    stats = campaign_stats(spark, tmp_path, events, "topic_tree")
    tree = stats.runs[0].topic_tree
    measured = [e for e in events if e[0] == "publish" and not e[7]]
    assert tree.topics_published == len({e[4] for e in events if e[0] == "publish"}) == 125
    assert list(tree.filters) == sorted(f"{ROOT}/{f}" for f in FILTERS)
    for subscriber in (c for c in clients if c.role == Role.SUBSCRIBER):
        figures = tree.filters[subscriber.topic]
        matched = sum(matches(subscriber.topic, e[4]) for e in measured)
        lost = int(subscriber.client_id == "sub-1")
        assert (figures.subscribers, figures.matched, figures.delivered, figures.lost,
                figures.unexpected, figures.duplicated) == (1, matched, matched - lost, lost,
                                                            0, 0), subscriber.topic
        assert figures.latency_us.count == matched - lost
    assert stats.runs[0].lost == 1
    assert stats.runs[0].shared is None
