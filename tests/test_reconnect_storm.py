"""Reconnect storms (workload.reconnect): Mosquitto restarted mid-run with persistence on,
every client of the native engine back with exponential backoff, exact counts of what the
outage cost: a persistent QoS 1 session keeps what a QoS 0 (or clean) subscriber loses. A
backend that cannot restart its broker is refused before the run, by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqttbed.agents.gpio import VirtualGpio
from mqttbed.agents.mqtt_session import MqttSession
from mqttbed.brokers.mosquitto.backend import MosquittoBackend, Options
from mqttbed.campaigns.spec import CampaignSpec
from mqttbed.controller.assignments import check_away_shapes, plan_assignments
from mqttbed.core.backends import RestartsBroker, create_backend
from mqttbed.core.clock import monotonic_ns
from mqttbed.core.host import LocalHost
from mqttbed.core.protocol import (
    ClientAssignment,
    Endpoint,
    ReconnectPlan,
    Role,
    SessionPlan,
)

RATE_HZ = 100
MESSAGES = 300                  # 3 s of publishing
RESTART_AT_NS = 1_000_000_000
DOWN_S = 0.5
# publishers come back at once, subscribers later: what is sent in between is the test.
# A subscriber tries 0.4 s after the loss (refused: the broker is down 0.5 s) and again
# 0.8 s later; its publisher is back within 0.1 s of the broker, so unless Mosquitto takes
# 0.6 s longer than asked to come back the gap holds 30 messages or more. (With 0.3 s and
# 0.6 s, a restart 0.35 s late on a loaded CI machine left a gap of 3 messages.)
PUBLISHERS_BACK = ReconnectPlan(backoff_initial_ns=50_000_000, backoff_max_ns=100_000_000)
SUBSCRIBERS_BACK = ReconnectPlan(backoff_initial_ns=400_000_000,
                                 backoff_max_ns=1_000_000_000)


def storm_clients(messages: int = MESSAGES) -> list[ClientAssignment]:
    """A QoS 0 and a QoS 1 publisher; per QoS a clean and a persistent subscriber."""
    publishers = [ClientAssignment(
        client_id=f"pub-{qos}", role=Role.PUBLISHER, topic=f"storm/{qos}", qos=qos,
        gpio_pin=2 + qos, payload_bytes=64, rate_hz=RATE_HZ, messages=messages,
        publisher_index=qos, reconnect=PUBLISHERS_BACK) for qos in (0, 1)]
    subscribers = [ClientAssignment(
        client_id=f"sub-{qos}-{'kept' if kept else 'clean'}", role=Role.SUBSCRIBER,
        topic=f"storm/{qos}", qos=qos, gpio_pin=4 + 2 * qos + kept,
        expected_messages=messages, subscribe_rank=2 * qos + kept, reconnect=SUBSCRIBERS_BACK,
        session=SessionPlan() if kept else None) for qos in (0, 1) for kept in (0, 1)]
    return [*publishers, *subscribers]


@pytest.mark.integration  # Mosquitto
def test_a_restarted_mosquitto_gets_every_client_back_and_kept_sessions_lose_nothing():
    backend = MosquittoBackend()
    backend.keep_sessions(True)
    endpoint = backend.deploy(Options(sys_topics=False), LocalHost())
    events: list[tuple] = []
    try:
        assert "persistence true" in backend.deployment().config
        assert backend.deployment().persistence
        session = MqttSession(endpoint, storm_clients(), VirtualGpio(), events.append)
        try:
            session.connect(timeout_s=10)
            start = monotonic_ns() + 20_000_000
            backend.restart_at(start + RESTART_AT_NS, DOWN_S)
            session.run(start, start + 8_000_000_000, abort=lambda: False,
                        drain_idle=(start + 3_000_000_000, 500_000_000))
            assert backend.health() is None       # restarted, not dead
            away = {c.client_id: c for c in session.reconnects()}
        finally:
            session.close()
    finally:
        backend.teardown()
    [restart] = backend.faults()
    assert restart.until_ns is not None and restart.until_ns - restart.at_ns >= DOWN_S * 1e9
    assert set(away) == {"pub-0", "pub-1", "sub-0-clean", "sub-0-kept", "sub-1-clean",
                         "sub-1-kept"}
    for client in away.values():   # every client lost its connection once and came back
        [back] = client.reconnects
        assert not back.scheduled and back.t_lost_ns >= restart.at_ns
        assert back.t_connack_ns is not None
        assert back.t_connack_ns > restart.at_ns + DOWN_S * 1e9
        assert back.attempts >= 2             # refused while the broker was down
        kept = client.persistent
        assert back.session_present is kept   # persistence gave the sessions back
        assert (back.t_subscribed_ns is None) is (kept or client.role == Role.PUBLISHER)
    published = {(e[1], e[2]): e[9] for e in events if e[0] == "publish"}
    skipped = sum(away[p].reconnects[0].publishes_skipped for p in ("pub-0", "pub-1"))
    assert len(published) + skipped == 2 * MESSAGES and skipped > 0
    outage = {}
    for name, client in away.items():
        if client.role != Role.SUBSCRIBER:
            continue
        back = client.reconnects[0]
        on_stream = back.t_connack_ns if client.persistent else back.t_subscribed_ns
        assert on_stream is not None
        mine = {(p, s): t for (p, s), t in published.items() if p == f"pub-{client.qos}"}
        during = {key for key, t in mine.items() if back.t_lost_ns <= t < on_stream}
        got = {(e[1], e[2]) for e in events if e[0] == "delivery" and e[3] == name}
        late = during & got
        outage[name] = (len(during), len(late))
        if not client.persistent or client.qos == 0:
            # a subscription holds at the broker a moment before its SUBACK is read: what
            # was sent in that moment may come; nothing sent earlier in the outage does
            assert all(on_stream - mine[key] < 5_000_000 for key in late), (
                name, sorted((on_stream - mine[key]) / 1e6 for key in late))
        if client.qos == 1:   # nothing lost outside the outage but what was under way:
            # sent before the loss and after the last message that arrived before it (the
            # broker delivers a publisher's messages in order), never anything after it
            missed = set(mine) - during - got
            before = [key[1] for key in got & set(mine) if mine[key] < back.t_lost_ns]
            last = max(before, default=-1)
            assert all(s > last and mine[(p, s)] < back.t_lost_ns for (p, s) in missed), (
                name, last, {key: (mine[key] - restart.at_ns) / 1e6 for key in missed})
    # sent during each subscriber's outage (its publisher back, itself not yet): a kept
    # QoS 1 session gets all of it; QoS 0 and clean sessions lose it
    assert outage["sub-1-kept"][0] > 0 and outage["sub-1-kept"][1] == outage["sub-1-kept"][0]
    for name in ("sub-0-clean", "sub-0-kept", "sub-1-clean"):
        assert outage[name][0] - outage[name][1] > 10, (name, outage[name])


@pytest.mark.integration  # Mosquitto
def test_an_idle_drain_does_not_end_the_run_while_clients_are_away():
    # The broker comes back only after the publishing window (0.5 s) and its idle drain
    # (0.3 s): nothing is delivered meanwhile, yet the run waits for the clients that are
    # away (amqtt, 2.6 s to listen again, ended a campaign's run with none of them back).
    backend = MosquittoBackend()
    endpoint = backend.deploy(Options(sys_topics=False), LocalHost())
    try:
        session = MqttSession(endpoint, storm_clients(messages=50), VirtualGpio(),
                              lambda event: None)
        try:
            session.connect(timeout_s=10)
            start = monotonic_ns() + 20_000_000
            backend.restart_at(start + 300_000_000, 1.5)
            session.run(start, start + 8_000_000_000, abort=lambda: False,
                        t_publish_end_ns=start + 500_000_000,
                        drain_idle=(start + 500_000_000, 300_000_000))
            ended = monotonic_ns()
            away = session.reconnects()
        finally:
            session.close()
    finally:
        backend.teardown()
    [restart] = backend.faults()
    assert restart.until_ns is not None
    assert len(away) == 6 and all(c.reconnects[0].t_connack_ns is not None for c in away)
    assert restart.until_ns < ended < start + 8_000_000_000   # back, then idle: not the deadline


def spec(backend: dict[str, object], **workload: object) -> CampaignSpec:
    return CampaignSpec.model_validate({
        "name": "storm", "broker": backend,
        "workload": {"publishers": 1, "subscribers": 2, "qos": 1, "rate_hz": 100,
                     "messages": 100, **workload}})


def test_a_reconnect_storm_on_a_backend_that_cannot_restart_is_refused_naming_it():
    storm = spec({"backend": "external", "url": "mqtt://127.0.0.1:1883"},
                 reconnect={"restart_at_s": 1})
    assert not isinstance(create_backend("external"), RestartsBroker)
    with pytest.raises(ValueError, match="backend external cannot restart its broker"):
        check_away_shapes(storm)


def test_every_client_of_a_storm_reconnects_and_persistent_subscribers_keep_sessions():
    planned = plan_assignments(
        spec({"backend": "mosquitto"}, reconnect={"restart_at_s": 1, "backoff_initial_s": 0.1,
                                                  "backoff_max_s": 0.8, "persistent": True}),
        "r1", "c1", Endpoint(host="127.0.0.1", port=1883), ["a1"])
    assigned = {c.client_id: c for c in planned["a1"].clients}
    again = ReconnectPlan(backoff_initial_ns=100_000_000, backoff_max_ns=800_000_000)
    assert all(c.reconnect == again for c in assigned.values())
    assert assigned["pub-0"].session is None
    assert assigned["sub-0"].session == assigned["sub-1"].session == SessionPlan()
    assert isinstance(MosquittoBackend(), RestartsBroker)


@pytest.mark.integration  # nats-server, through the command backend
@pytest.mark.skipif(not Path("/usr/sbin/nats-server").exists(), reason="needs nats-server")
def test_the_command_backend_restarts_its_broker_nats_keeping_a_persistent_session():
    backend = create_backend("nats")
    assert isinstance(backend, RestartsBroker)
    backend.keep_sessions(True)
    endpoint = backend.deploy({}, LocalHost())
    kept = [c for c in storm_clients() if c.qos == 1]   # NATS grants QoS 0 and 1
    try:
        session = MqttSession(endpoint, kept, VirtualGpio(), lambda _e: None)
        try:
            session.connect(timeout_s=10)
            start = monotonic_ns() + 20_000_000
            backend.restart_at(start + RESTART_AT_NS, DOWN_S)
            session.run(start, start + 8_000_000_000, abort=lambda: False,
                        drain_idle=(start + 3_000_000_000, 500_000_000))
            away = {c.client_id: c for c in session.reconnects()}
        finally:
            session.close()
    finally:
        backend.teardown()
    [restart] = backend.faults()
    assert "restarted broker nats" in restart.what and restart.until_ns is not None
    assert all(len(c.reconnects) == 1 and c.reconnects[0].t_connack_ns is not None
               for c in away.values())
    assert away["sub-1-kept"].reconnects[0].session_present is True   # its JetStream store
    assert away["sub-1-clean"].reconnects[0].session_present is False
