"""The order in which a session's subscribers subscribe (by rank, as the controller says),
and the deadline of a session's handshakes.

Both sessions (the native engine's and the Python clients') subscribe one subscriber at
a time in this order, each SUBSCRIBE after the SUBACK before it, and give up on a CONNACK
or SUBACK that does not come in time with the same error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

from mqttbed.core.clock import monotonic_ns
from mqttbed.core.protocol import ClientAssignment, Endpoint, Role


class HasSpec(Protocol):
    @property
    def spec(self) -> ClientAssignment: ...


class Handshaking(HasSpec, Protocol):
    """A session's client as the handshake deadline sees it."""

    @property
    def connected(self) -> bool: ...
    @property
    def subscribed(self) -> bool: ...
    @property
    def failure(self) -> str | None: ...


ClientT = TypeVar("ClientT", bound=HasSpec)


def subscriber_ranks(clients: Iterable[HasSpec]) -> list[int]:
    """The subscribe ranks of the subscribers among ``clients``, lowest first."""
    return sorted(c.spec.subscribe_rank for c in clients if c.spec.role == Role.SUBSCRIBER)


def subscribers_in_order(clients: Sequence[ClientT], ranks: list[int] | None) -> list[ClientT]:
    """The subscribers of ``ranks`` (default: all, lowest rank first), in that order.

    Raises RuntimeError for a rank no subscriber of ``clients`` holds.
    """
    by_rank = {c.spec.subscribe_rank: c for c in clients if c.spec.role == Role.SUBSCRIBER}
    order = subscriber_ranks(clients) if ranks is None else ranks
    missing = [rank for rank in order if rank not in by_rank]
    if missing:
        raise RuntimeError(f"no subscriber of rank {missing[0]} in this session")
    return [by_rank[rank] for rank in order]


def check_handshakes(clients: Sequence[Handshaking], deadline_ns: int, waiting_for: str,
                     endpoint_of: Callable[[ClientAssignment], Endpoint]) -> None:
    """Raise RuntimeError if a client failed, or if ``deadline_ns`` (monotonic) passed
    with a ``waiting_for`` ("CONNACK" or "SUBACK") missing: the error names the first
    five clients still waiting and the brokers they wait on."""
    if failed := "; ".join(f"{c.spec.client_id}: {c.failure}" for c in clients if c.failure):
        raise RuntimeError(failed)
    if monotonic_ns() <= deadline_ns:
        return
    if waiting_for == "CONNACK":
        missing = [c.spec for c in clients if not c.connected]
    else:
        missing = [c.spec for c in clients if c.spec.role == Role.SUBSCRIBER and not c.subscribed]
    brokers = sorted({f"{e.host}:{e.port}" for e in map(endpoint_of, missing)})
    raise RuntimeError(f"no {waiting_for} for {', '.join(s.client_id for s in missing[:5])} "
                       f"from {', '.join(brokers)}")
