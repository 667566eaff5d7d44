"""Each method's natural tree shapes at a draft budget of K tokens (:func:`natural_shapes`).

Tree specs themselves (``chain:``, ``multi:``, ``batch:``, ``paths:``, ``binary:K``,
``optimal:K[@file]``) are parsed by the library: :func:`ersd.parse_tree`.
"""

from __future__ import annotations

from ersd.errors import UnsupportedTreeError
from ersd.methods import get_method
from ersd.methods.catalog import method_info
from ersd.tree_spec import parse_tree


def natural_shapes(method: str, k: int, style: str = "natural") -> list[str]:
    """Tree specs of ``method`` at a draft budget of ``k`` tokens.

    The templates of the method's catalog entry (:attr:`ersd.methods.catalog.MethodInfo.natural`
    or ``.minimal``): ``natural`` is chain:K and M×L with M = 2 and 4 for the multi-draft
    methods, chain:K only for SD, multi:2xL and binary:K for SpecHub (at most two children per
    node); ``minimal`` is chain:K for SD, chain:K and multi:2x(K/2) for ERSD, multi:2x(K/2) for
    the others; ``chain`` is chain:K alone.  Shapes a method rejects, and repeats of one shape,
    are dropped.
    """
    name = get_method(method).name
    specs = method_info(name).shapes(k, style)
    out: list[str] = []
    seen: set[tuple[tuple[int, ...], ...]] = set()
    for s in specs:
        shape = parse_tree(s)
        if shape.paths in seen:
            continue
        try:
            get_method(name).check_shape(shape)
        except UnsupportedTreeError:
            continue
        seen.add(shape.paths)
        out.append(s)
    return out
