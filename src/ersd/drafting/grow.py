"""Growing a draft tree from counted continuations: the shared part of the model-free drafters.

A model-free drafter (prompt lookup, suffix trie) knows, at a context, a short list of
*continuations*: tokens that followed this context's tail somewhere in the text, each with a
weight (how often) and the drafter's state after it.  :func:`grow_tree` turns that into a
:class:`~ersd.methods.DraftTree` within a :class:`Budget`, and it is where exactness is decided
(docs/drafters.md):

* the **proposal set** ``S`` of a context is its best ``k`` continuations (``k`` = branching left)
  and the **draft distribution** there is ``q = weights of S, normalised`` (one-hot when ``k = 1``);
* under ERSD, GLS and greedy decoding (rules that are exact for *any* children: the emitted token
  is always the target's own race winner / argmax) the children are ``S`` itself, best first;
* under every other rule (SD, SpecInfer, RRS-wor, SpecTr, SpecHub) the children are drawn by
  the rule's own drafting rule from ``q`` (``rule.draft(q, k, noise)``), exactly as a draft model's
  children are drawn from its ``q``: each method's exactness proof then applies unchanged.  A
  child drawn twice (i.i.d. drafting) is kept (the verifier needs it) but not expanded.

``q`` and ``k`` depend only on the context, the text before it and the budget left — never on the
context's verification noise — so the draft is a legitimate draw for every method.
Expansion is best-first by the estimated probability of the path (product of continuation
shares), so a budget goes to the likeliest branches.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ersd.errors import ErsdError
from ersd.methods import DraftTree, GreedyRule, Method, NodeNoise
from ersd.methods.ersd import ERSD
from ersd.methods.gls import GumbelListSampling
from ersd.race import RaceNoise
from ersd.tree import TreeShape


class DrafterConfigError(ErsdError):
    """A drafter spec, option or corpus is invalid (the message names the fix)."""


class Continuation(NamedTuple):
    """A token that followed the current context's tail, its share, and the state after it.

    ``weight`` is the share of this token among *all* continuations of the tail (how often it
    followed, normalised); a drafter may return only its best few continuations.
    """

    token: int
    weight: float
    state: Hashable


#: a drafter's look-up: continuations of a state, best first (empty: nothing to propose)
Expand = Callable[[Hashable], list[Continuation]]


@dataclass(frozen=True)
class Budget:
    """At most ``nodes`` nodes, ``depth`` levels and ``branches`` children per context."""

    nodes: int
    depth: int
    branches: int

    @classmethod
    def within(cls, shape: TreeShape, nodes: int, depth: int, branches: int) -> Budget:
        """The drafter's own limits intersected with the step's shape (the shape is the budget)."""
        return cls(
            nodes=min(nodes, shape.num_nodes),
            depth=min(depth, shape.depth),
            branches=min(branches, shape.max_children),
        )


def any_children_exact(rule: Method) -> bool:
    """True for rules whose verification is exact whatever children are proposed.

    ERSD (the emitted token is always the target's race winner), GLS (always the target's race
    winner over the node's lanes, ``K`` = number of children, whatever the children are) and
    greedy decoding (always the target's argmax).  Every other rule assumes its children were
    drawn by its drafting rule.
    """
    return isinstance(rule, ERSD | GumbelListSampling | GreedyRule)


def proposal_probs(
    conts: list[Continuation], vocab_size: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``q`` over the proposal set: the continuations' weights, normalised (float64, dense).

    ``out``: a zeroed float64 vector of ``vocab_size`` entries to fill instead of a new one.
    """
    q = torch.zeros(vocab_size, dtype=torch.float64) if out is None else out
    total = sum(c.weight for c in conts)
    for c in conts:
        q[c.token] += c.weight / total
    return q


def grow_tree(
    expand: Expand,
    root_state: Hashable,
    budget: Budget,
    key: int,
    rule: Method,
    noise: RaceNoise,
    alloc: Callable[[], torch.Tensor] | None = None,
) -> tuple[DraftTree, dict[int, Hashable]]:
    """Grow a draft tree below the root (race key ``key``) within ``budget``.

    Returns the tree and the drafter state at each context that has one.  Continuation tokens
    must lie in ``[0, noise.vocab_size)`` (the target's vocabulary).  ``alloc`` returns a zeroed
    float64 vector of ``noise.vocab_size`` entries for each ``q`` (default: a new one).
    """
    tree = DraftTree.empty(key)
    states: dict[int, Hashable] = {DraftTree.ROOT: root_state}
    vocab = noise.vocab_size
    left = budget.nodes
    order = 0
    # (-path probability, insertion order, context, depth of the context)
    heap: list[tuple[float, int, int, int]] = [(-1.0, order, DraftTree.ROOT, 0)]
    deterministic = any_children_exact(rule)
    while heap and left > 0:
        neg_w, _, ctx, depth = heapq.heappop(heap)
        if depth >= budget.depth:
            continue
        conts = expand(states[ctx])
        if not conts:
            continue
        proposed = conts[: min(budget.branches, left)]
        for c in proposed:
            if not 0 <= c.token < vocab:
                raise DrafterConfigError(
                    f"drafter proposed token {c.token}, outside the target's vocabulary "
                    f"[0, {vocab}); the drafter's text (prompt or corpus) uses another tokenizer"
                )
        q = proposal_probs(proposed, vocab, alloc() if alloc is not None else None)
        tree.draft_probs[ctx] = q
        if deterministic or len(proposed) == 1:
            # one candidate: q is one-hot and every rule's drafting returns that token (skipped:
            # an i.i.d. draw scans the whole vocabulary)
            chosen = [c.token for c in proposed]
        else:
            chosen = rule.draft(q, len(proposed), NodeNoise(noise, tree.keys[ctx]))
        by_token = {c.token: c for c in proposed}
        expanded: set[int] = set()
        for tok in chosen:
            child = tree.add_child(ctx, tok)
            left -= 1
            if tok in expanded:  # an i.i.d. duplicate: verified, but its subtree stays empty
                continue
            expanded.add(tok)
            c = by_token[tok]
            states[child] = c.state
            order += 1
            heapq.heappush(heap, (neg_w * c.weight, order, child, depth + 1))
    return tree, states
