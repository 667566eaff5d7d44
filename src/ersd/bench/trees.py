"""Each method's natural tree shapes at a draft budget of K tokens (:func:`natural_shapes`).

Tree specs themselves (``chain:``, ``multi:``, ``batch:``, ``paths:``, ``binary:K``,
``optimal:K[@file]``) are parsed by the library: :func:`ersd.parse_tree`.
"""

from __future__ import annotations

from ersd.errors import UnsupportedTreeError
from ersd.methods import get_method
from ersd.tree import parse_tree


def natural_shapes(method: str, k: int, style: str = "natural") -> list[str]:
    """Tree specs of ``method`` at a draft budget of ``k`` tokens.

    ``natural``: chain:K for every method (SD's only shape); M×L with M = 2 and 4 for the
    multi-draft methods (ERSD, SpecInfer, RRS-wor, SpecTr, GLS); for SpecHub (at most two
    children per node) multi:2xL and binary:K.  ``minimal``: chain:K for SD, chain:K and
    multi:2x(K/2) for ERSD, multi:2x(K/2) for the others.  Shapes a method rejects are dropped.
    """
    name = get_method(method).name
    specs: list[str] = []
    if style == "natural":
        if name != "spechub":
            specs.append(f"chain:{k}")
        for m in (2, 4):
            if k % m == 0 and k // m >= 1 and (name != "spechub" or m == 2) and name != "sd":
                specs.append(f"multi:{m}x{k // m}")
        if name == "spechub" and k >= 3:
            specs.append(f"binary:{k}")
    else:
        if name in ("sd", "ersd"):
            specs.append(f"chain:{k}")
        if name == "ersd" and k % 2 == 0 and k >= 4:
            specs.append(f"multi:2x{k // 2}")  # the multi-draft baselines' shape, for comparison
        elif name != "sd" and k % 2 == 0:
            specs.append(f"multi:2x{k // 2}")
        else:
            specs.append(f"chain:{k}")
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
