"""The best-first growth step of dynamic draft trees (pure: numbers in, choices out).

A dynamic tree is grown in rounds, one draft forward per round.  Before a round's forward the
drafter knows the race (candidates and predicted acceptance ``a_r``) at every context fed so far;
a node's **value** is its predicted reach probability, the product of ``a_r`` along its path, and
the expected tokens per target call of a tree is ``1 + Σ value`` (Kobus & Gündüz 2025, §3, with a
margin-conditioned ``P_R`` per context instead of one profile).

:func:`plan_round` runs the Tunstall greedy (max-heap: pop the best node, push its next sibling
and its first child) over the remaining budget, mixing **known** candidates (children of fed
contexts, valued with their context's own prediction) and **virtual** ones (below nodes not fed
yet, valued with the margin-free per-depth prior).  The known candidates it pops are added now;
the added nodes with a virtual child in the plan are fed in the next forward, where their races
replace the prior and the plan is made again.  With a cost model the plan is cut at the prefix
of highest predicted tokens per second (the cost-aware variant stops growing there).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class StepCosts(Protocol):
    """Forward-time curves (e.g. :class:`ersd.costs.CostModel`): seconds per forward with
    ``n`` new tokens, plus per-step overhead seconds."""

    overhead: float

    def target_cost(self, n: float) -> float: ...

    def draft_cost(self, n: float) -> float: ...


@dataclass(frozen=True)
class OpenContext:
    """A fed context whose race is known: candidates ``next_rank ..`` may still be added."""

    ctx: int
    reach: float  # predicted probability that the verification walk reaches this context
    accept: np.ndarray  # predicted P(target's winner = candidate i), i = 0, 1, ...
    next_rank: int  # 0-based index of the next candidate (= children already added)
    depth: int  # depth of its children (1 = children of the root)


@dataclass(frozen=True)
class CostState:
    """What the step has already spent, for the cost-aware cut."""

    costs: StepCosts
    nodes: int  # nodes already in the tree
    expected: float  # 1 + Σ value of the nodes already in the tree
    draft_seconds: float  # predicted seconds of the draft forwards already made


@dataclass(frozen=True)
class RoundPlan:
    """``add``: known candidates to add now ``(ctx, index)``, best first; ``feed``: positions in
    ``add`` of the new nodes to feed next round; ``values``: their predicted reach."""

    add: list[tuple[int, int]]
    feed: list[int]
    values: list[float]


def plan_round(
    contexts: Sequence[OpenContext],
    budget: int,
    max_depth: int,
    prior: Callable[[int], np.ndarray],
    cost: CostState | None = None,
) -> RoundPlan:
    """One round of best-first growth under ``budget`` nodes and ``max_depth`` (module doc)."""
    by_ctx = {c.ctx: c for c in contexts}
    heap: list[tuple[float, int, int, int, int, int]] = []  # (-value, tie, parent, ctx, i, depth)
    tie = 0
    for c in contexts:
        if c.next_rank < c.accept.size and c.depth <= max_depth:
            heapq.heappush(
                heap,
                (-c.reach * float(c.accept[c.next_rank]), tie, -1, c.ctx, c.next_rank, c.depth),
            )
            tie += 1
    # plan nodes: (parent plan node or -1 for a known context, ctx, index, depth, value)
    nodes: list[tuple[int, int, int, int, float]] = []
    while heap and len(nodes) < budget:
        neg, _, parent, ctx, i, depth = heapq.heappop(heap)
        value = -neg
        if value <= 0.0:
            break
        nid = len(nodes)
        nodes.append((parent, ctx, i, depth, value))
        if parent < 0:
            known = by_ctx[ctx]
            if i + 1 < known.accept.size:
                heapq.heappush(
                    heap, (-known.reach * float(known.accept[i + 1]), tie, -1, ctx, i + 1, depth)
                )
                tie += 1
        else:
            pr = prior(depth)
            if i + 1 < pr.size:
                heapq.heappush(
                    heap, (-nodes[parent][4] * float(pr[i + 1]), tie, parent, -1, i + 1, depth)
                )
                tie += 1
        if depth < max_depth:
            heapq.heappush(heap, (-value * float(prior(depth + 1)[0]), tie, nid, -1, 0, depth + 1))
            tie += 1
    keep = len(nodes) if cost is None else _best_prefix(nodes, cost)
    add: list[tuple[int, int]] = []
    values: list[float] = []
    position: dict[int, int] = {}
    feed: set[int] = set()
    for nid, (parent, ctx, i, _depth, value) in enumerate(nodes[:keep]):
        if parent < 0:
            position[nid] = len(add)
            add.append((ctx, i))
            values.append(value)
        elif parent in position:
            feed.add(position[parent])
    return RoundPlan(add=add, feed=sorted(feed), values=values)


def _best_prefix(nodes: list[tuple[int, int, int, int, float]], cost: CostState) -> int:
    """The number of plan nodes whose prefix has the highest predicted tokens per second."""
    c = cost.costs
    fixed = cost.draft_seconds + c.overhead
    widths: dict[int, int] = {}  # planned fed nodes per depth
    fed: set[int] = set()
    draft = 0.0
    expected = cost.expected
    best_n, best_rate = 0, expected / (c.target_cost(cost.nodes + 1) + fixed)
    for n, (parent, _ctx, _i, _depth, value) in enumerate(nodes, start=1):
        if parent >= 0 and parent not in fed:
            fed.add(parent)
            level = nodes[parent][3]
            w = widths.get(level, 0)
            draft += c.draft_cost(w + 1) - (c.draft_cost(w) if w else 0.0)
            widths[level] = w + 1
        expected += value
        rate = expected / (c.target_cost(cost.nodes + n + 1) + fixed + draft)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n
