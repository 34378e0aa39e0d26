"""The FPGA broker's destination search: a Topic Table and a Subscriber Table (seed 000, 4.1).

Both are hash tables in a fixed number of words, as block RAM is:

- Topic Table, key ``topic filter``, value ``number of subscribers`` (12-bit words, so at
  most 4095 subscribers per filter), 65,536 words deep.
- Subscriber Table, key ``topic filter + ID``, value ``destination IPv4 address and UDP
  port`` (48-bit words), 65,536 words deep. IDs run from 1 to the filter's count; a new
  subscriber gets ID = count + 1.

A PUBLISH to ``topic1/topic2/humid`` looks up the topic itself and every prefix rewritten
with ``#`` (``topic1/topic2/#``, then ``topic1/#``), as the parser's rewriter does.

What the paper leaves open, and what this model does:

- Collisions. The paper names hash functions but no collision policy. A key's home word
  is CRC-32 of the key (a different seed per table) modulo the depth; a key may sit in
  any of the ``probe_window`` words from its home word on (wrapping), and every lookup
  reads that whole window, so a lookup touches a fixed number of words, as a pipeline
  stage must. When no word of the window is free the table refuses the key: that is
  "full" for that key. With ``probe_window == depth`` a table refuses only when every
  word is used.
- Refusals are visible: :meth:`TopicTables.subscribe` returns False and the broker
  answers SUBACK 0x80 (failure).
- UNSUBSCRIBE (not in the paper's design): the subscriber's word is overwritten with a
  tombstone, an all-zero destination (0.0.0.0:0, never a valid one); IDs stay dense, so
  publishes skip tombstones. Tombstones with the highest IDs are freed at once (the
  count shrinks); a tombstone below a live subscriber is reused by the filter's next
  SUBSCRIBE, so subscribe/unsubscribe churn cannot fill the table. After such a reuse the
  send order no longer follows the subscription order.
- A SUBSCRIBE for a filter the same destination already holds is the same subscription
  (MQTT 3.1.1, 3.8.4): acknowledged again, not added twice. The hardware as described
  would add a second entry; the model does not, because UDP clients resend a SUBSCRIBE
  whose SUBACK was lost.
"""

from __future__ import annotations

import zlib
from typing import Generic, NamedTuple, TypeVar

Address = tuple[str, int]

PAPER_DEPTH_WORDS = 65_536
TOPIC_COUNT_BITS = 12
DEFAULT_PROBE_WINDOW = 8
TOMBSTONE: Address = ("0.0.0.0", 0)
_TOPIC_SEED = 0x00000000
_SUBSCRIBER_SEED = 0x5BD1E995


_Value = TypeVar("_Value")


class BoundedHashTable(Generic[_Value]):
    """A hash table of ``depth`` words; a key lives within ``probe_window`` words of home."""

    def __init__(self, depth: int, probe_window: int, seed: int):
        if depth < 1:
            raise ValueError(f"table depth must be at least 1 word, got {depth}")
        if not 1 <= probe_window <= depth:
            raise ValueError(f"probe_window must be between 1 and the depth ({depth}), "
                             f"got {probe_window}")
        self.depth = depth
        self.probe_window = probe_window
        self._seed = seed
        self._keys: list[bytes | None] = [None] * depth
        self._values: list[_Value | None] = [None] * depth
        self.used = 0
        self.peak = 0
        self.reads = 0
        self.writes = 0

    def _window(self, key: bytes) -> list[int]:
        """The words ``key`` may occupy: ``probe_window`` of them from its home word, wrapping."""
        home = zlib.crc32(key, self._seed) % self.depth
        end = home + self.probe_window
        if end <= self.depth:
            return list(range(home, end))
        return [*range(home, self.depth), *range(end - self.depth)]

    def _find(self, key: bytes) -> int | None:
        # The hot path of every PUBLISH: one CRC and a short scan, no per-word generator.
        keys = self._keys
        home = zlib.crc32(key, self._seed) % self.depth
        if keys[home] == key:
            return home
        for slot in self._window(key)[1:]:
            if keys[slot] == key:
                return slot
        return None

    def get(self, key: bytes) -> _Value | None:
        """Return the value stored under ``key``, or None."""
        self.reads += 1
        slot = self._find(key)
        return None if slot is None else self._values[slot]

    def has_room_for(self, key: bytes) -> bool:
        """Return True if ``key`` is stored or a word of its window is free."""
        keys = self._keys
        return any(keys[slot] is None or keys[slot] == key for slot in self._window(key))

    def put(self, key: bytes, value: _Value) -> bool:
        """Store ``value`` under ``key``; return False (table full for it) when no word is free."""
        keys = self._keys
        free = None
        for slot in self._window(key):
            if keys[slot] == key:
                self._values[slot] = value
                self.writes += 1
                return True
            if free is None and keys[slot] is None:
                free = slot
        if free is None:
            return False
        keys[free] = key
        self._values[free] = value
        self.used += 1
        self.peak = max(self.peak, self.used)
        self.writes += 1
        return True

    def delete(self, key: bytes) -> bool:
        """Free ``key``'s word; return False if it was not stored."""
        slot = self._find(key)
        if slot is None:
            return False
        self._keys[slot] = None
        self._values[slot] = None
        self.used -= 1
        self.writes += 1
        return True

    def occupancy(self) -> dict[str, int]:
        return {"depth_words": self.depth, "probe_window": self.probe_window,
                "used_words": self.used, "peak_words": self.peak,
                "reads": self.reads, "writes": self.writes}


def rewritten_names(topic: str) -> list[str]:
    """Return the names a PUBLISH to ``topic`` is looked up under, in the rewriter's order.

    ``topic1/topic2/humid`` gives ``topic1/topic2/humid``, ``topic1/topic2/#``, ``topic1/#``.
    """
    names = [topic]
    end = len(topic)
    while (end := topic.rfind("/", 0, end)) >= 0:
        names.append(topic[:end + 1] + "#")
    return names


def filter_refusal(topic_filter: str) -> str | None:
    """Return why the hardware cannot serve ``topic_filter``, or None if it can.

    Only what the rewriter can produce can ever match: exact names and ``prefix/#``.
    """
    if not topic_filter:
        return "empty topic filter"
    if "+" in topic_filter:
        return "single-level wildcard '+' is not supported by the hardware"
    if topic_filter == "#":
        return "'#' alone never matches: the rewriter only produces 'prefix/#'"
    hash_at = topic_filter.find("#")
    if hash_at >= 0 and (hash_at != len(topic_filter) - 1 or topic_filter[hash_at - 1] != "/"):
        return "'#' must be the last level, after '/'"
    return None


def _subscriber_key(topic_filter: bytes, subscriber_id: int) -> bytes:
    # "topic + ID": a NUL cannot occur in an MQTT topic, so the key is unambiguous.
    return topic_filter + b"\x00" + subscriber_id.to_bytes(2, "big")


class Destination(NamedTuple):
    """One copy a PUBLISH is sent as: to ``address``, found under rewritten name ``name_index``."""

    address: Address
    name_index: int


class TopicTables:
    """The Topic Table and Subscriber Table together, with the broker's table operations."""

    def __init__(self, topic_depth: int = PAPER_DEPTH_WORDS,
                 subscriber_depth: int = PAPER_DEPTH_WORDS,
                 probe_window: int = DEFAULT_PROBE_WINDOW,
                 count_bits: int = TOPIC_COUNT_BITS):
        self.topics = BoundedHashTable[int](topic_depth, min(probe_window, topic_depth),
                                            _TOPIC_SEED)
        self.subscribers = BoundedHashTable[Address](subscriber_depth,
                                                     min(probe_window, subscriber_depth),
                                                     _SUBSCRIBER_SEED)
        self.max_subscribers_per_filter = (1 << count_bits) - 1
        self.tombstones = 0

    def subscribe(self, topic_filter: str, address: Address) -> bool:
        """Add ``address`` under ``topic_filter`` with ID count + 1; False if a table refuses."""
        key = topic_filter.encode()
        count = self._count(key)
        reusable = None
        for subscriber_id in range(1, count + 1):
            held = self.subscribers.get(_subscriber_key(key, subscriber_id))
            if held == address:
                return True
            if reusable is None and held == TOMBSTONE:
                reusable = subscriber_id
        if reusable is not None:
            self.subscribers.put(_subscriber_key(key, reusable), address)
            self.tombstones -= 1
            return True
        new_id = count + 1
        if new_id > self.max_subscribers_per_filter:
            return False
        if count == 0 and not self.topics.has_room_for(key):
            return False
        if not self.subscribers.put(_subscriber_key(key, new_id), address):
            return False
        self.topics.put(key, new_id)
        return True

    def unsubscribe(self, topic_filter: str, address: Address) -> bool:
        """Tombstone ``address``'s entry under ``topic_filter``; False if it held none."""
        key = topic_filter.encode()
        count = self._count(key)
        for subscriber_id in range(1, count + 1):
            if self.subscribers.get(_subscriber_key(key, subscriber_id)) == address:
                self.subscribers.put(_subscriber_key(key, subscriber_id), TOMBSTONE)
                self.tombstones += 1
                break
        else:
            return False
        # Free trailing tombstones so the count only covers IDs up to the last live one.
        while count and self.subscribers.get(_subscriber_key(key, count)) == TOMBSTONE:
            self.subscribers.delete(_subscriber_key(key, count))
            self.tombstones -= 1
            count -= 1
        if count:
            self.topics.put(key, count)
        else:
            self.topics.delete(key)
        return True

    def destinations(self, topic: str) -> list[Destination]:
        """Return every destination of a PUBLISH to ``topic``, in send order."""
        found = []
        get = self.subscribers.get
        for name_index, name in enumerate(rewritten_names(topic)):
            key = name.encode() + b"\x00"
            for subscriber_id in range(1, self._count(name.encode()) + 1):
                address = get(key + subscriber_id.to_bytes(2, "big"))
                if address is not None and address != TOMBSTONE:
                    found.append(Destination(address, name_index))
        return found

    def _count(self, key: bytes) -> int:
        count = self.topics.get(key)
        return count if isinstance(count, int) else 0

    def occupancy(self) -> dict[str, object]:
        return {"topic_table": self.topics.occupancy(),
                "subscriber_table": {**self.subscribers.occupancy(),
                                     "tombstones": self.tombstones},
                "max_subscribers_per_filter": self.max_subscribers_per_filter}
