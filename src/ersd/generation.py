"""The generation loop: propose → score → verify → commit, one record per target call.

* **propose** — the drafter builds the draft tree level by level (one draft forward per depth),
  choosing each node's children with the method's drafting rule.
* **score** — the target scores the root and every tree node in one forward pass.
* **verify** — the method's rules walk the tree (:func:`ersd.methods.verify_tree`).
* **commit** — both model sessions keep exactly the accepted path and the next token.

Models know nothing about verification and methods know nothing about models: this module wires
them.  Randomness comes only from keyed races (:mod:`ersd.race`) built from ``seed`` and the
context, so every run is a deterministic function of its arguments.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ersd.errors import GenerationInputError, VocabularyMismatchError
from ersd.methods import DraftTree, GreedyRule, Method, NodeNoise, get_method, verify_tree
from ersd.models.base import LanguageModel, ModelSession
from ersd.probs import SamplingParams, logits_to_probs
from ersd.race import STREAM_RACE, RaceNoise, extend_key, race_winner, root_key
from ersd.tree import TreeShape, parse_tree


@dataclass
class StepRecord:
    """What happened in one target call."""

    step: int
    tokens: list[int]  # tokens emitted by this call (after EOS / length truncation)
    num_draft_tokens: int  # nodes in the drafted tree
    num_accepted: int  # accepted draft tokens among ``tokens``
    draft_forwards: int
    tree_depth: int
    ranks: list[int] = field(default_factory=list)  # ERSD: rank of target winner per context
    draft_time: float = 0.0  # seconds in draft model forwards
    target_time: float = 0.0  # seconds in the target model forward
    total_time: float = 0.0  # seconds for the whole step

    @property
    def other_time(self) -> float:
        return max(self.total_time - self.draft_time - self.target_time, 0.0)


@dataclass
class GenerationResult:
    """Generated tokens (new tokens only, EOS included if hit) and statistics.

    ``block_efficiency`` is tokens emitted per target call, bonus/correction token included
    (the vLLM / EAGLE "mean acceptance length"); ``mean_accepted`` excludes it (gpt-fast).
    """

    tokens: list[int]
    target_calls: int
    draft_forwards: int
    steps: list[StepRecord]
    method: str
    tree: str | None
    finish_reason: str  # "eos" or "length"
    wall_time: float

    @property
    def block_efficiency(self) -> float:
        return len(self.tokens) / self.target_calls if self.target_calls else 0.0

    @property
    def num_draft_tokens(self) -> int:
        return sum(s.num_draft_tokens for s in self.steps)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(s.num_accepted for s in self.steps)

    @property
    def mean_accepted(self) -> float:
        return self.num_accepted_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_rate(self) -> float:
        d = self.num_draft_tokens
        return self.num_accepted_tokens / d if d else 0.0

    @property
    def acceptance_histogram(self) -> list[int]:
        """``hist[j]`` = target calls that accepted exactly ``j`` draft tokens."""
        top = max((s.num_accepted for s in self.steps), default=0)
        hist = [0] * (top + 1)
        for s in self.steps:
            hist[s.num_accepted] += 1
        return hist

    @property
    def accepted_per_pos(self) -> list[float]:
        """``P(depth i accepted)`` for i = 1, 2, ...: calls accepting >= i drafts / calls."""
        depth = max((s.tree_depth for s in self.steps), default=0)
        n = len(self.steps) or 1
        return [sum(s.num_accepted >= i for s in self.steps) / n for i in range(1, depth + 1)]

    @property
    def ranks(self) -> list[int]:
        return [r for s in self.steps for r in s.ranks]

    @property
    def draft_time(self) -> float:
        return sum(s.draft_time for s in self.steps)

    @property
    def target_time(self) -> float:
        return sum(s.target_time for s in self.steps)

    @property
    def other_time(self) -> float:
        return max(self.wall_time - self.draft_time - self.target_time, 0.0)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.wall_time if self.wall_time > 0 else float("inf")

    @classmethod
    def from_steps(
        cls,
        steps: list[StepRecord],
        *,
        method: str | Method,
        tree: str | TreeShape | Sequence[Sequence[int]] | None,
        eos_token_id: int | Sequence[int] | None,
        wall_time: float,
    ) -> GenerationResult:
        """Collect the records of :func:`generate_stream` (``tree=None``: no draft was used)."""
        tokens = [t for s in steps for t in s.tokens]
        return cls(
            tokens=tokens,
            target_calls=len(steps),
            draft_forwards=sum(s.draft_forwards for s in steps),
            steps=steps,
            method=get_method(method).name,
            tree=parse_tree(tree).spec if tree is not None else None,
            finish_reason="eos" if tokens and tokens[-1] in _eos_set(eos_token_id) else "length",
            wall_time=wall_time,
        )

    def stats(self) -> dict[str, Any]:
        """Summary statistics as a JSON-ready dict (vLLM metric names where one exists)."""
        return {
            "method": self.method,
            "tree": self.tree,
            "num_tokens": len(self.tokens),
            "target_calls": self.target_calls,
            "draft_forwards": self.draft_forwards,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "block_efficiency": self.block_efficiency,
            "mean_accepted": self.mean_accepted,
            "acceptance_rate": self.acceptance_rate,
            "num_accepted_tokens_per_pos": self.accepted_per_pos,
            "acceptance_histogram": self.acceptance_histogram,
            "wall_time": self.wall_time,
            "draft_time": self.draft_time,
            "target_time": self.target_time,
            "other_time": self.other_time,
            "tokens_per_second": self.tokens_per_second,
            "finish_reason": self.finish_reason,
        }

    def to_dict(self) -> dict[str, Any]:
        d = self.stats()
        d["tokens"] = list(self.tokens)
        d["steps"] = [asdict(s) for s in self.steps]
        return d


class _LazyProbs:
    """Rows of ``logits`` turned into probabilities only when the verifier looks at them."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams) -> None:
        self.logits = logits
        self.params = params
        self._rows: dict[int, torch.Tensor] = {}

    def __getitem__(self, i: int) -> torch.Tensor:
        row = self._rows.get(i)
        if row is None:
            row = logits_to_probs(self.logits[i], self.params)
            self._rows[i] = row
        return row


def _check_model(model: Any, role: str) -> None:
    if not isinstance(model, LanguageModel):
        raise GenerationInputError(
            f"{role} must be a model with .vocab_size, .max_length and .start(prompt) (an "
            f"ersd.LanguageModel, e.g. ersd.FunctionModel or ersd.load_model(...)), got "
            f"{type(model).__name__}"
        )


def _validate(
    target: LanguageModel,
    draft: LanguageModel | None,
    prompt: Sequence[int],
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None,
) -> None:
    _check_model(target, "target")
    if draft is not None:
        _check_model(draft, "draft")
        if draft.vocab_size != target.vocab_size:
            raise VocabularyMismatchError(
                f"draft vocabulary has {draft.vocab_size} entries but the target's has "
                f"{target.vocab_size}; draft and target must share one tokenizer and vocabulary "
                "(pick a draft from the target's model family)"
            )
    if isinstance(prompt, str):
        raise GenerationInputError(
            "prompt must be a list of token ids, not a string; tokenize it first "
            "(e.g. model.tokenizer.encode(text))"
        )
    if len(prompt) == 0:
        raise GenerationInputError(
            "prompt is empty; give at least one token (e.g. the tokenizer's BOS token)"
        )
    v = target.vocab_size
    bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < v]
    if bad:
        raise GenerationInputError(
            f"prompt holds token ids outside [0, {v}): {bad[:5]}; check the tokenizer matches "
            "the model"
        )
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or (max_new_tokens < 1)
    ):
        raise GenerationInputError(
            f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}"
        )
    for eos in _eos_set(eos_token_id):
        if not 0 <= eos < v:
            raise GenerationInputError(f"eos_token_id {eos} is outside [0, {v})")


def _eos_set(eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(e) for e in eos_token_id)


def _propose(
    session: ModelSession,
    method: Method,
    shape: TreeShape,
    params: SamplingParams,
    noise: RaceNoise,
    key: int,
) -> tuple[DraftTree, dict[int, int], int, float]:
    """Draft a tree of ``shape`` level by level; returns (tree, fed node -> pending index,
    draft forwards, seconds in draft forwards)."""
    tree = DraftTree(tokens=[], parents=[], keys=[key], draft_probs=[None], children=[[]])
    fed: dict[int, int] = {}
    t0 = time.perf_counter()
    root_logits = session.score([], [])[0]
    draft_time = time.perf_counter() - t0
    forwards = 1
    # (shape node, tree context, logits at that context) of contexts to expand at this level
    frontier: list[tuple[int, int, torch.Tensor]] = [(-1, 0, root_logits)]
    while frontier:
        grown: list[tuple[int, int]] = []  # (shape node, tree context) of new expandable nodes
        for snode, ctx, logits in frontier:
            kids = shape.child_nodes(snode)
            if params.greedy:
                tree.draft_probs[ctx] = logits_to_probs(logits, params)
                toks = GreedyRule.draft(logits, len(kids))
            else:
                q = logits_to_probs(logits, params)
                tree.draft_probs[ctx] = q
                toks = method.draft(q, len(kids), NodeNoise(noise, tree.keys[ctx]))
            for j, tok in enumerate(toks):
                node = len(tree.tokens)
                tree.tokens.append(int(tok))
                tree.parents.append(ctx - 1)
                tree.keys.append(extend_key(tree.keys[ctx], tok))
                tree.draft_probs.append(None)
                tree.children.append([])
                tree.children[ctx].append(node)
                if shape.child_nodes(kids[j]):
                    grown.append((kids[j], node + 1))
        if not grown:
            break
        feed_tokens = [tree.tokens[c - 1] for _, c in grown]
        feed_parents = [fed.get(tree.parents[c - 1], -1) for _, c in grown]
        base = len(fed)
        t0 = time.perf_counter()
        rows = session.score(feed_tokens, feed_parents)
        draft_time += time.perf_counter() - t0
        forwards += 1
        for r, (_, c) in enumerate(grown):
            fed[c - 1] = base + r
        frontier = [(s, c, rows[1 + r]) for r, (s, c) in enumerate(grown)]
    return tree, fed, forwards, draft_time


def generate_stream(
    target: LanguageModel,
    draft: LanguageModel | None,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    method: str | Method = "ersd",
    tree: str | TreeShape | Sequence[Sequence[int]] = "chain:4",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
) -> Iterator[StepRecord]:
    """Generate like :func:`generate`, yielding one :class:`StepRecord` per target call."""
    _validate(target, draft, prompt, max_new_tokens, eos_token_id)
    params = SamplingParams(temperature, top_k, top_p, min_p)
    meth = get_method(method)
    shape = parse_tree(tree)
    if draft is not None:
        meth.check_shape(shape)
    eos = _eos_set(eos_token_id)
    noise = RaceNoise(target.vocab_size)
    key = root_key(seed, prompt)
    tsess = target.start(list(prompt))
    dsess = draft.start(list(prompt)) if draft is not None else None
    emitted = 0
    step = 0
    while emitted < max_new_tokens:
        t_step = time.perf_counter()
        remaining = max_new_tokens - emitted
        step_shape = shape.truncated(remaining - 1) if dsess is not None else None
        draft_time = 0.0
        forwards = 0
        fed: dict[int, int] = {}
        # propose
        if dsess is not None and step_shape is not None:
            dtree, fed, forwards, draft_time = _propose(dsess, meth, step_shape, params, noise, key)
        else:
            dtree = DraftTree(tokens=[], parents=[], keys=[key], draft_probs=[None], children=[[]])
        # score
        t0 = time.perf_counter()
        logits = tsess.score(dtree.tokens, dtree.parents)
        target_time = time.perf_counter() - t0
        # verify
        target_probs = _LazyProbs(logits, params)
        if dtree.num_nodes == 0 and not params.greedy:
            tok = race_winner(target_probs[0], noise.exponentials(key, STREAM_RACE))
            accepted, tokens, ranks = [], [tok], []
        else:
            ver = verify_tree(None if params.greedy else meth, dtree, target_probs, noise)  # type: ignore[arg-type]
            accepted, tokens, ranks = ver.accepted, ver.tokens, ver.ranks
        # commit
        cut = min(len(tokens), remaining)
        for j, t in enumerate(tokens[:cut]):
            if t in eos:
                cut = j + 1
                break
        tokens = tokens[:cut]
        accepted = accepted[:cut]
        for t in tokens:
            key = extend_key(key, t)
        emitted += len(tokens)
        done = emitted >= max_new_tokens or tokens[-1] in eos
        if not done:
            tsess.commit(tokens, accepted)
            if dsess is not None:
                path: list[int] = []
                for n in accepted:
                    if n not in fed:
                        break
                    path.append(fed[n])
                dsess.commit(tokens, path)
        yield StepRecord(
            step=step,
            tokens=tokens,
            num_draft_tokens=dtree.num_nodes,
            num_accepted=len(accepted),
            draft_forwards=forwards,
            tree_depth=step_shape.depth if step_shape is not None else 0,
            ranks=ranks,
            draft_time=draft_time,
            target_time=target_time,
            total_time=time.perf_counter() - t_step,
        )
        step += 1
        if done:
            return


def generate(
    target: LanguageModel,
    draft: LanguageModel | None,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    method: str | Method = "ersd",
    tree: str | TreeShape | Sequence[Sequence[int]] = "chain:4",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
) -> GenerationResult:
    """Sample up to ``max_new_tokens`` tokens from ``target`` after ``prompt``.

    With a ``draft`` model, speculative sampling with ``method`` over draft trees of shape ``tree``
    (see :mod:`ersd.tree`); with ``draft=None``, plain autoregressive sampling from the target with
    the same sampler and keyed races (one target call per token).  Temperature 0 is greedy.
    """
    t0 = time.perf_counter()
    steps = list(
        generate_stream(
            target,
            draft,
            prompt,
            max_new_tokens=max_new_tokens,
            method=method,
            tree=tree,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            eos_token_id=eos_token_id,
        )
    )
    return GenerationResult.from_steps(
        steps,
        method=method,
        tree=tree if draft is not None else None,
        eos_token_id=eos_token_id,
        wall_time=time.perf_counter() - t0,
    )
