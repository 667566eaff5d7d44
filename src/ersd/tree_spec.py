"""The tree a request drafts, parsed once into a value that carries its own label.

Every kind a ``tree=`` argument (library, batch, CLI, server, bench) may name parses here, once,
into a :class:`ParsedTree`:

* a fixed shape — ``chain:K``, ``multi:MxL``, ``batch:K``, ``binary:K``, ``paths:[...]``, a path
  list or a :class:`~ersd.tree.TreeShape` (:func:`ersd.tree.parse_tree`), and ``optimal:K@FILE``
  resolved at the request's temperature (the profile file's nearest calibrated temperature);
* ``auto`` / ``auto@FILE`` / an :class:`~ersd.tree.AutoTree`: chosen per step (:mod:`ersd.auto`);
* ``dynamic:K[@D]`` / ``dynamic-cost:K[@D]``: grown per step by a dynamic drafter
  (:mod:`ersd.drafting.dynamic`; the drafter is made when the request meets its draft model).

The value's ``label`` is what a result is labelled with (the canonical ``paths:`` spec of the
shape actually drafted, ``auto[@FILE]``, or the canonical dynamic spec), so nothing downstream
parses the spec again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ersd import tree as shapes
from ersd.errors import InvalidTreeSpecError
from ersd.theory.profile import RankProfileError, tree_depth_probs
from ersd.theory.trees import optimal_tree_by_depth
from ersd.tree import (
    MAX_TREE_DEPTH,
    MAX_TREE_NODES,
    AutoTree,
    TreeShape,
    check_tree_size,
    parse_auto,
)

#: what a ``tree=`` argument may be
TreeArg = str | TreeShape | AutoTree | Sequence[Sequence[int]]

_SPEC = re.compile(r"\s*(dynamic|dynamic-cost)\s*:\s*([1-9][0-9]*)\s*(?:@\s*([1-9][0-9]*)\s*)?")


@dataclass(frozen=True)
class DynamicSpec:
    budget: int
    max_depth: int | None = None
    cost_aware: bool = False

    @property
    def spec(self) -> str:
        kind = "dynamic-cost" if self.cost_aware else "dynamic"
        cap = f"@{self.max_depth}" if self.max_depth is not None else ""
        return f"{kind}:{self.budget}{cap}"


def parse_dynamic(spec: Any) -> DynamicSpec | None:
    """The :class:`DynamicSpec` of a ``dynamic[-cost]:K[@D]`` string; None for other specs."""
    if not isinstance(spec, str) or not spec.strip().lower().startswith("dynamic"):
        return None
    m = _SPEC.fullmatch(spec.lower())
    if not m:
        raise InvalidTreeSpecError(
            f"tree spec {spec!r}: dynamic trees are 'dynamic:K' (K drafted tokens per step), "
            "'dynamic:K@D' (depth cap D) or 'dynamic-cost:K[@D]' (cost-aware), e.g. 'dynamic:8'"
        )
    budget, cap = m.group(2), m.group(3)
    check_tree_size(
        f"tree spec {spec!r}",
        int(budget) if len(budget) <= 9 else MAX_TREE_NODES + 1,
        int(cap or budget) if len(cap or budget) <= 9 else MAX_TREE_DEPTH + 1,
        max_nodes=MAX_TREE_NODES,
        max_depth=MAX_TREE_DEPTH,
    )
    return DynamicSpec(int(budget), int(cap) if cap else None, m.group(1) == "dynamic-cost")


def parse_tree(
    spec: str | TreeShape | AutoTree | Sequence[Sequence[int]],
    *,
    profile: Any = None,
    temperature: float | None = None,
    max_nodes: int | None = MAX_TREE_NODES,
    max_depth: int | None = MAX_TREE_DEPTH,
) -> TreeShape:
    """One fixed shape: a spec string (:mod:`ersd.tree`), a path list, a :class:`TreeShape`, or
    ``optimal:K[@FILE]`` resolved here.

    ``profile`` (for ``optimal:K`` without ``@FILE``): a :class:`ersd.theory.RankProfile`, a rank
    vector, a list of per-depth rank vectors, or a profile / calibration file path.
    ``temperature`` picks the profile of a calibration file (nearest calibrated temperature; None:
    the lowest).  Trees beyond ``max_nodes`` nodes or depth ``max_depth`` (None: unbounded) are
    refused naming the limit (:func:`ersd.tree.check_tree_size`).
    """
    limits: dict[str, Any] = dict(max_nodes=max_nodes, max_depth=max_depth)
    if isinstance(spec, str):
        kind, _, arg = spec.strip().partition(":")
        if kind.strip().lower() == "optimal":
            return _optimal(spec, arg.strip(), profile, temperature, limits)
    return shapes.parse_tree(spec, **limits)


def _optimal(
    spec: str, arg: str, profile: Any, temperature: float | None, limits: dict[str, Any]
) -> TreeShape:
    m = re.fullmatch(r"([1-9][0-9]*)\s*(?:@\s*(.+?)\s*)?", arg)
    if not m:
        raise InvalidTreeSpecError(
            f"tree spec {spec!r}: 'optimal:' takes a node count and optionally a profile file, "
            "e.g. 'optimal:8' or 'optimal:8@profile.json'"
        )
    digits, source = m.group(1), m.group(2)
    k = int(digits) if len(digits) <= 9 else MAX_TREE_NODES + 1
    check_tree_size(f"tree spec {spec!r}", k, 1, max_nodes=limits["max_nodes"], max_depth=None)
    prof = source if source else profile
    if prof is None:
        raise InvalidTreeSpecError(
            f"tree spec {spec!r} needs a rank profile: write 'optimal:{k}@FILE' with a file from "
            "`ersd bench calibrate CONFIG --out FILE`, or pass profile="
        )
    try:
        probs = tree_depth_probs(prof, temperature)
    except RankProfileError as exc:
        raise InvalidTreeSpecError(f"tree spec {spec!r}: {exc}") from None
    return TreeShape.from_paths(optimal_tree_by_depth(probs, k), **limits)


@dataclass(frozen=True)
class ParsedTree:
    """One parsed tree spec: exactly one of ``shape``, ``auto``, ``dynamic`` is set."""

    label: str
    shape: TreeShape | None = None
    auto: AutoTree | None = None
    dynamic: DynamicSpec | None = None

    @property
    def kind(self) -> str:
        """``"shape"``, ``"auto"`` or ``"dynamic"``."""
        return "auto" if self.auto else "dynamic" if self.dynamic else "shape"

    def __str__(self) -> str:
        return self.label


def parse_tree_spec(
    spec: TreeArg | ParsedTree,
    *,
    temperature: float | None,
    max_nodes: int | None = MAX_TREE_NODES,
    max_depth: int | None = MAX_TREE_DEPTH,
) -> ParsedTree:
    """Parse ``spec`` (see the module docstring); ``temperature`` picks an ``optimal:K@FILE``
    calibration file's profile; trees beyond ``max_nodes`` / ``max_depth`` are refused.  A
    :class:`ParsedTree` passes through."""
    if isinstance(spec, ParsedTree):
        return spec
    auto = parse_auto(spec)
    if auto is not None:
        return ParsedTree(auto.spec, auto=auto)
    dynamic = parse_dynamic(spec)
    if dynamic is not None:
        return ParsedTree(dynamic.spec, dynamic=dynamic)
    shape = parse_tree(spec, temperature=temperature, max_nodes=max_nodes, max_depth=max_depth)
    return ParsedTree(shape.spec, shape=shape)
