"""Dynamic ERSD trees: the draft grows each step's tree best-first from its own races.

At every context it drafts, the draft model's race ``E_i / q_i**beta`` (the race ERSD shares with
the target; ``beta`` = the rule's draft sharpness, 1 by default) gives the candidates (ranks 1, 2,
...) and the **margin** ``log(s_2 / s_1)`` between the winner's and the runner-up's scores. A
calibrated :class:`~ersd.theory.margin.MarginPredictor` maps (depth, margin) to ``a_r = P(target's
winner = the draft's rank-r candidate)``; a node's value is its predicted reach probability (the
product of ``a_r`` along its path) and :func:`~ersd.drafting.policy.plan_round` adds nodes
best-first under a budget of ``K`` drafted tokens (and a depth cap), one draft forward per round as
for static trees. The cost-aware variant also stops where the predicted tokens per second (a cost
model such as :class:`ersd.costs.CostModel`) is highest. Each proposal reports its expected tokens
per target call, ``1 + Σ reach`` (``Proposal.expected_tokens`` → ``StepRecord.expected_tokens``).

Exactness is untouched: the tree is a function of the draft side only, and ERSD emits the
target's race winners whatever the tree (it stays drafter invariant).  SD, SpecInfer and SpecTr
get the same specs grown from the draft's confidence instead (their i.i.d. lanes carry no race
margin): :mod:`ersd.drafting.confidence`.  At temperature 0 the tree is a chain of
``min(K, depth cap)`` greedy tokens.

Spec strings (parsed by :mod:`ersd.tree_spec`; their drafter is made by
:func:`ersd.drafting.grown.dynamic_drafter`):
``dynamic:K`` (depth cap K), ``dynamic:K@D`` (depth cap D), ``dynamic-cost:K[@D]`` (cost-aware;
the drafter must carry a cost model).  Without a calibrated predictor the drafter starts from a
weak prior and learns online from its own observations: at each verified context the emitted
token is the target's race winner, whose rank in the draft's race the drafter computes itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ersd.drafting.base import Proposal
from ersd.drafting.model import ModelDrafter, ModelDraftSession
from ersd.drafting.policy import CostState, OpenContext, StepCosts, plan_round
from ersd.errors import GenerationInputError, UnsupportedTreeError
from ersd.methods import DraftTree, GreedyRule, Method
from ersd.methods.ersd import ERSD
from ersd.models.base import LanguageModel, ModelSession
from ersd.probs import SamplingParams, logits_to_probs
from ersd.race import STREAM_RACE, RaceNoise, race_scores
from ersd.theory.margin import MarginPredictor, MarginTable, race_margin
from ersd.tree import MAX_TREE_DEPTH, MAX_TREE_NODES, TreeShape
from ersd.tree_spec import DynamicSpec, parse_dynamic


def check_budget(budget: Any, max_depth: Any) -> None:
    """A dynamic drafter's budget and depth cap (None: the budget) must be integers >= 1."""
    for name, v, bound in (
        ("budget", budget, MAX_TREE_NODES),
        ("max_depth", max_depth, MAX_TREE_DEPTH),
    ):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= bound):
            raise GenerationInputError(
                f"{name} must be an integer in 1..{bound} (ersd.tree's default bound on draft "
                f"trees), got {v!r}"
            )
    if max_depth is None and isinstance(budget, int) and budget > MAX_TREE_DEPTH:
        raise GenerationInputError(
            f"a budget of {budget} tokens needs a depth cap of at most {MAX_TREE_DEPTH} "
            f"(max_depth=, or 'dynamic:{budget}@16')"
        )


@dataclass(frozen=True)
class MarginEvent:
    """One verified context with a known draft race: the target's winner had ``rank`` there;
    ``children`` ranks were drafted, predicted to hold the winner with probability
    ``predicted`` (None when no predictor was used)."""

    depth: int
    margin: float
    rank: int
    children: int
    predicted: float | None

    @property
    def accepted(self) -> bool:
        return self.rank <= self.children


#: draft sharpness values :class:`SharpnessFit` scores by default
SHARPNESS_GRID = (0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.7, 2.0)


class SharpnessFit:
    """Which draft sharpness ``beta`` would have proposed the target's winner most often.

    At every verified ERSD context (the draft's ``q``, the race noise ``E`` and the target's
    winner ``y``) it counts, for each ``beta`` of ``grid``, whether ``argmin_i E_i / q_i**beta``
    is ``y``: the chain's per-token acceptance under that sharpness.  The counts do not depend on
    the sharpness the text was drafted with (ERSD's text is the target's whatever the drafter), so
    one calibration run scores every ``beta``.  :meth:`best` is the most accepting one.
    """

    def __init__(self, grid: Sequence[float] = SHARPNESS_GRID) -> None:
        if not grid or any(not (b > 0 and math.isfinite(b)) for b in grid):
            raise GenerationInputError(f"a sharpness grid needs numbers > 0, got {list(grid)!r}")
        self.grid = [float(b) for b in grid]
        self.hits = np.zeros(len(self.grid), dtype=np.int64)
        self.contexts = 0

    def add(self, q: torch.Tensor, e: torch.Tensor, winner: int) -> None:
        with np.errstate(divide="ignore"):
            log_q = np.log(q.cpu().numpy())
            log_e = np.log(e.cpu().numpy())
        for i, beta in enumerate(self.grid):
            if int(np.argmin(log_e - beta * log_q)) == winner:  # -inf log q: +inf, never wins
                self.hits[i] += 1
        self.contexts += 1

    def rates(self) -> list[float]:
        return [float(h) / self.contexts if self.contexts else 0.0 for h in self.hits]

    def best(self) -> float:
        """The sharpness with the most hits (the one nearest 1 among ties); 1 without data."""
        if not self.contexts:
            return 1.0
        top = self.hits.max()
        return min(
            (b for b, h in zip(self.grid, self.hits, strict=True) if h == top),
            key=lambda b: abs(b - 1.0),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "grid": self.grid,
            "acceptance": self.rates(),
            "contexts": self.contexts,
            "best": self.best(),
        }


@dataclass
class _Race:
    depth: int  # depth of the children drafted here (1 = children of the root)
    scores: torch.Tensor  # E_i / q_i**beta
    tokens: list[int]  # candidates, best first
    margin: float
    reach: float = 1.0
    accept: np.ndarray = field(default_factory=lambda: np.zeros(0))
    children: int = 0
    q: torch.Tensor | None = None  # the draft's probabilities (kept for a SharpnessFit)
    noise: torch.Tensor | None = None  # the race's exponentials (idem)


def _race(
    logits: torch.Tensor,
    params: SamplingParams,
    noise: RaceNoise,
    key: int,
    m: int,
    depth: int,
    rule: ERSD,
) -> tuple[torch.Tensor, _Race]:
    """The draft's race at one context: (draft probabilities, race with ``m`` candidates).

    The candidates are ERSD's drafting order (:func:`ersd.race.race_ranking`): the smallest
    ``E_i / q_i**beta`` first (``beta``: the rule's draft sharpness), ties to the lowest token id,
    zero-mass tokens never.
    """
    q = logits_to_probs(logits, params)
    e = noise.exponentials(key, STREAM_RACE)
    scores = race_scores(rule.race_probs(q), e)
    k = min(max(m, 2), scores.numel())
    vals, idx = torch.topk(scores, k, largest=False, sorted=True)
    pairs = sorted(zip(vals.tolist(), idx.tolist(), strict=True))
    tokens = [i for v, i in pairs[:m] if v != math.inf]
    margin = race_margin(pairs[0][0], pairs[1][0]) if len(pairs) > 1 else math.inf
    return q, _Race(depth, scores, tokens, margin, q=q, noise=e)


class RaceDraftSession(ModelDraftSession):
    """A model draft session that keeps the draft's race at every context it drafts for ERSD
    and, on ``observe``, reports the target winner's rank there (:class:`MarginEvent`)."""

    parallel_grow = False  # it reports to shared state (a margin table, a predictor, counters)

    def __init__(
        self,
        session: ModelSession,
        on_event: Callable[[MarginEvent], None] | None,
        fit: SharpnessFit | None = None,
    ) -> None:
        super().__init__(session)
        self._races: dict[int, _Race] = {}
        self._on_event = on_event
        self._fit = fit

    def _race_at(
        self,
        tree: DraftTree,
        ctx: int,
        logits: torch.Tensor,
        m: int,
        params: SamplingParams,
        noise: RaceNoise,
        rule: ERSD,
    ) -> _Race:
        depth = tree.depth_of(tree.node_of(ctx)) + 1
        q, race = _race(logits, params, noise, tree.keys[ctx], m, depth, rule)
        tree.draft_probs[ctx] = q
        self._races[ctx] = race
        return race

    def _draft_at(
        self,
        tree: DraftTree,
        ctx: int,
        logits: torch.Tensor,
        num_children: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
    ) -> list[int]:
        if not isinstance(rule, ERSD):
            return super()._draft_at(tree, ctx, logits, num_children, rule, params, noise)
        race = self._race_at(tree, ctx, logits, num_children, params, noise, rule)
        race.children = len(race.tokens)
        return race.tokens

    def observe(self, tokens: Sequence[int], accepted: Sequence[int]) -> None:
        if self._on_event is not None:
            path = [DraftTree.ROOT] + [DraftTree.context_of(n) for n in accepted]
            for ctx, tok in zip(path, tokens, strict=False):
                race = self._races.get(ctx)
                if race is None:
                    break
                s = race.scores[int(tok)]
                rank = (
                    race.scores.numel() + 1
                    if math.isinf(float(s))
                    else int((race.scores < s).sum().item()) + 1
                )
                pred = float(race.accept[: race.children].sum()) if race.accept.size else None
                self._on_event(MarginEvent(race.depth, race.margin, rank, race.children, pred))
                if self._fit is not None and race.q is not None and race.noise is not None:
                    self._fit.add(race.q, race.noise, int(tok))
        self._races = {}
        super().observe(tokens, accepted)


class MarginRecorder:
    """A :class:`~ersd.drafting.Drafter` that drafts the static shapes it is given (like
    :class:`ModelDrafter`) and counts, in ``table``, the target winner's rank by depth and margin
    at every verified ERSD context: the calibration data of the dynamic policy.  With ``fit`` (a
    :class:`SharpnessFit`) it also scores every draft sharpness of its grid there."""

    def __init__(
        self,
        model: LanguageModel,
        table: MarginTable | None = None,
        fit: SharpnessFit | None = None,
    ) -> None:
        self.model = model.model if isinstance(model, ModelDrafter) else model
        self.table = table if table is not None else MarginTable.empty()
        self.fit = fit

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    def start_drafting(self, prompt: Sequence[int]) -> RaceDraftSession:
        return RaceDraftSession(self.model.start(list(prompt)), self._record, self.fit)

    def _record(self, ev: MarginEvent) -> None:
        self.table.add(ev.depth, ev.margin, ev.rank)


def as_predictor(source: Any) -> MarginPredictor:
    """A :class:`MarginPredictor` from a predictor, a margin table or a rank profile with one."""
    if isinstance(source, MarginPredictor):
        return source
    if isinstance(source, MarginTable):
        return MarginPredictor(source)
    if hasattr(source, "margin"):
        return MarginPredictor.from_profile(source)
    raise GenerationInputError(
        "predictor must be an ersd.theory.margin.MarginPredictor, a MarginTable or a RankProfile "
        f"with a margin table (from `ersd bench calibrate`), got {type(source).__name__}"
    )


class DynamicDrafter:
    """A :class:`~ersd.drafting.Drafter` growing dynamic ERSD trees (module docstring).

    ``budget`` drafted tokens per step, depth cap ``max_depth`` (default: ``budget``; a step's
    shape, e.g. ``chain:D``, caps it further), ``predictor`` (a :class:`MarginPredictor`,
    :class:`MarginTable` or calibrated :class:`~ersd.theory.RankProfile`; None: a weak prior that
    learns online), ``costs`` (forward-time curves; needed by ``cost_aware``), ``learn`` (update
    the predictor from every observation; default: only without a calibrated predictor),
    ``keep_events`` (keep every :class:`MarginEvent` in ``events``, for calibration plots).
    """

    def __init__(
        self,
        model: LanguageModel | ModelDrafter,
        budget: int = 8,
        *,
        max_depth: int | None = None,
        predictor: Any = None,
        costs: StepCosts | None = None,
        cost_aware: bool = False,
        learn: bool | None = None,
        keep_events: bool = False,
    ) -> None:
        self.model = model.model if isinstance(model, ModelDrafter) else model
        check_budget(budget, max_depth)
        if cost_aware and costs is None:
            raise GenerationInputError(
                "a cost-aware dynamic tree needs forward-time curves: pass costs= (e.g. the "
                "CostModel of an `ersd bench calibrate` file) or use the plain dynamic policy"
            )
        self.budget = budget
        self.max_depth = max_depth
        self.predictor = MarginPredictor() if predictor is None else as_predictor(predictor)
        self.costs = costs
        self.cost_aware = cost_aware
        self.learn = predictor is None if learn is None else learn
        self.keep_events = keep_events
        self.events: list[MarginEvent] = []
        #: seconds spent choosing nodes (predictor and planner, not the races or forwards)
        self.policy_seconds = 0.0

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    @property
    def depth_cap(self) -> int:
        return self.max_depth if self.max_depth is not None else self.budget

    @property
    def spec(self) -> str:
        return DynamicSpec(self.budget, self.max_depth, self.cost_aware).spec

    def configured(self, spec: DynamicSpec) -> DynamicDrafter:
        """A drafter with ``spec``'s budget, depth cap and variant, sharing this one's model,
        predictor, costs and event list."""
        out = DynamicDrafter(
            self.model,
            spec.budget,
            max_depth=spec.max_depth,
            predictor=self.predictor,
            costs=self.costs,
            cost_aware=spec.cost_aware,
            learn=self.learn,
            keep_events=self.keep_events,
        )
        out.events = self.events
        return out

    def start_drafting(self, prompt: Sequence[int]) -> DynamicDraftSession:
        return DynamicDraftSession(self.model.start(list(prompt)), self)

    def _on_event(self, ev: MarginEvent) -> None:
        if self.learn:
            self.predictor.update(ev.depth, ev.margin, ev.rank)
        if self.keep_events:
            self.events.append(ev)

    def __repr__(self) -> str:
        return f"DynamicDrafter({self.model!r}, {self.spec!r})"


class DynamicDraftSession(RaceDraftSession):
    """One sequence's dynamic drafting: grows each step's tree round by round."""

    def __init__(self, session: ModelSession, drafter: DynamicDrafter) -> None:
        super().__init__(session, drafter._on_event)
        self.drafter = drafter

    def propose(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
        guess: Sequence[int] = (),
    ) -> Proposal:
        self._expected: float | None = None
        proposal = super().propose(shape, key, rule, params, noise)  # drives grow() below
        proposal.expected_tokens = self._expected
        return proposal

    def grow(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
        guess: Sequence[int] = (),  # not used: the tree is grown from the draft's own confidence
    ) -> Generator[tuple[list[int], list[int]], torch.Tensor, DraftTree]:
        """The dynamic tree as a generator of draft-model calls (the protocol of
        :meth:`ModelDraftSession.grow`, so a batched engine can drive it): the root, then one
        call per round.  ``shape`` is an envelope: only its depth is used (the depth cap)."""
        cap = min(shape.depth, self.drafter.depth_cap)
        if isinstance(rule, ERSD):
            return (yield from self._grow_dynamic(key, rule, params, noise, cap))
        if isinstance(rule, GreedyRule):  # temperature 0: the chain (nothing to rank)
            chain = TreeShape.chain(min(self.drafter.budget, cap))
            return (yield from super().grow(chain, key, rule, params, noise))
        raise UnsupportedTreeError(
            f"dynamic trees are grown from the draft's race, which only ERSD shares with the "
            f"target; method {rule.name!r} needs a static tree (e.g. 'chain:4')"
        )

    def _grow_dynamic(
        self, key: int, rule: ERSD, params: SamplingParams, noise: RaceNoise, cap: int
    ) -> Generator[tuple[list[int], list[int]], torch.Tensor, DraftTree]:
        d = self.drafter
        pred = d.predictor
        tree = DraftTree.empty(key)
        fed = {DraftTree.ROOT: -1}
        rows = yield [], []
        added, expected = 0, 1.0
        draft_pred = d.costs.draft_cost(1) if d.costs is not None else 0.0
        fresh = [(DraftTree.ROOT, rows[0], 1.0)]
        self._races = {}
        while fresh:
            for ctx, logits, reach in fresh:
                race = self._race_at(
                    tree, ctx, logits, min(pred.max_rank, d.budget - added), params, noise, rule
                )
                race.reach = reach
                t0 = time.perf_counter()
                race.accept = pred.predict(race.depth, race.margin)[: len(race.tokens)]
                d.policy_seconds += time.perf_counter() - t0
            t0 = time.perf_counter()
            by_ctx = self._races
            open_ = [
                OpenContext(c, r.reach, r.accept, r.children, r.depth)
                for c, r in by_ctx.items()
                if r.children < len(r.tokens)
            ]
            cost = (
                CostState(d.costs, added, expected, draft_pred)
                if d.cost_aware and d.costs is not None
                else None
            )
            plan = plan_round(open_, d.budget - added, cap, pred.depth_prior, cost)
            d.policy_seconds += time.perf_counter() - t0
            new: list[int] = []
            for (ctx, i), value in zip(plan.add, plan.values, strict=True):
                race = by_ctx[ctx]
                new.append(tree.add_child(ctx, race.tokens[i]))
                race.children += 1
                expected += value
            added += len(new)
            feed = [new[j] for j in plan.feed]
            if not feed:
                break
            base = len(fed) - 1
            rows = yield (
                [tree.token_ending(c) for c in feed],
                [fed[tree.parent_context(c)] for c in feed],
            )
            for r, c in enumerate(feed):
                fed[c] = base + r
            if d.costs is not None:
                draft_pred += d.costs.draft_cost(len(feed))
            fresh = [(c, rows[1 + j], plan.values[plan.feed[j]]) for j, c in enumerate(feed)]
        self._fed = fed
        self._expected = expected
        return tree


__all__ = [
    "DynamicDraftSession",
    "DynamicDrafter",
    "DynamicSpec",
    "MarginEvent",
    "MarginRecorder",
    "RaceDraftSession",
    "SharpnessFit",
    "as_predictor",
    "parse_dynamic",
]
