"""The model drafter: a draft language model grows the tree level by level.

One draft forward per tree depth: the root row first, then every node of a level that has children
in the shape is fed in one ``score`` call.  Children come from the rule's drafting rule applied to
the draft model's logits (the shared race for ERSD, keyed i.i.d. draws for the baselines, the top
logits at temperature 0).

**What the next depth would have done.**  After a step whose drafted path was accepted to a leaf,
the target's bonus token sits one depth below it -- where a deeper tree would have drafted.  The
next step's first draft forward feeds that leaf and the bonus anyway (neither was fed yet), so one
more row of the output layer gives the draft's distribution at the bonus, and with it the rank of
the bonus token in the draft's order there: an observation of depth ``leaf + 1`` that costs no
forward (:attr:`ModelDraftSession.observe_beyond`, read by ``tree="auto"``, which otherwise
never learns how deep trees would fare while it drafts short ones).

**The confidence stop** (``ModelDrafter(model, stop=0.4)``): a drafted node whose token had a
draft probability below ``stop`` is kept but gets no children, so a chain ends there and, in a
tree, that branch does (``transformers``' assisted generation does the same with its
``assistant_confidence_threshold``: ``ConfidenceCriteria`` keeps the token and then stops).  The
probability is the draft's sampling distribution at the request's settings (temperature, top-k,
top-p, min-p; at temperature 0 the plain softmax of the draft's logits, as transformers' greedy
draft scores are).  It changes only the drafted tree, so ERSD's text is unchanged (drafter
invariance); it saves the draft forwards (and target tokens) below a token the draft is unsure
of, where the rest of a chain is most likely rejected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Sequence
from typing import Any

import torch

from ersd.drafting.base import Proposal
from ersd.drafting.grow import DrafterConfigError
from ersd.methods import DraftTree, Method, NodeNoise
from ersd.methods.base import DraftLogits
from ersd.methods.ersd import ERSD
from ersd.models.base import LanguageModel, ModelSession
from ersd.models.batch import score_many
from ersd.probs import SamplingParams, logits_to_probs, plain_temperature
from ersd.race import STREAM_RACE, RaceNoise
from ersd.race_v2 import LogitRow, v2_ranking_from_logits
from ersd.tree import TreeShape

#: ranks of the bonus token looked for in the draft's order (deeper ones: "not among them")
BEYOND_RANKS = 8


#: ERSD drafts from the draft's logits where that gives the same tokens (race scheme v2 on the
#: CPU, temperature-only sampling, the paper's draft rule): :func:`draft_from_logits`.  False:
#: always through the float64 probabilities (the reference path the tests and
#: ``research/profile_batch.py --compare-draft`` compare with; the same trees, ranks and texts)
FROM_LOGITS = True


#: set up the v2 race of each context the drafter will draft below (its block words and bounds,
#: ~20 NumPy passes over the 2,374 blocks of a 152k vocabulary) *before* the draft forward that
#: scores that context, while the interpreter's and NumPy's caches are warm from the race just
#: run, instead of right after the forward has evicted them (at batch 1 the same work costs about
#: twice as much there).  False: on first use (the reference ``research/profile_batch.py
#: --compare-prune`` compares with; the same tokens: a race is a function of its key)
PREPARE_RACES = True


def prepare_races(keys: Sequence[int], rule: Method, noise: RaceNoise) -> None:
    """Create (and cache) the lazy v2 races at ``keys`` where :func:`draft_from_logits` will use
    them (ERSD's own drafting rule under race scheme v2); nothing otherwise."""
    if PREPARE_RACES and FROM_LOGITS and noise.lazy() and _plain_ersd(rule):
        for key in keys:
            noise.lazy_race(key, STREAM_RACE)


def _plain_ersd(rule: Method) -> bool:
    """ERSD with its own drafting rule and draft race at sharpness 1: its children are the top
    ranks of the race over ``q`` itself (by the rule's class and sharpness, remembered)."""
    cls: Any = type(rule)
    which = (cls, getattr(rule, "draft_sharpness", None))
    known = _PLAIN.get(which)
    if known is None:
        known = _PLAIN[which] = (
            isinstance(rule, ERSD)
            and cls.draft is ERSD.draft
            and cls.race_probs is ERSD.race_probs
            and cls.draft_children is Method.draft_children
            and rule.draft_sharpness == 1.0
        )
    return known


_PLAIN: dict[tuple[type, object], bool] = {}


def draft_from_logits(
    logits: torch.Tensor,
    num_children: int,
    key: int,
    rule: Method,
    params: SamplingParams,
    noise: RaceNoise,
) -> tuple[list[int], DraftLogits] | None:
    """ERSD's children below a context found from the draft's ``logits`` without the float64
    softmax (:func:`ersd.race_v2.v2_ranking_from_logits`), and the distribution held as
    :class:`~ersd.methods.base.DraftLogits` (computed only if read); or None where that does not
    apply (another rule, race scheme v1, a device, top-k / top-p / min-p, temperature 0) or
    rounding could decide, and the caller drafts through the probabilities: the same tokens."""
    if (
        not FROM_LOGITS
        or logits.dim() != 1
        or logits.device.type != "cpu"
        or not noise.lazy()
        or logits.shape[0] != noise.vocab_size
        or not _plain_ersd(rule)
    ):
        return None
    t = plain_temperature(params, noise.vocab_size)
    if t is None:
        return None
    row = LogitRow(logits, t)
    toks = v2_ranking_from_logits(noise.lazy_race(key, STREAM_RACE), row, num_children)
    if toks is None:
        return None
    return toks, DraftLogits(logits, params, row, ranked=toks)


def check_stop(stop: Any) -> float | None:
    """``stop`` of :class:`ModelDrafter` checked: None (or 0) is off, else a probability in
    (0, 1]."""
    if stop is None:
        return None
    ok = isinstance(stop, int | float) and not isinstance(stop, bool)
    if not ok or math.isnan(stop) or not 0.0 <= float(stop) <= 1.0:
        raise DrafterConfigError(
            f"draft stop must be a probability in [0, 1] (a drafted token whose draft "
            f"probability is below it ends its chain, e.g. 0.4 as transformers' "
            f"assistant_confidence_threshold) or None for no stop, got {stop!r}",
            param="draft_stop",
        )
    return float(stop) or None


def token_probability(logits: torch.Tensor, token: int, params: SamplingParams) -> float:
    """The draft's probability of ``token`` at a context from its ``logits`` there: its sampling
    distribution under ``params`` (the softmax of ``logits / T`` after top-k / top-p / min-p); at
    temperature 0 the plain softmax (what transformers' greedy assistant scores its tokens by)."""
    row = logits.double()
    if params.greedy:
        return math.exp(float(row[token] - torch.logsumexp(row, -1)))
    t = plain_temperature(params, row.shape[-1])
    if t is not None:
        row = row / t
        return math.exp(float(row[token] - torch.logsumexp(row, -1)))
    return float(logits_to_probs(logits, params)[token])


class ModelDrafter:
    """A :class:`~ersd.drafting.base.Drafter` backed by a draft language model.

    ``stop`` (None: off): the confidence stop -- a drafted token whose draft probability is
    below ``stop`` gets no children, so its chain (or branch) ends there, the token kept
    (module docstring).  ERSD's text does not change; the draft forwards it saves are counted
    in ``GenerationResult.draft_forwards``, and the result's tree label gets ``+stop=VALUE``.
    ``tree="auto"`` and ``dynamic:K`` choose their own depths and refuse it.
    """

    def __init__(self, model: LanguageModel, stop: float | None = None) -> None:
        self.model = model
        self.stop = check_stop(stop)

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    def start_drafting(self, prompt: Sequence[int]) -> ModelDraftSession:
        session = ModelDraftSession(self.model.start(list(prompt)))
        session.stop = self.stop
        return session

    def __repr__(self) -> str:
        stop = "" if self.stop is None else f", stop={self.stop}"
        return f"ModelDrafter({self.model!r}{stop})"


def draft_stop_of(drafter: Any) -> float | None:
    """The confidence stop of ``drafter``: a :class:`ModelDrafter`'s, or the model part's of a
    hybrid drafter; None when it has none."""
    if isinstance(drafter, ModelDrafter):
        return drafter.stop
    model = getattr(drafter, "model", None)
    return model.stop if isinstance(model, ModelDrafter) else None


class ModelDraftSession:
    """Drafting state of one sequence: the draft model's session and the last tree's feed map."""

    #: whether the batched engine may grow this session's tree on a worker thread while other
    #: rows grow theirs (True when growing touches only this session's own state)
    parallel_grow = True

    #: observe the bonus token below a fully accepted path (module docstring): set by the
    #: generation loop for ``tree="auto"``; needs a session with ``score_previous`` (the
    #: PyTorch backend's), and is skipped by the batched engine, which drives :meth:`grow`
    observe_beyond = False

    #: the confidence stop (:class:`ModelDrafter`'s ``stop``): a drafted token whose draft
    #: probability is below it gets no children; None: off (the dynamic drafters' sessions)
    stop: float | None = None

    def __init__(self, session: ModelSession) -> None:
        self.session = session
        # context of the last proposed tree -> its pending index in the draft session
        self._fed: dict[int, int] = {}
        self._tree: DraftTree | None = None  # the last proposed tree
        #: (depth, race key, token) of the bonus token below the last step's accepted leaf
        self._beyond: tuple[int, int, int] | None = None

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
        """Draft ``num_children`` tokens below context ``ctx`` from the draft's ``logits`` there
        (the rule's drafting rule); records the draft distribution on the tree.  Subclasses
        (:mod:`ersd.drafting.dynamic`) hook in here."""
        lazy = draft_from_logits(logits, num_children, tree.keys[ctx], rule, params, noise)
        if lazy is not None:
            toks, held = lazy
            tree.draft_probs[ctx] = held  # type: ignore[call-overload]  # read as probabilities
            return toks
        toks, q = rule.draft_children(
            logits, params, num_children, NodeNoise(noise, tree.keys[ctx])
        )
        tree.draft_probs[ctx] = q
        return toks

    def grow(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
        guess: Sequence[int] = (),
    ) -> Generator[tuple[list[int], list[int]], torch.Tensor, DraftTree]:
        """Draft a tree of ``shape`` level by level, as a generator of draft-model calls.

        Yields the ``(tokens, parents)`` of each ``score`` call the draft session must make
        (first the root, then one call per level that has children to draft) and receives that
        call's logits; returns the tree.  :meth:`propose` drives it with this session's model; a
        batched engine drives the generators of many sequences with one forward per level.

        ``guess`` (chain shapes only): tokens the chain is expected to start with (a model-free
        drafter's run).  They are fed with the root, in the first call, so the draft's logits
        below each guessed prefix come with it; while the token drafted at a level (the rule's
        own choice from the draft's logits, as always) equals the guess there, the next level
        needs no forward of its own.  The first level whose drafted token differs is fed and the
        chain grows on one forward per level.  The tree is the one the draft would draft anyway;
        a correct guess of ``g`` tokens saves ``g`` forwards, a wrong one costs a wider first
        call.
        """
        tree = DraftTree.empty(key)
        fed = {DraftTree.ROOT: -1}
        prepare_races([key], rule, noise)  # the root's race, before the root's forward
        chain = [int(t) for t in guess][: max(shape.depth - 1, 0)] if shape.is_chain else []
        rows = yield chain, list(range(-1, len(chain) - 1))
        guessed = rows  # row 1 + d: the draft's logits below guess[: d + 1]
        pending = len(chain)  # nodes fed to the draft session since the last commit
        on_guess = 0 if chain else None  # depth of the next chain node the guess may hold
        # (shape node, tree context, draft logits there) of the contexts to expand at this level
        frontier: list[tuple[int, int, torch.Tensor]] = [(-1, DraftTree.ROOT, rows[0])]
        while frontier:
            grown: list[tuple[int, int]] = []  # (shape node, context) that have children to draft
            for snode, ctx, logits in frontier:
                kids = shape.child_nodes(snode)
                toks = self._draft_at(tree, ctx, logits, len(kids), rule, params, noise)
                for kid, tok in zip(kids, toks, strict=False):
                    child = tree.add_child(ctx, tok)
                    if shape.child_nodes(kid) and self._confident(logits, tok, params):
                        grown.append((kid, child))
            if not grown:
                break
            if on_guess is not None:
                kid, c = grown[0]
                if on_guess < len(chain) and tree.token_ending(c) == chain[on_guess]:
                    fed[c] = on_guess  # the guess's node: its logits are already here
                    frontier = [(kid, c, guessed[1 + on_guess])]
                    on_guess += 1
                    continue
                on_guess = None
            prepare_races([tree.keys[c] for _, c in grown], rule, noise)  # before their forward
            rows = yield (
                [tree.token_ending(c) for _, c in grown],
                [fed[tree.parent_context(c)] for _, c in grown],
            )
            for r, (_, c) in enumerate(grown):
                fed[c] = pending + r
            pending += len(grown)
            frontier = [(s, c, rows[1 + r]) for r, (s, c) in enumerate(grown)]
        self._fed = fed
        return tree

    def _confident(self, logits: torch.Tensor, token: int, params: SamplingParams) -> bool:
        """Whether a drafted ``token`` may get children: no stop, or its draft probability is
        at least the stop (transformers' ``ConfidenceCriteria`` stops when it is below)."""
        stop = self.stop
        return stop is None or token_probability(logits, token, params) >= stop

    def propose(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
        guess: Sequence[int] = (),
    ) -> Proposal:
        levels = self.grow(shape, key, rule, params, noise, guess)
        call = next(levels)
        forwards, seconds = 0, 0.0
        beyond, self._beyond = self._beyond, None
        score_previous = getattr(self.session, "score_previous", None)
        seen: tuple[int, int | None] | None = None
        while True:
            t0 = time.perf_counter()
            if beyond is not None and score_previous is not None and not forwards:
                rows, previous = score_previous(*call)
                if previous is not None:
                    seen = (beyond[0], self._rank_of(previous, beyond, rule, params, noise))
            else:  # after the first call the grower reads the new nodes' rows only
                rows = score_many(None, [self.session], [call], root=not forwards)[0]
            seconds += time.perf_counter() - t0
            forwards += 1
            try:
                call = levels.send(rows)
            except StopIteration as done:
                self._tree = done.value
                return Proposal(tree=done.value, forwards=forwards, seconds=seconds, beyond=seen)

    @staticmethod
    def _rank_of(
        logits: torch.Tensor,
        beyond: tuple[int, int, int],
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
    ) -> int | None:
        """The rank of the bonus token in the draft's order at its context (ERSD: the race
        rank, as in verification; other rules: 1 if it is the one token they draft there)."""
        _, key, token = beyond
        node = NodeNoise(noise, key)
        toks, q = rule.draft_children(logits, params, 1, node)
        rank = rule.rank(q, q, token, node)  # ERSD's rank reads only the draft's race
        if rank is None:
            rank = 1 if toks and toks[0] == token else None
        return rank if rank is not None and rank <= BEYOND_RANKS else None

    def observe(self, tokens: Sequence[int], accepted: Sequence[int]) -> None:
        tree, self._tree, self._beyond = self._tree, None, None
        if self.observe_beyond and tree is not None and accepted and len(tokens) > len(accepted):
            below = DraftTree.context_of(accepted[-1])
            if not tree.children[below]:  # accepted to a leaf: the next token is its bonus
                self._beyond = (len(accepted) + 1, tree.keys[below], int(tokens[len(accepted)]))
        path: list[int] = []
        for node in accepted:
            pending = self._fed.get(DraftTree.context_of(node))
            if pending is None:  # accepted past the fed levels: the rest is fed next call
                break
            path.append(pending)
        self.session.commit(list(tokens), path)
        self._fed = {}
