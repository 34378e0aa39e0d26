"""One subscriber's outgoing messages: size classes, withholding, and the payload bytes held.

The cloud-edge paper (seed 003, Fig. 4) labels each PUBLISH by size on arrival: a payload
above ``threshold_bytes`` is *large*. For a subscriber under a withholding policy
(:class:`~mqttbed.core.withholding.Withholding`), an :class:`Outbox` keeps three queues:

- ``express``: small messages and RTT queries, written first, in arrival order;
- ``bulk``: large messages the policy released, written when ``express`` is empty,
  in arrival order;
- ``withheld``: large messages the policy holds back. Decisions are taken when one
  arrives (:meth:`Outbox.offer`), at each new RTT estimate and query period
  (:meth:`Outbox.reconsider`), and at the starvation timer ``D``
  (:meth:`Outbox.release_starved`, due at :meth:`Outbox.next_deadline_ns`). When a
  message is released, every older withheld one goes with it, ahead of it, so large
  messages keep their order (the probabilistic policy can favour a newer message: its
  ``p`` falls with the sojourn).

So a small message overtakes every large one not yet written; one already handed to the
socket cannot be overtaken (an MQTT packet is never interleaved). Topics are therefore
*Unordered Topics* (MQTT 3.1.1 section 4.6 lets a server treat them so): a small message
can overtake a large one on the same topic. A subscriber without a policy (``policy:
none``, the paper's first-come-first-serve baseline) has one FIFO queue, ``express``.

Memory (the paper's Fig. 5): a :class:`PayloadLedger` counts the payload bytes held for
deliveries not yet written. *Eager* (Fig. 5A, the baseline broker): each subscriber's
queue entry is its own copy of the PUBLISH, made on arrival. *Lazy* (Fig. 5B): queue
entries reference one shared :class:`Message`; its payload counts once while any queue
holds it, and a subscriber's packet is built only when it is written.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field

from mqttbed.core.mqtt_codec import encode_publish
from mqttbed.core.withholding import Withholding

_U16 = struct.Struct("!H")
_PLACEHOLDER_PACKET_ID = 1


@dataclass(slots=True, eq=False)
class Message:
    """One PUBLISH as the broker keeps it: shared by every queue it is in (lazy allocation)."""

    topic: str
    payload: bytes
    qos: int
    arrived_ns: int
    large: bool
    counted: bool = True    # in the ledger; False for the broker's own RTT queries
    queued: int = 0         # queue entries referencing it (lazy allocation)


@dataclass(slots=True, eq=False)
class Delivery:
    """One message on its way to one subscriber."""

    message: Message
    qos: int
    copy: bytearray | None = None   # eager: this subscriber's own PUBLISH packet
    query: bool = False             # an RTT query (its PUBACK gives an RTT sample)

    def packet(self, packet_id: int | None) -> bytes | bytearray:
        """The PUBLISH to write, with ``packet_id`` (QoS 1); lazy: built now."""
        if self.copy is None:
            message = self.message
            return encode_publish(message.topic, message.payload, self.qos, packet_id=packet_id)
        if self.qos:
            at = len(self.copy) - len(self.message.payload) - 2
            self.copy[at:at + 2] = _U16.pack(packet_id)
        return self.copy


class PayloadLedger:
    """Payload bytes of application messages held for deliveries not yet written, exactly.

    Eager: every queue entry's copy counts. Lazy: a shared message counts once while at
    least one queue entry references it. Bytes handed to a socket no longer count (the
    sockets' write buffers are reported apart), nor do the broker's RTT queries.
    """

    def __init__(self, lazy: bool):
        self.lazy = lazy
        self.held_bytes = 0
        self.peak_bytes = 0
        self.copies_made = 0   # eager: per-subscriber copies allocated on arrival

    def take(self, message: Message, qos: int, query: bool = False) -> Delivery:
        """A queue entry for ``message`` at ``qos``, allocating the subscriber's copy if eager."""
        if not message.counted:
            return Delivery(message, qos, query=query)
        size = len(message.payload)
        if self.lazy:
            message.queued += 1
            if message.queued == 1:
                self._add(size)
            return Delivery(message, qos)
        self.copies_made += 1
        self._add(size)
        packet_id = _PLACEHOLDER_PACKET_ID if qos else None
        return Delivery(message, qos, bytearray(
            encode_publish(message.topic, message.payload, qos, packet_id=packet_id)))

    def give_back(self, delivery: Delivery) -> None:
        """``delivery`` left its queue (written, or dropped with its subscriber)."""
        message = delivery.message
        if not message.counted:
            return
        if self.lazy:
            message.queued -= 1
            if message.queued == 0:
                self.held_bytes -= len(message.payload)
        else:
            self.held_bytes -= len(message.payload)

    def _add(self, size: int) -> None:
        self.held_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)


@dataclass(slots=True)
class Withheld:
    """A large message held back, and since when (its sojourn ``ΔS`` starts on arrival)."""

    delivery: Delivery
    since_ns: int


@dataclass
class WithholdingCounts:
    """What the withholding of one broker did, over all subscribers."""

    small_deliveries: int = 0
    large_deliveries: int = 0
    large_sent_immediately: int = 0
    large_withheld: int = 0
    released_by_policy: int = 0        # at a new RTT estimate or query period
    released_by_starvation: int = 0    # at the starvation timer D
    withheld_dropped: int = 0          # its subscriber left while it was withheld
    dropped_queue_full: int = 0
    withheld_s: list[float] = field(default_factory=list)  # ΔS of each withheld message


class Outbox:
    """The queues of one subscriber (see the module docstring).

    ``policy`` None: first come, first served (no RTT-based decisions at all).
    """

    def __init__(self, ledger: PayloadLedger, counts: WithholdingCounts,
                 threshold_bytes: int, max_queued: int, policy: Withholding | None = None):
        self.ledger = ledger
        self.counts = counts
        self.threshold_bytes = threshold_bytes
        self.max_queued = max_queued
        self.policy = policy
        self.express: deque[Delivery] = deque()
        self.bulk: deque[Delivery] = deque()
        self.withheld: deque[Withheld] = deque()

    def __len__(self) -> int:
        return len(self.express) + len(self.bulk) + len(self.withheld)

    # -- in --------------------------------------------------------------------------------

    def offer(self, message: Message, qos: int, now_ns: int, rtt_s: float | None) -> bool:
        """Queue ``message`` at ``qos``; False if the queue is full and it was dropped."""
        if message.counted and self.max_queued and len(self) >= self.max_queued:
            self.counts.dropped_queue_full += 1
            return False
        delivery = self.ledger.take(message, qos)
        if not message.large:
            self.counts.small_deliveries += 1
            self.express.append(delivery)
            return True
        self.counts.large_deliveries += 1
        if self.policy is None:
            self.counts.large_sent_immediately += 1
            self.express.append(delivery)     # one FIFO: the baseline's order
        elif self.policy.sends_now(rtt_s, 0.0):
            self._release(len(self.withheld), now_ns, starved=False)  # older ones go first
            self.counts.large_sent_immediately += 1
            self.bulk.append(delivery)
        else:
            self.counts.large_withheld += 1
            self.withheld.append(Withheld(delivery, message.arrived_ns))
        return True

    def offer_query(self, message: Message) -> None:
        """Queue an RTT query: always express, never counted against the queue limit."""
        self.express.append(Delivery(message, 1, query=True))

    # -- decisions ---------------------------------------------------------------------

    def reconsider(self, now_ns: int, rtt_s: float | None) -> int:
        """Apply the policy to each withheld message with the latest RTT; return how many
        were released (a released message takes the older ones with it)."""
        if self.policy is None or not self.withheld:
            return 0
        last_sent = -1
        for index, held in enumerate(self.withheld):
            if self.policy.sends_now(rtt_s, (now_ns - held.since_ns) / 1e9):
                last_sent = index
        return self._release(last_sent + 1, now_ns, starved=False)

    def next_deadline_ns(self) -> int | None:
        """When the oldest withheld message reaches the starvation timer; None if never."""
        timer_s = None if self.policy is None else self.policy.starvation_timer_s
        if timer_s is None or not self.withheld:
            return None
        return self.withheld[0].since_ns + int(timer_s * 1e9)

    def release_starved(self, now_ns: int) -> int:
        """Release every message withheld for the starvation timer ``D`` or longer."""
        timer_s = None if self.policy is None else self.policy.starvation_timer_s
        if timer_s is None:
            return 0
        timer_ns = int(timer_s * 1e9)
        count = 0
        while count < len(self.withheld) and now_ns - self.withheld[count].since_ns >= timer_ns:
            count += 1
        return self._release(count, now_ns, starved=True)

    def _release(self, count: int, now_ns: int, starved: bool) -> int:
        for _ in range(count):
            held = self.withheld.popleft()
            self.counts.withheld_s.append((now_ns - held.since_ns) / 1e9)
            self.bulk.append(held.delivery)
        if starved:
            self.counts.released_by_starvation += count
        else:
            self.counts.released_by_policy += count
        return count

    # -- out ---------------------------------------------------------------------------

    def pop(self) -> Delivery | None:
        """The next delivery to write (express first); it no longer counts as held."""
        queue = self.express or self.bulk
        if not queue:
            return None
        delivery = queue.popleft()
        self.ledger.give_back(delivery)
        return delivery

    def clear(self) -> None:
        """Drop everything (the subscriber left); withheld messages are counted as dropped."""
        self.counts.withheld_dropped += len(self.withheld)
        for delivery in [*self.express, *self.bulk, *(held.delivery for held in self.withheld)]:
            self.ledger.give_back(delivery)
        self.express.clear()
        self.bulk.clear()
        self.withheld.clear()
