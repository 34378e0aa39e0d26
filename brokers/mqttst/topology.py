"""Cluster shapes and the check that a cluster's nodes agree on one spanning tree; pure.

:func:`topology_edges` turns a topology name or edge list into links; :func:`tree_verdict`
reads the nodes' counters (:meth:`.node.Node.counters_snapshot`) and says whether they show one
converged tree: every live broker has noticed every dead neighbour, all live brokers
are in one epoch and name the same live root, every configured link between two live
brokers is up, and the active links are exactly a spanning tree of the live brokers
(each non-root broker's root link ends at a designated link of its parent, every other
link is blocked at one end at least, and every parent chain reaches the root).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TOPOLOGIES = ("full-mesh", "ring", "chain")


def topology_edges(kind: str | Sequence[Sequence[int]], brokers: int) -> list[tuple[int, int]]:
    """The links of ``kind`` over ``brokers`` brokers, as sorted (low, high) index pairs.

    ``kind`` is one of :data:`TOPOLOGIES`, an edge list ``"0-1,1-2"``, or pairs
    ``[[0, 1], [1, 2]]``. Raises ValueError naming the bad value, also for a topology
    that leaves a broker unreachable (its tree could never span the cluster).
    """
    if not isinstance(brokers, int) or brokers < 1:
        raise ValueError(f"brokers={brokers!r}: need at least 1")
    if kind == "full-mesh":
        pairs = [(i, j) for i in range(brokers) for j in range(i + 1, brokers)]
    elif kind == "chain":
        pairs = [(i, i + 1) for i in range(brokers - 1)]
    elif kind == "ring":
        pairs = [(i, (i + 1) % brokers) for i in range(brokers)] if brokers > 2 else \
            [(i, i + 1) for i in range(brokers - 1)]
    else:
        pairs = _explicit_edges(kind)
    edges: set[tuple[int, int]] = set()
    for a, b in pairs:
        if not (0 <= a < brokers and 0 <= b < brokers) or a == b:
            raise ValueError(f"topology {kind!r}: link {a}-{b} needs two different broker "
                             f"indexes in 0..{brokers - 1}")
        edges.add((min(a, b), max(a, b)))
    reached, frontier = {0}, [0]
    while frontier:
        node = frontier.pop()
        for a, b in edges:
            for here, there in ((a, b), (b, a)):
                if here == node and there not in reached:
                    reached.add(there)
                    frontier.append(there)
    if len(reached) < brokers:
        cut_off = sorted(set(range(brokers)) - reached)
        raise ValueError(f"topology {kind!r} leaves brokers {cut_off} unconnected to broker 0")
    return sorted(edges)


def _explicit_edges(kind: object) -> list[tuple[int, int]]:
    if isinstance(kind, str):
        try:
            pairs = [tuple(int(end) for end in item.split("-")) for item in kind.split(",")]
        except ValueError:
            pairs = [()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"topology {kind!r} is none of {', '.join(TOPOLOGIES)} nor an "
                             "edge list like '0-1,1-2'")
        return [(pair[0], pair[1]) for pair in pairs]
    if isinstance(kind, Sequence) and all(
            isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2
            and all(isinstance(end, int) for end in pair) for pair in kind):
        return [(pair[0], pair[1]) for pair in kind]
    raise ValueError(f"topology {kind!r} is none of {', '.join(TOPOLOGIES)}, an edge list "
                     "like '0-1,1-2' nor pairs like [[0, 1], [1, 2]]")


def tree_verdict(states: Sequence[dict[str, Any] | None], ids: Sequence[str],
                 live: Sequence[bool], edges: Sequence[tuple[int, int]]) -> tuple[int | None, str]:
    """(root index, "") if the live brokers' stats show one converged spanning tree,
    else (None, why not). ``ids[i]`` is broker i's id as the nodes write it."""
    alive = [i for i, up in enumerate(live) if up]
    if not alive:
        return None, "no broker is alive"
    if missing := [i for i in alive if states[i] is None]:
        return None, f"no stats from brokers {missing} yet"
    index_of = {broker_id: i for i, broker_id in enumerate(ids)}
    view = {i: state for i in alive if (state := states[i]) is not None}  # each is, as checked
    epochs = {i: s["epoch"] for i, s in view.items()}
    if len(set(epochs.values())) > 1:
        return None, f"brokers are in different epochs: {epochs}"
    roots = {i: (s["root"], s["root_capability"]) for i, s in view.items()}
    if len(set(roots.values())) > 1:
        return None, f"brokers disagree on the root (id, C): {roots}"
    root_id, root_capability = next(iter(roots.values()))
    root = index_of.get(root_id)
    if root is None or not live[root]:
        return None, f"the root {root_id} is not a live broker"
    if view[root]["capability"] != root_capability:
        return None, f"the root {root_id} is believed to have C {root_capability!r}, but " \
                     f"says it has {view[root]['capability']!r}"
    roles = {i: {index_of.get(link["peer"]): link["role"] for link in s["links"]}
             for i, s in view.items()}
    parent: dict[int, int] = {}
    for a, b in edges:
        for here, there in ((a, b), (b, a)):
            if live[here] and not live[there] and roles[here].get(there) != "down":
                return None, f"broker {here} has not noticed that broker {there} is down"
        if not (live[a] and live[b]):
            continue
        role_a, role_b = roles[a].get(b), roles[b].get(a)
        if "down" in (role_a, role_b) or None in (role_a, role_b):
            return None, f"link {a}-{b} is not up at both ends ({role_a}, {role_b})"
        if role_a == "root" or role_b == "root":
            child, up = (a, b) if role_a == "root" else (b, a)
            if roles[up][child] != "designated":
                return None, f"broker {child}'s root link leads to {up}, whose end is " \
                             f"{roles[up][child]}"
            parent[child] = up
        elif "blocked" not in (role_a, role_b):
            return None, f"link {a}-{b} is active at both ends without being a root link"
    for i in alive:
        seen, at = {i}, i
        while at != root:
            if at not in parent:
                return None, f"broker {at} has no root link to follow towards {root}"
            at = parent[at]
            if at in seen:
                return None, f"root links loop through broker {at}"
            seen.add(at)
    return root, ""
