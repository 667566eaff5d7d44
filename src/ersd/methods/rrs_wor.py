"""Recursive rejection sampling without replacement (Jeon et al. 2024, "Recursive Speculative
Decoding"), any tree.

The children of a node are the top ``m`` tokens of a race on ``q`` with noise of stream
``STREAM_DRAFT`` (Gumbel-top-m: ``m`` sequential draws without replacement), independent of the
verifier's coins (``STREAM_VERIFY``) and of the shared race (stream 0, used for bonus tokens).
Child ``x_j`` is accepted with probability ``min(1, p_j(x_j) / q_j(x_j))``; after a rejection
``p_{j+1} = norm(max(p_j - q_j, 0))`` and ``q_{j+1}`` is ``q_j`` with ``x_j`` removed and
renormalised.  If every child is rejected the token is drawn from the last residual
(``STREAM_RESIDUAL``).  Fewer than ``m`` children come back when ``q`` has fewer non-zero entries.

Hooks (see :class:`ersd.methods.rejection.RecursiveRejection`): ``acceptance_probability``,
``residual``, ``next_draft_probs``, ``verify_uniforms``, ``sample_residual``, ``draft``.
"""

from __future__ import annotations

import torch

from ersd.methods.base import NodeNoise
from ersd.methods.catalog import CATALOG
from ersd.methods.rejection import RecursiveRejection, normalised_or
from ersd.race import STREAM_DRAFT, race_ranking


class RRSWithoutReplacement(RecursiveRejection):
    info = CATALOG["rrs-wor"]
    #: stream of the drafting race (never the shared race, stream 0)
    draft_stream: int = STREAM_DRAFT

    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        return race_ranking(draft_probs, noise.exponentials(self.draft_stream), num_children)

    def next_draft_probs(self, draft_probs: torch.Tensor, token: int) -> torch.Tensor:
        """``q`` with ``token`` removed and renormalised (all zeros if nothing is left)."""
        rest = draft_probs.clone()
        rest[token] = 0.0
        return normalised_or(rest, rest)
