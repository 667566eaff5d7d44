"""What ``tree="auto"`` learns from a run, as explicit state updated by small methods: the
per-depth acceptance estimate (:class:`OnlineProfile`) and the step-time correction
(:class:`StepTiming`).  Their constants come from the :class:`~ersd.auto.rules.Rules` they are
given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ersd.auto.rules import MAX_RANK, RULES, Rules


class OnlineProfile:
    """Per-depth rank observations of one generation, shrunk towards a prior.

    ``ranked``: the observations are full ranks (ERSD at T > 0, ``StepRecord.ranks``); otherwise
    accepted (rank 1) or rejected (rank unknown, > 1) chain positions.  :meth:`depth_probs` gives
    depth ``d``'s estimate ``(counts_d + W · pool_d) / (n_d + W)`` with
    ``pool_d = (Σ_{e ≠ d} counts_e + W · prior) / (Σ_{e ≠ d} n_e + W)`` (``W`` =
    ``Rules.prior_weight``), and ``(Σ counts + W · prior) / (Σ n + W)`` below the deepest observed
    depth.

    **Acceptance comes in stretches** (easy text, hard text), and the estimate follows them as a
    first-order Markov chain: a token drafted right after an accepted one is accepted more often
    than one after a rejection.  Every observation below the root was made right after an
    accepted token; so was the root of a step that follows a step whose drafts were *all*
    accepted (state ``True``), unlike the root after a rejection (``False``).  So

    - after a full acceptance the root is estimated from the roots observed in that state
      (shrunk towards the other roots), and :meth:`depth_probs` takes the states of the rows
      it decides for; after a rejection it stays the estimate over all roots, since a plain
      step decided on that state's own estimate would observe nothing to correct it;
    - depths below the root, and the depths below the deepest observed, are shrunk towards the
      observations made right after an accepted token (depths below the root and the roots in
      state ``True``), which are in turn shrunk towards all;
    - **the depth below a fully accepted path is observed too** (:meth:`observe_beyond`): the
      rank of the bonus token in the draft's order there, which the next step's first draft
      forward gives at the cost of one more output row (:mod:`ersd.drafting.model`).

    Without stretches both pools estimate the same and this is the plain per-depth estimate;
    with them, a run drafting short chains in an easy stretch sees that its deeper tokens would
    be accepted as often as its roots after a full acceptance are, instead of as often as its
    roots on average (under that independent estimate, the bf16 pair on an arithmetic prompt
    at T = 0 stayed on ``chain:1``, with 78% of its roots accepted, where ``chain:4`` accepted
    3.8 tokens per call).
    """

    def __init__(
        self,
        ranked: bool,
        prior_probs: Any = None,
        prior_trials: list[int] | None = None,
        rules: Rules = RULES,
    ) -> None:
        self.ranked = ranked
        self.rules = rules
        prior = np.zeros(MAX_RANK)
        if prior_probs is None:
            prior[: len(rules.prior_rank_probs)] = rules.prior_rank_probs
        else:  # a stored profile of this pair: its per-depth vectors' mean, weighted by the
            # observations behind each depth (``prior_trials``; equal weights if not known) --
            # a deep depth reached in a few easy stretches must not count as much as the root
            rows = [np.asarray(r, dtype=np.float64)[:MAX_RANK] for r in prior_probs]
            weights = [float(n) for n in prior_trials or []]
            if len(weights) != len(rows) or sum(weights) <= 0:
                weights = [1.0] * len(rows)
            for r, w in zip(rows, weights, strict=True):
                prior[: r.size] += r * w / sum(weights)
        if not ranked:
            prior[1:] = 0.0
        self.prior = prior
        self.counts: list[np.ndarray] = []  # counts[d][r - 1], depth d + 1
        self.trials: list[int] = []  # observations at depth d + 1 (any rank)
        self.steps = 0  # drafting steps observed
        #: root observations right after a step whose drafts were all accepted (state True);
        #: part of counts[0] / trials[0]
        self.full_counts = np.zeros(MAX_RANK)
        self.full_trials = 0

    def _add(self, depth: int, rank: int | None) -> None:
        while len(self.trials) <= depth:
            self.counts.append(np.zeros(MAX_RANK))
            self.trials.append(0)
        self.trials[depth] += 1
        if rank is not None and 1 <= rank <= MAX_RANK:
            self.counts[depth][rank - 1] += 1

    def _add_root(self, state: bool | None, rank: int | None) -> None:
        if not state:
            return
        self.full_trials += 1
        if rank is not None and 1 <= rank <= MAX_RANK:
            self.full_counts[rank - 1] += 1

    def observe_ranks(self, ranks: list[int], state: bool | None = None) -> None:
        """Root-down ranks of one step (``StepRecord.ranks``); ``state``: whether the step
        before drafted and had all its drafts accepted (None: it did not draft, or unknown)."""
        self.steps += 1
        for d, r in enumerate(ranks):
            self._add(d, int(r))
        if ranks:
            self._add_root(state, int(ranks[0]))

    def observe_chain(self, accepted: int, depth: int, state: bool | None = None) -> None:
        """A chain of ``depth`` drafted tokens of which ``accepted`` were accepted (``state``:
        as :meth:`observe_ranks`)."""
        self.steps += 1
        for d in range(min(accepted + 1, depth)):
            self._add(d, 1 if d < accepted else None)
        if depth > 0:
            self._add_root(state, 1 if accepted > 0 else None)

    def observe_beyond(self, depth: int, rank: int | None) -> None:
        """The bonus token one depth below a fully accepted path of ``depth - 1`` drafts, and its
        ``rank`` in the draft's order there (:attr:`ersd.drafting.Proposal.beyond`): what
        drafting ``depth`` would have observed, made right after accepted tokens like any depth
        below the root.  Not a step."""
        if depth < 2:
            return
        if not self.ranked:  # an accepted or a rejected position
            rank = 1 if rank == 1 else None
        self._add(depth - 1, rank)

    def depth_probs(self, states: Sequence[bool | None] | None = None) -> list[np.ndarray]:
        """Per-depth rank probabilities; the last entry applies below the deepest observed
        depth.  ``states``: the state of each row decided for (class docstring); the root is
        their mean (expected tokens are linear in the root's vector); None or [None]: the root
        over all its observations.

        Each estimate is shrunk towards a pool of observations *other* than its own: pooling
        its own too would count each observation twice (one early root rejection moved the
        root's estimate almost twice as far as the prior's weight says, and a step that then
        drafts nothing observes nothing more)."""
        w = self.rules.prior_weight
        counts, trials = self.counts, self.trials
        total = sum(counts, np.zeros(MAX_RANK))
        n_all = sum(trials)
        if not trials:
            return [(total + w * self.prior) / (n_all + w)]

        def pool(c: Any, n: float) -> Any:  # every observation but (c, n), and the prior
            return (total - c + w * self.prior) / (n_all - n + w)

        # right after an accepted token: the depths below the root, the roots in state True
        after = sum(counts[1:], self.full_counts.copy())
        n_after = sum(trials[1:]) + self.full_trials

        def after_pool(c: Any, n: float) -> Any:
            return (after - c + w * pool(c, n)) / (n_after - n + w)

        c0, n0 = counts[0], trials[0]
        root = (c0 + w * pool(c0, n0)) / (n0 + w)
        rc, rn = self.full_counts, self.full_trials
        full = (rc + w * (c0 - rc + w * pool(c0, n0)) / (n0 - rn + w)) / (rn + w)
        # after a rejection (or a step without drafting): the root over all its observations,
        # not its own state's -- a step that then drafts nothing observes nothing, so an
        # unlucky early estimate in that state would never be corrected (on a chat prompt at
        # T = 0 it made 23 of 67 steps plain, 5% slower than drafting chain:1 throughout)
        roots = [full if s else root for s in (states if states is not None else [None])]
        below = [
            (c + w * after_pool(c, n)) / (n + w)
            for c, n in zip(counts[1:], trials[1:], strict=True)
        ]
        beyond = (after + w * (total + w * self.prior) / (n_all + w)) / (n_after + w)
        return [sum(roots) / len(roots), *below, beyond]


@dataclass
class StepTiming:
    """Online correction of the predicted step time for one kind of step (drafting or not):
    measured / predicted forward seconds of the target and the draft, and seconds per row
    outside the forwards — exponential moving averages (weight ``Rules.timing_ema``).  The
    target's ratio is kept per forward size too (:meth:`target_at`): one ratio scales a curve,
    and a curve whose shape is off (a noisy point, kept in the store for every later run) would
    otherwise rank trees of different sizes wrongly for good."""

    target_ratio: float = 1.0
    draft_ratio: float = 1.0
    overhead: float | None = None  # seconds per row per step outside forwards (None: not seen)
    steps: int = 0
    #: per (target tokens per row, rows) of a timed step: [its target ratio, its steps]
    sizes: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    rules: Rules = field(default=RULES, repr=False, compare=False)

    def seed(self, stored: list[float]) -> None:
        """Start from a stored correction ``[target ratio, draft ratio, overhead]`` (of an
        earlier run at this batch size), weighted as one step: this run's first step then
        moves it by ``Rules.timing_ema``, not all the way."""
        self.target_ratio, self.draft_ratio, self.overhead = stored
        self.steps = 1

    def stored(self) -> list[float]:
        return [self.target_ratio, self.draft_ratio, self.overhead or 0.0]

    def update(
        self, target: float, draft: float, overhead: float, size: tuple[int, int] | None = None
    ) -> None:
        ema = self.rules.timing_ema
        w = 1.0 if self.steps == 0 else ema
        self.target_ratio += w * (target - self.target_ratio)
        self.draft_ratio += w * (draft - self.draft_ratio)
        old = overhead if self.overhead is None else self.overhead
        self.overhead = old + w * (overhead - old)
        self.steps += 1
        if size is not None:  # a mean over the size's first steps, then the same EMA
            entry = self.sizes.setdefault(size, [target, 0])
            entry[1] += 1
            entry[0] += max(1 / entry[1], ema) * (target - entry[0])

    def target_at(self, size: tuple[int, int]) -> float:
        """The target's ratio for a forward of ``size`` (tokens per row, rows): the size's own
        where this run timed it, shrunk towards the ratio over every size by
        ``Rules.size_prior_steps`` pseudo-steps; else the ratio over every size."""
        entry = self.sizes.get(size)
        if entry is None:
            return self.target_ratio
        n = min(entry[1], 1 / self.rules.timing_ema)  # an EMA holds about 1 / weight steps
        prior = self.rules.size_prior_steps
        return (n * entry[0] + prior * self.target_ratio) / (n + prior)


__all__ = ["OnlineProfile", "StepTiming"]
