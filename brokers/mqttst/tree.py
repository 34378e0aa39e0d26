"""MQTT-ST root election and link roles (paper §II.C.3-4), as pure functions: no I/O.

A node feeds :func:`compute_tree` what it knows of each neighbour (its capability, its
current root claim, the measured RTT of the link) and gets back the root it believes
in, its cumulative latency to that root, and a role per link:

- **root election**: the highest capability C wins; a tie goes to the lowest address
  (IP, then client port, since brokers on one machine share an IP);
- **root link**: the link with the least cumulative latency to the root (the
  neighbour's advertised root path cost plus the link's RTT); a tie goes to the
  neighbour with the higher C, then the lower address;
- the root's links are all **designated**; another broker's non-root link is
  **designated** if this broker has the better advertised path cost (tie: higher C, then
  lower address) than the neighbour, else **blocked**; a link that is down is **down**.

Two additions the paper does not specify, both because RTTs on one machine jitter by
tens of percent: a node keeps its root link unless another path is better by more than
``hysteresis``, and keeps its advertised cost while the new one is within ``hysteresis``
of it (so it re-advertises only real changes). Roles always compare *advertised* costs,
so the two ends of a link decide from the same numbers and agree.

Epochs restart the election from scratch after a failure (the paper's Topology Change):
:func:`epoch_newer` compares them as 32-bit serial numbers (RFC 1982), so they never run
out.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

EPOCH_MODULUS = 1 << 32


@dataclass(frozen=True, slots=True)
class BrokerId:
    """A broker's identity: the paper's IP address, plus its client port here."""

    address: str
    port: int
    key: tuple[int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            ip = ipaddress.ip_address(self.address)
        except ValueError:
            raise ValueError(f"broker address {self.address!r} is not an IP address") from None
        if not 1 <= self.port <= 0xFFFF:
            raise ValueError(f"broker port {self.port} is outside 1..65535")
        object.__setattr__(self, "key", (ip.version, int(ip), self.port))

    @classmethod
    def parse(cls, text: str) -> BrokerId:
        """``ADDRESS:PORT`` (``[v6]:PORT`` for IPv6) as a BrokerId; ValueError names the text."""
        address, sep, port = text.rpartition(":")
        if not sep:
            raise ValueError(f"{text!r} is not ADDRESS:PORT, e.g. 127.0.0.1:1883")
        try:
            return cls(address.strip("[]"), int(port))
        except ValueError as exc:
            raise ValueError(f"{text!r} is not ADDRESS:PORT ({exc})") from None

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else \
            f"{self.address}:{self.port}"


class Role(StrEnum):
    ROOT = "root"
    DESIGNATED = "designated"
    BLOCKED = "blocked"
    DOWN = "down"


ACTIVE_ROLES = frozenset({Role.ROOT, Role.DESIGNATED})


@dataclass(frozen=True, slots=True)
class RootClaim:
    """What a BPDU says about the sender's root: who, its capability, the sender's cost."""

    root: BrokerId
    root_capability: float
    cost_us: int


@dataclass(frozen=True, slots=True)
class Neighbour:
    """What a node knows of one link: the peer's capability and claim, the link's RTT."""

    capability: float | None = None   # the peer's own C (None until its first BPDU)
    claim: RootClaim | None = None    # its current root claim (None: none this epoch)
    rtt_us: float | None = None       # smoothed RTT of the link (None: not measured yet)
    up: bool = True


@dataclass(frozen=True, slots=True)
class TreeState:
    """One node's view: the root, its advertised cost to it, its root link, link roles."""

    root: BrokerId
    root_capability: float
    cost_us: int
    root_link: BrokerId | None
    roles: Mapping[BrokerId, Role]

    @property
    def is_root(self) -> bool:
        return self.root_link is None


def outranks(capability: float, broker: BrokerId, other_capability: float,
             other: BrokerId) -> bool:
    """Whether ``broker`` beats ``other`` as root: higher C, then lower address."""
    if capability != other_capability:
        return capability > other_capability
    return broker.key < other.key


def epoch_newer(epoch: int, than: int) -> bool:
    """Whether ``epoch`` is after ``than`` in 32-bit serial number arithmetic (RFC 1982)."""
    return 0 < (epoch - than) % EPOCH_MODULUS < EPOCH_MODULUS // 2


def link_cost_us(rtt_us: float) -> int:
    """A link's contribution to the root path cost: its RTT in whole microseconds, >= 1."""
    return max(1, round(rtt_us))


def compute_tree(me: BrokerId, capability: float, neighbours: Mapping[BrokerId, Neighbour],
                 previous: TreeState | None = None, hysteresis: float = 0.0) -> TreeState:
    """This node's root, cost, root link and link roles from what it knows of its links.

    ``previous`` (this node's last state, in the same epoch) and ``hysteresis`` (a
    fraction) keep the root link and the advertised cost unless a change is bigger than
    ``hysteresis``; with ``hysteresis=0`` this is exactly the paper's rule.
    """
    if not math.isfinite(hysteresis) or hysteresis < 0:
        raise ValueError(f"hysteresis {hysteresis!r} must be a finite fraction >= 0")
    root, root_capability = me, capability
    for info in neighbours.values():
        claim = info.claim
        if not _usable(info) or claim is None or claim.root == me:
            continue
        if outranks(claim.root_capability, claim.root, root_capability, root):
            root, root_capability = claim.root, claim.root_capability

    root_link, cost = None, 0
    if root != me:
        candidates = {
            peer: info.claim.cost_us + link_cost_us(info.rtt_us)
            for peer, info in neighbours.items()
            if info.up and info.rtt_us is not None  # _usable(info), spelled out for mypy
            and info.claim is not None and info.claim.root == root
            and info.claim.root_capability == root_capability}
        root_link = min(candidates, key=lambda peer: (
            candidates[peer], -(neighbours[peer].capability or 0.0), peer.key))
        cost = candidates[root_link]
        if previous is not None and previous.root == root and not previous.is_root:
            kept = previous.root_link
            if kept in candidates and kept != root_link \
                    and candidates[kept] <= cost * (1 + hysteresis):
                root_link, cost = kept, candidates[kept]
            if root_link == previous.root_link and _within(previous.cost_us, cost, hysteresis) \
                    and (parent_claim := neighbours[root_link].claim) is not None \
                    and previous.cost_us > parent_claim.cost_us:
                # Never advertise a cost at or below the parent's: the parent would then
                # think this node closer to the root and block the link they share.
                cost = previous.cost_us

    roles: dict[BrokerId, Role] = {}
    for peer, info in neighbours.items():
        if not info.up:
            roles[peer] = Role.DOWN
        elif peer == root_link:
            roles[peer] = Role.ROOT
        elif root_link is None or _designated(me, capability, cost, root, root_capability,
                                                 peer, info):
            roles[peer] = Role.DESIGNATED
        else:
            roles[peer] = Role.BLOCKED
    return TreeState(root, root_capability, cost, root_link, roles)


def _usable(info: Neighbour) -> bool:
    """A link counts for the election once it is up and its RTT has been measured."""
    return info.up and info.rtt_us is not None


def _within(kept: int, new: int, hysteresis: float) -> bool:
    return abs(new - kept) <= hysteresis * kept


def _designated(me: BrokerId, capability: float, cost: int, root: BrokerId,
                root_capability: float, peer: BrokerId, info: Neighbour) -> bool:
    """Whether this node's end of a non-root link forwards: the better advertised path."""
    claim = info.claim
    if claim is None or info.capability is None or claim.root != root \
            or claim.root_capability != root_capability:
        # The neighbour has no root yet, a worse one, or a different story about ours
        # (a forged C): forward. Blocking needs both ends to agree on the root; while
        # they do not, both forwarding costs duplicates (dropped), never a split.
        return True
    if cost != claim.cost_us:
        return cost < claim.cost_us
    if capability != info.capability:
        return capability > info.capability
    return me.key < peer.key
