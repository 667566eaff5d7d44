"""What the model-free drafters share: per-source statistics and the session skeleton.

A model-free session keeps the text seen so far (prompt + committed tokens) in some index and
answers two questions: the state at the end of the committed text (:meth:`FreeSession.root_state`)
and the continuations of a state (:meth:`FreeSession.expand`).
:func:`~ersd.drafting.grow.grow_tree` does the rest.  Time spent in the index (look-ups while
proposing, updates while observing) is the drafter's own time, reported as the step's
``draft_time``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ersd.drafting.base import Proposal
from ersd.drafting.grow import Budget, Continuation, DrafterConfigError, grow_tree
from ersd.methods import DraftTree, Method
from ersd.probs import SamplingParams
from ersd.race import RaceNoise
from ersd.tree import TreeShape


@dataclass
class SourceStats:
    """What one source of draft tokens did: steps it proposed in, nodes, accepted tokens, time."""

    steps: int = 0  # steps in which this source proposed at least one node
    proposed: int = 0  # nodes proposed
    accepted: int = 0  # accepted nodes it had proposed (a node two sources proposed counts twice)
    seconds: float = 0.0  # drafting time of this source

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed nodes (0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def accepted_per_step(self) -> float:
        """Accepted tokens per step in which the source proposed."""
        return self.accepted / self.steps if self.steps else 0.0


@dataclass
class DrafterStats:
    """Per-source statistics of a drafter, summed over all its sessions."""

    sources: dict[str, SourceStats] = field(default_factory=dict)

    def source(self, name: str) -> SourceStats:
        return self.sources.setdefault(name, SourceStats())

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """JSON-ready: ``{source: {steps, proposed, accepted, seconds, acceptance_rate}}``."""
        return {
            name: {
                "steps": s.steps,
                "proposed": s.proposed,
                "accepted": s.accepted,
                "seconds": s.seconds,
                "acceptance_rate": s.acceptance_rate,
            }
            for name, s in self.sources.items()
        }


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DrafterConfigError(f"drafter option {name} must be an integer >= 1, got {value!r}")
    return value


class QPool:
    """Reusable dense ``q`` vectors: at V = 150k a fresh 1.2 MB tensor costs ~2 ms (page faults),
    zeroing a warm one ~0.1 ms.  The vectors of one proposal are reused by the next one."""

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []
        self._used: list[torch.Tensor] = []

    def release(self) -> None:
        """The last proposal's vectors may be reused (its tree has been verified)."""
        self._free.extend(self._used)
        self._used = []

    def take(self, vocab_size: int) -> torch.Tensor:
        q = None
        while self._free and q is None:
            cand = self._free.pop()
            if cand.numel() == vocab_size:
                q = cand.zero_()
        if q is None:
            q = torch.zeros(vocab_size, dtype=torch.float64)
        self._used.append(q)
        return q


class FreeSession(ABC):
    """Drafting state of one sequence for a model-free drafter (lookup, suffix).

    The ``q`` vectors of a proposal's tree are reused by the session's next proposal: a tree is
    valid until the next ``propose`` (the loop verifies it before).
    """

    #: source name in the drafter's statistics
    source: str = "free"

    def __init__(self, stats: DrafterStats, nodes: int, depth: int, branches: int) -> None:
        self.stats = stats
        self.limits = (nodes, depth, branches)
        self._pending_seconds = 0.0  # index updates since the last proposal
        self._last: DraftTree | None = None
        self._qpool = QPool()

    # --- what a concrete drafter implements ---------------------------------------------------

    @abstractmethod
    def root_state(self) -> Hashable:
        """State at the end of the committed text."""

    @abstractmethod
    def expand(self, state: Hashable) -> list[Continuation]:
        """Continuations of ``state``, best first."""

    @abstractmethod
    def append(self, tokens: Sequence[int]) -> None:
        """Add committed tokens to the index."""

    def match_length(self, state: Hashable) -> int:
        """Length of the context matched at ``state`` (how much to trust its continuations)."""
        return 0

    # --- the DraftSession protocol ------------------------------------------------------------

    def budget(self, shape: TreeShape | None) -> Budget:
        """This drafter's limits, intersected with ``shape`` when given."""
        nodes, depth, branches = self.limits
        if shape is None:
            return Budget(nodes, depth, branches)
        return Budget.within(shape, nodes, depth, branches)

    def draft_tree(
        self, budget: Budget, key: int, rule: Method, noise: RaceNoise
    ) -> tuple[DraftTree, float]:
        """The tree within ``budget`` and the seconds it took (statistics not yet recorded)."""
        t0 = time.perf_counter()
        self._qpool.release()
        vocab = noise.vocab_size
        tree, _ = grow_tree(
            self.expand,
            self.root_state(),
            budget,
            key,
            rule,
            noise,
            lambda: self._qpool.take(vocab),
        )
        return tree, time.perf_counter() - t0

    def record(self, tree: DraftTree, seconds: float) -> None:
        """Count a proposal in the statistics (``tree`` is the one the target will verify)."""
        s = self.stats.source(self.source)
        s.seconds += seconds
        if tree.num_nodes:
            s.steps += 1
            s.proposed += tree.num_nodes

    def propose(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
    ) -> Proposal:
        tree, seconds = self.draft_tree(self.budget(shape), key, rule, noise)
        self.record(tree, seconds)
        self._last = tree
        seconds += self._pending_seconds
        self._pending_seconds = 0.0
        return Proposal(tree=tree, forwards=0, seconds=seconds)

    def observe(self, tokens: Sequence[int], accepted: Sequence[int]) -> None:
        if self._last is not None and self._last.num_nodes:
            self.stats.source(self.source).accepted += len(accepted)
        self._last = None
        t0 = time.perf_counter()
        self.append(tokens)
        dt = time.perf_counter() - t0
        self._pending_seconds += dt
        self.stats.source(self.source).seconds += dt
