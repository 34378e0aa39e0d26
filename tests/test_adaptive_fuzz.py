"""Malformed and mutated MQTT never takes the adaptive broker down, nor hits a bug in it.

The cases are the fork/pipe fuzzer's (:func:`tests.test_forkpipe_fuzz.case_bytes`: bit
flips, truncations, insertions, lying remaining lengths, random types, noise, with or
without a valid CONNECT first), seeded, so a failure names its seed and case. Each
connection that breaks the protocol must be refused (counted by reason), never reach
the broker's internal-error handler; afterwards a well-behaved subscriber is still served.
"""

from __future__ import annotations

import random
import time

import pytest

from mqttbed.brokers.adaptive.backend import AdaptiveBackend, Options
from mqttbed.brokers.adaptive.shaped_client import ShapedSubscribers
from mqttbed.core.host import LocalHost
from tests.conftest import eventually
from tests.test_forkpipe_fuzz import case_bytes, send_case
from tests.test_forkpipe_protocol import RawClient, publish

pytestmark = pytest.mark.timeout(60)

SEED = 20250317
CASES = 1000
TIME_BUDGET_S = 15.0


def test_mutated_packets_are_refused_and_a_well_behaved_client_is_still_served():
    rng = random.Random(SEED)
    backend = AdaptiveBackend()
    endpoint = backend.deploy(Options(rtt_query_period_s=0.2, rtt_query_bytes=50,
                                      max_packet_bytes=1 << 16), LocalHost())
    shaped = ShapedSubscribers(endpoint.host, endpoint.port)
    try:
        # a subscriber that stays through the fuzzing: the bad connections must not hurt it
        bystander = shaped.connect("bystander", [("fz/#", 1), ("after/#", 1)])
        deadline = time.monotonic() + TIME_BUDGET_S
        sent = 0
        while sent < CASES and time.monotonic() < deadline:
            data = case_bytes(rng)
            send_case(endpoint.port, data, linger_s=0.02 if rng.random() < 0.3 else 0.0)
            sent += 1
            assert backend.health() is None, f"seed {SEED} case {sent}: {data!r}"
        assert sent >= 200, f"only {sent} cases in {TIME_BUDGET_S} s"

        publisher = RawClient(endpoint)
        publisher.handshake("good-pub")
        publisher.send(publish("after/fuzz/ok", b"still served"))
        assert shaped.wait_for(lambda: any(r.topic == "after/fuzz/ok"
                                           for r in bystander.received), 3)
        publisher.close()
        assert bystander.queries_answered > 0 and not bystander.closed
        # every fuzz connection is gone; only the bystander's session is left
        assert eventually(lambda: backend.live_counters()["sessions"] == 1, timeout_s=5)
        stats = backend.live_counters()
        assert stats["internal_errors"] == 0
        assert stats["refused"]["malformed packet"] > 0
        assert stats["connections"] > sent // 2   # (a few die in the listen backlog)
    finally:
        shaped.close()
        backend.teardown()
    assert backend.deployment().exit_code == 0
