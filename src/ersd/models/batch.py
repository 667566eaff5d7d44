"""Scoring many sequences at once: the optional batched capability of a backend.

A batched engine keeps one ordinary :class:`~ersd.models.base.ModelSession` per sequence (so a
sequence can join or leave between steps, and a finished one frees its cache by being dropped)
and asks the *model* to run the score calls of several of its sessions in one forward pass:

    model.score_batch(sessions, calls) -> [logits of each call]

where ``calls[i] = (tokens, parents)`` is exactly what ``sessions[i].score`` would take and the
result is exactly what it would return.  :func:`score_many` uses ``score_batch`` when the model has
it and falls back to one ``score`` per session otherwise, so every backend works in a batch; a
backend implements :class:`BatchScoring` to make it one forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from ersd.models.base import ModelSession

ScoreCall = tuple[Sequence[int], Sequence[int]]


@runtime_checkable
class BatchScoring(Protocol):
    """A model that scores several of its sessions' calls in one forward pass."""

    def score_batch(
        self, sessions: Sequence[ModelSession], calls: Sequence[ScoreCall]
    ) -> list[torch.Tensor]: ...


def score_many(
    model: Any, sessions: Sequence[ModelSession], calls: Sequence[ScoreCall]
) -> list[torch.Tensor]:
    """``[s.score(*c) for s, c in zip(sessions, calls)]``, in one forward where the model can."""
    if len(sessions) != len(calls):
        raise ValueError(f"score_many: {len(sessions)} sessions but {len(calls)} calls")
    if not sessions:
        return []
    if len(sessions) > 1 and isinstance(model, BatchScoring):
        return model.score_batch(sessions, calls)
    return [s.score(*c) for s, c in zip(sessions, calls, strict=True)]
