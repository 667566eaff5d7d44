"""Dynamic trees for the rejection-based baselines (SD, SpecInfer, SpecTr), grown from the draft's
confidence as in EAGLE-2 (Li et al. 2024): the counterpart of :mod:`ersd.drafting.dynamic`, so
``tree="dynamic:K[@D]"`` compares like for like across methods.

**Children stay the method's own i.i.d. draws.**  At a drafted context ``c`` with draft
distribution ``q`` the ``k``-th child is always lane ``k`` of the method's drafting rule
(``rule.draft``: inverse CDF with the uniform of ``STREAM_DRAFT + k``), whatever the policy.  The
policy only decides *how many* lanes each context gets (and which nodes are fed to the draft).

**Value (the draft's confidence, EAGLE-2 style).**  A node is valued by its parent's value times
the predicted chance that its draw adds acceptance, taken as the chance that it is a token not
drawn yet at that context: with ``D`` the distinct tokens drawn at ``c`` so far, a new child of
``c`` is worth ``v(c)·(1 − Σ_{x∈D} q(x))`` (the first child ``v(c)``; the root has value 1; a
repeated token adds nothing: SpecInfer never accepts a token it has just rejected,
``p_2(x) = 0``, so it is not expanded).  Before drawing, the ``j``-th further lane is valued by its
expectation ``v(c)·Σ_{x∉D} q(x)(1 − q(x))^j``.  A confident context (peaked ``q``) thus gets few
siblings and a flat one more; below a node not fed yet the mean value profile of the contexts
seen in the step stands in for the unknown ``q`` (the "prior").  (EAGLE-2's literal path product
``Π q(x)`` was measured too: on the toy models at T = 1 it cut depth so hard that SpecInfer
``dynamic:6`` fell to 2.6 tokens per call against 4.1 for ``chain:6``; see the docs.)
:func:`~ersd.drafting.policy.plan_round` adds nodes best-first under the budget of ``K`` drafted
tokens and the depth cap, one draft forward per round, as for ERSD (children are fed only below
the contexts of the last forward; SpecInfer may spend one forward more when the last fed level
then loses to late siblings).
SD gets one lane per context, so its dynamic tree is a chain (of ``min(K, D)`` tokens unless the
draft's mass runs out).  At temperature 0 every method's tree is the greedy chain.  Duplicate
children are verified but never expanded, and no prediction of tokens per call is reported
(``Proposal.expected_tokens`` stays None: confidence is a ranking, not a calibrated probability).

**Why the methods stay exact.**  The tree depends on the draft side only (``q``, the lanes drawn),
never on the target or the verifier's coins (``STREAM_VERIFY``/``STREAM_RESIDUAL``).

* *SD and SpecInfer* (recursive rejection with replacement, mode ``"sequential"``): whether lane
  ``j`` becomes a child of ``c`` is decided before lane ``j`` is drawn, from lanes ``< j`` at
  ``c`` and from draws at other contexts (independent of lane ``j``), so the number of children
  is a stopping time of the draft-side history.  Verification tries the children in order; by
  backward induction over ``j``, conditional on reaching round ``j`` with the history so far the
  output law is the residual ``r_j``: if there is no child ``j`` the token is drawn from ``r_j``;
  otherwise ``x_j ~ q`` is fresh, accepted with probability ``min(1, r_j(x)/q(x))``, and on
  rejection the output law is ``r_{j+1} = (r_j − q)^+ / (1 − Σ min(r_j, q))`` whatever the rule
  says next, so ``P(y) = min(r_j, q)(y) + (1 − Σ min(r_j, q))·r_{j+1}(y) = r_j(y)``.  At ``j = 1``
  this is ``p``.  Below the accepted child the same holds: a context is created (and its lanes
  first read) only after every decision that led the walk there, and duplicates are not
  expanded, so each expanded context has its own key and its lanes are fresh given the path.
  The policy may even add siblings later, in another round.
* *SpecTr* (mode ``"fixed"``): its acceptance ratio ``ρ`` and residual depend on the number of
  drafts ``K``, and its proof needs ``K`` i.i.d. drafts *given* ``K``; a ``K`` decided from the
  drafts themselves breaks it.  So a context's ``K`` is decided once, in the round its ``q``
  becomes known, from ``q`` and the rest of the tree only (values with ``D = ∅``), before its
  lanes are drawn; the context is then closed.

The exactness suite (``tests/test_dynamic_baselines.py``) checks both, and rejects a policy that
deduplicates the draws (children no longer i.i.d.) and SpecTr with a draw-dependent ``K``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ersd.drafting.dynamic import DynamicSpec, check_budget
from ersd.drafting.model import ModelDrafter, ModelDraftSession
from ersd.drafting.policy import OpenContext, plan_round
from ersd.errors import GenerationInputError, UnsupportedTreeError
from ersd.methods import DraftTree, GreedyRule, Method, NodeNoise
from ersd.methods.sd import SpeculativeSampling
from ersd.methods.specinfer import SpecInfer
from ersd.methods.spectr import SpecTr
from ersd.models.base import LanguageModel, ModelSession
from ersd.probs import SamplingParams, logits_to_probs
from ersd.race import RaceNoise
from ersd.tree import TreeShape

#: head of ``q`` summed exactly in :func:`draw_values` (below it ``(1 − q)^j ≈ 1``)
_TOP = 256


def confidence_mode(rule: Method) -> str | None:
    """``"sequential"`` (SD, SpecInfer: a context's children may depend on its drawn lanes),
    ``"fixed"`` (SpecTr: decided from ``q`` before drawing) or None (not supported)."""
    if isinstance(rule, SpeculativeSampling | SpecInfer):
        return "sequential"
    if isinstance(rule, SpecTr):
        return "fixed"
    return None


def draw_values(q: torch.Tensor, drawn: Sequence[int], m: int) -> np.ndarray:
    """Value factor of the next ``m`` i.i.d. draws from ``q`` given the tokens ``drawn`` so far:
    entry ``j`` is the chance that the ``j``-th further draw is a new token,
    ``Σ_{x∉drawn} q(x) (1 − q(x))^j`` (module docstring)."""
    if m <= 0:
        return np.zeros(0)
    q64 = q.to(torch.float64)
    vals, idx = torch.topk(q64, min(_TOP, q64.numel()))
    rest = vals.clone()
    tail = max(1.0 - float(vals.sum()), 0.0)  # mass below the head: (1 - q)^j ~ 1 there
    if drawn:
        seen = torch.tensor(sorted(set(drawn)), dtype=idx.dtype)
        rest[torch.isin(idx, seen)] = 0.0
        tail = max(tail - float(q64[seen[~torch.isin(seen, idx)]].sum()), 0.0)
    powers = (1.0 - vals).unsqueeze(0) ** torch.arange(m, dtype=torch.float64).unsqueeze(1)
    return ((powers * rest.unsqueeze(0)).sum(dim=1) + tail).numpy()


def _constant(profile: np.ndarray) -> Callable[[int], np.ndarray]:
    """The prior of every depth: one value profile (the mean of those seen in the step)."""
    return lambda _depth: profile


@dataclass
class _Context:
    """A fed context: its draft distribution, value, depth of its children, lanes drawn."""

    q: torch.Tensor
    reach: float
    depth: int
    drawn: list[int] = field(default_factory=list)
    open: bool = True


class ConfidenceDrafter:
    """A :class:`~ersd.drafting.Drafter` growing dynamic SD / SpecInfer / SpecTr trees from the
    draft's confidence (module docstring): ``budget`` drafted tokens per step, depth cap
    ``max_depth`` (default ``budget``; a step's shape caps it further)."""

    def __init__(
        self,
        model: LanguageModel | ModelDrafter,
        budget: int = 8,
        *,
        max_depth: int | None = None,
    ) -> None:
        self.model = model.model if isinstance(model, ModelDrafter) else model
        check_budget(budget, max_depth)
        self.budget = budget
        self.max_depth = max_depth
        #: seconds spent choosing nodes (values and planner, not the draws or forwards)
        self.policy_seconds = 0.0

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    @property
    def depth_cap(self) -> int:
        return self.max_depth if self.max_depth is not None else self.budget

    @property
    def spec(self) -> str:
        return DynamicSpec(self.budget, self.max_depth).spec

    def configured(self, budget: int, max_depth: int | None) -> ConfidenceDrafter:
        """A drafter of the same kind and model with another budget and depth cap."""
        return type(self)(self.model, budget, max_depth=max_depth)

    def start_drafting(self, prompt: Sequence[int]) -> ConfidenceDraftSession:
        return ConfidenceDraftSession(self.model.start(list(prompt)), self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, {self.spec!r})"


class ConfidenceDraftSession(ModelDraftSession):
    """One sequence's confidence-grown drafting (the generator protocol of
    :meth:`ModelDraftSession.grow`, so a batched engine can drive it)."""

    parallel_grow = False  # it adds to its drafter's shared policy_seconds counter

    def __init__(self, session: ModelSession, drafter: ConfidenceDrafter) -> None:
        super().__init__(session)
        self.drafter = drafter

    def draw(self, rule: Method, ctx: _Context, count: int, noise: NodeNoise) -> list[int]:
        """The next ``count`` children of a context: lanes ``len(ctx.drawn) ..`` of the rule's
        own drafting (i.i.d. draws from ``q``)."""
        n = len(ctx.drawn)
        return rule.draft(ctx.q, n + count, noise)[n:]

    def grow(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
        guess: Sequence[int] = (),  # not used: the tree is grown from the draft's own confidence
    ) -> Generator[tuple[list[int], list[int]], torch.Tensor, DraftTree]:
        cap = min(shape.depth, self.drafter.depth_cap)
        if isinstance(rule, GreedyRule):  # temperature 0: the greedy chain
            chain = TreeShape.chain(min(self.drafter.budget, cap))
            return (yield from super().grow(chain, key, rule, params, noise))
        mode = confidence_mode(rule)
        if mode is None:
            raise UnsupportedTreeError(
                f"confidence-grown dynamic trees need i.i.d. children verified by SD, SpecInfer "
                f"or SpecTr; method {rule.name!r} needs a static tree (e.g. 'chain:4')"
            )
        return (yield from self._grow(key, rule, params, noise, cap, mode))

    def _grow(
        self,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
        cap: int,
        mode: str,
    ) -> Generator[tuple[list[int], list[int]], torch.Tensor, DraftTree]:
        d = self.drafter
        info = rule.info
        width = d.budget if info is None or info.max_children is None else info.max_children
        tree = DraftTree.empty(key)
        fed = {DraftTree.ROOT: -1}
        rows = yield [], []
        added = 0
        known: dict[int, _Context] = {}
        profiles: list[np.ndarray] = []
        fresh: list[tuple[int, torch.Tensor, float]] = [(DraftTree.ROOT, rows[0], 1.0)]
        frontier = {DraftTree.ROOT}  # contexts fed by the last forward: only their children are fed
        while True:
            if fresh:
                frontier = {ctx for ctx, _, _ in fresh}
            for ctx, logits, reach in fresh:
                q = logits_to_probs(logits, params)
                tree.draft_probs[ctx] = q
                known[ctx] = _Context(q, reach, tree.depth_of(tree.node_of(ctx)) + 1)
                profiles.append(draw_values(q, (), width))
            t0 = time.perf_counter()
            prior_profile = np.mean(profiles, axis=0)
            open_ = []
            for ctx, k in known.items():
                m = min(width - len(k.drawn), d.budget - added)
                if k.open and m > 0:
                    open_.append(
                        OpenContext(ctx, k.reach, draw_values(k.q, k.drawn, m), 0, k.depth)
                    )
                    k.open = mode == "sequential"  # SpecTr: K is decided in this round only
            plan = plan_round(open_, d.budget - added, cap, _constant(prior_profile))
            d.policy_seconds += time.perf_counter() - t0
            counts: dict[int, int] = {}
            for ctx, _ in plan.add:
                counts[ctx] = counts.get(ctx, 0) + 1
            lanes = {
                c: iter(self.draw(rule, known[c], n, NodeNoise(noise, tree.keys[c])))
                for c, n in counts.items()
            }
            # per plan.add position: (context, duplicate, value), None if no lane came back
            new: list[tuple[int, bool, float] | None] = []
            for ctx, _ in plan.add:
                tok = next(lanes[ctx], None)
                if tok is None:  # the drafting rule returned fewer lanes (no mass left)
                    new.append(None)
                    continue
                k = known[ctx]
                dup = tok in k.drawn
                fresh_mass = 1.0 - float(k.q[sorted(set(k.drawn))].sum()) if k.drawn else 1.0
                k.drawn.append(tok)
                new.append((tree.add_child(ctx, tok), dup, k.reach * fresh_mass))
            grown = sum(n is not None for n in new)
            added += grown
            feed = [
                n
                for n in (new[j] for j in plan.feed)
                if n is not None and not n[1] and tree.parent_context(n[0]) in frontier
            ]
            if not feed:
                if grown and added < d.budget:
                    fresh = []  # nothing to feed, budget left: plan again from what is known
                    continue
                break
            base = len(fed) - 1
            rows = yield (
                [tree.token_ending(c) for c, _, _ in feed],
                [fed[tree.parent_context(c)] for c, _, _ in feed],
            )
            for r, (c, _, _) in enumerate(feed):
                fed[c] = base + r
            fresh = [(c, rows[1 + r], v) for r, (c, _, v) in enumerate(feed)]
        self._fed = fed
        return tree


def baseline_drafter(spec: Any, drafter: Any, method: Method) -> ConfidenceDrafter:
    """The drafter of ``dynamic:K[@D]`` (a :class:`~ersd.drafting.dynamic.DynamicSpec`) for a
    baseline ``method`` (through :func:`ersd.drafting.grown.dynamic_drafter`)."""
    from ersd.drafting.dynamic import DynamicDrafter

    if confidence_mode(method) is None:
        raise UnsupportedTreeError(
            f"tree {spec.spec!r}: dynamic trees exist for ERSD (grown from the draft's race) and "
            f"for SD, SpecInfer and SpecTr (grown from the draft's confidence), not for method "
            f"{method.name!r}; use one of those or a static tree such as 'chain:4'"
        )
    if spec.cost_aware:
        raise UnsupportedTreeError(
            f"tree {spec.spec!r}: the cost-aware variant is ERSD's (its cut needs the calibrated "
            f"acceptance predictor); use 'dynamic:{spec.budget}' with method {method.name!r}"
        )
    if isinstance(drafter, ConfidenceDrafter):
        return drafter.configured(spec.budget, spec.max_depth)
    if isinstance(drafter, ModelDrafter | DynamicDrafter):
        return ConfidenceDrafter(drafter.model, spec.budget, max_depth=spec.max_depth)
    raise GenerationInputError(
        f"tree {spec.spec!r} needs a draft model (or an ersd.drafting.ConfidenceDrafter), got a "
        f"{type(drafter).__name__}"
    )


__all__ = [
    "ConfidenceDraftSession",
    "ConfidenceDrafter",
    "baseline_drafter",
    "confidence_mode",
    "draw_values",
]
