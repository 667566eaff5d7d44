"""Exact node acceptance probabilities of ERSD and the baselines, and the ERSD rank distribution.

A *node* is one context with target distribution ``p`` (``target_probs``) and draft distribution
``q`` (``draft_probs``); ``m`` children are drafted below it by a method's drafting rule and the
method's verification rule accepts one of them or emits a correction token.  This module gives the
probability that one child is accepted, exactly (closed form, 1-D quadrature, or enumeration over
small vocabularies), for every method of :data:`ersd.METHODS`:

* ``ersd`` — Kobus & Gündüz, "Speculative Sampling via Exponential Races" (arXiv 2504.15475):
  the children are the top-``m`` tokens of the drafter's race, accepted iff the target's race
  winner is among them, i.e. ``P(R <= m)`` for the rank ``R`` of the target's winner in the
  drafter's race.  ``m = 1``: ``Σ_x 1 / Σ_y max(p_y/p_x, q_y/q_x)``.  ``m > 1``: the
  Poisson–binomial quadrature of the method notes (§3), see :func:`ersd_rank_joint`.
* ``sd`` — standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023): ``1 − TV``.
* ``specinfer`` — recursive rejection sampling with i.i.d. drafts (Miao et al. 2024).
* ``rrs-wor`` — recursive rejection sampling without replacement (Jeon et al. 2024).
* ``spectr`` — SpecTr k-sequential selection (Sun et al. 2023).
* ``spechub`` — SpecHub with two drafts around the hub ``argmax q`` (Sun et al. 2024).
* ``gls`` — Gumbel list sampling with ``K`` race lanes (Rowan, Phan & Khisti 2025).

plus the best acceptance any verifier can reach with ``m`` i.i.d. drafts (Khisti et al. 2025) and
the known lower bounds.  Only numpy/scipy are used: importing this module never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import integrate, optimize

from ersd.errors import ErsdError, UnknownMethodError, UnsupportedTreeError
from ersd.methods.catalog import CATALOG, METHOD_NAMES
from ersd.theory.distributions import as_pair, check_count

#: methods with an exact acceptance formula here: every method of the catalog
#: (:data:`ersd.methods.catalog.METHOD_NAMES`; :data:`_ACCEPTANCE` must cover them all)
ACCEPTANCE_METHODS: tuple[str, ...] = METHOD_NAMES

#: largest vocabulary for the subset enumeration of :func:`iid_optimal_acceptance`
MAX_SUBSET_VOCAB = 20

_QUAD_EPSABS = 1e-12
_QUAD_EPSREL = 1e-10


# ---------------------------------------------------------------------------------------------
# ERSD: the rank of the target's race winner in the drafter's race


def _excess_rates(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``C[x, y] = (p_x q_y / q_x − p_y)_+`` (0 on rows with ``q_x = 0``).

    Given that ``x`` wins the target race at ``E_x = p_x u``, token ``y`` beats ``x`` in the
    drafter's race with probability ``1 − exp(−u C[x, y])`` (memorylessness).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q[:, None] > 0, p[:, None] * q[None, :] / q[:, None], 0.0)
    c = np.clip(ratio - p[None, :], 0.0, None)
    c[q <= 0, :] = 0.0
    np.fill_diagonal(c, 0.0)
    return c


def ersd_match_probability(target_probs: Any, draft_probs: Any) -> float:
    """One-draft ERSD acceptance ``P(X = Y) = Σ_x 1 / Σ_y max(p_y/p_x, q_y/q_x)``.

    Written as ``Σ_x p_x / (1 + Σ_y (p_x q_y/q_x − p_y)_+)`` over ``p_x, q_x > 0``.
    """
    p, q = as_pair(target_probs, draft_probs)
    c = _excess_rates(p, q)
    live = (p > 0) & (q > 0)
    return float(np.sum(p[live] / (1.0 + c[live].sum(axis=1))))


def _poisson_binomial(b: np.ndarray, keep: int) -> np.ndarray:
    """Poisson–binomial pmfs per row: ``out[x, k] = P(Σ_y Bernoulli(b[x, y]) = k)``, k < keep."""
    rows, n = b.shape
    pmf = np.zeros((rows, keep))
    pmf[:, 0] = 1.0
    for y in range(n):
        by = b[:, y : y + 1]
        if not np.any(by):
            continue
        shifted = np.zeros_like(pmf)
        shifted[:, 1:] = pmf[:, :-1]
        pmf = pmf * (1.0 - by) + shifted * by
    return pmf


def ersd_rank_joint(target_probs: Any, draft_probs: Any, max_rank: int | None = None) -> np.ndarray:
    """Joint law ``J[x, r − 1] = P(Y = x, R = r)`` of the target's token and its draft rank.

    ``P(Y = x, R = r) = p_x ∫_0^∞ e^{−u} PB_{r−1}(u) du`` where ``PB`` is the Poisson–binomial pmf
    of the independent ``B_y(u) ~ Bernoulli(1 − exp(−u (p_x q_y/q_x − p_y)_+))``, ``y ≠ x``
    (substituting ``E_x = p_x u`` in the method notes' formula).  Integrated adaptively
    (``scipy.integrate.quad_vec``, absolute error ~1e-12); ``O(V² · max_rank)`` per evaluation.
    Tokens with ``q_x = 0`` are never drafted: their mass is absent (their rank is "V + 1").
    """
    p, q = as_pair(target_probs, draft_probs)
    v = p.size
    keep = v if max_rank is None else max(1, min(int(max_rank), v))
    c = _excess_rates(p, q)
    live = (p > 0) & (q > 0)
    if not np.any(live):
        return np.zeros((v, keep))
    cl = c[live]
    pl = p[live]

    def integrand(u: float) -> np.ndarray:
        b = -np.expm1(-u * cl)
        return (pl[:, None] * np.exp(-u)) * _poisson_binomial(b, keep)

    val, _err = integrate.quad_vec(
        integrand, 0.0, np.inf, epsabs=_QUAD_EPSABS, epsrel=_QUAD_EPSREL, limit=2000
    )
    out = np.zeros((v, keep))
    out[live] = np.clip(val, 0.0, None)
    if keep == 1:  # the exact closed form
        out[live, 0] = pl / (1.0 + cl.sum(axis=1))
    return out


def rank_distribution(target_probs: Any, draft_probs: Any) -> np.ndarray:
    """``P(R = r)`` for ``r = 1..V`` (element ``r − 1``) for the ERSD race.

    ``R`` is the 1-based rank of the target's race winner ``Y = argmin E_i/p_i`` in the drafter's
    race ``E_i/q_i`` (rank 1 = the drafter's own sample); ERSD with ``m`` top-ranked children
    accepts iff ``R <= m``.  The vector sums to ``1 − P(q_Y = 0)``: a target token the drafter
    gives no mass is never drafted (rank "V + 1", the value :func:`ersd.race.race_rank` returns).
    """
    return ersd_rank_joint(target_probs, draft_probs).sum(axis=0)


def ersd_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """``P(R <= m)``: ERSD acceptance with the top-``m`` ranks drafted."""
    m = check_count(num_drafts, "num_drafts")
    if m == 1:
        return ersd_match_probability(target_probs, draft_probs)
    return float(min(1.0, ersd_rank_joint(target_probs, draft_probs, m).sum()))


# ---------------------------------------------------------------------------------------------
# rejection-based baselines


def sd_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int = 1) -> float:
    """Standard speculative sampling, one draft: ``Σ min(p, q) = 1 − TV``."""
    p, q = as_pair(target_probs, draft_probs)
    if check_count(num_drafts, "num_drafts") != 1:
        raise UnsupportedTreeError(
            "method 'sd' drafts one child per node (chains only); use num_drafts=1, or a "
            "multi-draft method such as 'specinfer' or 'ersd'"
        )
    return float(np.minimum(p, q).sum())


def specinfer_rejection_profile(target_probs: Any, draft_probs: Any, num_drafts: int) -> np.ndarray:
    """``P(the first j i.i.d. drafts are all rejected)`` for ``j = 0..m`` under SpecInfer's RRS.

    With the current residual ``p_j`` (``p_1 = p``) a fresh draft ``x ~ q`` is accepted with
    probability ``Σ_x min(q(x), p_j(x)) = 1 − TV(p_j, q)``; after a rejection the residual becomes
    ``p_{j+1} = norm(max(p_j − q, 0))`` whatever ``x`` was, so the rejection probabilities
    multiply: ``P(all m rejected) = Π_j TV(p_j, q)``.
    """
    p, q = as_pair(target_probs, draft_probs)
    m = check_count(num_drafts, "num_drafts")
    out = np.ones(m + 1)
    cur = p
    for j in range(1, m + 1):
        resid = np.clip(cur - q, 0.0, None)
        tv = float(resid.sum())
        out[j] = out[j - 1] * tv
        if tv <= 1e-15:
            out[j:] = 0.0
            break
        cur = resid / tv
    return out


def specinfer_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """SpecInfer RRS with ``m`` i.i.d. drafts: ``1 − Π_j TV(p_j, q)``."""
    return float(1.0 - specinfer_rejection_profile(target_probs, draft_probs, num_drafts)[-1])


#: largest number of rejection histories :func:`rrs_wor_rejection_profile` keeps at one depth
RRS_WOR_MAX_STATES = 200_000


def rrs_wor_partial_profile(
    target_probs: Any, draft_probs: Any, num_drafts: int, max_states: int = RRS_WOR_MAX_STATES
) -> np.ndarray:
    """As :func:`rrs_wor_rejection_profile`, but stops before a depth whose enumeration would
    exceed ``max_states`` histories: ``P(first j rejected)`` for ``j = 0..J``, ``J <= m``."""
    p, q = as_pair(target_probs, draft_probs)
    m = check_count(num_drafts, "num_drafts")
    v = p.size
    weights = np.ones(1)
    cur = p[None, :].copy()
    mask = (q > 0).astype(np.float64)[None, :]
    out = [1.0]
    for _ in range(m):
        qm = q[None, :] * mask
        total = qm.sum(axis=1)
        done = total <= 0  # q's support exhausted: no further child, the history stays rejected
        qj = np.where(done[:, None], 0.0, qm / np.where(done, 1.0, total)[:, None])
        resid = np.clip(cur - qj, 0.0, None)
        tv = resid.sum(axis=1)
        reject_w = np.clip(qj - cur, 0.0, None)
        reject_w[tv <= 1e-15] = 0.0  # residual empty: the draft is surely accepted
        rows, cols = np.nonzero(reject_w > 0)
        if rows.size + int(done.sum()) > max_states:
            break
        nxt = resid / np.where(tv > 0, tv, 1.0)[:, None]
        new_w = np.concatenate([weights[rows] * reject_w[rows, cols], weights[done]])
        new_cur = np.concatenate([nxt[rows], cur[done]])
        new_mask = np.concatenate([mask[rows], mask[done]])
        new_mask[np.arange(rows.size), cols] = 0.0
        weights, cur, mask = new_w, new_cur, new_mask.reshape(-1, v)
        out.append(float(weights.sum()))
    return np.asarray(out)


def rrs_wor_rejection_profile(
    target_probs: Any, draft_probs: Any, num_drafts: int, max_states: int = RRS_WOR_MAX_STATES
) -> np.ndarray:
    """``P(the first j drafts are all rejected)``, ``j = 0..m``, for RRS without replacement.

    Drafts ``x_1, x_2, ...`` are drawn without replacement from ``q`` (Gumbel-top-m); draft ``j``
    is accepted with probability ``min(1, p_j(x_j)/q_j(x_j))`` where ``q_j`` is ``q`` with the
    earlier drafts removed and renormalised and ``p_{j+1} = norm(max(p_j − q_j, 0))``.  A step
    rejects with probability ``TV(p_j, q_j)`` and, given rejection, the rejected draft has law
    ``(q_j − p_j)_+ / TV``; the enumeration follows only those tokens, depth by depth, one
    history per ordered set of rejected drafts (exact; up to ``V!/(V − m)!`` histories in the
    worst case, fine for ``V <= 10``).  When ``q``'s support is exhausted no further child is
    drafted, so the profile stays flat.  Raises :class:`ErsdError` if a depth would need more
    than ``max_states`` histories.
    """
    m = check_count(num_drafts, "num_drafts")
    out = rrs_wor_partial_profile(target_probs, draft_probs, m, max_states)
    if out.size < m + 1:
        raise ErsdError(
            f"exact rrs-wor acceptance with {m} drafts needs more than {max_states} rejection "
            f"histories at depth {out.size} for this vocabulary ({np.size(target_probs)} "
            f"tokens); use at most {out.size - 1} drafts, a smaller vocabulary (V <= 10), or "
            f"raise max_states"
        )
    return out


def rrs_wor_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """RRS without replacement with ``m`` distinct drafts: ``1 − P(all rejected)``."""
    return float(1.0 - rrs_wor_rejection_profile(target_probs, draft_probs, num_drafts)[-1])


def spectr_beta(target_probs: Any, draft_probs: Any, rho: float) -> float:
    """``β(ρ) = Σ_x min(q(x), p(x)/ρ)``: SpecTr's per-draft acceptance at ratio ``ρ``."""
    p, q = as_pair(target_probs, draft_probs)
    return float(np.minimum(q, p / rho).sum())


def spectr_rho(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """SpecTr's ``ρ*``: the smallest ``ρ ∈ [1, K]`` with ``ρ β(ρ) >= 1 − (1 − β(ρ))^K``.

    ``g(ρ) = ρβ(ρ) − 1 + (1 − β(ρ))^K`` is non-decreasing, ``g(1) <= 0 <= g(K)``; solved by Brent's
    method to ~1e-13.  This is what makes the residual distribution non-negative.
    """
    p, q = as_pair(target_probs, draft_probs)
    k = check_count(num_drafts, "num_drafts")

    def g(rho: float) -> float:
        beta = float(np.minimum(q, p / rho).sum())
        return rho * beta - 1.0 + (1.0 - beta) ** k

    if k == 1 or g(1.0) >= 0.0:
        return 1.0
    if g(float(k)) <= 0.0:
        return float(k)
    return float(optimize.brentq(g, 1.0, float(k), xtol=1e-14, rtol=1e-15, maxiter=500))


def spectr_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """SpecTr k-sequential selection with ``K`` i.i.d. drafts: ``1 − (1 − β(ρ*))^K``.

    Each draft is accepted independently with probability ``β(ρ*)`` (the drafts and the coins
    are independent), and the first accepted one is emitted.
    """
    k = check_count(num_drafts, "num_drafts")
    rho = spectr_rho(target_probs, draft_probs, k)
    beta = spectr_beta(target_probs, draft_probs, rho)
    return float(1.0 - (1.0 - beta) ** k)


def spechub_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int = 2) -> float:
    """SpecHub with two drafts around the hub ``a = argmax q`` (lowest id on ties).

    The drafted pair is always ``{a, b}``, ``b ≠ a``, with ``P(b) = π(b) = q(b)/(1 − q(a))``.
    Accepting ``b`` with probability ``min(1, p(b)/π(b))`` and moving the rejected mass
    ``R = Σ_b (π(b) − min(π(b), p(b)))`` to the hub (up to ``p(a)``) gives
    ``Σ_{b≠a} min(π(b), p(b)) + min(p(a), R)``.  One draft (``m = 1``) is standard SD, ``1 − TV``.
    """
    p, q = as_pair(target_probs, draft_probs)
    m = check_count(num_drafts, "num_drafts")
    if m == 1:
        return float(np.minimum(p, q).sum())
    if m != 2:
        raise UnsupportedTreeError(
            f"method 'spechub' drafts 1 or 2 children per node, got num_drafts={m}; use "
            f"num_drafts <= 2 or a method such as 'specinfer' or 'ersd'"
        )
    a = int(np.argmax(q))
    if q[a] >= 1.0:
        return float(min(p[a], 1.0))
    pi = q / (1.0 - q[a])
    pi[a] = 0.0
    others = np.arange(p.size) != a
    kept = np.minimum(pi[others], p[others])
    rejected = float(pi[others].sum() - kept.sum())
    return float(min(1.0, kept.sum() + min(p[a], rejected)))


def _gls_lane_match(p: np.ndarray, q: np.ndarray, y: int, t: float) -> float:
    """``P(argmin_i S_i/q_i = y)`` for a lane with ``S_i = t p_i + Exp(1)`` independently.

    ``= ∫_0^∞ exp(−e − Σ_{i≠y} ((t p_y + e) q_i/q_y − t p_i)_+) de``, integrated exactly: the
    exponent is convex piecewise linear in ``e`` with kinks where a term switches on.
    """
    others = np.arange(p.size) != y
    b = q[others] / q[y]
    a = t * (p[y] * b - p[others])
    active = b > 0
    a, b = a[active], b[active]
    start = np.where(a >= 0, 0.0, -a / np.where(b > 0, b, 1.0))
    order = np.argsort(start)
    a, b, start = a[order], b[order], start[order]
    total = 0.0
    lo = 0.0
    # terms already on at e = 0 contribute from the start
    on = start <= 0.0
    slope = 1.0 + float(b[on].sum())
    level = float(a[on].sum())  # h(e) = level + slope * e on the current piece
    idx = int(on.sum())
    while True:
        hi = float(start[idx]) if idx < start.size else np.inf
        h_lo = level + slope * lo
        if np.isinf(hi):
            total += np.exp(-h_lo) / slope
            break
        total += np.exp(-h_lo) * (-np.expm1(-slope * (hi - lo))) / slope
        lo = hi
        slope += float(b[idx])
        level += float(a[idx])
        idx += 1
    return float(total)


def gls_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """Gumbel list sampling with ``K`` lanes: ``P(Y ∈ {X^(1..K)})``.

    Lane ``k`` has ``S^(k)_i ~ Exp(1)``; drafts ``X^(k) = argmin_i S^(k)_i/q_i``; the target's
    token is ``Y = argmin_i min_k S^(k)_i/p_i``.  Conditioning on the winning pair
    ``(k*, Y = y)`` and the winning value ``t`` (density ``K p_y e^{−Kt}`` summed over ``k*``),
    the lanes are independent with ``S^(k)_i = t p_i + Exp(1)`` (and ``S^(k*)_y = t p_y``), so

    ``P(accept) = Σ_y ∫ K p_y e^{−Kt} [1 − (1 − A_y(t)) (1 − B_y(t))^{K−1}] dt``

    with ``A_y(t) = exp(−t Σ_i (p_y q_i/q_y − p_i)_+)`` (the winning lane drafts ``y``) and
    ``B_y(t)`` the probability that another lane drafts ``y`` (:func:`_gls_lane_match`).
    ``K = 1`` is the ERSD one-draft formula.
    """
    p, q = as_pair(target_probs, draft_probs)
    k = check_count(num_drafts, "num_drafts")
    if k == 1:
        return ersd_match_probability(p, q)
    c = _excess_rates(p, q).sum(axis=1)
    live = np.nonzero((p > 0) & (q > 0))[0]

    def integrand(t: float) -> np.ndarray:
        out = np.empty(live.size)
        for j, y in enumerate(live):
            a_y = np.exp(-t * c[y])
            b_y = _gls_lane_match(p, q, int(y), t)
            out[j] = k * p[y] * np.exp(-k * t) * (1.0 - (1.0 - a_y) * (1.0 - b_y) ** (k - 1))
        return out

    val, _err = integrate.quad_vec(
        integrand, 0.0, np.inf, epsabs=_QUAD_EPSABS, epsrel=_QUAD_EPSREL, limit=2000
    )
    return float(min(1.0, np.sum(val)))


# ---------------------------------------------------------------------------------------------
# optimum and lower bounds


def iid_optimal_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """Best acceptance of any verifier given ``m`` i.i.d. drafts from ``q`` (Khisti et al. 2025).

    ``min_{S ⊆ Ω} [p(S) + 1 − q(S)^m]``, by enumerating all ``2^V`` subsets (``V <= 20``).
    ERSD's drafts are not i.i.d., so ERSD can exceed it.
    """
    p, q = as_pair(target_probs, draft_probs)
    m = check_count(num_drafts, "num_drafts")
    if p.size > MAX_SUBSET_VOCAB:
        raise ErsdError(
            f"iid_optimal_acceptance enumerates all 2^V subsets and needs V <= "
            f"{MAX_SUBSET_VOCAB}, got V = {p.size}; restrict the distributions to their top "
            f"tokens first"
        )
    ps = np.zeros(1)
    qs = np.zeros(1)
    for i in range(p.size):
        ps = np.concatenate([ps, ps + p[i]])
        qs = np.concatenate([qs, qs + q[i]])
    return float(min(1.0, np.min(ps + 1.0 - np.clip(qs, 0.0, 1.0) ** m)))


def ersd_one_draft_lower_bound(target_probs: Any, draft_probs: Any) -> float:
    """``(1 − TV)/(1 + TV)``: lower bound on ERSD's one-draft acceptance."""
    p, q = as_pair(target_probs, draft_probs)
    tv = float(0.5 * np.abs(p - q).sum())
    return (1.0 - tv) / (1.0 + tv)


def rank_cdf_lower_bound(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    """``1 − Σ_x p_x (p_x/(p_x + q_x))^m``: lower bound on ``P(R <= m)``."""
    p, q = as_pair(target_probs, draft_probs)
    m = check_count(num_drafts, "num_drafts")
    live = p > 0
    ratio = p[live] / (p[live] + q[live])
    return float(1.0 - np.sum(p[live] * ratio**m))


# ---------------------------------------------------------------------------------------------
# the public dispatcher

_ACCEPTANCE: dict[str, Callable[[Any, Any, int], float]] = {
    "ersd": ersd_acceptance,
    "sd": sd_acceptance,
    "specinfer": specinfer_acceptance,
    "rrs-wor": rrs_wor_acceptance,
    "spectr": spectr_acceptance,
    "spechub": spechub_acceptance,
    "gls": gls_acceptance,
}
assert set(_ACCEPTANCE) == set(CATALOG), "every catalog method needs an acceptance formula"


def acceptance_probability(
    target_probs: Any, draft_probs: Any, num_drafts: int, method: str = "ersd"
) -> float:
    """Probability that a node with ``num_drafts`` children drafted by ``method`` accepts one.

    For ``ersd`` and ``rrs-wor`` the children are distinct (the top ranks of a race / draws
    without replacement); for ``specinfer``, ``spectr`` and ``gls`` they are i.i.d. draws (lanes);
    ``sd`` takes one child and ``spechub`` one or two.  See the per-method functions of
    :mod:`ersd.theory.acceptance` for the formulas.
    """
    fn = _ACCEPTANCE.get(method) if isinstance(method, str) else None
    if fn is None:
        raise UnknownMethodError(
            f"no acceptance formula for method {method!r}; known methods: "
            f"{', '.join(ACCEPTANCE_METHODS)}"
        )
    return fn(target_probs, draft_probs, num_drafts)


def child_index_distribution(
    target_probs: Any, draft_probs: Any, num_children: int, method: str = "ersd"
) -> np.ndarray | None:
    """``P(child j is the accepted one)``, ``j = 1..num_children``, or None if not defined.

    Defined for methods that try their children in a fixed order, so that the first ``j``
    children behave the same whatever is drafted after them: ``ersd`` (the rank distribution),
    ``specinfer``, ``rrs-wor`` and ``sd`` (one child).  Under the i.i.d. per-node model these
    play the role of the rank distribution for trees and the optimal tree.  ``spectr``, ``gls``
    and ``spechub`` change their rule with the number of children: None.
    """
    m = check_count(num_children, "num_children")
    if method == "ersd":
        joint = ersd_rank_joint(target_probs, draft_probs, m)
        return np.asarray(joint.sum(axis=0))
    if method == "sd":
        return np.array([sd_acceptance(target_probs, draft_probs, 1)])
    if method == "specinfer":
        return np.asarray(-np.diff(specinfer_rejection_profile(target_probs, draft_probs, m)))
    if method == "rrs-wor":
        return np.asarray(-np.diff(rrs_wor_rejection_profile(target_probs, draft_probs, m)))
    if method in _ACCEPTANCE:
        return None
    raise UnknownMethodError(
        f"unknown method {method!r}; known methods: {', '.join(ACCEPTANCE_METHODS)}"
    )
