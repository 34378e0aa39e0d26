"""The order in which a session's subscribers subscribe: by rank, as the controller says.

Both sessions (the native engine's and the Python clients') subscribe one subscriber at
a time in this order, each SUBSCRIBE after the SUBACK before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

from mqttbed.core.protocol import ClientAssignment, Role


class HasSpec(Protocol):
    @property
    def spec(self) -> ClientAssignment: ...


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
