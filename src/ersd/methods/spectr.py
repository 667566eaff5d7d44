"""SpecTr k-sequential selection (Sun, Suresh, Ro, Beirami, Jain & Yu 2023), any tree.

The ``K`` children of a node are i.i.d. draws from ``q`` (child ``k`` from draft lane ``k``,
stream ``STREAM_DRAFT + k``).  With ``beta(rho) = sum_x min(q(x), p(x) / rho)`` the verifier uses
the smallest ``rho`` in ``[1, K]`` with ``rho * beta(rho) >= 1 - (1 - beta(rho))^K`` (found by
bisection: the left side minus the right side increases with ``rho``, and ``rho = K`` always
satisfies it).  Draft ``i`` is accepted with probability ``min(1, p(x_i) / (rho q(x_i)))``, in
order (coins from ``STREAM_VERIFY``); if all fail the token is drawn (``STREAM_RESIDUAL``) from

    p_res(x) = [p(x) - p_acc * min(q(x), p(x) / rho) / beta] / (1 - p_acc),
    p_acc = 1 - (1 - beta)^K

(tiny negatives from rounding are clipped).  Each draft is accepted with probability ``beta`` and
an accepted draft has law ``min(q, p / rho) / beta``, so the output law is exactly ``p``.  With
``K = 1``, ``rho = 1`` and this is standard speculative sampling.

Hooks: ``compute_rho``, ``acceptance_probability``, ``residual``, ``verify_uniforms``,
``sample_residual``, ``draft``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ersd.methods.base import NodeDecision, NodeNoise
from ersd.methods.catalog import CATALOG
from ersd.methods.rejection import (
    KeyedCoins,
    accept_probability,
    iid_draws,
    normalised_or,
    positive_part,
)


def _beta(p: torch.Tensor, q: torch.Tensor, rho: float) -> float:
    return float(torch.minimum(q, p / rho).sum().clamp(0.0, 1.0))


def spectr_rho(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, num_drafts: int, tol: float = 1e-13
) -> float:
    """Smallest ``rho`` in ``[1, K]`` with ``rho * beta(rho) >= 1 - (1 - beta(rho))^K``.

    ``f(rho) = rho * beta(rho) - 1 + (1 - beta(rho))^K`` is continuous and non-decreasing.  Only
    tokens with ``1 < p/q < K`` change sides in ``min(q, p / rho)`` on ``[1, K]``; they are sorted
    by ``p/q`` (the rest of the vocabulary is summed once), ``f`` is evaluated at every such
    breakpoint at once, and the root is bisected with scalar arithmetic inside the bracketing
    interval, where ``beta(rho) = A + B / rho``.  The returned value always satisfies the
    inequality (the upper end of the final bracket).
    """
    k = max(int(num_drafts), 1)
    if k == 1:
        return 1.0
    p = target_probs.to(torch.float64)
    q = draft_probs.to(torch.float64)
    ratio = torch.where(q > 0, p / q, torch.full_like(p, float("inf")))
    low = ratio <= 1.0  # min(q, p / rho) = p / rho for every rho >= 1
    high = ratio >= k  # min(q, p / rho) = q for every rho <= K
    mid = ~(low | high)
    b0 = float(p[low].sum())
    a0 = float(q[high].sum())
    order = torch.argsort(ratio[mid])
    t = ratio[mid][order]
    pm = p[mid][order]
    qm = q[mid][order]

    def f(rho: float, a: float, b: float) -> float:
        beta = min(max(a + b / rho, 0.0), 1.0)
        return rho * beta - 1.0 + (1.0 - beta) ** k

    # on (t[j-1], t[j]]: A = a0 + sum_{i >= j} q_i, B = b0 + sum_{i < j} p_i  (t[-1] := 1)
    a_sum = a0 + torch.flip(torch.cumsum(torch.flip(qm, [0]), 0), [0])  # sum_{i >= j} q_i
    b_sum = b0 + torch.cumsum(pm, 0) - pm  # sum_{i < j} p_i
    if f(1.0, a0 + float(qm.sum()), b0) >= 0.0:
        return 1.0
    beta_t = (a_sum + b_sum / t).clamp(0.0, 1.0)
    f_t = t * beta_t - 1.0 + (1.0 - beta_t) ** k
    hits = torch.nonzero(f_t >= 0.0).flatten()
    if hits.numel() > 0:
        j = int(hits[0])
        lo = float(t[j - 1]) if j > 0 else 1.0
        hi = float(t[j])
        a, b = float(a_sum[j]), float(b_sum[j])
    else:
        lo = float(t[-1]) if t.numel() > 0 else 1.0
        hi = float(k)
        a, b = a0, b0 + float(pm.sum())
    while hi - lo > tol * hi:
        m = 0.5 * (lo + hi)
        if f(m, a, b) >= 0.0:
            hi = m
        else:
            lo = m
    return hi


class SpecTr(KeyedCoins):
    info = CATALOG["spectr"]

    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        return iid_draws(draft_probs, num_children, noise)

    # --- hooks ---------------------------------------------------------------------------------

    def compute_rho(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, num_drafts: int
    ) -> float:
        return spectr_rho(target_probs, draft_probs, num_drafts)

    def acceptance_probability(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int, rho: float
    ) -> float:
        """``min(1, p(x) / (rho q(x)))``."""
        return accept_probability(float(target_probs[token]), rho * float(draft_probs[token]))

    def residual(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, rho: float, num_drafts: int
    ) -> torch.Tensor:
        """``p_res`` (normalised; ``p`` itself when no draft can be accepted)."""
        accepted = torch.minimum(draft_probs, target_probs / rho)
        beta = float(accepted.sum().clamp(0.0, 1.0))
        if not beta > 0.0:
            return target_probs
        p_acc = 1.0 - (1.0 - beta) ** num_drafts
        return normalised_or(positive_part(target_probs - (p_acc / beta) * accepted), target_probs)

    # --- rule ----------------------------------------------------------------------------------

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        p = target_probs.to(torch.float64)
        q = draft_probs.to(torch.float64)
        k = len(children)
        rho = self.compute_rho(p, q, k)
        coins = self.verify_uniforms(noise, k)
        for j, (token, u) in enumerate(zip(children, coins, strict=True)):
            if u < self.acceptance_probability(p, q, token, rho):
                return NodeDecision(j, int(token))
        return NodeDecision(None, self.sample_residual(self.residual(p, q, rho, k), noise))

    @staticmethod
    def acceptance_rate(
        target_probs: torch.Tensor, draft_probs: torch.Tensor, num_drafts: int
    ) -> float:
        """Closed form ``1 - (1 - beta(rho))^K``: the probability that some draft is accepted."""
        p = target_probs.to(torch.float64)
        q = draft_probs.to(torch.float64)
        rho = spectr_rho(p, q, num_drafts)
        return 1.0 - (1.0 - _beta(p, q, rho)) ** num_drafts
