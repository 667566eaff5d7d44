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
* ``binary:K``  — the first K nodes of a complete binary tree, breadth first (at most two
  children per node: SpecHub's natural shape).
* ``optimal:K[@FILE]`` — the K-node tree that maximises expected tokens per target call under the
  i.i.d.-rank model with a measured (per-depth) rank profile: Tunstall coding,
  :func:`ersd.theory.optimal_tree_by_depth`.  The profile comes from ``@FILE`` (a rank profile or
  a calibration file of ``ersd bench calibrate``, read by :func:`ersd.theory.load_profiles`) or
  from the ``profile=`` argument; ``temperature=`` picks a calibration file's profile (nearest
  temperature).  It is resolved above :mod:`ersd.theory`, by :func:`ersd.tree_spec.parse_tree`
  (``ersd.parse_tree``); this module never imports the theory.
* ``auto[@FILE]`` — not one shape but a rule: every step, the tree (or no drafting) with the
  highest predicted throughput at the current batch size, from a rank profile (``@FILE``, else
  estimated online) and forward-cost curves (:mod:`ersd.auto`, ``docs/auto-tree.md``).
  :func:`parse_auto` reads it into an :class:`AutoTree`; :func:`parse_tree` refuses it, since it
  names no fixed shape.

**Size bounds.**  A tree has at most :data:`MAX_TREE_NODES` nodes and depth at most
:data:`MAX_TREE_DEPTH` unless the caller raises them (``max_nodes=`` / ``max_depth=`` of
:func:`parse_tree` and :meth:`TreeShape.from_paths`; ``ersd serve --max-tree-nodes`` lowers them
per server).  Spec strings are checked from their numbers before anything is built, so
``chain:100000`` is refused at once instead of filling memory; generated kinds (chain, multi,
batch) are built directly in topological order, in time linear in the size of their paths.

Nodes are stored in topological order (by depth, then path); ``parents[i]`` is the index of node
``i``'s parent, ``-1`` for children of the root.  Depths, ancestor masks, position offsets and
root-to-leaf paths are derived from a parent list by the functions at the end of this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ersd.errors import InvalidTreeSpecError

if TYPE_CHECKING:  # torch only for ancestor_mask, imported there
    import torch

#: default bound on a draft tree's nodes (far beyond what pays off: trees of 4-64 nodes do)
MAX_TREE_NODES = 256
#: default bound on a draft tree's depth (the longest root-to-leaf path)
MAX_TREE_DEPTH = 128

_EXAMPLES = (
    "valid examples: 'chain:4', 'multi:2x3', 'batch:4', 'binary:6', 'optimal:8@calib.json', "
    "'paths:[[0],[1],[0,0]]'"
)


def check_tree_size(
    what: str, nodes: int, depth: int, *, max_nodes: int | None, max_depth: int | None
) -> None:
    """Refuse a tree of ``nodes`` nodes and depth ``depth`` beyond the bounds (None: unbounded);
    ``what`` names it in the message."""
    over = []
    if max_nodes is not None and nodes > max_nodes:
        over.append(f"{nodes} nodes (limit {max_nodes})")
    if max_depth is not None and depth > max_depth:
        over.append(f"depth {depth} (limit {max_depth})")
    if over:
        raise InvalidTreeSpecError(
            f"{what} has {' and '.join(over)}; draft trees beyond a few dozen nodes only cost "
            "time and memory. Use a smaller tree (e.g. 'chain:8', 'multi:2x4'). The library's "
            f"default limits ({MAX_TREE_NODES} nodes, depth {MAX_TREE_DEPTH}) are raised with "
            "max_nodes= / max_depth= of ersd.parse_tree; a server's with `ersd serve "
            "--max-tree-nodes`"
        )


def check_paths(
    paths: Iterable[Sequence[int]], *, siblings: bool = True, allow_empty: bool = False
) -> list[tuple[int, ...]]:
    """Validate child-index paths; returns them as tuples, in the given order.

    Every path is a non-empty sequence of integers >= 0, none appears twice and every prefix of a
    path is in the set.  ``siblings``: child indices under one parent must also be 0, 1, 2, ...
    without gaps (what a :class:`TreeShape` needs).  ``allow_empty``: an empty set is fine (the
    theory's "no draft").  Shared by :class:`TreeShape` and :mod:`ersd.theory.trees`.
    """
    out: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    for p in paths:
        if isinstance(p, str | bytes) or not isinstance(p, Sequence):
            raise InvalidTreeSpecError(
                f"tree path {p!r} is not a list of child indices; {_EXAMPLES}"
            )
        if len(p) == 0:
            raise InvalidTreeSpecError(
                f"empty path in tree spec (the root is implicit); {_EXAMPLES}"
            )
        if not all(_is_index(c) for c in p):
            raise InvalidTreeSpecError(
                f"tree path {list(p)} must hold integers >= 0 (0 = first child); {_EXAMPLES}"
            )
        t = tuple(int(c) for c in p)
        if t in seen:
            raise InvalidTreeSpecError(f"tree path {list(t)} appears twice; {_EXAMPLES}")
        seen.add(t)
        out.append(t)
    if not out and not allow_empty:
        raise InvalidTreeSpecError(f"a draft tree needs at least one node; {_EXAMPLES}")
    for t in out:
        if len(t) > 1 and t[:-1] not in seen:
            raise InvalidTreeSpecError(
                f"tree path {list(t)} has no parent {list(t[:-1])}; every path's prefixes "
                f"must be in the tree; {_EXAMPLES}"
            )
        if siblings and t[-1] > 0 and (*t[:-1], t[-1] - 1) not in seen:
            raise InvalidTreeSpecError(
                f"tree path {list(t)} has no elder sibling {[*t[:-1], t[-1] - 1]}; child "
                f"indices under one parent must be 0, 1, 2, ... without gaps; {_EXAMPLES}"
            )
    return out


def _is_index(c: Any) -> bool:
    """An integer >= 0 (Python or numpy; not a bool)."""
    if isinstance(c, bool) or not hasattr(c, "__index__"):
        return False
    return int(c.__index__()) >= 0


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
    def from_paths(
        cls,
        paths: Sequence[Sequence[int]],
        *,
        max_nodes: int | None = MAX_TREE_NODES,
        max_depth: int | None = MAX_TREE_DEPTH,
    ) -> TreeShape:
        """Validate and sort a list of child-index paths (refused beyond the size bounds)."""
        if isinstance(paths, Sequence) and not isinstance(paths, str | bytes):
            depth = max((len(p) for p in paths if isinstance(p, Sequence)), default=0)
            check_tree_size("the tree", len(paths), depth, max_nodes=max_nodes, max_depth=max_depth)
        return cls(tuple(sorted(check_paths(paths), key=lambda t: (len(t), t))))

    @classmethod
    def chain(
        cls,
        k: int,
        *,
        max_nodes: int | None = MAX_TREE_NODES,
        max_depth: int | None = MAX_TREE_DEPTH,
    ) -> TreeShape:
        return cls.multi(1, k, max_nodes=max_nodes, max_depth=max_depth)

    @classmethod
    def multi(
        cls,
        m: int,
        length: int,
        *,
        max_nodes: int | None = MAX_TREE_NODES,
        max_depth: int | None = MAX_TREE_DEPTH,
    ) -> TreeShape:
        """``m`` chains of ``length`` under the root; built in topological order directly (valid
        by construction: no sort, no re-validation), after the size check."""
        if m < 1 or length < 1:
            raise InvalidTreeSpecError(f"multi needs m, length >= 1, got {m} x {length}")
        check_tree_size(
            f"a tree of {m} x {length}",
            m * length,
            length,
            max_nodes=max_nodes,
            max_depth=max_depth,
        )
        zeros = [(0,) * d for d in range(length)]
        return cls(tuple((r, *zeros[d]) for d in range(length) for r in range(m)))

    @classmethod
    def binary(
        cls,
        k: int,
        *,
        max_nodes: int | None = MAX_TREE_NODES,
        max_depth: int | None = MAX_TREE_DEPTH,
    ) -> TreeShape:
        """First ``k`` nodes of a complete binary tree, breadth first."""
        check_tree_size(
            f"a binary tree of {k} nodes",
            k,
            k.bit_length(),
            max_nodes=max_nodes,
            max_depth=max_depth,
        )
        paths: list[tuple[int, ...]] = []
        frontier: list[tuple[int, ...]] = [()]
        while len(paths) < k:
            nxt = []
            for base in frontier:
                for c in (0, 1):
                    if len(paths) < k:
                        paths.append((*base, c))
                        nxt.append((*base, c))
            frontier = nxt
        return cls.from_paths(paths, max_nodes=None, max_depth=None)

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


def parse_tree(
    spec: str | TreeShape | AutoTree | Sequence[Sequence[int]],
    *,
    max_nodes: int | None = MAX_TREE_NODES,
    max_depth: int | None = MAX_TREE_DEPTH,
) -> TreeShape:
    """Parse a fixed-shape spec string (see module docstring), a path list or a
    :class:`TreeShape`; ``optimal:K[@FILE]`` needs a rank profile and is resolved one layer up,
    by :func:`ersd.parse_tree` (:mod:`ersd.tree_spec`).

    Trees beyond ``max_nodes`` nodes or depth ``max_depth`` (None: unbounded) raise
    :class:`InvalidTreeSpecError` naming the limit; a spec string is checked from its numbers
    before the tree is built.
    """
    limits = dict(max_nodes=max_nodes, max_depth=max_depth)
    if isinstance(spec, TreeShape):
        check_tree_size(f"tree {spec.spec[:60]!r}", spec.num_nodes, spec.depth, **limits)
        return spec
    if isinstance(spec, AutoTree):
        raise InvalidTreeSpecError(
            f"tree {spec.spec!r} chooses a tree per step, it is not one fixed shape: pass it as "
            "tree= to ersd.generate / ersd.generate_batch"
        )
    if not isinstance(spec, str):
        if isinstance(spec, bytes) or not isinstance(spec, Sequence):
            shown = f"{spec!r:.60}"
            hint = f"; for {spec} tokens in a line write 'chain:{spec}'" if _is_index(spec) else ""
            raise InvalidTreeSpecError(
                f"tree must be a spec string or a list of child-index paths, got {shown} "
                f"({type(spec).__name__}){hint}; {_EXAMPLES}"
            )
        return TreeShape.from_paths(cast(Sequence[Sequence[int]], spec), **limits)
    s = spec.strip()
    kind, sep, arg = s.partition(":")
    kind = kind.strip().lower()
    arg = arg.strip()
    if kind.partition("@")[0].strip() == "auto":
        kind = "auto"
    elif not sep:
        raise InvalidTreeSpecError(f"tree spec {spec!r} has no 'kind:' prefix; {_EXAMPLES}")
    if kind in ("chain", "batch", "binary"):
        if not re.fullmatch(r"[1-9][0-9]*", arg):
            raise InvalidTreeSpecError(
                f"tree spec {spec!r}: '{kind}:' takes a positive integer, e.g. '{kind}:4'"
            )
        k = _count(spec, arg)
        depth = {"chain": k, "batch": 1, "binary": k.bit_length()}[kind]
        check_tree_size(f"tree spec {spec!r}", k, depth, **limits)
        if kind == "chain":
            return TreeShape.chain(k, max_nodes=None, max_depth=None)
        if kind == "batch":
            return TreeShape.multi(k, 1, max_nodes=None, max_depth=None)
        return TreeShape.binary(k, max_nodes=None, max_depth=None)
    if kind == "multi":
        m = re.fullmatch(r"([1-9][0-9]*)\s*[xX]\s*([1-9][0-9]*)", arg)
        if not m:
            raise InvalidTreeSpecError(
                f"tree spec {spec!r}: 'multi:' takes MxL (M drafts of L tokens), e.g. 'multi:2x3'"
            )
        lanes, length = _count(spec, m.group(1)), _count(spec, m.group(2))
        check_tree_size(f"tree spec {spec!r}", lanes * length, length, **limits)
        return TreeShape.multi(lanes, length, max_nodes=None, max_depth=None)
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
        return TreeShape.from_paths(paths, **limits)
    if kind == "optimal":
        raise InvalidTreeSpecError(
            f"tree spec {spec!r} needs a rank profile: parse it with ersd.parse_tree "
            "(ersd.tree_spec), which resolves 'optimal:K[@FILE]'"
        )
    if kind == "auto":
        raise InvalidTreeSpecError(
            f"tree spec {spec!r} chooses a tree per step, it is not one fixed shape: pass it as "
            "tree= to ersd.generate / ersd.generate_batch (or --tree auto), or read it with "
            "ersd.tree.parse_auto"
        )
    raise InvalidTreeSpecError(f"unknown tree kind {kind!r} in {spec!r}; {_EXAMPLES}")


def _count(spec: str, digits: str) -> int:
    """A count of a spec string (digits only: checked by the caller's pattern), refused before
    ``int()`` when it has more digits than any bound allows."""
    if len(digits) > 9:
        raise InvalidTreeSpecError(
            f"tree spec {spec!r}: {digits[:12]}... is far beyond any tree size; the default limit "
            f"is {MAX_TREE_NODES} nodes and depth {MAX_TREE_DEPTH}"
        )
    return int(digits)


@dataclass(frozen=True)
class AutoTree:
    """``tree="auto"``: choose each step's tree by predicted throughput (:mod:`ersd.auto`).

    ``profile``: where the rank profile comes from: a rank-profile or calibration file path (as in
    ``optimal:K@FILE``), a :class:`ersd.theory.RankProfile`, or per-depth rank vectors; ``None``
    estimates it online from the run's own verified steps.  ``costs``: an
    :class:`ersd.costs.CostModel` (or its dict); ``None`` takes a calibration file's costs, else
    the curves kept in the cost store (:mod:`ersd.cost_store`, measured earlier on this machine),
    else measures the models' forward curves once per generation (or batch engine) and stores
    them; an :class:`ersd.auto.CurveCache` shares that measurement across the generations given
    it.
    ``max_nodes`` caps the candidate trees' size.  Plain data: each generation builds its own
    chooser from it.
    """

    profile: Any = None
    costs: Any = None
    max_nodes: int = 16

    def __post_init__(self) -> None:
        m = self.max_nodes
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 64:
            raise InvalidTreeSpecError(f"AutoTree max_nodes must be an int in 1..64, got {m!r}")

    @property
    def spec(self) -> str:
        """``auto`` or ``auto@FILE`` (a profile given as an object is not named)."""
        return f"auto@{self.profile}" if isinstance(self.profile, str) else "auto"

    def __str__(self) -> str:
        return self.spec


def parse_auto(spec: Any) -> AutoTree | None:
    """The :class:`AutoTree` of ``auto`` / ``auto@FILE`` (or an AutoTree); None for other specs."""
    if isinstance(spec, AutoTree):
        return spec
    if not isinstance(spec, str):
        return None
    if re.split(r"[@:]", spec, maxsplit=1)[0].strip().lower() != "auto":
        return None
    m = re.fullmatch(r"auto\s*(?:@\s*(.+?)\s*)?", spec.strip(), flags=re.IGNORECASE)
    if not m:
        raise InvalidTreeSpecError(
            f"tree spec {spec!r}: write 'auto' (profile estimated online) or 'auto@FILE' (a "
            "calibration or rank-profile file from `ersd bench calibrate CONFIG --out FILE`)"
        )
    return AutoTree(profile=m.group(1))


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
    import torch

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
