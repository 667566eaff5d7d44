"""Draft tree shapes and the derived tree-attention data.

A **tree shape** is plain data: a list of child-index paths (the Medusa / vLLM
``speculative_token_tree`` convention).  ``(0,)`` is the first child of the root, ``(0, 1)`` the
second child of that node, and so on.  For ERSD a child index is a rank in the drafter's race
(0 = the drafter's own sample); for the i.i.d. baselines it is a draft lane.  A shape must be
closed under parents and elder siblings: ``(0, 1)`` needs ``(0,)`` and ``(0, 0)``.

Spec strings (:func:`parse_tree`):

* ``chain:K``   — K tokens in a line (one draft sequence).
* ``multi:MxL`` — M drafts of L tokens: M children at the root, each continued by a chain.
* ``batch:K``   — K siblings at the root (= ``multi:Kx1``).
* ``paths:[[0],[1],[0,0]]`` — a JSON list of child-index paths.

Nodes are stored in topological order (by depth, then path); ``parents[i]`` is the index of node
``i``'s parent, ``-1`` for children of the root.  Depths, ancestor masks, position offsets and
root-to-leaf paths are derived from a parent list by the functions at the end of this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ersd.errors import InvalidTreeSpecError

_EXAMPLES = "valid examples: 'chain:4', 'multi:2x3', 'batch:4', 'paths:[[0],[1],[0,0]]'"


@dataclass(frozen=True)
class TreeShape:
    """A draft tree shape: child-index paths in topological order, with derived structure."""

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...] = field(init=False)
    children: tuple[tuple[int, ...], ...] = field(init=False)  # children[i + 1] of node i; [0] root

    def __post_init__(self) -> None:
        index = {p: i for i, p in enumerate(self.paths)}
        parents = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in self.paths)
        kids: list[list[int]] = [[] for _ in range(len(self.paths) + 1)]
        for i, par in enumerate(parents):
            kids[par + 1].append(i)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "children", tuple(tuple(k) for k in kids))

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> TreeShape:
        """Validate and sort a list of child-index paths."""
        clean: set[tuple[int, ...]] = set()
        for p in paths:
            if isinstance(p, str | bytes) or not isinstance(p, Sequence):
                raise InvalidTreeSpecError(
                    f"tree path {p!r} is not a list of child indices; {_EXAMPLES}"
                )
            if len(p) == 0:
                raise InvalidTreeSpecError(
                    f"empty path in tree spec (the root is implicit); {_EXAMPLES}"
                )
            if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in p):
                raise InvalidTreeSpecError(
                    f"tree path {list(p)} must hold integers >= 0 (0 = first child); {_EXAMPLES}"
                )
            t = tuple(int(c) for c in p)
            if t in clean:
                raise InvalidTreeSpecError(f"tree path {list(t)} appears twice; {_EXAMPLES}")
            clean.add(t)
        if not clean:
            raise InvalidTreeSpecError(f"a draft tree needs at least one node; {_EXAMPLES}")
        for t in clean:
            if len(t) > 1 and t[:-1] not in clean:
                raise InvalidTreeSpecError(
                    f"tree path {list(t)} has no parent {list(t[:-1])}; every path's prefixes "
                    f"must be in the tree; {_EXAMPLES}"
                )
            if t[-1] > 0 and (*t[:-1], t[-1] - 1) not in clean:
                raise InvalidTreeSpecError(
                    f"tree path {list(t)} has no elder sibling {[*t[:-1], t[-1] - 1]}; child "
                    f"indices under one parent must be 0, 1, 2, ... without gaps; {_EXAMPLES}"
                )
        return cls(tuple(sorted(clean, key=lambda t: (len(t), t))))

    @classmethod
    def chain(cls, k: int) -> TreeShape:
        return cls.from_paths([(0,) * d for d in range(1, k + 1)])

    @classmethod
    def multi(cls, m: int, length: int) -> TreeShape:
        return cls.from_paths([(r,) + (0,) * d for r in range(m) for d in range(length)])

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    def child_nodes(self, node: int) -> tuple[int, ...]:
        """Children of ``node`` (``-1`` = root), in child-index order."""
        return self.children[node + 1]

    @property
    def max_children(self) -> int:
        return max(len(c) for c in self.children)

    @property
    def is_chain(self) -> bool:
        return self.max_children == 1

    def truncated(self, max_depth: int) -> TreeShape | None:
        """The shape with every node deeper than ``max_depth`` removed (None if nothing is left)."""
        kept = [p for p in self.paths if len(p) <= max_depth]
        return TreeShape(tuple(kept)) if kept else None

    @property
    def spec(self) -> str:
        """Canonical ``paths:`` spec string of this shape."""
        return "paths:" + json.dumps([list(p) for p in self.paths], separators=(",", ":"))

    def __str__(self) -> str:
        return self.spec


def parse_tree(spec: str | TreeShape | Sequence[Sequence[int]]) -> TreeShape:
    """Parse a tree spec string (see module docstring), a path list or a :class:`TreeShape`."""
    if isinstance(spec, TreeShape):
        return spec
    if not isinstance(spec, str):
        return TreeShape.from_paths(spec)
    s = spec.strip()
    kind, sep, arg = s.partition(":")
    kind = kind.strip().lower()
    arg = arg.strip()
    if not sep:
        raise InvalidTreeSpecError(f"tree spec {spec!r} has no 'kind:' prefix; {_EXAMPLES}")
    if kind == "chain" or kind == "batch":
        if not re.fullmatch(r"[1-9][0-9]*", arg):
            raise InvalidTreeSpecError(
                f"tree spec {spec!r}: '{kind}:' takes a positive integer, e.g. '{kind}:4'"
            )
        k = int(arg)
        return TreeShape.chain(k) if kind == "chain" else TreeShape.multi(k, 1)
    if kind == "multi":
        m = re.fullmatch(r"([1-9][0-9]*)\s*[xX]\s*([1-9][0-9]*)", arg)
        if not m:
            raise InvalidTreeSpecError(
                f"tree spec {spec!r}: 'multi:' takes MxL (M drafts of L tokens), e.g. 'multi:2x3'"
            )
        return TreeShape.multi(int(m.group(1)), int(m.group(2)))
    if kind == "paths":
        try:
            paths = json.loads(arg)
        except json.JSONDecodeError as exc:
            raise InvalidTreeSpecError(
                f"tree spec {spec!r}: 'paths:' takes a JSON list of lists ({exc.msg}); "
                "e.g. 'paths:[[0],[1],[0,0]]'"
            ) from None
        if not isinstance(paths, list):
            raise InvalidTreeSpecError(
                f"tree spec {spec!r}: 'paths:' takes a JSON list of lists, e.g. 'paths:[[0],[1]]'"
            )
        return TreeShape.from_paths(paths)
    raise InvalidTreeSpecError(f"unknown tree kind {kind!r} in {spec!r}; {_EXAMPLES}")


# --- derived tree-attention data, for any parent list in topological order ---------------------


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (children of the root have depth 1)."""
    depths: list[int] = []
    for i, par in enumerate(parents):
        if par >= i:
            raise InvalidTreeSpecError(
                f"parents must be in topological order (node {i} has parent {par})"
            )
        depths.append(1 if par < 0 else depths[par] + 1)
    return depths


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """Boolean ``[n, n]``: ``mask[i, j]`` is True when node j is node i or one of its ancestors."""
    n = len(parents)
    mask = torch.zeros((n, n), dtype=torch.bool)
    for i, par in enumerate(parents):
        if par >= i:
            raise InvalidTreeSpecError(
                f"parents must be in topological order (node {i} has parent {par})"
            )
        if par >= 0:
            mask[i] = mask[par]
        mask[i, i] = True
    return mask


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from the root's child down to ``node`` (inclusive)."""
    out: list[int] = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def root_to_leaf_paths(parents: Sequence[int]) -> list[list[int]]:
    """Every root-to-leaf path as a list of node indices."""
    has_child = set(p for p in parents if p >= 0)
    return [path_to(parents, i) for i in range(len(parents)) if i not in has_child]
