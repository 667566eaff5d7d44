"""Gumbel list sampling (Rowan, Phan & Khisti 2025), any tree of i.i.d. race drafts.

Each child lane ``k`` of a node has its own exponentials ``S^(k)_i ~ Exp(1)`` (lane 0 is the
shared race, stream 0; lane ``k >= 1`` is stream ``STREAM_DRAFT + k``).  Child ``k`` is the lane's
race winner on the draft, ``X^(k) = argmin_i S^(k)_i / q_i``, so the children are i.i.d. draws
from ``q``.  The target's token is ``Y = argmin_i min_k S^(k)_i / p_i`` over the node's ``K``
lanes (``min_k S^(k)_i ~ Exp(K)`` i.i.d. over ``i``, so ``Y ~ p`` exactly); the first child equal
to ``Y`` is accepted, otherwise ``Y`` is emitted.  No coin and no residual.  A one-child GLS chain
is ERSD's chain.  Drafter invariant only conditionally on the drafts.

Hooks: ``lane_stream``, ``lane_exponentials``, ``target_exponentials``, ``draft``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ersd.methods.base import Method, NodeDecision, NodeNoise
from ersd.methods.catalog import CATALOG
from ersd.race import STREAM_DRAFT, STREAM_RACE, race_winner


class GumbelListSampling(Method):
    info = CATALOG["gls"]

    # --- hooks ---------------------------------------------------------------------------------

    def lane_stream(self, lane: int) -> int:
        """Noise stream of lane ``lane`` (lane 0 is the shared race)."""
        return STREAM_RACE if lane == 0 else STREAM_DRAFT + lane

    def lane_exponentials(self, noise: NodeNoise, lane: int) -> torch.Tensor:
        return noise.exponentials(self.lane_stream(lane))

    def target_exponentials(self, noise: NodeNoise, num_lanes: int) -> torch.Tensor:
        """``min_k S^(k)`` over lanes ``0 .. num_lanes - 1`` (elementwise)."""
        out = self.lane_exponentials(noise, 0)
        for lane in range(1, num_lanes):
            out = torch.minimum(out, self.lane_exponentials(noise, lane))
        return out

    # --- rules ---------------------------------------------------------------------------------

    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        return [
            race_winner(draft_probs, self.lane_exponentials(noise, k)) for k in range(num_children)
        ]

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        y = race_winner(target_probs, self.target_exponentials(noise, max(len(children), 1)))
        for j, c in enumerate(children):
            if c == y:
                return NodeDecision(j, y)
        return NodeDecision(None, y)
