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

from collections.abc import Sequence
from dataclasses import dataclass

from ersd.drafting.dynamic import DynamicSpec, parse_dynamic
from ersd.tree import AutoTree, TreeShape, parse_auto, parse_tree

#: what a ``tree=`` argument may be
TreeArg = str | TreeShape | AutoTree | Sequence[Sequence[int]]


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


def parse_tree_spec(spec: TreeArg | ParsedTree, *, temperature: float | None) -> ParsedTree:
    """Parse ``spec`` (see the module docstring); ``temperature`` picks an ``optimal:K@FILE``
    calibration file's profile.  A :class:`ParsedTree` passes through."""
    if isinstance(spec, ParsedTree):
        return spec
    auto = parse_auto(spec)
    if auto is not None:
        return ParsedTree(auto.spec, auto=auto)
    dynamic = parse_dynamic(spec)
    if dynamic is not None:
        return ParsedTree(dynamic.spec, dynamic=dynamic)
    shape = parse_tree(spec, temperature=temperature)
    return ParsedTree(shape.spec, shape=shape)
