"""Recursive rejection sampling (the verification rule of SD, SpecInfer and RRS-wor) and the keyed
i.i.d. draws, coins and residuals it shares with SpecTr and SpecHub.

Every helper is a pure function of float64 probability vectors and uniforms drawn from the keyed
noise of one context (:class:`ersd.methods.base.NodeNoise`).  Streams (see :mod:`ersd.race`):

* draft lane ``k`` draws from stream ``STREAM_DRAFT + k`` (one uniform per i.i.d. draw);
* verification coins come from ``STREAM_VERIFY``;
* the final residual ("recovered token") draw comes from ``STREAM_RESIDUAL``.

The verifier's randomness is therefore independent of the draft's: a ``u < p/q`` test that reused
the draft's uniform would bias the output (the exactness suite has a mutant that does exactly
that).

Sampling is by inverse CDF (one ``cumsum`` over the vocabulary, no sort): a token with zero
weight is never returned, and weights need not be normalised.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ersd.errors import ErsdError
from ersd.methods.base import Method, NodeDecision, NodeNoise
from ersd.race import STREAM_DRAFT, STREAM_RESIDUAL, STREAM_VERIFY


def accept_probability(numerator: float, denominator: float) -> float:
    """``min(1, numerator / denominator)`` with the limits made explicit (never NaN).

    ``numerator <= 0`` gives 0 (a token the target cannot emit is never accepted);
    ``denominator <= 0 < numerator`` gives 1 (the limit of the ratio).
    """
    if not numerator > 0.0:
        return 0.0
    if not denominator > 0.0:
        return 1.0
    return min(1.0, numerator / denominator)


def sample_categorical(weights: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw from the (unnormalised, non-negative) ``weights`` with uniform ``u``.

    Tokens of zero weight are never returned.  Raises :class:`ErsdError` if every weight is 0.
    """
    w = weights.to(torch.float64).clamp(min=0.0)
    cdf = torch.cumsum(w, dim=0)
    total = float(cdf[-1])
    if not total > 0.0:
        raise ErsdError(
            "cannot sample from an all-zero distribution; the probabilities passed to the "
            "verification method must have positive mass"
        )
    # first index whose cumulative weight exceeds u * total (cdf is non-decreasing)
    i = int((cdf <= u * total).sum())
    if i >= w.numel():  # u * total rounded up to total: take the last token with mass
        i = int(torch.nonzero(w > 0)[-1].item())
    return i


def positive_part(weights: torch.Tensor) -> torch.Tensor:
    """``max(weights, 0)`` elementwise."""
    return weights.clamp(min=0.0)


def normalised_or(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``weights / sum(weights)``, or ``fallback`` when the weights have no positive mass.

    The fallback covers residuals that vanish (``p == q`` up to rounding): the branch that would
    sample them then has probability zero, and any valid distribution keeps the code NaN-free.
    """
    total = float(weights.sum())
    if not total > 0.0:
        return fallback
    return weights / total


def lane_uniform(noise: NodeNoise, lane: int) -> float:
    """The uniform of draft lane ``lane`` (stream ``STREAM_DRAFT + lane``)."""
    return noise.uniforms(STREAM_DRAFT + lane, 1)[0]


def iid_draws(draft_probs: torch.Tensor, num: int, noise: NodeNoise) -> list[int]:
    """``num`` i.i.d. draws from ``draft_probs``, draw ``k`` from draft lane ``k``."""
    return [sample_categorical(draft_probs, lane_uniform(noise, k)) for k in range(num)]


def verify_uniforms(noise: NodeNoise, n: int) -> list[float]:
    """``n`` verification coins (stream ``STREAM_VERIFY``), independent of the draft lanes."""
    return noise.uniforms(STREAM_VERIFY, n)


def residual_uniform(noise: NodeNoise) -> float:
    """The uniform of the final residual draw (stream ``STREAM_RESIDUAL``)."""
    return noise.uniforms(STREAM_RESIDUAL, 1)[0]


class KeyedCoins(Method):
    """Verification randomness of the rejection-based methods, as two overridable hooks."""

    def verify_uniforms(self, noise: NodeNoise, n: int) -> list[float]:
        """The ``n`` acceptance coins (``STREAM_VERIFY``, independent of the draft lanes)."""
        return verify_uniforms(noise, n)

    def sample_residual(self, residual_probs: torch.Tensor, noise: NodeNoise) -> int:
        """Draw the correction token from ``residual_probs`` (``STREAM_RESIDUAL``)."""
        return sample_categorical(residual_probs, residual_uniform(noise))


class RecursiveRejection(KeyedCoins):
    """Recursive rejection sampling over a node's children, tried in order (base class).

    For child ``x_j`` with current target ``p_j`` and draft ``q_j``: accept with probability
    :meth:`acceptance_probability` using coin ``u_j`` (:meth:`verify_uniforms`); on rejection
    ``p_{j+1} =`` :meth:`residual` ``(p_j, q_j)`` and ``q_{j+1} =`` :meth:`next_draft_probs`
    ``(q_j, x_j)``.  When every child is rejected the emitted token is drawn from the last
    residual by :meth:`sample_residual`.  With one child this is standard speculative sampling.

    Subclasses choose the drafting rule and ``next_draft_probs``; mutants (deliberately broken
    variants for the exactness suite) override one hook.
    """

    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        """``num_children`` i.i.d. draws from ``draft_probs`` (lane ``k``: ``STREAM_DRAFT + k``)."""
        return iid_draws(draft_probs, num_children, noise)

    # --- hooks ---------------------------------------------------------------------------------

    def acceptance_probability(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int
    ) -> float:
        """``min(1, p(x) / q(x))``."""
        return accept_probability(float(target_probs[token]), float(draft_probs[token]))

    def residual(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        """Target after a rejection: ``norm(max(p - q, 0))`` (``p`` itself if that is empty)."""
        return normalised_or(positive_part(target_probs - draft_probs), target_probs)

    def next_draft_probs(self, draft_probs: torch.Tensor, token: int) -> torch.Tensor:
        """Draft distribution of the next child after rejecting ``token`` (i.i.d.: unchanged)."""
        return draft_probs

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
        coins = self.verify_uniforms(noise, len(children))
        for j, (token, u) in enumerate(zip(children, coins, strict=True)):
            if u < self.acceptance_probability(p, q, token):
                return NodeDecision(j, int(token))
            p = self.residual(p, q)
            q = self.next_draft_probs(q, token)
        return NodeDecision(None, self.sample_residual(p, noise))

    @staticmethod
    def acceptance_rate(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> float:
        """Closed-form probability that a single child is accepted: ``sum min(p, q) = 1 - TV``."""
        return float(torch.minimum(target_probs, draft_probs).sum())
