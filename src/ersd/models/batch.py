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
    model: Any, sessions: Sequence[ModelSession], calls: Sequence[ScoreCall], *, root: bool = True
) -> list[Any]:
    """``[s.score(*c) for s, c in zip(sessions, calls)]``, in one forward where the model can.

    ``root=False``: the caller reads only the new nodes' rows (a drafter's level after its
    first), so sessions with ``rootless_rows`` may skip copying the already-known root row in
    front of them; such a call's result is a :class:`NodeRows` (``rows[1 + r]`` is node ``r``, as
    in a full result)."""
    if len(sessions) != len(calls):
        raise ValueError(f"score_many: {len(sessions)} sessions but {len(calls)} calls")
    if not sessions:
        return []
    rootless = not root and all(getattr(s, "rootless_rows", False) for s in sessions)
    if len(sessions) > 1 and isinstance(model, BatchScoring):
        if rootless:
            outs = model.score_batch(sessions, calls, root=False)  # type: ignore[call-arg]
            return [node_rows(o, c) for o, c in zip(outs, calls, strict=True)]
        return model.score_batch(sessions, calls)
    if rootless:
        return [
            node_rows(s.score(*c, root=False), c)  # type: ignore[call-arg]
            for s, c in zip(sessions, calls, strict=True)
        ]
    return [s.score(*c) for s, c in zip(sessions, calls, strict=True)]


class NodeRows:
    """The rows of a score call without its root row: ``rows[1 + r]`` is new node ``r``'s logits
    (as in the full ``[1 + n, V]`` result), ``rows[0]`` is refused.  What a session with
    ``rootless_rows`` returns for ``root=False``: the new rows as the forward computed them,
    without a copy of the known root in front of them (one row a level of drafting)."""

    __slots__ = ("nodes",)

    def __init__(self, nodes: torch.Tensor) -> None:
        self.nodes = nodes

    def __len__(self) -> int:
        return 1 + self.nodes.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        if not isinstance(i, int) or not 1 <= i <= self.nodes.shape[0]:
            raise IndexError(f"NodeRows holds rows 1..{self.nodes.shape[0]} only, not {i!r}")
        return self.nodes[i - 1]


def node_rows(rows: torch.Tensor, call: ScoreCall) -> Any:
    """``rows`` as a call's result: a :class:`NodeRows` when it holds only the new nodes' rows
    (a rootless result), else ``rows`` itself (a result with its root: a tail was fed)."""
    return NodeRows(rows) if rows.shape[0] == len(call[0]) else rows
