"""YAML from people and networks, loaded within bounds: size, depth and alias expansion.

``yaml.safe_load`` builds no objects of arbitrary classes, but it happily loads a
"billion laughs" document (nine nested anchors, each aliased ten times, are 10**9
values once anything walks them: pydantic, ``json.dumps``, ``copy.deepcopy``), recurses
once per nesting level (``[[[[...`` 100,000 deep is a RecursionError) and builds
self-referencing lists (``&a [*a]``). :func:`load_bounded_yaml` refuses each before
anything is constructed, with a message that names the bound.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_BYTES = 1 << 20          # a campaign spec is a few kB; the library's largest is 2.2 kB
MAX_DEPTH = 64               # nesting levels of collections
MAX_VALUES = 100_000         # scalars and collections, aliases counted as often as used


class YamlBoundsError(ValueError):
    """The document is beyond one of the bounds; the message names it."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts its nesting depth while composing."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlBoundsError(f"nested more than {MAX_DEPTH} levels deep (line "
                                      f"{mark.line + 1}); MAX_DEPTH is {MAX_DEPTH}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(root: Node) -> int:
    """How many values the document has once every alias is replaced by what it names.

    Iterative, memoised per node (an anchored node is counted once and reused), so a
    billion-laughs document is sized in a few steps; a node met again while its own size
    is being computed is a recursive alias.
    """
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if children_done:
            in_progress.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[key] > MAX_VALUES:
                raise YamlBoundsError(
                    f"expands to more than {MAX_VALUES:,} values (line "
                    f"{node.start_mark.line + 1}: aliases of aliases?); MAX_VALUES is "
                    f"{MAX_VALUES:,}")
            continue
        if key in in_progress:
            raise YamlBoundsError(f"a recursive alias (line {node.start_mark.line + 1}): "
                                  "an anchor used inside itself has no finite value")
        in_progress.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in in_progress:
                raise YamlBoundsError(f"a recursive alias (line {child.start_mark.line + 1}): "
                                      "an anchor used inside itself has no finite value")
            stack.append((child, False))
    return sizes[id(root)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_bounded_yaml(text: str) -> Any:
    """Parse one YAML (or JSON) document within MAX_BYTES, MAX_DEPTH and MAX_VALUES.

    Raises :class:`YamlBoundsError` for a document past a bound and ``yaml.YAMLError``
    for one that is not YAML.
    """
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_BYTES:
        raise YamlBoundsError(f"{size:,} bytes, more than the {MAX_BYTES:,} a document may "
                              f"have (MAX_BYTES)")
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        try:
            return loader.construct_document(node)
        except ValueError as exc:  # e.g. an integer of more than 4,300 digits
            raise YamlBoundsError(f"a value cannot be read: {str(exc).split(';')[0]}"
                                  ) from None
    finally:
        loader.dispose()
