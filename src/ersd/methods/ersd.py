"""ERSD: speculative sampling via exponential races (Kobus & Gündüz 2025).

Drafter and target share the race at every context (stream 0 of :class:`ersd.race.RaceNoise`).
The drafter proposes the top-m tokens of its race ``E_i / q_i`` as the children of a node; the
target's token is its own race winner ``argmin_i E_i / p_i``, accepted iff it is one of the
children.  There is no rejection coin and no residual: the emitted token is always the target's
race winner, so the output is exactly the target's law and equals target-only race sampling with
the same seed whatever the drafter or tree (drafter invariance).

**Draft sharpness** ``beta`` (default 1, the paper's rule): the drafter may run its race over
``q**beta`` instead of ``q`` (ranking ``E_i / q_i**beta``; for plain temperature sampling, the
draft at temperature ``T / beta``).  Which tokens the drafter proposes is free -- verification
never looks at ``q`` -- so exactness and drafter invariance hold for every ``beta``; what changes
is how often the proposal is the target's winner.  A target that is more confident than its
draft (a larger model against a small or quantized one) is predicted better by a sharpened race:
on the bundled Qwen2.5-Coder pair (1.5B float32 <- 0.5B int8), ``beta = 1.15`` raises the chain's
tokens per call by about 1% at T = 0.7 and 1 (``docs/dynamic-trees.md``, "Draft sharpness").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ersd.errors import GenerationInputError
from ersd.methods.base import Method, NodeDecision, NodeNoise
from ersd.methods.catalog import CATALOG


def check_sharpness(beta: object) -> float:
    """A draft sharpness must be a finite number > 0 (1 = the draft's own race)."""
    if isinstance(beta, bool) or not isinstance(beta, int | float):
        raise GenerationInputError(f"draft_sharpness must be a number > 0, got {beta!r}")
    if not math.isfinite(beta) or beta <= 0:
        raise GenerationInputError(
            f"draft_sharpness must be a finite number > 0 (1 = the draft's own race, > 1 = a "
            f"sharper race for a target more confident than its draft), got {beta!r}"
        )
    return float(beta)


def sharpen(draft_probs: torch.Tensor, beta: float) -> torch.Tensor:
    """``q**beta`` (unnormalised: races only compare ``E_i / q_i**beta``); ``q`` itself at 1."""
    if beta == 1.0:
        return draft_probs
    q = draft_probs if draft_probs.dtype == torch.float64 else draft_probs.to(torch.float64)
    return torch.pow(q, beta)


class ERSD(Method):
    info = CATALOG["ersd"]

    def __init__(self, draft_sharpness: float = 1.0) -> None:
        self.draft_sharpness = check_sharpness(draft_sharpness)

    def race_probs(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """The (unnormalised) weights of the drafter's race: ``q**beta``."""
        return sharpen(draft_probs, self.draft_sharpness)

    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        return noise.ranking(self.race_probs(draft_probs), num_children)

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        y = noise.winner(target_probs)
        for j, c in enumerate(children):
            if c == y:
                return NodeDecision(j, y)
        return NodeDecision(None, y)

    def rank(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int, noise: NodeNoise
    ) -> int | None:
        return noise.rank(self.race_probs(draft_probs), token)

    def __repr__(self) -> str:
        beta = self.draft_sharpness
        return "ERSD()" if beta == 1.0 else f"ERSD(draft_sharpness={beta:g})"


def with_sharpness(method: str | Method, draft_sharpness: float) -> str | Method:
    """ERSD (by name or object) with ``draft_sharpness``; any other method unchanged (it has no
    draft race to sharpen), and everything unchanged at sharpness 1."""
    if draft_sharpness == 1.0 or getattr(method, "name", method) != "ersd":
        return method
    return ERSD(draft_sharpness=draft_sharpness)
