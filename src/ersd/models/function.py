"""A weight-free model: next-token logits from a plain Python function of the token sequence."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ersd.models.base import check_commit_args, check_tree_args
from ersd.probs import check_logits


class FunctionModel:
    """``FunctionModel(fn, vocab_size)``: ``fn(sequences) -> Tensor[len(sequences), vocab_size]``.

    ``fn`` receives full token sequences (prompt + tokens so far) and returns one row of
    next-token logits per sequence; ``max_length`` sets a context window (default unbounded).
    Every call of ``fn`` counts as one forward pass
    (``forward_calls``), which lets tests check how many model calls a method makes.
    """

    def __init__(
        self,
        fn: Callable[[list[list[int]]], torch.Tensor],
        vocab_size: int,
        *,
        max_length: int | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError("FunctionModel(fn, vocab_size): fn must be callable")
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(
                f"FunctionModel: vocab_size must be a positive int, got {vocab_size!r}"
            )
        if max_length is not None and (not isinstance(max_length, int) or max_length < 2):
            raise ValueError(f"FunctionModel: max_length must be an int >= 2, got {max_length!r}")
        self.fn = fn
        self.vocab_size = vocab_size
        #: context window in tokens (None: unbounded)
        self.max_length = max_length
        self.forward_calls = 0

    def logits(self, sequences: list[list[int]]) -> torch.Tensor:
        self.forward_calls += 1
        out = self.fn(sequences)
        if not isinstance(out, torch.Tensor):
            out = torch.as_tensor(out)
        if out.dim() != 2 or out.shape[0] != len(sequences):
            raise ValueError(
                f"FunctionModel fn returned shape {tuple(out.shape)} for {len(sequences)} "
                f"sequences; expected ({len(sequences)}, {self.vocab_size})"
            )
        check_logits(out, self.vocab_size, who="FunctionModel fn")
        return out

    def start(self, prompt: Sequence[int]) -> FunctionSession:
        return FunctionSession(self, prompt)

    def score_batch(
        self,
        sessions: Sequence[FunctionSession],
        calls: Sequence[tuple[Sequence[int], Sequence[int]]],
    ) -> list[torch.Tensor]:
        """Score several sessions' calls with ONE call of ``fn`` (one forward pass)."""
        plans = [s._plan(*c) for s, c in zip(sessions, calls, strict=True)]
        flat = [seq for plan in plans for seq in plan]
        rows = self.logits(flat) if flat else None
        out: list[torch.Tensor] = []
        at = 0
        for s, plan in zip(sessions, plans, strict=True):
            out.append(s._finish(rows[at : at + len(plan)] if plan and rows is not None else None))
            at += len(plan)
        return out


class FunctionSession:
    """Session of a :class:`FunctionModel`; recomputes every row from full sequences."""

    def __init__(self, model: FunctionModel, prompt: Sequence[int]) -> None:
        self.model = model
        self._committed = list(prompt)
        self._pending_tokens: list[int] = []
        self._pending_parents: list[int] = []
        self._root: torch.Tensor | None = None

    @property
    def committed(self) -> list[int]:
        return self._committed

    def _sequence(self, node: int) -> list[int]:
        toks: list[int] = []
        while node >= 0:
            toks.append(self._pending_tokens[node])
            node = self._pending_parents[node]
        return self._committed + toks[::-1]

    def score(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        seqs = self._plan(tokens, parents)
        return self._finish(self.model.logits(seqs) if seqs else None)

    def score_previous(
        self, tokens: Sequence[int], parents: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`score`, and the logits after ``committed[:-1]`` where this call computes the
        root row (in the same call of ``fn``); None otherwise.  As
        :meth:`ersd.models.hf.HFSession.score_previous`."""
        fresh = self._root is None and len(self._committed) >= 2
        seqs = self._plan(tokens, parents)
        if not fresh:
            return self._finish(self.model.logits(seqs) if seqs else None), None
        rows = self.model.logits([self._committed[:-1], *seqs])
        return self._finish(rows[1:]), rows[0]

    def _plan(self, tokens: Sequence[int], parents: Sequence[int]) -> list[list[int]]:
        """Add the nodes to the pending tree; the sequences whose logits the call needs."""
        check_tree_args(tokens, parents, len(self._pending_tokens))
        first = len(self._pending_tokens)
        self._pending_tokens.extend(int(t) for t in tokens)
        self._pending_parents.extend(int(p) for p in parents)
        seqs = [self._sequence(first + i) for i in range(len(tokens))]
        return [list(self._committed), *seqs] if self._root is None else seqs

    def _finish(self, rows: torch.Tensor | None) -> torch.Tensor:
        """The call's logits from the rows computed for :meth:`_plan`'s sequences."""
        if self._root is None:
            assert rows is not None
            self._root = rows[0]
            return rows
        if rows is None:
            return self._root.unsqueeze(0)
        return torch.cat([self._root.unsqueeze(0), rows], dim=0)

    def commit(self, tokens: Sequence[int], path: Sequence[int]) -> None:
        check_commit_args(tokens, path, self._pending_tokens, self._pending_parents)
        self._committed.extend(int(t) for t in tokens)
        self._pending_tokens = []
        self._pending_parents = []
        self._root = None
