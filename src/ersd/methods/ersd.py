"""ERSD: speculative sampling via exponential races (Kobus & Gündüz 2025).

Drafter and target share the race at every context (stream 0 of :class:`ersd.race.RaceNoise`).
The drafter proposes the top-m tokens of its race ``E_i / q_i`` as the children of a node; the
target's token is its own race winner ``argmin_i E_i / p_i``, accepted iff it is one of the
children.  There is no rejection coin and no residual: the emitted token is always the target's
race winner, so the output is exactly the target's law and equals target-only race sampling with
the same seed whatever the drafter or tree (drafter invariance).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ersd.methods.base import Method, NodeDecision, NodeNoise
from ersd.methods.catalog import CATALOG
from ersd.race import STREAM_RACE, race_rank, race_ranking, race_winner


class ERSD(Method):
    info = CATALOG["ersd"]

    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        return race_ranking(draft_probs, noise.exponentials(STREAM_RACE), num_children)

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        y = race_winner(target_probs, noise.exponentials(STREAM_RACE))
        for j, c in enumerate(children):
            if c == y:
                return NodeDecision(j, y)
        return NodeDecision(None, y)

    def rank(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int, noise: NodeNoise
    ) -> int | None:
        return race_rank(draft_probs, noise.exponentials(STREAM_RACE), token)
