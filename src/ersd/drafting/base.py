"""The drafter interface: who proposes the draft tree of each step.

A :class:`Drafter` hands out one :class:`DraftSession` per sequence (``start_drafting(prompt)``),
as a model hands out model sessions (a distinct name, so that nothing is both by accident).
A session does two things:

* ``propose(shape, key, rule, params, noise)`` — build the draft tree for this step: a
  :class:`~ersd.methods.DraftTree` below the committed sequence whose root context has race key
  ``key``, with at most the nodes of ``shape``, children chosen by ``rule`` (the verification
  method's drafting rule, or :data:`~ersd.methods.GREEDY` at temperature 0) under ``params``.
  Every context that has children must carry the draft distribution they were drafted from
  (``tree.draft_probs[ctx]``): that is what the rejection-based methods divide by.
* ``observe(tokens, accepted)`` — the step's outcome: ``tokens`` were appended to the sequence;
  ``accepted`` are the nodes of the last proposed tree that hold ``tokens``' prefix (root-down).

The loop never sees how a drafter numbers its own state (a draft model's pending cache entries, a
lookup table's positions).  A model drafter (:class:`~ersd.drafting.model.ModelDrafter`) is one
implementation; drafters that are not models implement the same two methods.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ersd.methods import DraftTree, Method
from ersd.models.base import ModelSession
from ersd.probs import SamplingParams
from ersd.race import RaceNoise
from ersd.tree import TreeShape

if TYPE_CHECKING:
    import torch


@dataclass
class Proposal:
    """A drafted tree and what drafting it cost."""

    tree: DraftTree
    forwards: int = 0  # draft model forward passes
    seconds: float = 0.0  # time spent in draft model forwards
    #: predicted tokens per target call of this tree (1 + Σ predicted reach of its nodes), when
    #: the drafter predicts it (dynamic trees, :mod:`ersd.drafting.dynamic`); None otherwise
    expected_tokens: float | None = None
    #: ``(depth, rank)``: the previous step's bonus token, one depth below its fully accepted
    #: path, and its rank in the draft's order there (None: not among the first few), seen by
    #: this step's first draft forward (:attr:`ersd.drafting.ModelDraftSession.observe_beyond`)
    beyond: tuple[int, int | None] | None = None


@runtime_checkable
class DraftSession(Protocol):
    def propose(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
    ) -> Proposal: ...

    def observe(self, tokens: Sequence[int], accepted: Sequence[int]) -> None: ...


@runtime_checkable
class GrowingSession(DraftSession, Protocol):
    """A draft session that grows its tree level by level on a draft model's ``session`` (the
    optional capability a batched engine uses, as :class:`~ersd.models.batch.BatchScoring` is
    for models): :meth:`grow` yields each draft-model call ``(tokens, parents)``, receives its
    logits and returns the tree, so an engine drives many sessions with one draft forward per
    level.  ``parallel_grow``: whether sessions may grow on worker threads side by side (False
    when they share state, e.g. a dynamic drafter's predictor).  :class:`ModelDraftSession` and
    the dynamic drafters' sessions are ones."""

    session: ModelSession
    parallel_grow: bool

    def grow(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
    ) -> Generator[tuple[list[int], list[int]], torch.Tensor, DraftTree]: ...


@runtime_checkable
class Drafter(Protocol):
    """Anything with a ``vocab_size`` (``None``: any vocabulary) and ``start_drafting(prompt)``."""

    @property
    def vocab_size(self) -> int | None: ...

    def start_drafting(self, prompt: Sequence[int]) -> DraftSession: ...
