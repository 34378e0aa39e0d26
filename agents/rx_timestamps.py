"""Kernel receive timestamps (SO_TIMESTAMPNS), mapped onto the run's CLOCK_MONOTONIC.

With ``SO_TIMESTAMPNS`` set, every ``recvmsg`` carries a control message with the time
the kernel received the data (``struct timespec``, CLOCK_REALTIME). The run measures on
CLOCK_MONOTONIC, so a :class:`RealtimeToMonotonic` samples both clocks back to back and
keeps the pair read closest together (the smallest monotonic gap bounds how wrong the
offset can be); a kernel stamp minus that offset is on the run's clock.

What one stamp covers: on UDP, the datagram. On TCP, Linux stamps a ``recvmsg`` with the
*last* segment it copied from (``tcp_recvmsg_locked`` updates the stamp for every skb it
consumes; checked here: two writes 50 ms apart read in one call carry the second's time).
The lean client gives that stamp to every packet a read completes: exact for the packet
that ends the read (a packet has arrived when its last byte has), later by at most the
read's span for packets before it in the same read. At the rates where the difference
matters each read holds one packet; under bursts the kernel figure errs late, never early.
"""

from __future__ import annotations

import socket
import struct
import time

# Linux: SO_TIMESTAMPNS (SO_TIMESTAMPNS_OLD on 64-bit: struct timespec of two longs);
# Python's socket module does not export the name.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
TIMESPEC = struct.Struct("@qq")
ANCILLARY_BYTES = socket.CMSG_SPACE(TIMESPEC.size)
OFFSET_SAMPLES = 64


def enable(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what ``sock`` receives; False where it cannot."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def realtime_ns(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The kernel's CLOCK_REALTIME receive stamp in a recvmsg's ancillary data, or None."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            seconds, nanoseconds = TIMESPEC.unpack_from(data)
            return seconds * 1_000_000_000 + nanoseconds
    return None


class RealtimeToMonotonic:
    """The measured offset CLOCK_REALTIME - CLOCK_MONOTONIC, to put kernel stamps on the
    run's clock.

    ``offset_ns`` is taken from the sample whose two monotonic reads lie closest together
    (``gap_ns``): the realtime read happened within that gap, so the offset is right to
    within half of it. Measured again at every session (a realtime step between runs
    would otherwise shift every kernel stamp).
    """

    def __init__(self, samples: int = OFFSET_SAMPLES):
        best_gap, best_offset = None, 0
        mono, real = time.CLOCK_MONOTONIC, time.CLOCK_REALTIME
        for _ in range(samples):
            before = time.clock_gettime_ns(mono)
            wall = time.clock_gettime_ns(real)
            after = time.clock_gettime_ns(mono)
            gap = after - before
            if best_gap is None or gap < best_gap:
                best_gap, best_offset = gap, wall - (before + after) // 2
        self.offset_ns: int = best_offset
        self.gap_ns: int = best_gap or 0

    def monotonic(self, realtime_ns: int) -> int:
        """``realtime_ns`` (a kernel stamp) on CLOCK_MONOTONIC."""
        return realtime_ns - self.offset_ns
