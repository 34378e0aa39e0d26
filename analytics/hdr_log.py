"""HdrHistogram logs, written from scratch after the format's specification.

The HdrHistogram tools (Java's ``HistogramLogProcessor``, the ``hdrhistogram`` Python
package's log reader, and the Go, Rust and C ports) read interval histograms from a text
log: a few ``#[...]`` comment lines, a CSV legend, then one line per interval with its
start time, length and maximum, and the histogram in the V2 compressed encoding in base64.
OpenMessaging Benchmark and wrk2 users already know these tools; exporting mqttbed's
latency and spread in this form lets them read mqttbed's numbers with them.

Only the writing side is here (mqttbed never needs to read these logs back). What it
follows of the format:

- Buckets: a histogram of ``significant_digits`` decimal digits keeps values apart down
  to ``10**-significant_digits`` of their size (3 digits: 0.1 %), by ``2 * 10**digits``
  linear sub-buckets (rounded up to a power of two) per power of two of the value.
  Counts are held in one array indexed by (bucket, sub-bucket).
- V2 encoding: a 40-byte big-endian header (cookie, payload length, normalizing index
  offset, significant digits, lowest discernible value, highest trackable value, integer
  to double ratio) and the counts up to the highest non-zero one, each as a ZigZag
  LEB128 varint (at most 9 bytes), a run of two or more zero counts written as one
  negative number (minus its length).
- Compressed V2: an 8-byte header (the compressed cookie and the length of what follows)
  and the V2 encoding DEFLATEd in zlib's wrapper; base64 (standard alphabet, padded) in
  the log.
- Log: ``#[Histogram log format version 1.3]``, ``#[StartTime: ...]`` and
  ``#[BaseTime: ...]`` (seconds since the epoch), the legend, and intervals whose start
  timestamps are relative to the base time, all in seconds with millisecond decimals.

Values are non-negative integers (HdrHistogram has no negative values and no fractions):
the caller chooses the unit and says it in the log's comments.
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

LOG_FORMAT_VERSION = "1.3"
LEGEND = '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'
# The V2 cookies; 0x10 in the word-size nibble marks the ZigZag LEB128 ("TLZE") payload.
V2_ENCODING_COOKIE = 0x1C849303 | 0x10
V2_COMPRESSED_COOKIE = 0x1C849304 | 0x10
# cookie, payload length, normalizing index offset, significant digits (int32 each);
# lowest discernible and highest trackable value (int64); integer-to-double ratio.
_V2_HEADER = struct.Struct(">iiiiqqd")
_COMPRESSED_HEADER = struct.Struct(">ii")
# Values are bucketed through float64, exact for integers below 2**53.
MAX_VALUE = 2**53 - 1
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class HistogramLayout:
    """Where each value is counted in a histogram of given precision and range."""

    significant_digits: int
    lowest_discernible: int = 1
    highest_trackable: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.significant_digits <= 5:
            raise ValueError(f"significant_digits={self.significant_digits}: HdrHistogram "
                             "supports 0 to 5 significant digits")
        if self.lowest_discernible < 1:
            raise ValueError(f"lowest_discernible={self.lowest_discernible}: must be 1 or more")
        if self.highest_trackable < 2 * self.lowest_discernible:
            raise ValueError(f"highest_trackable={self.highest_trackable}: must be at least "
                             f"twice lowest_discernible ({self.lowest_discernible})")

    @property
    def unit_magnitude(self) -> int:
        return int(math.floor(math.log2(self.lowest_discernible)))

    @property
    def sub_bucket_half_count_magnitude(self) -> int:
        single_unit_range = 2 * 10 ** self.significant_digits
        return max(int(math.ceil(math.log2(single_unit_range))), 1) - 1

    @property
    def sub_bucket_half_count(self) -> int:
        return 1 << self.sub_bucket_half_count_magnitude

    @property
    def sub_bucket_count(self) -> int:
        return 2 * self.sub_bucket_half_count

    @property
    def bucket_count(self) -> int:
        """How many powers-of-two buckets cover values up to ``highest_trackable``."""
        smallest_untrackable = self.sub_bucket_count << self.unit_magnitude
        buckets = 1
        while smallest_untrackable <= self.highest_trackable:
            if smallest_untrackable > _INT64_MAX // 2:
                return buckets + 1
            smallest_untrackable <<= 1
            buckets += 1
        return buckets

    def counts_index(self, values: np.ndarray) -> np.ndarray:
        """The index in the counts array of each value (non-negative int64 array)."""
        mask = (self.sub_bucket_count - 1) << self.unit_magnitude
        # bit length of (v | mask), exact through float64 below 2**53
        bit_length = np.frexp((values | mask).astype(np.float64))[1].astype(np.int64)
        bucket = bit_length - (self.unit_magnitude + self.sub_bucket_half_count_magnitude + 1)
        sub_bucket = values >> (bucket + self.unit_magnitude)
        return (((bucket + 1) << self.sub_bucket_half_count_magnitude)
                + (sub_bucket - self.sub_bucket_half_count))


def histogram_counts(values: np.ndarray, layout: HistogramLayout) -> np.ndarray:
    """The counts array of ``values`` in ``layout`` (int64, trimmed after the last count)."""
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    low, high = int(values.min()), int(values.max())
    if low < 0:
        raise ValueError(f"value {low}: HdrHistogram records no negative values")
    if high > layout.highest_trackable:
        raise ValueError(f"value {high} exceeds highest_trackable={layout.highest_trackable}")
    if high > MAX_VALUE:
        raise ValueError(f"value {high} exceeds {MAX_VALUE}, the largest this encoder buckets")
    return np.bincount(layout.counts_index(values))


def zigzag_leb128(number: int) -> bytes:
    """``number`` (a signed 64-bit integer) as a ZigZag LEB128 varint of at most 9 bytes
    (the 9th byte carries 8 bits, HdrHistogram's LEB128-64b9B variant)."""
    if not -(2**63) <= number <= _INT64_MAX:
        raise ValueError(f"{number} is outside the signed 64-bit range")
    value = ((number << 1) ^ (number >> 63)) & 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    for _ in range(8):
        if value < 0x80:
            out.append(value)
            return bytes(out)
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)  # the 9th byte: the remaining 8 bits, no continuation flag
    return bytes(out)


def encode_counts(counts: np.ndarray) -> bytes:
    """The V2 payload of a counts array: each count as a varint, runs of zeros (two or
    more) as one negative varint of the run's length."""
    out = bytearray()
    nonzero = np.flatnonzero(counts)
    position = 0
    for index in nonzero.tolist():
        gap = index - position
        if gap == 1:
            out += zigzag_leb128(0)
        elif gap > 1:
            out += zigzag_leb128(-gap)
        out += zigzag_leb128(int(counts[index]))
        position = index + 1
    return bytes(out)


def encode_histogram(values: np.ndarray, layout: HistogramLayout) -> str:
    """The base64 compressed V2 encoding of a histogram of ``values``, as a log line
    carries it."""
    payload = encode_counts(histogram_counts(values, layout))
    header = _V2_HEADER.pack(V2_ENCODING_COOKIE, len(payload), 0, layout.significant_digits,
                             layout.lowest_discernible, layout.highest_trackable, 1.0)
    compressed = zlib.compress(header + payload)
    framed = _COMPRESSED_HEADER.pack(V2_COMPRESSED_COOKIE, len(compressed)) + compressed
    return base64.b64encode(framed).decode("ascii")


@dataclass(frozen=True)
class Interval:
    """One interval of a log: when it began (seconds since the epoch), how long it lasted
    (seconds), its values, and comment lines written just before it."""

    start_s: float
    length_s: float
    values: np.ndarray
    comments: tuple[str, ...] = ()


@dataclass(frozen=True)
class HistogramLog:
    """An HdrHistogram log: its intervals in time order, and comments for its head.

    ``max_value_unit_ratio`` divides each interval's maximum for the ``Interval_Max``
    column (Java's writer: 1e6, i.e. nanoseconds shown as milliseconds), as the tools
    expect; the histograms themselves keep the values as given.
    """

    intervals: Sequence[Interval]
    layout: HistogramLayout
    comments: tuple[str, ...] = ()
    max_value_unit_ratio: float = 1e6
    base_time_s: float | None = field(default=None)

    def text(self) -> str:
        """The log as text, one line per interval after the head."""
        starts = [interval.start_s for interval in self.intervals]
        if any(later < earlier for earlier, later in zip(starts, starts[1:], strict=False)):
            raise ValueError(f"interval start times {starts} are not in time order")
        base = self.base_time_s if self.base_time_s is not None else min(starts, default=0.0)
        lines = [f"#[Histogram log format version {LOG_FORMAT_VERSION}]"]
        lines += [f"#[{_one_line(comment)}]" for comment in self.comments]
        human = datetime.fromtimestamp(base, UTC).strftime("%a %b %d %H:%M:%S UTC %Y")
        lines.append(f"#[StartTime: {base:.3f} (seconds since epoch), {human}]")
        lines.append(f"#[BaseTime: {base:.3f} (seconds since epoch)]")
        lines.append(LEGEND)
        for interval in self.intervals:
            lines += [f"#[{_one_line(comment)}]" for comment in interval.comments]
            values = np.asarray(interval.values, dtype=np.int64)
            top = int(values.max()) if values.size else 0
            lines.append(f"{interval.start_s - base:.3f},{interval.length_s:.3f},"
                         f"{top / self.max_value_unit_ratio:.3f},"
                         f"{encode_histogram(values, self.layout)}")
        return "\n".join(lines) + "\n"


def _one_line(comment: str) -> str:
    # A comment stays one line, and never closes its "#[...]" early.
    return " ".join(comment.replace("]", ")").split())
