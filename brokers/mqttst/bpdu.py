"""The BPDU an MQTT-ST node appends to its PINGREQs (paper §II.C.2), as bytes and back.

Layout, network byte order (40 bytes with IPv4 addresses, so a BPDU PINGREQ is 42 bytes
at the MQTT level against 2 for a plain one)::

    u8  version (1)            u8  flags (bit 0: Topology Change)
    u32 epoch                  -- the tree's generation, bumped by a Topology Change
    id  sender                 f64 sender capability C
    id  root                   f64 root capability C
    u32 root path cost P (microseconds of cumulative RTT)

where ``id`` is ``u8 family (4 or 6)``, the 4 or 16 address bytes, ``u16`` client port.
The paper's BPDU names the root by IP and carries one C; the root's C travels too so a
broker two hops from the root can compare roots, and the epoch makes "restart the tree
from scratch" (the TC) unambiguous (see :mod:`.node`).

:func:`decode_bpdu` refuses anything a correct node never sends, with a short reason a
node counts under (``malformed_bpdus``): a cut or over-long payload, an unknown version
or flag, an address that is not one, a capability that is not a finite number in
``0..MAX_CAPABILITY``, a cost beyond ``MAX_PATH_COST_US``, or a claim that contradicts
itself (a sender naming itself root with another C or a non-zero cost; a sender naming
a root it outranks).
"""

from __future__ import annotations

import ipaddress
import math
import struct
from dataclasses import dataclass

from mqttbed.brokers.mqttst.tree import BrokerId, RootClaim, outranks

BPDU_VERSION = 1
FLAG_TOPOLOGY_CHANGE = 0x01
MAX_CAPABILITY = 1e9            # a million GHz of CPU or a PiB of RAM at the default weights
MAX_PATH_COST_US = 60_000_000   # a minute of cumulative RTT: nothing real gets near it

_HEAD = struct.Struct("!BBI")
_F64 = struct.Struct("!d")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


class MalformedBpdu(ValueError):
    """A PINGREQ payload is not a BPDU a correct node sends; ``reason`` is a counter key."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Bpdu:
    sender: BrokerId
    sender_capability: float
    root: BrokerId
    root_capability: float
    root_path_cost_us: int
    epoch: int
    topology_change: bool = False

    @property
    def claim(self) -> RootClaim:
        return RootClaim(self.root, self.root_capability, self.root_path_cost_us)


def _encode_id(broker: BrokerId) -> bytes:
    ip = ipaddress.ip_address(broker.address)
    return bytes((ip.version,)) + ip.packed + _U16.pack(broker.port)


def encode_bpdu(bpdu: Bpdu) -> bytes:
    """The PINGREQ payload carrying ``bpdu``."""
    flags = FLAG_TOPOLOGY_CHANGE if bpdu.topology_change else 0
    return b"".join((
        _HEAD.pack(BPDU_VERSION, flags, bpdu.epoch % (1 << 32)),
        _encode_id(bpdu.sender), _F64.pack(bpdu.sender_capability),
        _encode_id(bpdu.root), _F64.pack(bpdu.root_capability),
        _U32.pack(bpdu.root_path_cost_us)))


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, count: int, what: str) -> bytes:
        if self.pos + count > len(self.data):
            raise MalformedBpdu("truncated", f"{what} needs {count} bytes, "
                                             f"{len(self.data) - self.pos} left")
        chunk = self.data[self.pos:self.pos + count]
        self.pos += count
        return chunk

    def broker(self, what: str) -> BrokerId:
        family = self.take(1, f"{what} address family")[0]
        if family not in (4, 6):
            raise MalformedBpdu("address", f"{what} address family {family} is not 4 or 6")
        raw = self.take(4 if family == 4 else 16, f"{what} address")
        port = _U16.unpack(self.take(2, f"{what} port"))[0]
        try:
            return BrokerId(str(ipaddress.ip_address(raw)), port)
        except ValueError as exc:
            raise MalformedBpdu("address", f"{what}: {exc}") from None

    def capability(self, what: str) -> float:
        value = _F64.unpack(self.take(8, what))[0]
        if not math.isfinite(value) or not 0.0 <= value <= MAX_CAPABILITY:
            raise MalformedBpdu("capability", f"{what} {value!r} is not a finite number in "
                                              f"0..{MAX_CAPABILITY:g}")
        return value


def decode_bpdu(payload: bytes) -> Bpdu:
    """The BPDU in a PINGREQ payload; raise MalformedBpdu with the reason."""
    cursor = _Cursor(payload)
    version, flags, epoch = _HEAD.unpack(cursor.take(_HEAD.size, "header"))
    if version != BPDU_VERSION:
        raise MalformedBpdu("version", f"BPDU version {version}, expected {BPDU_VERSION}")
    if flags & ~FLAG_TOPOLOGY_CHANGE:
        raise MalformedBpdu("flags", f"unknown BPDU flags {flags:#x}")
    sender = cursor.broker("sender")
    sender_capability = cursor.capability("sender capability")
    root = cursor.broker("root")
    root_capability = cursor.capability("root capability")
    cost = _U32.unpack(cursor.take(4, "root path cost"))[0]
    if cursor.pos != len(payload):
        raise MalformedBpdu("length", f"{len(payload) - cursor.pos} bytes after the BPDU")
    if cost > MAX_PATH_COST_US:
        raise MalformedBpdu("cost", f"root path cost {cost} us exceeds {MAX_PATH_COST_US} us")
    if root == sender:
        if root_capability != sender_capability or cost != 0:
            raise MalformedBpdu("inconsistent", f"{sender} names itself root with C "
                                f"{root_capability!r} (own C {sender_capability!r}) at "
                                f"cost {cost} us")
    elif cost == 0 or not outranks(root_capability, root, sender_capability, sender):
        raise MalformedBpdu("inconsistent", f"{sender} (C {sender_capability!r}) names "
                            f"{root} (C {root_capability!r}) root at cost {cost} us")
    return Bpdu(sender, sender_capability, root, root_capability, cost, epoch,
                bool(flags & FLAG_TOPOLOGY_CHANGE))
