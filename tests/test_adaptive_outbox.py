"""One subscriber's outbox decides like the paper's policies and holds payload bytes exactly.

No sockets, no clock: times are given, so each decision is checked at a known ``L_now``
(``RTT/2``) and sojourn. The policies' equations themselves are tested in
test_cloud_edge_sim.py; here, when the outbox applies them and what it writes first.
"""

from __future__ import annotations

import pytest

from mqttbed.brokers.adaptive.outbox import Message, Outbox, PayloadLedger, WithholdingCounts
from mqttbed.brokers.adaptive.rtt import RttProbe
from mqttbed.brokers.adaptive.tally import ClientTally, samples, totals
from mqttbed.core.withholding import Withholding, WithholdingPolicy

S = 1_000_000_000   # ns per s
THRESHOLD = 10_240
CONGESTED_RTT_S = 0.8   # L_now 0.4 s, above threshold_l/2 = 0.25 s
FAST_RTT_S = 0.2        # L_now 0.1 s


def outbox(policy: WithholdingPolicy | None = WithholdingPolicy.CONSERVATIVE,
           ledger: PayloadLedger | None = None, max_queued: int = 0, **params) -> Outbox:
    withholding = None if policy is None else Withholding(
        policy, threshold_l_s=0.5, query_period_s=1.0, starvation_s=20.0, **params)
    return Outbox(ledger or PayloadLedger(lazy=True), WithholdingCounts(), THRESHOLD,
                  max_queued, withholding)


def message(name: str, size: int, at_s: float = 0.0) -> Message:
    payload = name.encode().ljust(size, b".")
    return Message(f"msg/{name}", payload, 0, int(at_s * S), large=size > THRESHOLD)


def written(box: Outbox) -> list[str]:
    out = []
    while (delivery := box.pop()) is not None:
        out.append(delivery.message.topic.removeprefix("msg/"))
    return out


def test_a_small_message_overtakes_a_large_one_withheld_on_a_congested_link():
    box = outbox()
    assert box.offer(message("large", 1 << 20), 0, 0, CONGESTED_RTT_S)
    box.offer(message("small", 100), 0, 0, CONGESTED_RTT_S)
    assert written(box) == ["small"]
    assert box.counts.large_withheld == 1 and len(box.withheld) == 1


def test_a_fast_rtt_releases_the_withheld_message_with_its_sojourn_recorded():
    box = outbox()
    box.offer(message("large", 1 << 20), 0, 0, CONGESTED_RTT_S)
    assert box.reconsider(3 * S, CONGESTED_RTT_S) == 0
    assert box.reconsider(4 * S, FAST_RTT_S) == 1
    assert written(box) == ["large"]
    assert box.counts.withheld_s == [4.0] and box.counts.released_by_policy == 1


def test_the_starvation_timer_releases_what_the_policy_still_holds():
    box = outbox()
    box.offer(message("a", 1 << 20, at_s=1.0), 0, 1 * S, CONGESTED_RTT_S)
    box.offer(message("b", 1 << 20, at_s=5.0), 0, 5 * S, CONGESTED_RTT_S)
    assert box.next_deadline_ns() == 21 * S
    assert box.release_starved(21 * S - 1) == 0
    assert box.release_starved(21 * S) == 1
    assert box.next_deadline_ns() == 25 * S
    assert written(box) == ["a"] and box.counts.released_by_starvation == 1


def test_without_policy_everything_goes_first_come_first_served():
    box = outbox(policy=None)
    box.offer(message("large", 1 << 20), 0, 0, CONGESTED_RTT_S)
    box.offer(message("small", 100), 0, 0, CONGESTED_RTT_S)
    assert written(box) == ["large", "small"]
    assert box.next_deadline_ns() is None and box.counts.large_sent_immediately == 1


def test_with_no_rtt_estimate_yet_a_large_message_is_sent():
    box = outbox()
    box.offer(message("large", 1 << 20), 0, 0, None)
    box.offer(message("small", 100), 0, 0, None)
    assert written(box) == ["small", "large"]   # released, still behind the express lane


def test_historic_releases_once_the_sojourn_outgrows_the_congestion():
    # L_now = 2.0 s; sends when 2.0 < TQ 1.0 + 0.25 + dS, i.e. dS > 0.75 s
    box = outbox(WithholdingPolicy.HISTORIC)
    box.offer(message("large", 1 << 20), 0, 0, 4.0)
    assert box.next_deadline_ns() is None   # no timer: the sojourn caps the wait
    assert box.reconsider(int(0.7 * S), 4.0) == 0
    assert box.reconsider(int(0.8 * S), 4.0) == 1


def test_a_release_takes_the_older_withheld_messages_with_it_in_order():
    # probabilistic: p = exp(-lambda (dS + TQ)) falls with dS, so L_next falls, and an
    # old message can be held where a new one is sent; the old one must not be overtaken
    box = outbox(WithholdingPolicy.PROBABILISTIC, congestion_rate_per_s=1.0)
    box.offer(message("old", 1 << 20), 0, 0, 6.0)       # L_now 3 > TQ 1 + L_next 1.26
    assert len(box.withheld) == 1
    # L_now 1.5 < 1 + L_next 0.71: sent, where the old one (dS 2 s: L_next 0.31) is not
    box.offer(message("new", 1 << 20, at_s=2.0), 0, 2 * S, 3.0)
    assert written(box) == ["old", "new"]


@pytest.mark.parametrize(("lazy", "held"), [(True, 3 * 50_000), (False, 4 * 3 * 50_000)])
def test_lazy_allocation_counts_a_shared_payload_once_eager_once_per_subscriber(lazy, held):
    ledger = PayloadLedger(lazy)
    boxes = [outbox(ledger=ledger) for _ in range(4)]
    for n in range(3):
        shared = message(f"large{n}", 50_000)
        for box in boxes:
            box.offer(shared, 0, 0, CONGESTED_RTT_S)
    assert ledger.held_bytes == ledger.peak_bytes == held
    assert ledger.copies_made == (0 if lazy else 12)
    boxes[0].reconsider(1 * S, FAST_RTT_S)
    written(boxes[0])
    assert ledger.held_bytes == (held if lazy else held - 3 * 50_000)  # others still hold
    for box in boxes[1:]:
        box.clear()
    assert ledger.held_bytes == 0 and ledger.peak_bytes == held
    assert boxes[1].counts.withheld_dropped == 3


def test_an_eager_copy_carries_its_own_packet_identifier():
    ledger = PayloadLedger(lazy=False)
    shared = Message("t", b"x" * 20_000, 1, 0, large=True)
    first, second = ledger.take(shared, 1), ledger.take(shared, 1)
    packets = bytes(first.packet(7)), bytes(second.packet(513))
    assert packets[0][-20_002:-20_000] == b"\x00\x07"
    assert packets[1][-20_002:-20_000] == b"\x02\x01"
    assert first.copy is not second.copy


def test_a_full_queue_drops_and_counts_but_queries_always_fit():
    box = outbox(max_queued=2)
    assert box.offer(message("a", 100), 0, 0, None) and box.offer(message("b", 100), 0, 0, None)
    assert not box.offer(message("c", 100), 0, 0, None)
    box.offer_query(Message("$adaptive/rtt", b"q", 1, 0, large=False, counted=False))
    assert len(box) == 3 and box.counts.dropped_queue_full == 1


def test_a_clients_tally_sums_into_the_totals_and_keeps_its_samples_apart():
    first, second = ClientTally(RttProbe(S)), ClientTally(RttProbe(S))
    for tally, rtts in ((first, [0.1, 0.3]), (second, [2.0])):
        box = Outbox(PayloadLedger(lazy=True), tally.counts, THRESHOLD, 0,
                     Withholding(WithholdingPolicy.CONSERVATIVE))
        for n, rtt_s in enumerate(rtts, start=1):
            tally.probe.written(n, 0)
            tally.probe.answer(n, int(rtt_s * S))
        box.offer(message("large", 1 << 20), 0, 0, tally.probe.latest_s)
    second.probe.written(9, 0)
    second.probe.new_connection()   # reconnected: that query can never be answered
    summed = totals({"a": first, "b": second})
    assert summed["large_deliveries"] == 2 and summed["large_withheld"] == 1
    assert summed["rtt_queries_sent"] == 4 and summed["rtt_queries_given_up"] == 1
    kept = samples({"a": first, "b": second})
    assert kept["clients"]["b"] == {"rtt_ms": [2000.0], "withheld_s": []}
    assert kept["rtt_ms"] == [100.0, 300.0, 2000.0]
