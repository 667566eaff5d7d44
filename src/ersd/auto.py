"""``tree="auto"``: each step's draft tree chosen for predicted throughput at the batch size.

Before every step a :class:`TreeChooser` predicts, for each candidate — no drafting (one target
forward, one token), chains of 1..8 tokens and (ERSD at temperature > 0) the optimal trees of a
few sizes under the current rank profile — the throughput over the batch of ``B`` live rows
(:func:`ersd.costs.predict`)::

    rate(tree, B) = B · E[tokens per call | tree, profile] / step_time(tree, B)
    rate(none, B) = B / (target(B, 1) + overhead_plain · B)

and drafts the best one (ties go to no drafting), or rather the smallest tree whose predicted
rate is within :data:`SMALLER_TREE_WITHIN` of the best (and above no drafting's).  In a batch
the rates are over the rest of the run, until its slowest row is done (each row's own
acceptance, rows leaving one by one: :meth:`TreeChooser._finish_rates`).  The two inputs:

* **rank profile** — a calibration or rank-profile file (``auto@FILE``, the file of
  ``ersd bench calibrate``; the profile nearest the sampling temperature), or an online estimate
  from the run's own verified steps (:class:`OnlineProfile`): per-depth counts of the target
  winner's rank in the drafter's race (ERSD at T > 0), or of accepted / rejected chain positions
  (other methods and T = 0, which then choose among chains only), shrunk towards a prior of
  :data:`PRIOR_WEIGHT` pseudo-observations of :data:`PRIOR_RANK_PROBS`.
* **cost curves** — an explicit :class:`~ersd.costs.CostModel` (``AutoTree(costs=...)``), a
  calibration file's costs, or, by default, a few timed forwards of 1, 2, 4, 8 and 16 tokens per
  row of the target and the draft model, at batch 1 and at the powers of two around the current
  batch size (:func:`measured_costs`), measured once per model and batch size in fresh sessions
  and kept in a :class:`CurveCache` owned by the caller (a batch engine shares one across its
  rows; ``AutoTree(costs=cache)`` shares one across generations).

The cost curves are corrected online from the run's own steps (:class:`StepTiming`): the ratio
of each measured target and draft forward time to its prediction (the target's per forward size
too, where the run timed that size), and the time per row outside the forwards, for drafting and
non-drafting steps separately (exponential moving averages).  So
the prediction includes the engine's own overhead and the real context length, and a tree that
does not pay in this run gives way to a shorter one or to no drafting.  Steps whose forwards
included a prompt's prefill are not learned from; after :data:`EXPLORE_AFTER` steps in a row
without drafting the best tree is drafted once, so drafting is re-measured (exploration), and
the other way round one step is not drafted after :data:`EXPLORE_PLAIN_AFTER` drafting steps
in a row (and once early, after two drafting steps, if no plain step was timed yet and -- at
batch 1 -- drafting's predicted lead is under :data:`EXPLORE_PLAIN_DOUBT`); until a kind of step
is timed it borrows the other kind's target correction.

The choice depends only on the costs and on steps already verified, never on the current step's
randomness, so every method stays exact and ERSD's text stays the target-only text (it is tree-
and batch-invariant); other methods' tokens depend on the trees chosen, hence on the batch.

(One module over the usual ~450 lines on purpose: the candidates, the online rank profile, the
timing correction and exploration are one decision rule, read together.)
"""

from __future__ import annotations

import functools
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist, pstdev
from typing import Any

import numpy as np

from ersd.cost_store import CostStore
from ersd.costs import (
    DEFAULT_SIZES,
    MEASURE_REPEATS,
    CostModel,
    CostModelError,
    measure_curve,
)
from ersd.errors import ErsdError, InvalidTreeSpecError, UnsupportedTreeError
from ersd.theory import expected_block_efficiency_by_depth
from ersd.theory.profile import RankProfileError, load_profiles, tree_depth_probs
from ersd.tree import AutoTree, TreeShape

#: prior per-depth rank profile of the online estimate: P(R = 1), P(R = 2), ... (sub-probability)
PRIOR_RANK_PROBS = (0.6, 0.1, 0.05, 0.03, 0.02)
#: weight of the prior, in observations (per depth, and for the pooled profile)
PRIOR_WEIGHT = 4.0
#: ranks counted individually by the online estimate (deeper ranks are never drafted by auto)
MAX_RANK = 8
#: chain lengths among the candidates
CHAIN_LENGTHS = range(1, 9)
#: node counts of the optimal trees among the candidates (ERSD at T > 0)
TREE_SIZES = (2, 3, 4, 6, 8, 12, 16)
#: at most this many of the context's last tokens prefill the cost-measurement sessions
MEASURE_PROMPT_TOKENS = 64
#: weight of the newest step in the online timing correction (exponential moving average)
TIMING_EMA = 0.25
#: pseudo-steps of the target's ratio over every forward size behind a size's own ratio
#: (:meth:`StepTiming.target_at`): measured curves of a flat bf16 target rose 0.26 -> 0.30 s
#: from 3 to 7 tokens where its steps took 0.253-0.257 s throughout, so one ratio over-predicted
#: chain:6's target forward by 11% where it fitted chain:2's
SIZE_PRIOR_STEPS = 0.5
#: after this many steps in a row without drafting, draft the best tree once (exploration) --
#: if drafting could pay at all, and within :data:`EXPLORE_BUDGET`
EXPLORE_AFTER = 16
#: exploration steps may lose at most this share of the run's time so far (predicted seconds
#: lost: the step's time, plus the draft's catch-up, minus the time of the same tokens the chosen
#: way)
EXPLORE_BUDGET = 0.02
#: drafting steps a run observes before its rank observations are kept in the cost store
#: (:meth:`TreeChooser.keep_profile`)
KEEP_PROFILE_AFTER = 8
#: steps of a kind (drafting or not) a run times at one batch size before its timing correction
#: is kept in the cost store (:meth:`TreeChooser.keep_timing`), for the next run at that batch
#: size to start from: on the Intel bf16 pair at batch 8 a drafting step took 1.17x the curves'
#: prediction (0.37 s, not 0.32 s), and a run that starts from 1.0 decides its first, costliest
#: step -- the one that prefills the draft on every row -- on the uncorrected curve
KEEP_TIMING_AFTER = 4
#: ... and after this many drafting steps in a row, one step without drafting (and once early,
#: after two drafting steps, if no plain step was ever timed): the target-only side of the
#: comparison is a measured curve until a plain step corrects it, and a curve measured in other
#: conditions than the run would otherwise bias every later decision towards drafting
EXPLORE_PLAIN_AFTER = 64
#: ... but at batch 1 the early one only while the best tree's predicted rate is within this
#: share of plain decoding's: the plain side borrows the drafting steps' measured target ratio
#: until then, and no error of that borrowed prediction this machine's curves have shown (5-10%)
#: would turn a larger lead around -- while the step itself cost 2-4% of a 48-token run that
#: drafts chain:7 on code (one token in a step where chain:7 emits five).  A batch keeps it: its
#: plain side is interpolated between batch sizes, and at batch 8 an untimed plain side once
#: kept auto drafting chain:1 at 0.81x target-only
EXPLORE_PLAIN_DOUBT = 0.2
#: a depth's own observations are multiplied by this at every drafting step whose tree does not
#: reach it (:class:`OnlineProfile`): what a depth showed in a stretch long past counts less and
#: less against the observations that go on being made right after accepted tokens, so a depth
#: a run stopped drafting after a few early rejections is drafted again once the rest of the run
#: says it should be (half its weight in 6.6 steps)
STALE_DECAY = 0.9
#: a verdict that drafting cannot pay by a clear margin (the best rate with every drafted token
#: accepted at most ``1 - CANNOT_PAY_MARGIN`` of plain decoding's) is kept for
#: :data:`CANNOT_PAY_RECHECK` steps at the same batch size instead of being recomputed after
#: every step's timing correction: on a backend where drafting never pays, the decision itself
#: is then the only thing auto adds to plain decoding, and it is made once in 32 steps
CANNOT_PAY_MARGIN = 0.05
CANNOT_PAY_RECHECK = 32
#: ... once this many plain steps of the run have been timed
CANNOT_PAY_TIMED = 4
#: a batch (more than one row) starts its draft only if drafting is predicted to beat plain
#: decoding by this share: starting it prefills the draft on every row at once, a cost that is
#: not got back if drafting then stops, and at batch 8 on CPU drafting's predicted gain is a few
#: percent, within the error of the step times it rests on.  On the packed float32 pair at batch
#: 8, fixed chain:4 ran at 0.77-0.86 of target-only, and the one of six batches that started its
#: draft on a gain predicted from plain steps timed slow in that repeat ran at 0.92 of it.  A
#: lone sequence is not held back: on that pair it ran at 1.04-2.1x target-only, and a margin
#: would cost the chat prompts, whose gain is smallest, their gain
BATCH_START_MARGIN = 0.10
#: among the drafting candidates whose predicted rate is within this share of the best one's,
#: the one with the fewest nodes is drafted: near its top the predicted rate is flat in the
#: tree's size (chain:4, 6 and 8 within a few percent), closer than the prediction's error,
#: and the error is not symmetric -- a larger tree's cost is measured, its extra tokens rest on
#: the acceptance of deep positions, observed least often -- so the smaller tree loses at most
#: this share where the prediction is right and saves the larger tree's cost where it is not
SMALLER_TREE_WITHIN = 0.03
#: a batch's rows accept at different rates (code against chat), and a batch is done when its
#: slowest row is: each row's expected tokens per step is scaled by its own acceptance so far,
#: ``(accepted + W) / (predicted + W)`` drafted tokens, ``W`` this many pseudo-tokens towards
#: the pool's rate (:meth:`TreeChooser.row_factor`)
ROW_PRIOR_TOKENS = 4.0
#: rows with at least this many predicted drafted tokens count in the spread of the rows'
#: factors that a run keeps for the next (:meth:`TreeChooser.keep_timing`)
ROW_SPREAD_AFTER = 8.0
#: the spread (standard deviation) of rows' factors assumed before any run has measured it,
#: weighted as :data:`ROW_SPREAD_PRIOR_ROWS` rows against the rows measured since: on the Intel
#: bf16 pair at batch 8 and T = 0 the slowest of 8 rows accepted 0.6 of the pool's rate, about
#: 1.42 spreads of 0.28 below the mean; a run that starts its batch drafting pays the draft's
#: prefill on every row (5% of a 96-token run) before its rows show their rates
DEFAULT_ROW_SPREAD = 0.25
ROW_SPREAD_PRIOR_ROWS = 8.0
#: at most this many rows' weight behind a kept spread (it follows the pair's recent batches)
ROW_SPREAD_MAX_ROWS = 256.0


def batch_finish_seconds(steps: Sequence[float], step_seconds: Callable[[int], float]) -> float:
    """Seconds until every row of a batch is done, row ``i`` needing ``steps[i]`` more steps and
    a step with ``b`` live rows costing ``step_seconds(b)``: the rows leave one by one, and the
    steps after the first has left run with fewer rows (at nearly a full step's cost where the
    forward's cost hardly depends on the rows, as on the Intel bf16 target: 0.206 s for 8 rows,
    0.195 s for one)."""
    total, done = 0.0, 0.0
    ordered = sorted(steps)
    for j, n in enumerate(ordered):
        if n > done:
            total += (n - done) * step_seconds(len(ordered) - j)
            done = n
    return total


def order_statistics(batch: int) -> list[float]:
    """About the expected ``k``-th smallest of ``batch`` standard normal draws, ascending
    (Blom's approximation): where ``batch`` rows' factors fall, in spreads from the mean (the
    slowest of 8 rows at -1.42).  Symmetric: where a step's cost grows with its rows the batch's
    mean row decides and the offsets cancel; where it hardly does, the slowest row decides."""
    if batch < 2:
        return [0.0] * batch
    unit = NormalDist()
    return [unit.inv_cdf((k + 1 - 0.375) / (batch + 0.25)) for k in range(batch)]


def _prob(probs: list[Any], depth: int, index: int) -> float:
    """``P(R = index + 1)`` at 0-based ``depth`` (the last vector is reused deeper down)."""
    vec = probs[min(depth, len(probs) - 1)]
    return float(vec[index]) if index < len(vec) else 0.0


def expected_tokens(shape: TreeShape, probs: list[Any]) -> float:
    """:func:`ersd.theory.expected_block_efficiency_by_depth` of ``shape`` without re-validating
    the (already checked) profile: ``1 + Σ_nodes Π P_R`` along each node's path."""
    reach: list[float] = []
    for path, parent in zip(shape.paths, shape.parents, strict=True):
        r = _prob(probs, len(path) - 1, path[-1]) * (reach[parent] if parent >= 0 else 1.0)
        reach.append(r)
    return 1.0 + sum(reach)


def tunstall_order(probs: list[Any], k: int) -> list[tuple[int, ...]]:
    """The paths :func:`ersd.theory.optimal_tree_by_depth` picks for ``k`` nodes, in the order
    they are picked (same ties), so that its first ``j`` are the optimal ``j``-node tree."""
    heap: list[tuple[float, int, tuple[int, ...], float]] = [(-_prob(probs, 0, 0), 1, (0,), 1.0)]
    out: list[tuple[int, ...]] = []
    while len(out) < k and heap:
        neg, depth, path, parent_prob = heapq.heappop(heap)
        out.append(path)
        heapq.heappush(heap, (neg * _prob(probs, depth, 0), depth + 1, (*path, 0), -neg))
        sib = path[-1] + 1
        heapq.heappush(
            heap,
            (-parent_prob * _prob(probs, depth - 1, sib), depth, (*path[:-1], sib), parent_prob),
        )
    return out


class OnlineProfile:
    """Per-depth rank observations of one generation, shrunk towards a prior.

    ``ranked``: the observations are full ranks (ERSD at T > 0, ``StepRecord.ranks``); otherwise
    accepted (rank 1) or rejected (rank unknown, > 1) chain positions.  :meth:`depth_probs` gives
    depth ``d``'s estimate ``(counts_d + W · pool_d) / (n_d + W)`` with
    ``pool_d = (Σ_{e ≠ d} counts_e + W · prior) / (Σ_{e ≠ d} n_e + W)`` (``W`` =
    :data:`PRIOR_WEIGHT`), and ``(Σ counts + W · prior) / (Σ n + W)`` below the deepest observed
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
    - **a depth goes stale** while the run drafts trees that do not reach it: its own
      observations are multiplied by :data:`STALE_DECAY` at each such step, so its estimate
      returns to the pool.  A depth estimated from a long-past stretch alone would otherwise
      never be drafted, hence never observed, again: the bf16 pair on an arithmetic prompt at
      T = 0 saw 4 of 8 depth-2 tokens rejected in its first hard stretch, then drafted
      ``chain:1`` in 38 of its 48 steps (31 of its 35 roots after a full acceptance accepted)
      at 0.89 of ``chain:4``.  The store keeps the raw counts;
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
        self, ranked: bool, prior_probs: Any = None, prior_trials: list[int] | None = None
    ) -> None:
        self.ranked = ranked
        prior = np.zeros(MAX_RANK)
        if prior_probs is None:
            prior[: len(PRIOR_RANK_PROBS)] = PRIOR_RANK_PROBS
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
        #: the same, each depth's multiplied by STALE_DECAY at every drafting step whose tree
        #: did not reach it: what the estimate uses (the store keeps the raw counts)
        self.live_counts: list[np.ndarray] = []
        self.live_trials: list[float] = []
        self.steps = 0  # drafting steps observed
        #: root observations right after a step whose drafts were all accepted (state True);
        #: part of counts[0] / trials[0]
        self.full_counts = np.zeros(MAX_RANK)
        self.full_trials = 0

    def _add(self, depth: int, rank: int | None) -> None:
        while len(self.trials) <= depth:
            self.counts.append(np.zeros(MAX_RANK))
            self.trials.append(0)
            self.live_counts.append(np.zeros(MAX_RANK))
            self.live_trials.append(0.0)
        self.trials[depth] += 1
        self.live_trials[depth] += 1.0
        if rank is not None and 1 <= rank <= MAX_RANK:
            self.counts[depth][rank - 1] += 1
            self.live_counts[depth][rank - 1] += 1

    def _age(self, depth: int | None) -> None:
        """A drafting step whose tree was ``depth`` deep: the depths below it go stale."""
        if depth is None or depth < 1:
            return
        for d in range(depth, len(self.live_trials)):
            self.live_counts[d] *= STALE_DECAY
            self.live_trials[d] *= STALE_DECAY

    def _add_root(self, state: bool | None, rank: int | None) -> None:
        if not state:
            return
        self.full_trials += 1
        if rank is not None and 1 <= rank <= MAX_RANK:
            self.full_counts[rank - 1] += 1

    def observe_ranks(
        self, ranks: list[int], state: bool | None = None, depth: int | None = None
    ) -> None:
        """Root-down ranks of one step (``StepRecord.ranks``); ``state``: whether the step
        before drafted and had all its drafts accepted (None: it did not draft, or unknown);
        ``depth``: the drafted tree's depth (None: not known, nothing goes stale)."""
        self.steps += 1
        self._age(depth)
        for d, r in enumerate(ranks):
            self._add(d, int(r))
        if ranks:
            self._add_root(state, int(ranks[0]))

    def observe_chain(self, accepted: int, depth: int, state: bool | None = None) -> None:
        """A chain of ``depth`` drafted tokens of which ``accepted`` were accepted (``state``:
        as :meth:`observe_ranks`)."""
        self.steps += 1
        self._age(depth)
        for d in range(min(accepted + 1, depth)):
            self._add(d, 1 if d < accepted else None)
        if depth > 0:
            self._add_root(state, 1 if accepted > 0 else None)

    def observe_beyond(self, depth: int, rank: int | None) -> None:
        """The bonus token one depth below a fully accepted path of ``depth - 1`` drafts, and its
        ``rank`` in the draft's order there (:attr:`ersd.drafting.Proposal.beyond`): what
        drafting ``depth`` would have observed, made right after accepted tokens like any depth
        below the root.  Not a step: nothing goes stale."""
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
        w = PRIOR_WEIGHT
        counts, trials = self.live_counts, self.live_trials
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


def _smallest_near_best(
    predicted: list[tuple[str, TreeShape, float, float]], plain: float
) -> tuple[str, TreeShape, float, float] | None:
    """Of ``(spec, shape, tokens, seconds)`` candidates, the one to draft: the smallest tree
    whose predicted rate is within :data:`SMALLER_TREE_WITHIN` of the best one's (and above
    ``plain``, if the best is); None without candidates."""
    if not predicted:
        return None
    top = max(t / s for _, _, t, s in predicted)
    floor = (1 - SMALLER_TREE_WITHIN) * top
    floor = max(floor, plain) if top > plain else top
    near = [p for p in predicted if p[2] / p[3] >= floor]
    return min(near, key=lambda p: (p[1].num_nodes, -p[2] / p[3]))


@dataclass
class Choice:
    """One step's decision: the tree drafted (``"none"``: no drafting) and the predictions."""

    tree: str
    predicted: float  # tokens/s over the batch of the chosen candidate
    target_only: float  # tokens/s over the batch without drafting
    best_tree: str | None  # the best drafting candidate (chosen or not)
    best_tree_predicted: float | None
    batch: int
    #: the prediction's two parts for the chosen candidate: new tokens of the batch
    #: (``batch · E[tokens per call]``) and seconds of the step (``predicted`` is their ratio)
    predicted_tokens: float = 0.0
    predicted_seconds: float = 0.0
    #: an exploration step (drafting predicted not to pay, or a plain step while drafting pays)
    explore: bool = False
    #: seconds this decision spent measuring cost curves (0: read from memory or the store)
    measure_seconds: float = 0.0
    #: whether drafting could pay at all (if every drafted token were accepted)
    can_pay: bool = True
    #: the chosen tree's expected tokens per row and step under the pooled profile (in a
    #: batch ``predicted_tokens`` is restated for the rest of the run; this is not)
    step_tokens: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)  # flat fields: no need for dataclasses.asdict's deep copy


class CurveCache:
    """Measured forward-cost curves per model and batch size, owned by whoever shares them: a
    batch engine (every row's chooser), a benchmark run or one CLI call (pass it as
    ``AutoTree(costs=cache)``), else one chooser.  Nothing is stored on the models.

    ``measurements`` counts the curves measured so far: a step during which one was measured is
    not learned from (its time includes the measurement)."""

    def __init__(self, store: CostStore | bool | None = True) -> None:
        self._curves: list[tuple[Any, dict[Any, list[float]]]] = []  # (model, its curves)
        self.measurements = 0
        #: seconds spent measuring curves (not read from the store)
        self.measure_seconds = 0.0
        #: where curves persist across processes (:mod:`ersd.cost_store`; ``True``: the default
        #: store in the model cache, ``None``/``False``: none)
        self.store: CostStore | None = (
            CostStore.default() if store is True else (store if store else None)
        )

    def _of(self, model: Any) -> dict[Any, list[float]]:
        for m, curves in self._curves:
            if m is model:
                return curves
        self._curves.append((model, {}))
        return self._curves[-1][1]

    def curve(self, model: Any, context: list[int], batch: int) -> list[float]:
        """Forward seconds of ``model`` for :data:`ersd.costs.DEFAULT_SIZES` new tokens in each
        of ``batch`` rows: measured once (fresh sessions of the context's last tokens)."""
        curves = self._of(model)
        key = (batch, DEFAULT_SIZES)
        if key not in curves:
            stored = self.store.get_curve(model, batch, DEFAULT_SIZES) if self.store else None
            if stored is not None:
                curves[key] = stored
                return stored
            self.measurements += 1
            t0 = time.perf_counter()
            curves[key] = measure_curve(
                model, measure_prompt(model, context), DEFAULT_SIZES, batch=batch
            )
            self.measure_seconds += time.perf_counter() - t0
            if self.store is not None:
                self.store.put_curve(model, batch, DEFAULT_SIZES, curves[key])
        return curves[key]


def measure_prompt(model: Any, context: list[int]) -> list[int]:
    """The tokens a curve of ``model`` is measured on: ``context``'s last
    :data:`MEASURE_PROMPT_TOKENS`, fewer if the model's window would not hold them and the
    timed forwards (:func:`~ersd.costs.measure_curve`)."""
    keep = MEASURE_PROMPT_TOKENS
    window = getattr(model, "max_length", None)
    # committed timings + the largest call
    room = len(DEFAULT_SIZES) * (MEASURE_REPEATS + 1) + max(DEFAULT_SIZES) + 2
    if window is not None:
        keep = min(keep, window - room)
    return context[-max(keep, 1) :]


def measured_costs(
    target: Any, draft: Any, context: list[int], batch: int, curves: CurveCache
) -> CostModel:
    """A :class:`CostModel` measured (into ``curves``) at batch 1 and the powers of two around
    ``batch`` (``draft=None``: a model-free drafter, no draft cost)."""
    lo = 1 << math.floor(math.log2(batch))
    hi = 1 << math.ceil(math.log2(batch))
    sizes = sorted({1, lo, hi})
    zero = [0.0] * len(DEFAULT_SIZES)
    tgt = [curves.curve(target, context, b) for b in sizes]
    drf = [curves.curve(draft, context, b) if draft is not None else zero for b in sizes]
    return CostModel(
        sizes=list(DEFAULT_SIZES),
        target=tgt[0],
        draft=drf[0],
        meta={"source": "measured by tree='auto'"},
        batch_sizes=sizes,
        target_batch=tgt,
        draft_batch=drf,
    )


def prepare_costs(
    target: Any, draft: Any, context: list[int], max_batch: int, curves: CurveCache
) -> None:
    """Measure into ``curves`` the cost curves ``tree="auto"`` uses for every batch size up to
    ``max_batch``, so that no later generation given ``AutoTree(costs=curves)`` pays for the
    measurement inside its own time (benchmarks call this before timing)."""
    sizes = {1}
    b = 1
    while b < max_batch:
        b *= 2
        sizes.add(b)
    for b in sorted(sizes):
        curves.curve(target, context, b)
        if draft is not None:
            curves.curve(draft, context, b)


@dataclass
class StepTiming:
    """Online correction of the predicted step time for one kind of step (drafting or not):
    measured / predicted forward seconds of the target and the draft, and seconds per row
    outside the forwards — exponential moving averages (weight :data:`TIMING_EMA`).  The
    target's ratio is kept per forward size too (:meth:`target_at`): one ratio scales a curve,
    and a curve whose shape is off (a noisy point, kept in the store for every later run) would
    otherwise rank trees of different sizes wrongly for good."""

    target_ratio: float = 1.0
    draft_ratio: float = 1.0
    overhead: float | None = None  # seconds per row per step outside forwards (None: not seen)
    steps: int = 0
    #: per (target tokens per row, rows) of a timed step: [its target ratio, its steps]
    sizes: dict[tuple[int, int], list[float]] = field(default_factory=dict)

    def seed(self, stored: list[float]) -> None:
        """Start from a stored correction ``[target ratio, draft ratio, overhead]`` (of an
        earlier run at this batch size), weighted as one step: this run's first step then
        moves it by :data:`TIMING_EMA`, not all the way."""
        self.target_ratio, self.draft_ratio, self.overhead = stored
        self.steps = 1

    def stored(self) -> list[float]:
        return [self.target_ratio, self.draft_ratio, self.overhead or 0.0]

    def update(
        self, target: float, draft: float, overhead: float, size: tuple[int, int] | None = None
    ) -> None:
        w = 1.0 if self.steps == 0 else TIMING_EMA
        self.target_ratio += w * (target - self.target_ratio)
        self.draft_ratio += w * (draft - self.draft_ratio)
        old = overhead if self.overhead is None else self.overhead
        self.overhead = old + w * (overhead - old)
        self.steps += 1
        if size is not None:  # a mean over the size's first steps, then the same EMA
            entry = self.sizes.setdefault(size, [target, 0])
            entry[1] += 1
            entry[0] += max(1 / entry[1], TIMING_EMA) * (target - entry[0])

    def target_at(self, size: tuple[int, int]) -> float:
        """The target's ratio for a forward of ``size`` (tokens per row, rows): the size's own
        where this run timed it, shrunk towards the ratio over every size by
        :data:`SIZE_PRIOR_STEPS` pseudo-steps; else the ratio over every size."""
        entry = self.sizes.get(size)
        if entry is None:
            return self.target_ratio
        n = min(entry[1], 1 / TIMING_EMA)  # an EMA holds about 1 / weight steps
        return (n * entry[0] + SIZE_PRIOR_STEPS * self.target_ratio) / (n + SIZE_PRIOR_STEPS)


def sharing(auto: AutoTree, curves: CurveCache) -> AutoTree:
    """``auto`` measuring its cost curves into ``curves`` (unless it names its costs), so that
    generations given it share one measurement (a benchmark's runs, a CLI call's warm-up)."""
    return auto if auto.costs is not None else replace(auto, costs=curves)


def draft_model_of(drafter: Any) -> Any:
    """The draft language model behind a drafter (a model drafter, a hybrid's model part), or
    None for a model-free drafter."""
    from ersd.drafting import ModelDrafter
    from ersd.models.base import LanguageModel

    model = getattr(drafter, "model", None)
    if isinstance(model, ModelDrafter):
        model = model.model
    return model if isinstance(model, LanguageModel) else None


def _method_name(method: Any) -> str:
    return str(getattr(method, "name", "") or method)


class TreeChooser:
    """Chooses each step's tree for one sequence (module docstring); built from an
    :class:`~ersd.tree.AutoTree` by :meth:`ersd.request.Request.resolve`.  ``curves``: where
    measured cost curves are kept (a batch engine's; ``auto.costs`` when that is a
    :class:`CurveCache`; else the chooser's own)."""

    def __init__(
        self,
        auto: AutoTree,
        target: Any,
        drafter: Any,
        method: Any,
        rule: Any,
        temperature: float | None,
        curves: CurveCache | None = None,
        horizon: int | None = None,
    ) -> None:
        from ersd.methods.ersd import ERSD

        self.auto = auto
        self.method = method
        self.target = target
        self.draft_model = draft_model_of(drafter)
        self.ranked = isinstance(rule, ERSD)
        self.temperature = float(temperature or 0.0)  # the stored profile's key
        costs = auto.costs
        if isinstance(costs, CurveCache):  # measured, into the cache the caller shares
            curves, costs = costs, None
        self.curves = curves if curves is not None else CurveCache()
        self.fixed_probs: list[Any] | None = None
        if auto.profile is not None:
            source = auto.profile
            try:
                if isinstance(source, str):
                    f = load_profiles(source)
                    source = f.profiles
                    if costs is None:
                        costs = f.data.get("costs")
                self.fixed_probs = tree_depth_probs(source, temperature)
                expected_block_efficiency_by_depth([(0,)], self.fixed_probs)  # checks the vectors
            except RankProfileError as exc:
                raise InvalidTreeSpecError(f"tree {auto.spec!r}: {exc}") from None
            except (ErsdError, TypeError, ValueError) as exc:
                raise InvalidTreeSpecError(
                    f"tree {auto.spec!r}: the rank profile must be a profile or calibration file, "
                    f"a RankProfile or per-depth rank-probability vectors ({exc})"
                ) from None
        try:
            self.costs = CostModel.from_dict(costs) if costs is not None else None
        except CostModelError as exc:
            raise InvalidTreeSpecError(f"tree {auto.spec!r}: cost model: {exc}") from None
        self.online: OnlineProfile | None = None
        self.stored_prior = False  # the online estimate starts from a stored profile
        if self.fixed_probs is None:
            stored = None
            store = self.curves.store
            if store is not None and self.draft_model is not None:
                stored = store.profile_entry(
                    target, self.draft_model, _method_name(method), self.temperature
                )
            self.stored_prior = stored is not None
            self.online = OnlineProfile(self.ranked, *(stored or (None, None)))
        self.chains: dict[str, TreeShape] = {}
        for k in CHAIN_LENGTHS:
            chain = TreeShape.chain(k)
            if k <= auto.max_nodes and self._supported(chain):
                self.chains[f"chain:{k}"] = chain
        self.last: Choice | None = None
        self._measured: dict[int, CostModel] = {}  # measured costs per batch size
        # predicted (target, draft) forward seconds per (tree, batch size), before correction
        self._parts: dict[tuple[Any, int], tuple[float, float]] = {}
        self.timing = {"plain": StepTiming(), "spec": StepTiming()}
        self._seeded: set[int] = set()  # batch sizes whose stored timing was looked up
        self._timed: dict[tuple[str, int], int] = {}  # steps timed in this run, per kind, batch
        self._timed_kept: dict[str, tuple[int, int]] = {}  # per kind: (steps, rows) last kept
        self._longest: int | None = None  # the longest row's context (a batch's), this step
        #: per row of a batch: [accepted, predicted] drafted tokens so far (row_factor)
        self._row_tokens: dict[Any, list[float]] = {}
        #: per row (None: the one sequence): whether its last step drafted and had all its
        #: drafts accepted (None after a step without drafting) -- the root's state
        self._after: dict[Any, bool | None] = {}
        self._last_row: Any = None  # the row observed last (a lone sequence's key)
        #: the spread of rows' factors and the rows behind it: the default, or an earlier run's
        self._row_spread = (DEFAULT_ROW_SPREAD, 0.0)
        self._spreads: list[float] = []  # factors of this run's rows that have left (keep)
        self._learned = 0  # steps learned from (the decision is kept while this is unchanged)
        #: observations that changed the rank estimate (a subset of ``_learned``); while it and
        #: the rows' states are unchanged, the candidates and their expected tokens are too
        self._profile_version = 0
        self._shapes: tuple[Any, dict[str, tuple[TreeShape, float]]] | None = None
        self._decided: tuple[tuple[int, int, bool], TreeShape | None] | None = None
        self._chosen: tuple[CostModel, TreeShape | None, int] | None = None
        self._epoch = self.curves.measurements
        self._plain_run = 0  # steps in a row without drafting
        self._spec_run = 0  # steps in a row with drafting
        self._plain_explored = False  # the early plain step was taken
        self._can_pay = True  # drafting can pay under the best plausible acceptance
        self._verdict: tuple[int, int] | None = None  # (batch, steps left): "cannot pay" kept
        self._start: int | None = None  # the context's length at the first step (horizon)
        self._ever_drafted = False  # the draft session has been fed (else it prefills lazily)
        self._catchup = 0  # tokens the draft must catch up on in the step just chosen
        self.elapsed = 0.0  # seconds of the steps observed so far (the run's time)
        self.explore_spent = 0.0  # predicted seconds lost to exploration steps so far
        #: new tokens per row the run may generate (its ``max_new_tokens``): the exploration
        #: budget is a share of the run's time, taken as the larger of the time so far and the
        #: predicted time of the whole run at plain decoding's rate (None: the time so far)
        self.horizon = horizon
        self._projected = 0.0  # predicted seconds of the whole run at plain decoding's rate
        # the online observations already folded into the store (keep_profile)
        self._kept_counts: list[np.ndarray] = []
        self._kept_trials: list[int] = []
        self._kept_steps = 0

    def _supported(self, shape: TreeShape) -> bool:
        try:
            self.method.check_shape(shape)
        except UnsupportedTreeError:
            return False
        return True

    def depth_probs(self, rows: Sequence[Any] | None = None) -> list[Any]:
        """The per-depth estimate for a step of ``rows`` (batch row keys; None: the row
        observed last, a lone sequence), from each row's state (:class:`OnlineProfile`)."""
        if self.fixed_probs is not None:
            return self.fixed_probs
        assert self.online is not None
        return self.online.depth_probs(self._states(rows))

    def _states(self, rows: Sequence[Any] | None) -> list[bool | None]:
        """The root state of each of ``rows`` (None: the row observed last)."""
        keys = [self._last_row] if rows is None else list(rows)
        return [self._after.get(k) for k in keys]

    def predicted_shapes(
        self, rows: Sequence[Any] | None = None
    ) -> dict[str, tuple[TreeShape, float]]:
        """Each candidate tree with its expected tokens per row under the estimate for ``rows``
        (:meth:`depth_probs`, :meth:`candidates`), kept while no observation has changed the
        estimate: a step without drafting changes only the timing, and recomputing the optimal
        trees and their expectations after every such step was most of what auto added to
        plain decoding's loop."""
        key = (self._profile_version, tuple(self._states(rows)))
        if self._shapes is None or self._shapes[0] != key:
            probs = self.depth_probs(rows)
            shapes = {
                spec: (shape, expected_tokens(shape, probs))
                for spec, shape in self.candidates(probs).items()
            }
            self._shapes = (key, shapes)
        return self._shapes[1]

    def candidates(self, probs: list[Any]) -> dict[str, TreeShape]:
        """Chains, and (ERSD at T > 0) optimal trees of :data:`TREE_SIZES` nodes under
        ``probs`` (a tree equal to an earlier candidate is left out)."""
        out = dict(self.chains)
        sizes = [k for k in TREE_SIZES if k <= self.auto.max_nodes]
        if self.ranked and sizes:
            seen = {s.paths for s in out.values()}
            order = tunstall_order(probs, sizes[-1])
            for k in sizes:
                shape = TreeShape(tuple(sorted(order[:k], key=lambda t: (len(t), t))))
                if shape.paths not in seen and self._supported(shape):
                    seen.add(shape.paths)
                    out[f"optimal:{k}"] = shape
        return out

    def costs_at(self, context: list[int], batch: int) -> CostModel:
        if self.costs is not None:
            return self.costs
        if batch not in self._measured:
            self._measured[batch] = measured_costs(
                self.target, self.draft_model, context, batch, self.curves
            )
        return self._measured[batch]

    def _forward_parts(self, costs: CostModel, shape: TreeShape, batch: int) -> tuple[float, float]:
        """Predicted (target, draft) forward seconds of a step with ``shape`` (uncorrected)."""
        key = (shape.paths, batch)  # the costs at one batch size never change
        if key not in self._parts:
            target = costs.target_cost(shape.num_nodes + 1, batch)
            draft = costs.step_time(shape, batch) - target - costs.overhead * batch
            self._parts[key] = (target, draft)
        return self._parts[key]

    def _step_time(self, costs: CostModel, shape: TreeShape, batch: int) -> float:
        """Predicted seconds of a drafting step, corrected by the run's own steps."""
        target, draft = self._forward_parts(costs, shape, batch)
        t, plain = self.timing["spec"], self.timing["plain"]
        overhead = t.overhead
        if overhead is None:  # not timed yet: at least what a plain step spends outside its
            overhead = max(costs.overhead, plain.overhead or 0.0)  # forward (it does all that)
        ratio = self._target_ratio("spec", (shape.num_nodes + 1, batch))
        return ratio * target + t.draft_ratio * draft + overhead * batch

    def _target_ratio(self, kind: str, size: tuple[int, int] = (1, 1)) -> float:
        """The target's measured / predicted forward time for ``kind`` of step with ``size``
        (tokens per row, rows: :meth:`StepTiming.target_at`); a kind not timed yet borrows
        the other kind's (one model, one machine: a curve measured in other conditions is off
        for both alike)."""
        own = self.timing[kind]
        other = self.timing["plain" if kind == "spec" else "spec"]
        return (own if own.steps or not other.steps else other).target_at(size)

    def _plain_rate(self, costs: CostModel, batch: int) -> float:
        """Predicted tokens/s over the batch without drafting, corrected likewise."""
        t = self.timing["plain"]
        overhead = costs.overhead_plain if t.overhead is None else t.overhead
        return batch / (
            self._target_ratio("plain", (1, batch)) * costs.target_cost(1, batch) + overhead * batch
        )

    def _unseen(self, context: list[int]) -> int:
        """Tokens the draft session has not been fed yet: the whole context before the first
        drafting step (sessions prefill lazily, on their first forward; in a batch, the longest
        row's, as the rows are fed as one padded forward), else one per row and plain step
        since the last drafting step."""
        if self._ever_drafted:
            return self._plain_run
        return max(len(context), self._longest or 0)

    def _seed_timing(self, batch: int) -> None:
        """Start the timing corrections of a kind not timed yet from the cost store's entry for
        the pair at ``batch`` rows (once per batch size; measured curves only: a stored
        correction is relative to this machine's measured curve, not to a given cost model)."""
        if batch in self._seeded:
            return
        self._seeded.add(batch)
        store = self.curves.store
        if self.costs is not None or store is None or self.draft_model is None:
            return
        stored_timing = store.get_timing(self.target, self.draft_model, batch)
        for kind, stored in stored_timing.items():
            if kind == "rows":
                self._row_spread = (stored[0], stored[1])
            elif self.timing[kind].steps == 0:
                self.timing[kind].seed(stored)

    def keep_timing(self) -> bool:
        """Keep this run's timing corrections in the cost store (:data:`KEEP_TIMING_AFTER`),
        each kind under the batch size it was timed at most, unless nothing was timed (and no
        row left) since it was last kept -- a batch's rows finishing in one step would
        otherwise write the same entry once per row; returns whether anything was written."""
        store = self.curves.store
        if self.costs is not None or store is None or self.draft_model is None:
            return False
        wrote = False
        for kind, timing in self.timing.items():
            counts = {b: n for (k, b), n in self._timed.items() if k == kind}
            if not counts:
                continue
            batch = max(counts, key=lambda b: counts[b])
            state = (sum(counts.values()), len(self._spreads))
            if counts[batch] >= KEEP_TIMING_AFTER and self._timed_kept.get(kind) != state:
                self._timed_kept[kind] = state
                keep = {kind: timing.stored()}
                if kind == "spec" and batch > 1 and len(self._spreads) >= 2:
                    keep["rows"] = list(self.row_spread(pstdev(self._spreads), len(self._spreads)))
                store.put_timing(self.target, self.draft_model, batch, keep)
                wrote = True
        return wrote

    def row_spread(self, spread: float, rows: float) -> tuple[float, float]:
        """The spread of rows' factors and the measured rows behind it: the kept one (or
        :data:`DEFAULT_ROW_SPREAD`, weighted as :data:`ROW_SPREAD_PRIOR_ROWS` rows) pooled with
        ``spread`` over ``rows`` more rows (variances weighted by rows)."""
        old, behind = self._row_spread
        weight = behind if behind > 0 else ROW_SPREAD_PRIOR_ROWS
        pooled = math.sqrt((weight * old**2 + rows * spread**2) / (weight + rows))
        return pooled, min(behind + rows, ROW_SPREAD_MAX_ROWS)

    def row_factor(self, row: Any) -> float:
        """A batch row's acceptance relative to the pool's: ``(accepted + W) / (predicted + W)``
        drafted tokens over its drafting steps so far (:data:`ROW_PRIOR_TOKENS`)."""
        accepted, predicted = self._row_tokens.get(row, (0.0, 0.0))
        return (accepted + ROW_PRIOR_TOKENS) / (predicted + ROW_PRIOR_TOKENS)

    def forget_row(self, row: Any) -> None:
        """A row left the batch: its factor joins the spread kept for the next run (if it
        drafted enough to say), and its key is dropped (ids are reused)."""
        self._after.pop(row, None)
        tokens = self._row_tokens.pop(row, None)
        if tokens is not None and tokens[1] >= ROW_SPREAD_AFTER:
            self._spreads.append(tokens[0] / tokens[1])

    def _finish_rates(
        self,
        costs: CostModel,
        predicted: list[tuple[str, TreeShape, float, float]],
        rows: Sequence[tuple[Any, int]],
    ) -> tuple[list[tuple[str, TreeShape, float, float]], float]:
        """The candidates' and plain decoding's rates over the rest of a batch's run (its rows'
        ``(key, tokens left)``): the tokens left over the seconds until the last row is done
        (:func:`batch_finish_seconds`), each row's expected tokens per step scaled by its own
        acceptance (:meth:`row_factor`), plus, for a row with few observations, its expected
        place among the batch's rows (:func:`order_statistics`, the rows ranked by their
        factors so far) times the spread of rows' factors (:meth:`row_spread`).  A candidate's
        tokens are restated so that tokens / seconds is that rate (its seconds stay one
        step's)."""
        left = [max(int(n), 1) for _, n in rows]
        total = float(sum(left))
        spread = self._row_spread[0]
        own = [self.row_factor(key) for key, _ in rows]
        ranked = sorted(range(len(rows)), key=lambda i: own[i])
        factors = [0.0] * len(rows)
        for z, i in zip(order_statistics(len(rows)), ranked, strict=True):
            seen = self._row_tokens.get(rows[i][0], (0.0, 0.0))[1]
            unsure = ROW_PRIOR_TOKENS / (seen + ROW_PRIOR_TOKENS)
            factors[i] = max(own[i] + z * spread * unsure, 0.0)
        plain = total / batch_finish_seconds(left, lambda b: b / self._plain_rate(costs, b))
        out = []
        for spec, shape, tokens, seconds in predicted:
            gain = tokens / len(rows) - 1.0  # drafted tokens accepted per step, pooled
            steps = [
                n / min(1.0 + f * gain, 1.0 + shape.depth)
                for n, f in zip(left, factors, strict=True)
            ]
            finish = batch_finish_seconds(steps, functools.partial(self._step_time, costs, shape))
            out.append((spec, shape, total / finish * seconds, seconds))
        return out, plain

    @staticmethod
    def _drafting_can_pay(ceiling: float, plain: float) -> bool:
        """Whether the best rate with every drafted token accepted beats plain decoding."""
        return ceiling > plain

    def _pays_off(
        self, costs: CostModel, context: list[int], batch: int, plain: float, rate: float
    ) -> bool:
        """Whether drafting at ``rate`` (tokens/s over the batch) for the rest of the run beats
        plain decoding once the draft's catch-up on the tokens it has not seen is paid -- on the
        first drafting step its whole prompt (lazy prefill): a short run on a long prompt does
        not start the draft for a small gain.  The rest of the run: the :attr:`horizon` less
        the tokens generated since the first step, per row."""
        catchup = self._unseen(context)
        if catchup <= 1:
            return True
        left = max(self.horizon or 0, 1) - (len(context) - (self._start or len(context)))
        tokens = batch * max(left, 1)
        cost = self.timing["spec"].draft_ratio * costs.draft_cost(catchup, batch)
        return cost + tokens / rate < tokens / plain

    def _budget_allows(self, cost: float) -> bool:
        """Whether an exploration step predicted to lose ``cost`` seconds keeps the time lost to
        exploration within :data:`EXPLORE_BUDGET` of the run's time: the time so far, or (with
        a :attr:`horizon`) the predicted time of the whole run at plain decoding's rate, if
        larger -- so a run that states its length can afford its first exploring step early,
        while a run of unknown length only spends what it has already run."""
        run = max(self.elapsed, self._projected)
        return self.explore_spent + max(cost, 0.0) <= EXPLORE_BUDGET * run

    def choose(
        self,
        context: list[int],
        batch: int = 1,
        longest: int | None = None,
        rows: Sequence[tuple[Any, int]] | None = None,
    ) -> TreeShape | None:
        """This step's tree (None: no drafting) for a row with committed ``context`` among
        ``batch`` live rows; the decision is kept in :attr:`last`.  In a batch: ``longest``, the
        longest row's context length, and ``rows``, each live row's ``(key, tokens it may
        still emit)`` -- the rates are then over the rest of the batch's run
        (:meth:`_finish_rates`), not one step's."""
        if self._start is None:
            self._start = len(context)
        self._longest = longest
        verdict = self._verdict
        if verdict is not None and verdict[0] == batch and verdict[1] > 0:
            self._verdict = (batch, verdict[1] - 1)  # drafting cannot pay: not re-decided yet
            return self._repeat(None, context, batch)
        self._verdict = None
        explore = self._plain_run >= EXPLORE_AFTER and self._can_pay
        cached = self._decided  # kept while nothing was learned (unless it is time to explore)
        fresh = cached is not None and cached[0] == (batch, self._learned, rows is not None)
        if cached is not None and fresh and not (explore and cached[1] is None):
            return self._repeat(cached[1], context, batch)
        measured = self.curves.measure_seconds
        costs = self.costs_at(context, batch)
        measured = self.curves.measure_seconds - measured
        self._seed_timing(batch)
        shapes = self.predicted_shapes([k for k, _ in rows] if rows is not None else None)
        plain = self._plain_rate(costs, batch)
        if self.horizon is not None:  # plain is over the batch: a row's rate is plain / batch
            self._projected = self.horizon * batch / plain
        best_spec, best_shape, best_rate, best_parts = None, None, -math.inf, (0.0, 0.0)
        predicted = [  # (spec, shape, tokens over the batch, seconds) per candidate
            (
                spec,
                shape,
                batch * tokens,
                self._step_time(costs, shape, batch),
            )
            for spec, (shape, tokens) in shapes.items()
        ]
        step_tokens = {spec: tokens / batch for spec, _, tokens, _ in predicted}
        if rows is not None and len(rows) == batch > 1:
            predicted, plain = self._finish_rates(costs, predicted, rows)
        ceiling = max(  # the best rate if every drafted token were accepted
            (batch * (1 + shape.depth) / sec for _, shape, _, sec in predicted), default=-math.inf
        )
        best = _smallest_near_best(predicted, plain)
        if best is not None:
            best_spec, best_shape = best[0], best[1]
            best_rate, best_parts = best[2] / best[3], (best[2], best[3])
        # drafting cannot pay even if every draft were accepted: never draft, never explore
        self._can_pay = self._drafting_can_pay(ceiling, plain)
        if (
            not self._can_pay
            and ceiling <= (1 - CANNOT_PAY_MARGIN) * plain
            and self.timing["plain"].steps >= CANNOT_PAY_TIMED
        ):  # a clear verdict, on plain steps timed in this run (not one step's noise)
            self._verdict = (batch, CANNOT_PAY_RECHECK - 1)
        spec_t, plain_t = self.timing["spec"], self.timing["plain"]
        drafts = best_shape is not None and best_rate > plain and self._can_pay
        if drafts and batch > 1 and not self._ever_drafted:  # starting a batch's draft
            drafts = best_rate >= (1 + BATCH_START_MARGIN) * plain
        if drafts and self.horizon is not None:
            drafts = self._pays_off(costs, context, batch, plain, best_rate)
        exploring = False
        if not drafts and best_shape is not None and self._can_pay and explore:
            # exploration: draft the best tree once, to measure drafting again (profile, step
            # time) -- if the time it is predicted to lose (its step, the draft's catch-up on
            # the tokens it has not seen, less the plain time of the same tokens) fits the budget
            catchup = self._unseen(context)
            lost = (
                best_parts[1]
                + (spec_t.draft_ratio * costs.draft_cost(catchup, batch) if catchup > 1 else 0.0)
                - best_parts[0] / plain
            )
            if self._budget_allows(lost):
                drafts = exploring = True
                self.explore_spent += max(lost, 0.0)
        elif drafts and (
            self._spec_run >= EXPLORE_PLAIN_AFTER
            or (
                not plain_t.steps
                and spec_t.steps >= 2
                and not self._plain_explored
                and (batch > 1 or best_rate < (1 + EXPLORE_PLAIN_DOUBT) * plain)
            )
        ):  # exploration the other way: time a step without drafting (within the budget)
            lost = batch / plain - batch / best_rate  # B tokens plain, not at the best rate
            if self._budget_allows(lost):
                drafts, exploring, self._plain_explored = False, True, True
                self.explore_spent += max(lost, 0.0)
        self.last = Choice(
            tree=best_spec if drafts and best_spec else "none",
            predicted=best_rate if drafts else plain,
            target_only=plain,
            best_tree=best_spec,
            best_tree_predicted=best_rate if best_spec else None,
            batch=batch,
            predicted_tokens=best_parts[0] if drafts else float(batch),
            predicted_seconds=best_parts[1] if drafts else batch / plain,
            explore=exploring,
            measure_seconds=measured,
            can_pay=self._can_pay,
            step_tokens=step_tokens[best_spec] if drafts and best_spec else 1.0,
        )
        chosen = best_shape if drafts else None
        self._decided = None if exploring else ((batch, self._learned, rows is not None), chosen)
        self._chosen = (costs, chosen, batch)
        return self._count(chosen, context)

    def _repeat(self, chosen: TreeShape | None, context: list[int], batch: int) -> TreeShape | None:
        """The last decision again (``chosen``), without deciding: nothing measured or explored
        in this step."""
        self._chosen = (self._chosen[0], chosen, batch) if self._chosen else None
        if self.last is not None and (self.last.measure_seconds or self.last.explore):
            self.last = replace(self.last, measure_seconds=0.0, explore=False)
        return self._count(chosen, context)

    def _count(self, chosen: TreeShape | None, context: list[int]) -> TreeShape | None:
        self._catchup = self._unseen(context) if chosen is not None else 0
        if chosen is not None:
            self._ever_drafted = True
        self._plain_run = 0 if chosen is not None else self._plain_run + 1
        self._spec_run = 0 if chosen is None else self._spec_run + 1
        return chosen

    def observe_times(
        self,
        batch: int,
        draft: float,
        target: float,
        total: float,
        *,
        prefill: bool = False,
        step: TreeShape | bool | None = False,
    ) -> None:
        """Learn the step time of the step just verified (``batch`` rows; its draft and target
        forward seconds and its total seconds) for the online correction.  ``step``: in a
        batch, the largest tree any row drafted (None: no row drafted) — the shared forwards
        cost what it costs, whatever this row chose; by default this row's own choice.
        Skipped: a step during which cost curves were measured, and one whose forwards included
        a prompt's prefill (``prefill``: a sequence's first step, a row joining the batch)."""
        self.elapsed += total
        epoch, self._epoch = self._epoch, self.curves.measurements
        if self._chosen is None or epoch != self.curves.measurements or batch < 1 or prefill:
            return
        costs, shape, b = self._chosen
        if b != batch:
            return
        if step is not False:
            shape = step if isinstance(step, TreeShape) else None
        overhead = max(total - draft - target, 0.0) / batch
        if shape is None:
            kind = "plain"
            predicted_target = costs.target_cost(1, batch)
            ratio = target / max(predicted_target, 1e-9)
            self.timing["plain"].update(ratio, 1.0, overhead, (1, batch))
        elif self._catchup > 2:  # the draft's forwards fed tokens of plain steps (or its
            return  # prompt: lazy prefill): not what a drafting step costs
        else:
            kind = "spec"
            pt, pd = self._forward_parts(costs, shape, batch)
            dr = draft / pd if pd > 0 else 1.0
            size = (shape.num_nodes + 1, batch)
            self.timing["spec"].update(target / max(pt, 1e-9), dr, overhead, size)
        self._timed[kind, batch] = self._timed.get((kind, batch), 0) + 1
        self._learned += 1  # the decision may change

    def keep_profile(self) -> bool:
        """Fold the rank observations made since the last call into the cost store's profile
        of this pair (method, temperature), so that the next run -- in this process or another
        -- starts from them instead of the generic prior (a run without a stored profile may
        otherwise never afford its first drafting step).  Kept only from
        :data:`KEEP_PROFILE_AFTER` drafting steps on; returns whether anything was written.
        The run's timing corrections are kept too (:meth:`keep_timing`)."""
        self.keep_timing()
        online, store = self.online, self.curves.store
        if online is None or store is None or self.draft_model is None:
            return False
        if online.steps - self._kept_steps < KEEP_PROFILE_AFTER:
            return False
        kept_c, kept_n = self._kept_counts, self._kept_trials
        counts = [c - (kept_c[d] if d < len(kept_c) else 0) for d, c in enumerate(online.counts)]
        trials = [n - (kept_n[d] if d < len(kept_n) else 0) for d, n in enumerate(online.trials)]
        store.merge_profile(
            self.target,
            self.draft_model,
            _method_name(self.method),
            self.temperature,
            [list(map(float, c)) for c in counts],
            trials,
        )
        self._kept_counts = [c.copy() for c in online.counts]
        self._kept_trials = list(online.trials)
        self._kept_steps = online.steps
        return True

    @property
    def learns_beyond(self) -> bool:
        """Whether :meth:`observe_beyond` learns anything: an online estimate whose observations
        are ranks (ERSD) or deterministic acceptances (temperature 0, where a drafted token is
        accepted exactly when it is the target's)."""
        return self.online is not None and (self.ranked or self.temperature == 0.0)

    def observe_beyond(self, depth: int, rank: int | None) -> None:
        """The last step's bonus token, one depth below its fully accepted path, and its rank in
        the draft's order there (:attr:`ersd.drafting.Proposal.beyond`): an observation of
        ``depth`` drafting it would have made, seen at no forward's cost.  While auto drafts
        short chains in an easy stretch, these are its only observations of the depths below."""
        if not self.learns_beyond:
            return
        assert self.online is not None
        self.online.observe_beyond(depth, rank)  # ignores the root (depth 1), never below a path
        self._learned += 1
        self._profile_version += 1

    def observe(
        self, ranks: list[int], accepted: int, depth: int, row: Any = None
    ) -> dict[str, Any] | None:
        """Learn from a verified step (its ranks, accepted drafts and drafted depth; ``row``:
        the batch row's key, for :meth:`row_factor`); returns the step's decision as a dict
        (for :attr:`ersd.StepRecord.choice`)."""
        last = self.last
        if row is not None and depth > 0 and last is not None and last.tree != "none":
            tokens = self._row_tokens.setdefault(row, [0.0, 0.0])
            tokens[0] += accepted
            tokens[1] += max(last.step_tokens - 1.0, 0.0)
            self._learned += 1  # the batch's finish time may change the decision
        self._last_row = row
        state = self._after.get(row)
        if self.online is not None and depth > 0:
            self._learned += 1
            self._profile_version += 1
            if self.ranked:
                self.online.observe_ranks(ranks, state, depth)
            else:
                self.online.observe_chain(accepted, depth, state)
        after = accepted >= depth if depth > 0 else None
        if after != state:
            self._after[row] = after
            self._learned += 1  # the next step's root estimate changes
        return self.last.to_dict() if self.last is not None else None


__all__ = [
    "BATCH_START_MARGIN",
    "CANNOT_PAY_MARGIN",
    "CANNOT_PAY_RECHECK",
    "CANNOT_PAY_TIMED",
    "CHAIN_LENGTHS",
    "DEFAULT_ROW_SPREAD",
    "EXPLORE_AFTER",
    "EXPLORE_BUDGET",
    "EXPLORE_PLAIN_AFTER",
    "EXPLORE_PLAIN_DOUBT",
    "KEEP_PROFILE_AFTER",
    "KEEP_TIMING_AFTER",
    "PRIOR_RANK_PROBS",
    "PRIOR_WEIGHT",
    "ROW_PRIOR_TOKENS",
    "ROW_SPREAD_AFTER",
    "SIZE_PRIOR_STEPS",
    "SMALLER_TREE_WITHIN",
    "STALE_DECAY",
    "TREE_SIZES",
    "Choice",
    "CurveCache",
    "OnlineProfile",
    "StepTiming",
    "TreeChooser",
    "batch_finish_seconds",
    "draft_model_of",
    "expected_tokens",
    "measure_prompt",
    "measured_costs",
    "order_statistics",
    "prepare_costs",
    "sharing",
    "tunstall_order",
]
