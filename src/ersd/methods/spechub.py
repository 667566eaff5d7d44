"""SpecHub (Sun, Zhou, Chen & Sun, EMNLP 2024), nodes with one or two children.

Drafting around a **hub** ``a = argmax q``: ``x1 ~ q`` (draft lane 0); if ``x1 = a`` then
``x2 ~ q(. | != a)`` (draft lane 1), else ``x2 = a``.  The drafted pair is therefore ``{a, b}``
with ``b`` distributed as ``pi(b) = q(b) / (1 - q(a))`` over ``b != a``; child 0 is ``x1`` and
child 1 is ``x2``.  When ``q(a) = 1`` no second token exists and only ``a`` is drafted.

Verification (an exact, LP-optimal rule for that draft distribution; coins from
``STREAM_VERIFY``, residual draw from ``STREAM_RESIDUAL``):

1. accept ``b`` with probability ``min(1, p(b) / pi(b))``;
2. else accept ``a`` with probability ``gamma = min(1, p(a) / R)``, where
   ``R = sum_b pi(b) (1 - min(1, p(b) / pi(b))) = 1 - sum_b min(pi(b), p(b))`` is the probability
   of reaching step 2;
3. else emit a draw from ``r'(x) = max(p(x) - pi(x), 0)`` for ``x != a`` and
   ``r'(a) = p(a) - gamma R`` (normalised).

Its acceptance rate is ``sum_b min(pi(b), p(b)) + min(p(a), R)``, the largest any verifier of
this draft distribution can reach.  A node with one child uses the standard speculative sampling
rule; nodes with three or more children are not supported.

Hooks: ``hub``, ``pair_probs``, ``acceptance_probability``, ``hub_acceptance``, ``residual``,
``verify_uniforms``, ``sample_residual``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ersd.errors import ErsdError, UnsupportedTreeError
from ersd.methods.base import NodeDecision, NodeNoise
from ersd.methods.catalog import CATALOG
from ersd.methods.rejection import (
    KeyedCoins,
    accept_probability,
    lane_uniform,
    normalised_or,
    positive_part,
    sample_categorical,
)


class SpecHub(KeyedCoins):
    info = CATALOG["spechub"]

    # --- hooks ---------------------------------------------------------------------------------

    def hub(self, draft_probs: torch.Tensor) -> int:
        """The hub token ``a = argmax q`` (lowest id on ties)."""
        return int(torch.argmax(draft_probs).item())

    def pair_probs(self, draft_probs: torch.Tensor, hub: int) -> torch.Tensor:
        """``pi``: law of the non-hub token of the pair, ``q(b) / (1 - q(a))``, ``pi(a) = 0``."""
        rest = draft_probs.clone()
        rest[hub] = 0.0
        return normalised_or(rest, rest)

    def acceptance_probability(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int
    ) -> float:
        """``min(1, p(x) / d(x))``, ``d`` the drafted token's law (``pi``; one child: ``q``)."""
        return accept_probability(float(target_probs[token]), float(draft_probs[token]))

    def hub_acceptance(
        self, target_probs: torch.Tensor, pair_probs: torch.Tensor, hub: int
    ) -> tuple[float, float]:
        """``(gamma, R)``: the hub's acceptance probability after ``b`` was rejected, and ``R``."""
        reach = float((pair_probs - torch.minimum(pair_probs, target_probs)).sum())
        reach = min(max(reach, 0.0), 1.0)
        return accept_probability(float(target_probs[hub]), reach), reach

    def residual(
        self, target_probs: torch.Tensor, pair_probs: torch.Tensor, hub: int, hub_mass: float
    ) -> torch.Tensor:
        """``r'``: ``max(p - pi, 0)`` off the hub and ``p(a) - gamma R`` (= ``hub_mass``) at it.

        With one child (``hub < 0``) this is the standard residual ``max(p - q, 0)``.
        """
        r = positive_part(target_probs - pair_probs)
        if hub >= 0:
            r[hub] = max(float(target_probs[hub]) - hub_mass, 0.0)
        return normalised_or(r, target_probs)

    # --- rules ---------------------------------------------------------------------------------

    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        if num_children <= 0:
            return []
        if num_children > 2:
            raise UnsupportedTreeError(
                f"method 'spechub' drafts at most 2 children per node, asked for {num_children}. "
                f"It supports {self.supported_shapes}."
            )
        x1 = sample_categorical(draft_probs, lane_uniform(noise, 0))
        if num_children == 1:
            return [x1]
        a = self.hub(draft_probs)
        if x1 != a:
            return [x1, a]
        rest = draft_probs.clone()
        rest[a] = 0.0
        if not float(rest.sum()) > 0.0:  # q(a) = 1: no second token exists
            return [a]
        return [a, sample_categorical(rest, lane_uniform(noise, 1))]

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        p = target_probs.to(torch.float64)
        q = draft_probs.to(torch.float64)
        if len(children) == 1:  # standard speculative sampling
            x = int(children[0])
            (u,) = self.verify_uniforms(noise, 1)
            if u < self.acceptance_probability(p, q, x):
                return NodeDecision(0, x)
            return NodeDecision(None, self.sample_residual(self.residual(p, q, -1, 0.0), noise))
        if len(children) != 2:
            raise UnsupportedTreeError(
                f"method 'spechub' verifies 1 or 2 children per node, got {len(children)}. "
                f"It supports {self.supported_shapes}."
            )
        a = self.hub(q)
        x1, x2 = int(children[0]), int(children[1])
        if x1 == a and x2 != a:
            b, b_index, a_index = x2, 1, 0
        elif x2 == a and x1 != a:
            b, b_index, a_index = x1, 0, 1
        else:
            raise ErsdError(
                f"SpecHub children {[x1, x2]} do not hold the hub token {a} (argmax of the draft) "
                "exactly once; draft them with SpecHub.draft"
            )
        pi = self.pair_probs(q, a)
        u_b, u_a = self.verify_uniforms(noise, 2)
        if u_b < self.acceptance_probability(p, pi, b):
            return NodeDecision(b_index, b)
        gamma, reach = self.hub_acceptance(p, pi, a)
        if u_a < gamma:
            return NodeDecision(a_index, a)
        return NodeDecision(
            None, self.sample_residual(self.residual(p, pi, a, gamma * reach), noise)
        )

    def acceptance_rate(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> float:
        """Closed form: ``sum_b min(pi(b), p(b)) + min(p(a), R)`` (``sum min(p, q)`` if q(a)=1)."""
        p = target_probs.to(torch.float64)
        q = draft_probs.to(torch.float64)
        a = self.hub(q)
        pi = self.pair_probs(q, a)
        if not float(pi.sum()) > 0.0:
            return float(torch.minimum(p, q).sum())
        both = float(torch.minimum(pi, p).sum())
        return both + min(float(p[a]), max(1.0 - both, 0.0))
