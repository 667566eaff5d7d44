"""Tree specs of the benchmark: the library's kinds plus ``optimal:K[@file]`` and ``binary:K``.

* ``optimal:K`` — the K-node tree that maximises expected tokens per target call under the
  i.i.d.-rank model with the measured (per-depth) rank profile: Tunstall coding,
  :func:`ersd.theory.optimal_tree_by_depth` (Kobus & Gündüz 2025, §3).  The profile comes from the
  ``profile`` argument, or from ``@file``: a rank profile (:class:`ersd.theory.RankProfile` JSON)
  or a calibration file written by ``ersd bench calibrate``.
* ``binary:K`` — the first K nodes of a complete binary tree in breadth-first order (at most two
  children per node: SpecHub's natural shape).
* anything else goes to :func:`ersd.parse_tree` (``chain:K``, ``multi:MxL``, ``batch:K``,
  ``paths:[...]``).

:func:`natural_shapes` lists each method's shapes at a draft budget of K tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ersd.errors import InvalidTreeSpecError, UnsupportedTreeError
from ersd.methods import get_method
from ersd.theory import RankProfile, optimal_tree_by_depth
from ersd.tree import TreeShape, parse_tree

#: per-depth estimates below this many observations fall back to the pooled profile
MIN_DEPTH_COUNT = 50

CALIBRATION_FORMAT = "ersd-bench-calibration"

ProfileLike = RankProfile | Sequence[Any] | np.ndarray | str | Path


def load_profile(source: str | Path, temperature: float | None = None) -> RankProfile:
    """A :class:`RankProfile` from a rank-profile file or a bench calibration file.

    A calibration file holds one profile per temperature; ``temperature`` picks the nearest one
    (``None``: the first).
    """
    p = Path(source)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InvalidTreeSpecError(
            f"profile file {str(p)!r} does not exist; write one with `ersd bench calibrate "
            "CONFIG --out FILE`"
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidTreeSpecError(f"profile file {str(p)!r} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and data.get("format") == CALIBRATION_FORMAT:
        return pick_profile(
            {float(t): RankProfile.from_dict(d) for t, d in data["profiles"].items()}, temperature
        )
    return RankProfile.from_dict(data)


def pick_profile(profiles: dict[float, RankProfile], temperature: float | None) -> RankProfile:
    """The profile calibrated at the temperature nearest ``temperature`` (T=0 takes the lowest)."""
    if not profiles:
        raise InvalidTreeSpecError("no rank profile available; run `ersd bench calibrate` first")
    temps = sorted(profiles)
    if temperature is None:
        return profiles[temps[0]]
    return profiles[min(temps, key=lambda t: (abs(t - temperature), t))]


def depth_probs(profile: ProfileLike, temperature: float | None = None) -> list[np.ndarray]:
    """Per-depth rank probabilities (depth 1 first) of a profile, file or plain vector(s)."""
    if isinstance(profile, str | Path):
        profile = load_profile(profile, temperature)
    if isinstance(profile, RankProfile):
        return profile.depth_rank_probs(min_count=MIN_DEPTH_COUNT)
    arr = list(profile)
    if arr and np.ndim(arr[0]) == 0:  # one pooled vector
        return [np.asarray(arr, dtype=np.float64)]
    return [np.asarray(a, dtype=np.float64) for a in arr]


def binary_tree(k: int) -> TreeShape:
    """First ``k`` nodes of a complete binary tree, breadth first."""
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
    return TreeShape.from_paths(paths)


def resolve_tree(
    spec: str | TreeShape | Sequence[Sequence[int]],
    profile: ProfileLike | None = None,
    temperature: float | None = None,
) -> TreeShape:
    """Parse a tree spec, including ``optimal:K[@file]`` and ``binary:K`` (module docstring)."""
    if not isinstance(spec, str):
        return parse_tree(spec)
    kind, _, arg = spec.strip().partition(":")
    kind = kind.strip().lower()
    if kind == "binary":
        if not re.fullmatch(r"\s*[1-9][0-9]*\s*", arg):
            raise InvalidTreeSpecError(
                f"tree spec {spec!r}: 'binary:' takes a positive integer, e.g. 'binary:6'"
            )
        return binary_tree(int(arg))
    if kind != "optimal":
        return parse_tree(spec)
    m = re.fullmatch(r"\s*([1-9][0-9]*)\s*(?:@\s*(.+?)\s*)?", arg)
    if not m:
        raise InvalidTreeSpecError(
            f"tree spec {spec!r}: 'optimal:' takes a node count and optionally a profile file, "
            "e.g. 'optimal:8' or 'optimal:8@profile.json'"
        )
    k, source = int(m.group(1)), m.group(2)
    prof: ProfileLike | None = source if source else profile
    if prof is None:
        raise InvalidTreeSpecError(
            f"tree spec {spec!r} needs a rank profile: write 'optimal:{k}@FILE' with a file from "
            "`ersd bench calibrate CONFIG --out FILE`, or pass profile="
        )
    return TreeShape.from_paths(optimal_tree_by_depth(depth_probs(prof, temperature), k))


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
        shape = resolve_tree(s)
        if shape.paths in seen:
            continue
        try:
            get_method(name).check_shape(shape)
        except UnsupportedTreeError:
            continue
        seen.add(shape.paths)
        out.append(s)
    return out
