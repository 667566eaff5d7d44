"""The best one-step acceptance of ``K`` i.i.d. drafts: the optimal-transport value, at any support.

A node has target distribution ``p`` and ``K`` drafts ``X = (x_1..x_K)`` drawn i.i.d. from ``q``.
Any exact verifier is a coupling ``π(X, Y)`` of ``q^{⊗K}`` and ``p``; it accepts when
``Y ∈ {x_1..x_K}``.  The best acceptance over all couplings is the optimal transport with
membership cost (Sun et al., SpecTr, 2023), a linear program in ``V^K · K`` unknowns.  Its value is
a max-flow, so by the max-flow/min-cut (supply-demand) theorem

    α*(p, q, K) = min_{S ⊆ Ω} [ p(S) + 1 − q(S)^K ]

(Khisti et al. 2025; Hu et al. 2025; Thomas & Pal, "Global Resolution", arXiv 2511.15898, show
both are the relaxed transport LP and reduce computing the *coupling itself* to a convex problem in
at most ``V`` unknowns; this module computes the *value* only, which is what an upper-bound column
needs).  :func:`ersd.theory.acceptance.iid_optimal_acceptance` enumerates the ``2^V`` subsets
(``V <= 20``).  Here the minimum is found in ``O(V log V)``: ``−x^K`` is concave, so it is the
lower envelope of its tangents ``−λx + c(λ)``, and

    min_S [p(S) − q(S)^K] = min_λ [c(λ) + Σ_i min(0, p_i − λ q_i)],

whose inner minimum for each ``λ`` is the level set ``{i : p_i/q_i < λ}``.  So a minimising
``S`` is always a prefix of the tokens sorted by ``p_i/q_i`` (ascending): ``V + 1`` candidates.
That is what lets the benchmark put the optimum beside every context with top-k 50 (support up
to 100 tokens once the two top-50 sets differ), where ``2^V`` is out of reach.

:func:`iid_optimum_lp` solves the transport LP itself with ``scipy.optimize.linprog`` over all
ordered draft tuples (small ``V`` and ``K`` only): the brute force the closed form is tested
against.  ``K = 1`` gives ``1 − TV(p, q)``.  ERSD's drafts (the top ranks of one race) and
RRS-wor's are not i.i.d., so those two can exceed ``α*``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from scipy import optimize

from ersd.errors import ErsdError
from ersd.theory.distributions import as_pair, check_count

#: largest number of LP unknowns :func:`iid_optimum_lp` builds (``V^K · K``)
MAX_LP_VARIABLES = 200_000


def iid_optimum_set(target_probs: Any, draft_probs: Any, num_drafts: int) -> np.ndarray:
    """A minimising set ``S`` of ``p(S) + 1 − q(S)^K`` as a boolean mask (see the module notes).

    The tokens sorted by ``p_i / q_i`` (``q_i = 0``: ``+inf``; ``p_i = q_i = 0``: last), the
    best of the ``V + 1`` prefixes.
    """
    p, q = as_pair(target_probs, draft_probs)
    k = check_count(num_drafts, "num_drafts")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
    ratio[(p <= 0) & (q <= 0)] = np.inf
    order = np.argsort(ratio, kind="stable")
    ps = np.concatenate([[0.0], np.cumsum(p[order])])
    qs = np.clip(np.concatenate([[0.0], np.cumsum(q[order])]), 0.0, 1.0)
    # every prefix is a valid S, and a minimiser is among them: the minimum over prefixes is α*
    best = int(np.argmin(ps + 1.0 - qs**k))
    mask = np.zeros(p.size, dtype=bool)
    mask[order[:best]] = True
    return mask


def iid_optimum(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """``α*(p, q, K) = min_S [p(S) + 1 − q(S)^K]``: the best acceptance of any exact verifier
    given ``K`` i.i.d. drafts from ``q``, in ``O(V log V)`` (any vocabulary size)."""
    p, q = as_pair(target_probs, draft_probs)
    k = check_count(num_drafts, "num_drafts")
    s = iid_optimum_set(p, q, k)
    return float(min(1.0, max(0.0, p[s].sum() + 1.0 - min(1.0, q[s].sum()) ** k)))


def iid_optimum_lp(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """The transport LP solved directly (brute force; ``V^K · K <= 200,000`` unknowns).

    Unknowns ``π(X, y) >= 0`` for every ordered draft tuple ``X ∈ Ω^K`` and every distinct
    ``y ∈ X``; ``Σ_y π(X, y) <= q^{⊗K}(X)`` and ``Σ_X π(X, y) <= p(y)``; maximise ``Σ π``.
    (The rest of each marginal is coupled by rejections, which never accept.)
    """
    p, q = as_pair(target_probs, draft_probs)
    k = check_count(num_drafts, "num_drafts")
    v = p.size
    if v**k * k > MAX_LP_VARIABLES:
        raise ErsdError(
            f"iid_optimum_lp builds V^K·K = {v}^{k}·{k} unknowns, over {MAX_LP_VARIABLES}; use "
            "iid_optimum (the closed form, any V) or a smaller vocabulary"
        )
    tuples = list(itertools.product(range(v), repeat=k))
    cols: list[tuple[int, int]] = []  # (tuple index, token)
    for ti, x in enumerate(tuples):
        for y in sorted(set(x)):
            cols.append((ti, y))
    n = len(cols)
    a = np.zeros((len(tuples) + v, n))
    for j, (ti, y) in enumerate(cols):
        a[ti, j] = 1.0
        a[len(tuples) + y, j] = 1.0
    b = np.concatenate([[float(np.prod(q[list(x)])) for x in tuples], p])
    res = optimize.linprog(-np.ones(n), A_ub=a, b_ub=b, bounds=(0, None), method="highs")
    if res.status != 0:  # pragma: no cover - a feasible bounded LP (π = 0 is feasible)
        raise ErsdError(f"iid_optimum_lp: the LP solver failed: {res.message}")
    return float(-res.fun)
