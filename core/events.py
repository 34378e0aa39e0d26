"""The event row: one record per publish, per delivery and per subscription.

Every run's events land in one Parquet dataset partitioned by ``campaign_id`` and
``run_id`` (hive style directories). The partition columns are not stored inside the
files. Three kinds of rows share the schema:

- ``publish``: one per PUBLISH sent; ``receiver`` and ``t_recv_ns`` are null.
- ``delivery``: one per message received by a subscriber; ``t_pub_ns``, ``seq`` and
  ``t_intended_ns`` come from the payload, ``t_recv_ns`` from the receiver's clock.
- ``subscribe``: one per subscription; ``t_recv_ns`` is when its SUBACK arrived, which
  orders the subscribers (first subscribed ... last subscribed) for the sync spread.

``clock_source`` says where ``t_recv_ns`` came from: ``kernel`` (the socket's receive
stamp, mapped onto CLOCK_MONOTONIC) or ``user`` (read in the receive loop); a delivery
also keeps the user-space time in ``t_recv_user_ns`` whatever its source, so figures can
be computed from either clock (``measurement.receive_clock``).

``retain`` is the PUBLISH's RETAIN flag (MQTT 3.1.1 section 3.3.1.3): on a publish row, the
value was sent to be retained (``workload.retained``); on a delivery row, the broker sent
it as retained state when the receiver subscribed. Null where the writer did not record it
(the lean and paho clients, files from before), which reads as not retained.
"""

from __future__ import annotations

import struct
from enum import StrEnum
from typing import Any


class EventKind(StrEnum):
    PUBLISH = "publish"
    DELIVERY = "delivery"
    SUBSCRIBE = "subscribe"


class ClockSource(StrEnum):
    """Where a timestamp came from; truth order scope > kernel > user."""

    SCOPE = "scope"
    KERNEL = "kernel"
    USER = "user"


# (name, arrow type name, nullable) in file order.
EVENT_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("kind", "string", False),
    ("agent_id", "string", False),
    ("publisher", "string", True),
    ("seq", "int64", True),
    ("receiver", "string", True),
    ("topic", "string", False),
    ("payload_bytes", "int32", False),
    ("qos", "int8", False),
    ("warmup", "bool", False),
    ("t_intended_ns", "int64", True),
    ("t_pub_ns", "int64", True),
    ("t_recv_ns", "int64", True),
    ("clock_source", "string", False),
    ("clock_offset_ns", "int64", False),
    ("clock_offset_uncertainty_ns", "int64", False),
    ("t_recv_user_ns", "int64", True),
    ("retain", "bool", True),
)
# Columns a chunk may leave out (null): added after writers that do not know them existed.
OPTIONAL_EVENT_COLUMNS: frozenset[str] = frozenset({"t_recv_user_ns", "retain"})
EVENT_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in EVENT_FIELDS)
PARTITION_COLUMNS: tuple[str, str] = ("campaign_id", "run_id")


def arrow_schema() -> Any:
    """Return the pyarrow schema of an event file (pyarrow imported lazily)."""
    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32(),
             "int8": pa.int8(), "bool": pa.bool_()}
    return pa.schema([pa.field(n, types[t], nullable=nb) for n, t, nb in EVENT_FIELDS])


# Payload header written by every publisher: sequence number, publisher index,
# actual send time and intended (open-loop schedule) send time, little endian.
PAYLOAD_HEADER = struct.Struct("<QIqq")
PAYLOAD_MAGIC = b"MQB1"
PAYLOAD_MIN_BYTES = len(PAYLOAD_MAGIC) + PAYLOAD_HEADER.size


def encode_payload(seq: int, publisher_index: int, t_pub_ns: int, t_intended_ns: int,
                   payload_bytes: int) -> bytes:
    """Build a payload of exactly ``payload_bytes`` carrying the send timestamps."""
    head = PAYLOAD_MAGIC + PAYLOAD_HEADER.pack(seq, publisher_index, t_pub_ns, t_intended_ns)
    return head + bytes(payload_bytes - len(head))


def decode_payload_at(buffer: bytes | bytearray, start: int, end: int
                      ) -> tuple[int, int, int, int]:
    """:func:`decode_payload` of ``buffer[start:end]``, read in place (no copy)."""
    if end - start < PAYLOAD_MIN_BYTES or not buffer.startswith(PAYLOAD_MAGIC, start):
        raise ValueError(f"not an mqttbed payload ({end - start} bytes)")
    return PAYLOAD_HEADER.unpack_from(buffer, start + 4)


def decode_payload(payload: bytes) -> tuple[int, int, int, int]:
    """Return ``(seq, publisher_index, t_pub_ns, t_intended_ns)`` from a payload."""
    if payload[:4] != PAYLOAD_MAGIC or len(payload) < PAYLOAD_MIN_BYTES:
        raise ValueError(f"not an mqttbed payload ({len(payload)} bytes)")
    return PAYLOAD_HEADER.unpack_from(payload, 4)


def publisher_client_id(index: int) -> str:
    """Client id of publisher ``index``; deliveries name their publisher with it."""
    return f"pub-{index}"


def subscriber_client_id(index: int) -> str:
    """Client id of subscriber ``index`` (0 subscribes first)."""
    return f"sub-{index}"
