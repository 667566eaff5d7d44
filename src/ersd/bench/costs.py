"""Forward-cost curves and the cost-aware choice of draft tree.

Tokens per target call is what trees maximise in theory; tokens per **second** is what users get.
One speculative step costs

    step_time(tree) = target(n + 1) + draft(1) + Σ_{d=1}^{depth-1} draft(w_d) + overhead

where ``target(s)`` / ``draft(s)`` are measured forward times with ``s`` new tokens on a KV cache
(one target forward scores the pending token and all ``n`` tree nodes; the drafter makes one
forward for the root and one per further level, feeding the ``w_d`` nodes of depth ``d`` that
have children), and ``overhead`` is the measured per-step time outside forwards.  The predicted
rate is ``E[tokens per call] / step_time`` with ``E`` from the i.i.d.-rank model
(:func:`ersd.theory.expected_block_efficiency_by_depth`), and the cost-aware tree maximises it
over a candidate set (chains, M×L, optimal trees of several sizes and their depth truncations).
Target-only decoding is predicted at ``1 / (target(1) + overhead_plain)`` tokens per second.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ersd.theory import expected_block_efficiency_by_depth, optimal_tree_by_depth
from ersd.tree import TreeShape


@dataclass
class CostModel:
    """Median forward seconds per number of new tokens, plus per-step overheads."""

    sizes: list[int]
    target: list[float]
    draft: list[float]
    overhead: float = 0.0  # seconds per speculative step outside model forwards
    overhead_plain: float = 0.0  # seconds per target-only step outside the forward
    meta: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def _interp(sizes: Sequence[int], times: Sequence[float], n: float) -> float:
        xs = np.asarray(sizes, dtype=np.float64)
        ys = np.asarray(times, dtype=np.float64)
        if n <= xs[-1] or xs.size < 2:
            return float(np.interp(n, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])  # linear beyond the last measured size
        return float(ys[-1] + slope * (n - xs[-1]))

    def target_cost(self, n: float) -> float:
        return self._interp(self.sizes, self.target, n)

    def draft_cost(self, n: float) -> float:
        return self._interp(self.sizes, self.draft, n)

    def step_time(self, shape: TreeShape) -> float:
        expanded = [0] * (shape.depth + 1)  # expanded[d]: nodes at depth d with children
        for i, p in enumerate(shape.paths):
            if shape.child_nodes(i):
                expanded[len(p)] += 1
        draft = self.draft_cost(1) + sum(self.draft_cost(w) for w in expanded[1:] if w)
        return self.target_cost(shape.num_nodes + 1) + draft + self.overhead

    def target_only_rate(self) -> float:
        return 1.0 / (self.target_cost(1) + self.overhead_plain)

    def cheap_target_only_rate(self) -> float:
        """Target-only decoding that pays a two-token forward per token (the cheaper kernel)."""
        return 1.0 / (self.target_cost(2) + self.overhead_plain)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        return cls(**data)


@dataclass
class TreePrediction:
    spec: str
    num_nodes: int
    depth: int
    block_efficiency: float  # expected tokens per target call (i.i.d.-rank model)
    step_time: float
    tokens_per_second: float
    speedup: float  # vs predicted target-only decoding

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict(
    shape: TreeShape, depth_rank_probs: Sequence[Any], costs: CostModel, spec: str = ""
) -> TreePrediction:
    tau = expected_block_efficiency_by_depth(shape.paths, depth_rank_probs)
    step = costs.step_time(shape)
    rate = tau / step
    return TreePrediction(
        spec=spec or shape.spec,
        num_nodes=shape.num_nodes,
        depth=shape.depth,
        block_efficiency=tau,
        step_time=step,
        tokens_per_second=rate,
        speedup=rate / costs.target_only_rate(),
    )


def candidate_trees(depth_rank_probs: Sequence[Any], max_nodes: int) -> dict[str, TreeShape]:
    """Chains, M×L, optimal trees up to ``max_nodes`` and every depth truncation of them."""
    out: dict[str, TreeShape] = {}
    for k in range(1, max_nodes + 1):
        out[f"chain:{k}"] = TreeShape.chain(k)
    for m in range(2, 5):
        for length in range(1, max_nodes // m + 1):
            out[f"multi:{m}x{length}"] = TreeShape.multi(m, length)
    seen = {s.paths for s in out.values()}
    for k in range(1, max_nodes + 1):
        full = TreeShape.from_paths(optimal_tree_by_depth(depth_rank_probs, k))
        for d in range(full.depth, 0, -1):
            cut = full.truncated(d)
            if cut is not None and cut.paths not in seen:
                seen.add(cut.paths)
                out[cut.spec] = cut
    return out


def choose_trees(
    depth_rank_probs: Sequence[Any], costs: CostModel, budgets: Sequence[int], max_nodes: int
) -> dict[str, Any]:
    """Per budget K the optimal-per-call tree (``optimal:K``) and its prediction; overall the
    cost-aware tree (highest predicted tokens/s among :func:`candidate_trees`)."""
    per_call = {}
    for k in budgets:
        shape = TreeShape.from_paths(optimal_tree_by_depth(depth_rank_probs, k))
        per_call[str(k)] = predict(shape, depth_rank_probs, costs, f"optimal:{k}").to_dict()
    preds = [
        predict(shape, depth_rank_probs, costs, spec)
        for spec, shape in candidate_trees(depth_rank_probs, max_nodes).items()
    ]
    preds.sort(key=lambda p: -p.tokens_per_second)
    return {
        "optimal_per_call": per_call,
        "cost_aware": preds[0].to_dict(),
        "top_candidates": [p.to_dict() for p in preds[:8]],
        "target_only_rate": costs.target_only_rate(),
        "cheap_target_only_rate": costs.cheap_target_only_rate(),
    }


def measure_costs(
    target: Any,
    draft: Any,
    prompt: Sequence[int],
    sizes: Sequence[int],
    repeats: int,
) -> CostModel:
    """Median seconds of one forward with ``s`` new tokens (s in ``sizes``) on each model.

    Uses the session protocol: after a prefill, each timed ``score`` feeds the one pending token
    plus ``s - 1`` chained nodes, then ``commit`` keeps one token (the context grows by one per
    timing, staying near the prompt length).
    """
    model_costs = []
    for model in (target, draft):
        session = model.start(list(prompt))
        session.score([], [])
        tok = int(prompt[-1])
        session.commit([tok], [])
        med = []
        for s in sizes:
            times = []
            for _ in range(repeats + 1):  # the first one is a warm-up for this shape
                nodes = s - 1
                t0 = time.perf_counter()
                session.score([tok] * nodes, list(range(-1, nodes - 1)))
                times.append(time.perf_counter() - t0)
                session.commit([tok], [])
            med.append(statistics.median(times[1:]))
        model_costs.append(med)
    return CostModel(sizes=list(sizes), target=model_costs[0], draft=model_costs[1])
