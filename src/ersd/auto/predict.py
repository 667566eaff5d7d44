"""Predictions ``tree="auto"`` decides on: a tree's expected tokens under a per-depth rank
profile, the optimal trees' node order, and a batch's time to its last row (pure functions)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Any

from ersd.tree import TreeShape


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


__all__ = ["batch_finish_seconds", "expected_tokens", "order_statistics", "tunstall_order"]
