"""Expected tokens per target call versus the number of drafted tokens ``k``, per method and shape.

Under the i.i.d. per-node model (every context has the same ``(p, q)``; ranks / acceptances are
independent across depths) for ``k = 1..max_k`` and four tree families:

* ``chain``   — ``chain:k``;
* ``batch``   — ``batch:k``;
* ``multi``   — the best ``multi:MxL`` with ``M, L >= 2`` and ``M·L <= k`` (NaN for ``k < 4``);
* ``optimal`` — the optimal ``k``-node tree (:func:`ersd.theory.optimal_tree`) for methods whose
  children are tried in a fixed order (``ersd``, ``specinfer``, ``rrs-wor``; ``sd`` is chains
  only, so its optimal tree is the chain), built on the method's child-index distribution.

Methods without a child-index structure (``spectr``, ``gls``) get chain/batch/multi from their
acceptance with ``c`` children (:func:`ersd.theory.trees.per_node_block_efficiency`); ``spechub``
is limited to two children per node.  ``bound``/``asymptote`` are the paper's bound and its
``log k / H[R]`` asymptote for ERSD's rank distribution.  NaN marks "not defined".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ersd.errors import ErsdError
from ersd.methods.catalog import CATALOG
from ersd.theory.acceptance import (
    ACCEPTANCE_METHODS,
    MAX_SUBSET_VOCAB,
    acceptance_probability,
    child_index_distribution,
    iid_optimal_acceptance,
    rank_cdf_lower_bound,
    rank_distribution,
    rrs_wor_partial_profile,
)
from ersd.theory.distributions import (
    as_pair,
    as_probs,
    check_count,
    kl_divergence,
    rank_entropy,
)
from ersd.theory.trees import (
    batch_paths,
    block_efficiency_bound,
    bound_asymptote,
    chain_paths,
    expected_block_efficiency_by_depth,
    multi_paths,
    optimal_tree_by_depth,
    per_node_block_efficiency,
)

SHAPES: tuple[str, ...] = ("chain", "batch", "multi", "optimal")


@dataclass
class Curves:
    """Tokens per call for ``k = ks``: ``values[method][shape]`` (lists aligned with ``ks``)."""

    ks: list[int]
    values: dict[str, dict[str, list[float]]]
    bound: list[float]
    asymptote: list[float]
    vocab_size: int
    rank_entropy_nats: float
    best_multi: dict[int, tuple[int, int]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def clean(xs: Sequence[float]) -> list[float | None]:
            return [None if (x is None or not math.isfinite(x)) else round(float(x), 6) for x in xs]

        return {
            "ks": self.ks,
            "vocab_size": self.vocab_size,
            "rank_entropy_nats": round(self.rank_entropy_nats, 6),
            "curves": {m: {s: clean(v) for s, v in d.items()} for m, d in self.values.items()},
            "bound": clean(self.bound),
            "asymptote": clean(self.asymptote),
            "best_multi": {str(k): list(v) for k, v in self.best_multi.items()},
            **self.info,
        }


def _multi_options(k: int) -> list[tuple[int, int]]:
    return [(m, n) for m in range(2, k // 2 + 1) for n in range(2, k // m + 1)]


def _rank_curves(
    rank_probs: np.ndarray | list[np.ndarray], ks: list[int], known: int | None = None
) -> tuple[dict[str, list[float]], dict]:
    """chain/batch/multi/optimal for a child-index distribution (1-D, may be short), or a list
    of them, one per depth (depth 1 first; the last is reused deeper down).

    ``known``: only the first ``known`` child indices have known probabilities (the rest were not
    computed); shapes that need more children per node are NaN.
    """
    profiles = rank_probs if isinstance(rank_probs, list) else [rank_probs]
    limit = known if known is not None else math.inf

    def eff(paths: list[tuple[int, ...]]) -> float:
        return expected_block_efficiency_by_depth(paths, profiles)

    out: dict[str, list[float]] = {s: [] for s in SHAPES}
    best: dict[int, tuple[int, int]] = {}
    for k in ks:
        out["chain"].append(eff(chain_paths(k)))
        out["batch"].append(eff(batch_paths(k)) if k <= limit else math.nan)
        opts = [(m, n) for m, n in _multi_options(k) if m <= limit]
        if opts:
            v, mn = max((eff(multi_paths(m, n)), (m, n)) for m, n in opts)
            out["multi"].append(v)
            best[k] = mn
        else:
            out["multi"].append(math.nan)
        out["optimal"].append(eff(optimal_tree_by_depth(profiles, k)) if k <= limit else math.nan)
    return out, best


def _acceptance_curves(
    alpha: list[float], ks: list[int], max_children: int
) -> dict[str, list[float]]:
    """chain/batch/multi for a method known only through its acceptance with c children."""
    out: dict[str, list[float]] = {s: [] for s in SHAPES}
    for k in ks:
        out["chain"].append(per_node_block_efficiency([1] * k, alpha))
        out["batch"].append(
            per_node_block_efficiency([k], alpha) if k <= max_children else math.nan
        )
        opts = [(m, n) for m, n in _multi_options(k) if m <= max_children]
        out["multi"].append(
            max(per_node_block_efficiency([m] + [1] * (n - 1), alpha) for m, n in opts)
            if opts
            else math.nan
        )
        out["optimal"].append(math.nan)
    return out


def pair_curves(
    target_probs: Any,
    draft_probs: Any,
    max_k: int = 16,
    methods: Sequence[str] = ACCEPTANCE_METHODS,
) -> Curves:
    """Curves for one ``(p, q)`` pair, every method in ``methods``."""
    p, q = as_pair(target_probs, draft_probs)
    kmax = check_count(max_k, "max_k")
    ks = list(range(1, kmax + 1))
    unknown = [m for m in methods if m not in ACCEPTANCE_METHODS]
    if unknown:
        raise ErsdError(f"unknown methods {unknown}; known: {', '.join(ACCEPTANCE_METHODS)}")
    rank = rank_distribution(p, q)
    values: dict[str, dict[str, list[float]]] = {}
    best_multi: dict[int, tuple[int, int]] = {}
    acceptance: dict[str, dict[str, float | None]] = {}
    for meth in methods:
        info = CATALOG[meth]
        cap = min(info.max_children or kmax, kmax)
        known = None
        if meth == "ersd":
            cid: np.ndarray | None = rank
        elif meth == "rrs-wor":  # exact enumeration as deep as it stays affordable
            cid = -np.diff(rrs_wor_partial_profile(p, q, cap))
            known = cid.size if cid.size < cap else None
        elif info.child_order:
            cid = child_index_distribution(p, q, cap, meth)
        else:
            cid = None
        if cid is not None:
            curves, best = _rank_curves(cid, ks, known)
            if info.max_children == 1:  # chains only
                curves["batch"] = [curves["chain"][0]] + [math.nan] * (len(ks) - 1)
                curves["multi"] = [math.nan] * len(ks)
            if meth == "ersd":
                best_multi = best
            values[meth] = curves
            alpha = list(np.cumsum(cid))
        else:
            alpha = [acceptance_probability(p, q, c, meth) for c in range(1, cap + 1)]
            values[meth] = _acceptance_curves(alpha, ks, cap)
        acceptance[meth] = {
            str(m): (float(alpha[m - 1]) if m <= len(alpha) else None) for m in (1, 2, 4)
        }
    h = rank_entropy(rank)
    return Curves(
        ks=ks,
        values=values,
        bound=[block_efficiency_bound(rank, k, p.size) for k in ks],
        asymptote=[bound_asymptote(rank, k) for k in ks],
        vocab_size=p.size,
        rank_entropy_nats=h,
        best_multi=best_multi,
        info={
            "tv": float(0.5 * np.abs(p - q).sum()),
            "kl_nats": kl_divergence(p, q),
            "acceptance": acceptance,
            "reference": _reference_rows(p, q),
        },
    )


def _reference_rows(p: np.ndarray, q: np.ndarray) -> dict[str, dict[str, float | None]]:
    """The i.i.d.-draft optimum (``V <= 20``) and the lower bound on ``P(R <= m)``."""
    rows: dict[str, dict[str, float | None]] = {}
    if p.size <= MAX_SUBSET_VOCAB:
        rows["iid-opt"] = {str(m): iid_optimal_acceptance(p, q, m) for m in (1, 2, 4)}
    rows["ersd-lb"] = {str(m): rank_cdf_lower_bound(p, q, m) for m in (1, 2, 4)}
    return rows


def profile_curves(
    rank_probs: Any,
    vocab_size: int,
    max_k: int = 16,
    depth_rank_probs: Sequence[Any] | None = None,
) -> Curves:
    """ERSD curves for a recorded rank profile (no ``(p, q)``, so no baselines).

    ``rank_probs`` is the pooled ``P_R`` (used for the bound); with ``depth_rank_probs`` (one
    vector per depth) the trees are evaluated and optimised with the per-depth profile.
    """
    rank = as_probs(rank_probs, "rank_probs", allow_deficit=True)
    kmax = check_count(max_k, "max_k")
    ks = list(range(1, kmax + 1))
    if depth_rank_probs is not None:
        profiles = [
            as_probs(r, f"depth_rank_probs[{d}]", allow_deficit=True)
            for d, r in enumerate(depth_rank_probs)
        ]
        curves, best = _rank_curves(profiles, ks)
    else:
        curves, best = _rank_curves(rank, ks)
    return Curves(
        ks=ks,
        values={"ersd": curves},
        bound=[block_efficiency_bound(rank, k, vocab_size) for k in ks],
        asymptote=[bound_asymptote(rank, k) for k in ks],
        vocab_size=vocab_size,
        rank_entropy_nats=rank_entropy(rank),
        best_multi=best,
        info={
            "acceptance": {"ersd": {str(m): float(rank[:m].sum()) for m in (1, 2, 4)}},
            "per_depth": depth_rank_probs is not None,
        },
    )


def _fmt(x: float | None, width: int = 7) -> str:
    if x is None or not math.isfinite(x):
        return "-".rjust(width)
    return f"{x:{width}.3f}"


def table_ks(max_k: int) -> list[int]:
    """The ``k`` columns of the printed table: powers of two up to ``max_k``, and ``max_k``."""
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= max_k]
    return ks if ks[-1] == max_k else [*ks, max_k]


def format_tables(curves: Curves) -> str:
    """Human-readable acceptance and tokens-per-call tables of ``curves``."""
    lines: list[str] = []
    acc = curves.info.get("acceptance", {})
    if acc:
        lines.append("node acceptance P(accept | m children)")
        lines.append(f"  {'method':<10}" + "".join(f"{'m=' + str(m):>8}" for m in (1, 2, 4)))
        for meth, vals in acc.items():
            lines.append(f"  {meth:<10}" + "".join(f" {_fmt(vals.get(str(m)))}" for m in (1, 2, 4)))
        for name, vals in curves.info.get("reference", {}).items():
            lines.append(f"  {name:<10}" + "".join(f" {_fmt(vals.get(str(m)))}" for m in (1, 2, 4)))
        lines.append("")
    ks = table_ks(curves.ks[-1])
    idx = [curves.ks.index(k) for k in ks]
    lines.append("expected tokens per target call (i.i.d. per-node model)")
    lines.append(f"  {'method':<10}{'tree':<9}" + "".join(f"{'k=' + str(k):>8}" for k in ks))
    for meth, by_shape in curves.values.items():
        for shape in SHAPES:
            vals = by_shape[shape]
            if not any(math.isfinite(vals[i]) for i in idx):
                continue
            lines.append(f"  {meth:<10}{shape:<9}" + "".join(f" {_fmt(vals[i])}" for i in idx))
    lines.append(f"  {'bound':<19}" + "".join(f" {_fmt(curves.bound[i])}" for i in idx))
    lines.append(f"  {'log k / H[R]':<19}" + "".join(f" {_fmt(curves.asymptote[i])}" for i in idx))
    if curves.best_multi:
        best = ", ".join(f"k={k}: {m}x{n}" for k, (m, n) in curves.best_multi.items() if k in ks)
        lines.append(f"  (best multi for ERSD: {best})")
    return "\n".join(lines)
