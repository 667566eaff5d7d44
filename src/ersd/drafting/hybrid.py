"""Hybrid drafting: a model-free drafter and a draft model in one tree, mixed per step by cost.

Each step the model-free drafter (lookup or suffix) proposes first, which costs next to nothing.
Then a small cost model picks one of three mixes:

* ``free``  — the model-free tree alone (the draft model does no forward this step);
* ``model`` — the draft model's tree alone (the step's shape, as model-only drafting).  On a
  chain the model-free run is the draft model's *guess*: fed with the root in the model's first
  forward, it hands over the draft's logits below every guessed prefix, so each level where the
  model drafts the guessed token costs no forward of its own (``guided``, the default;
  :meth:`ersd.drafting.ModelDraftSession.grow`).  The tree is the model's own — the guess only
  saves forwards (a copied run of ``g`` tokens the model agrees with: ``g`` fewer);
* ``both``  — the two trees merged into one (a trie merge: a token both propose below the same
  context is one node).  Only under rules that are exact for any children (ERSD, GLS, greedy);
  under
  the other methods a context's children must be draws from one ``q``, so the mix is per step.

The cost model keeps exponential moving averages of the time of a target step (target forward +
verification, measured between ``propose`` and ``observe``), of the model's drafting time, and of
the tokens each source gets accepted (the model-free ones per length of the matched context,
which says how much to trust a match).  It picks the mix with the most expected tokens per second:

    free:  (1 + e_free) / t_step
    model: (1 + e_model) / (t_step + t_model)
    both:  (1 + e_free + (1 - h_free) e_model) / (t_step + t_model)

(``h_free``: how often the model-free draft's first token is accepted).  Where the model-free
drafter finds nothing, the model drafts.  The choice depends only on the text and on past steps,
never on this step's noise, so every method stays exact; under ERSD the text is the same whatever
is chosen.  Per-source acceptance is in ``HybridDrafter.stats`` and the mixes used in ``.mixes``
(``guided``: the ``model`` steps that were given a guess, counted there instead of under
``model``).  Policy ``guided`` always takes the ``model``
mix: model-only drafting's trees, with the guess's savings.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ersd.drafting.base import Proposal
from ersd.drafting.free import DrafterConfigError, DrafterStats, FreeSession, positive_int
from ersd.drafting.grow import any_children_exact
from ersd.drafting.lookup import LookupDrafter
from ersd.drafting.model import ModelDrafter, ModelDraftSession
from ersd.drafting.suffix import SuffixDrafter
from ersd.methods import DraftTree, Method
from ersd.models.base import LanguageModel
from ersd.probs import SamplingParams
from ersd.race import RaceNoise
from ersd.tree import TreeShape

POLICIES = ("auto", "both", "fallback", "guided")
FreeDrafter = LookupDrafter | SuffixDrafter


def _ema(old: float | None, new: float, decay: float) -> float:
    return new if old is None else decay * old + (1.0 - decay) * new


@dataclass
class CostModel:
    """Moving averages the hybrid drafter chooses its mix by (shared by its sessions)."""

    decay: float = 0.8
    step_seconds: float | None = None  # target forward + verification, per step
    model_seconds: float | None = None  # the draft model's drafting time, per step it drafts
    model_tokens: float = 1.0  # accepted model-drafted tokens per step it drafts (prior 1)
    free_tokens: dict[int, float] = field(default_factory=dict)  # by match length (prior 1)
    free_hits: dict[int, float] = field(default_factory=dict)  # P(first free token accepted)

    MAX_BUCKET = 8

    def bucket(self, match_length: int) -> int:
        return min(match_length, self.MAX_BUCKET)

    def choose(self, bucket: int, can_merge: bool) -> str:
        """``free``, ``model`` or ``both``: the most expected tokens per second."""
        if self.step_seconds is None or self.model_seconds is None:
            return "both" if can_merge else "model"  # measure the model first
        e_free = self.free_tokens.get(bucket, 1.0)
        h_free = self.free_hits.get(bucket, 0.5)
        t_step, t_model = self.step_seconds, self.model_seconds
        rates = {
            "free": (1.0 + e_free) / t_step,
            "model": (1.0 + self.model_tokens) / (t_step + t_model),
        }
        if can_merge:
            rates["both"] = (1.0 + e_free + (1.0 - h_free) * self.model_tokens) / (t_step + t_model)
        return max(rates, key=lambda k: rates[k])


def map_onto(src: DraftTree, dst: DraftTree, add: bool = False) -> list[int | None]:
    """Per context of ``src``, the context of ``dst`` holding the same token path (a trie walk,
    parents first).  A path ``dst`` lacks is added to it (``add``) or mapped to None (with its
    subtree): which of a model-free proposal's nodes the model's tree kept."""
    out: list[int | None] = [DraftTree.ROOT] + [None] * src.num_nodes
    for node in range(src.num_nodes):  # topological order: parents first
        at = out[DraftTree.context_of(src.parents[node])]
        if at is None:
            continue
        tok = src.tokens[node]
        hit = next((k for k in dst.children[at] if dst.tokens[k] == tok), None)
        if hit is not None:
            out[DraftTree.context_of(node)] = DraftTree.context_of(hit)
        elif add:
            out[DraftTree.context_of(node)] = dst.add_child(at, tok)
    return out


def merge_trees(key: int, trees: Sequence[DraftTree]) -> tuple[DraftTree, list[list[int | None]]]:
    """Trie-merge ``trees`` (same root key) into one; a token proposed twice below the same
    context becomes one node.  Returns the merged tree and, per input tree, the merged context of
    each of its contexts.  Draft probabilities: the last tree that has children there wins."""
    out = DraftTree.empty(key)
    maps: list[list[int | None]] = []
    for t in trees:
        to_out = map_onto(t, out, add=True)
        for ctx, q in enumerate(t.draft_probs):
            if q is not None and t.children[ctx]:
                merged = to_out[ctx]
                assert merged is not None
                out.draft_probs[merged] = q
        maps.append(to_out)
    return out, maps


def main_path(tree: DraftTree) -> list[int]:
    """The tokens of ``tree``'s first-child path from the root (its best run)."""
    out: list[int] = []
    ctx = DraftTree.ROOT
    while tree.children[ctx]:
        node = tree.children[ctx][0]
        out.append(tree.tokens[node])
        ctx = DraftTree.context_of(node)
    return out


class HybridDrafter:
    """A model-free drafter and a draft model, mixed per step (see the module docstring).

    ``policy``: ``auto`` (cost model), ``both`` (always merge where the rule allows it, else as
    ``auto``), ``fallback`` (the model drafts only where the model-free drafter has nothing),
    ``guided`` (the model always drafts its own tree; on a chain the model-free run is its guess,
    below).
    ``model_depth``: the model drafts only the shape's first ``model_depth`` levels (default: the
    whole shape), while the model-free drafter may use the whole shape: long copied runs, short
    model chains.  ``guided`` (default): in a step the model drafts alone on a chain, the
    model-free run is fed to the draft model with the root (:meth:`ModelDraftSession.grow`'s
    ``guess``), so the levels where the model drafts the same tokens cost no forward of their own
    — the model's chain, for fewer draft forwards.
    """

    def __init__(
        self,
        free: FreeDrafter,
        model: LanguageModel | ModelDrafter,
        policy: str = "auto",
        model_depth: int | None = None,
        guided: bool = True,
    ) -> None:
        if not isinstance(free, LookupDrafter | SuffixDrafter):
            raise DrafterConfigError(
                f"the model-free part of a hybrid drafter must be a LookupDrafter or "
                f"SuffixDrafter, got {type(free).__name__}"
            )
        if policy not in POLICIES:
            raise DrafterConfigError(
                f"unknown hybrid policy {policy!r}; choose one of {', '.join(POLICIES)}"
            )
        self.free = free
        self.model = model if isinstance(model, ModelDrafter) else ModelDrafter(model)
        self.policy = policy
        self.model_depth = None if model_depth is None else positive_int("model_depth", model_depth)
        self.guided = bool(guided)
        self.stats = DrafterStats()
        self.costs = CostModel()
        self.mixes: Counter[str] = Counter()

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def start_drafting(self, prompt: Sequence[int]) -> HybridSession:
        free = self.free.start_drafting(prompt)
        free.stats = self.stats
        return HybridSession(self, free, self.model.start_drafting(prompt))

    def __repr__(self) -> str:
        return (
            f"HybridDrafter({self.free!r}, {self.model!r}, policy={self.policy!r}, "
            f"model_depth={self.model_depth}, guided={self.guided})"
        )


class HybridSession:
    """One sequence's model-free session and draft-model session."""

    def __init__(self, drafter: HybridDrafter, free: FreeSession, model: ModelDraftSession) -> None:
        self.drafter = drafter
        self.free = free
        self.model = model
        self._maps: dict[str, list[int | None]] = {}
        self._model_tree: DraftTree | None = None
        self._proposed_at = 0.0
        self._bucket = 0
        self._pending_seconds = 0.0

    def _mix(self, free_tree: DraftTree, rule: Method) -> str:
        if not free_tree.num_nodes:
            return "model"
        policy = self.drafter.policy
        can_merge = any_children_exact(rule)
        if policy == "fallback":
            return "free"
        if policy == "guided":
            return "model"  # the model's own tree; the run only saves its forwards
        if policy == "both" and can_merge:
            return "both"
        return self.drafter.costs.choose(self._bucket, can_merge)

    def propose(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
    ) -> Proposal:
        free_tree, seconds = self.free.draft_tree(self.free.budget(shape), key, rule, noise)
        self._bucket = self.drafter.costs.bucket(
            self.free.match_length(self.free.root_state()) if free_tree.num_nodes else 0
        )
        mix = self._mix(free_tree, rule)
        stats = self.drafter.stats
        stats.source(self.free.source).seconds += seconds
        forwards = 0
        model_tree = None
        guess: list[int] = []
        if mix in ("model", "both"):
            model_shape = shape
            if self.drafter.model_depth is not None:
                model_shape = shape.truncated(self.drafter.model_depth) or shape
            if mix == "model" and self.drafter.guided and model_shape.is_chain:
                guess = main_path(free_tree)  # the model checks the run in its first forward
            prop = self.model.propose(model_shape, key, rule, params, noise, guess)
            model_tree, forwards = prop.tree, prop.forwards
            seconds += prop.seconds
            stats.source("model").seconds += prop.seconds
            self.drafter.costs.model_seconds = _ema(
                self.drafter.costs.model_seconds, prop.seconds, self.drafter.costs.decay
            )
        self._maps = {}
        if mix == "free":
            tree = free_tree
            self._maps[self.free.source] = list(range(1 + free_tree.num_nodes))
        elif mix == "model":
            assert model_tree is not None
            tree = model_tree
            self._maps["model"] = list(range(1 + model_tree.num_nodes))
            if guess:  # the run the model was given: credited where the model's chain kept it
                self._maps[self.free.source] = map_onto(free_tree, model_tree)
        else:
            assert model_tree is not None
            tree, (fmap, mmap) = merge_trees(key, [free_tree, model_tree])
            self._maps = {self.free.source: fmap, "model": mmap}
        self.drafter.mixes["guided" if guess else mix] += 1
        self._model_tree = model_tree
        for name, mapping in self._maps.items():
            if len(mapping) > 1:
                s = stats.source(name)
                s.steps += 1
                s.proposed += len(mapping) - 1
        seconds += self._pending_seconds
        self._pending_seconds = 0.0
        self._proposed_at = time.perf_counter()
        return Proposal(tree=tree, forwards=forwards, seconds=seconds)

    def observe(self, tokens: Sequence[int], accepted: Sequence[int]) -> None:
        costs = self.drafter.costs
        costs.step_seconds = _ema(
            costs.step_seconds, time.perf_counter() - self._proposed_at, costs.decay
        )
        model_path: list[int] = []
        for name, mapping in self._maps.items():
            # the source's nodes on the accepted path: the longest prefix it proposed
            inverse = {m: ctx for ctx, m in enumerate(mapping) if m is not None}
            mine: list[int] = []
            for node in accepted:
                ctx = inverse.get(DraftTree.context_of(node))
                if ctx is None:
                    break
                mine.append(DraftTree.node_of(ctx))
            self.drafter.stats.source(name).accepted += len(mine)
            if name == "model":
                model_path = mine
                costs.model_tokens = _ema(costs.model_tokens, len(mine), costs.decay)
            else:
                b = self._bucket
                costs.free_tokens[b] = _ema(costs.free_tokens.get(b), len(mine), costs.decay)
                costs.free_hits[b] = _ema(costs.free_hits.get(b), float(bool(mine)), costs.decay)
        self.model.observe(tokens, model_path if self._model_tree is not None else [])
        t0 = time.perf_counter()
        self.free.append(tokens)
        dt = time.perf_counter() - t0
        self._pending_seconds += dt
        self.drafter.stats.source(self.free.source).seconds += dt
        self._maps = {}
        self._model_tree = None
