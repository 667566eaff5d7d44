"""Forward-cost curves and the cost-aware choice of draft tree, at any batch size.

Tokens per target call is what trees maximise in theory; tokens per **second** is what users get.
At batch size ``B`` (rows generated together, each with the same tree) one speculative step costs

    step_time(tree, B) = target(B, n + 1) + draft(B, 1) + Σ_{d=1}^{depth-1} draft(B, w_d)
                         + overhead · B

where ``target(B, s)`` / ``draft(B, s)`` are measured seconds of one forward feeding ``s`` new
tokens to each of ``B`` rows on their KV caches (one target forward scores every row's pending
token and all ``n`` nodes of its tree: ``B·(n + 1)`` tokens stacked; the drafter makes one forward
for the roots and one per further level, feeding the ``w_d`` nodes of depth ``d`` that have
children in every row), and ``overhead`` is the per-row time outside forwards.  The predicted
throughput over the batch is ``B · E[tokens per call] / step_time`` with ``E`` from the i.i.d.-rank
model (:func:`ersd.theory.expected_block_efficiency_by_depth`); target-only decoding is predicted
at ``B / (target(B, 1) + overhead_plain · B)``.  The cost-aware tree maximises the prediction over
a candidate set (:func:`candidate_trees`; :mod:`ersd.auto` adds "no drafting" and chooses per step).

A :class:`CostModel` holds the batch-1 curves (``sizes``, ``target``, ``draft``) and optionally
curves per measured batch size (``batch_sizes``, ``target_batch``, ``draft_batch``); without them a
batch of ``B`` rows with ``s`` tokens each is costed as one row with ``B·s`` tokens (the stacked
forward).  :func:`measure_costs` measures both on any ersd :class:`~ersd.LanguageModel` through the
public protocol, in fresh sessions, with :func:`ersd.models.batch.score_many` (a backend without
``score_batch`` is timed row by row, so its curve honestly shows no batching gain).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ersd.errors import ErsdError
from ersd.theory import expected_block_efficiency_by_depth, optimal_tree_by_depth
from ersd.tree import TreeShape

#: forward sizes (new tokens per row) timed by default: up to 16, so that the target forward of
#: ``tree="auto"``'s largest candidate (a 16-node tree: 17 tokens) is read off the curve, not
#: extrapolated from the 4 → 8 slope (on a 2-core CPU that slope under-predicted a 17-token
#: float32 forward by 12% and made the large trees look cheaper than they are)
DEFAULT_SIZES = (1, 2, 4, 8, 16)
#: timed rounds per measured curve (after one warm-up round): with two, one slow stretch of a
#: shared machine could leave its mark on a size or two (a bf16 1.5B target measured 0.31 s and
#: 0.34 s at 8 and 16 tokens, where its steps of 1-7 tokens took 0.25-0.26 s), and a curve is
#: kept in the cost store for every later run
MEASURE_REPEATS = 5


class CostModelError(ErsdError):
    """Forward-cost curves that cannot be used (lengths differ, negative or missing times)."""


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear in ``x``, extended linearly beyond the last point (constant before the
    first).  The extension's slope is the larger of the last segment's and the whole curve's,
    and never negative: a forward of more tokens never costs less, and two noisy timings
    (16 tokens timed a little faster than 8) once extrapolated a 118-token draft prefill to 60%
    of a one-token forward."""
    xa = np.asarray(xs, dtype=np.float64)
    ya = np.asarray(ys, dtype=np.float64)
    if x <= xa[-1] or xa.size < 2:
        return float(np.interp(x, xa, ya))
    last = (ya[-1] - ya[-2]) / (xa[-1] - xa[-2])
    overall = (ya[-1] - ya[0]) / (xa[-1] - xa[0])
    return float(ya[-1] + max(last, overall, 0.0) * (x - xa[-1]))


def _check_curve(name: str, values: Any, n: int) -> list[float]:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise CostModelError(
            f"cost curve {name} must be a list of seconds, got {values!r}"
        ) from None
    if len(out) != n or not all(math.isfinite(v) and v >= 0 for v in out):
        raise CostModelError(
            f"cost curve {name} must hold {n} finite non-negative seconds (one per size), got "
            f"{values!r}; measure one with ersd.costs.measure_costs or `ersd bench calibrate`"
        )
    return out


def _check_sizes(name: str, values: Any) -> list[int]:
    ok = isinstance(values, list | tuple) and len(values) > 0
    out = [int(v) for v in values] if ok and all(isinstance(v, int | float) for v in values) else []
    if not out or any(v < 1 for v in out) or out != sorted(set(out)):
        raise CostModelError(f"{name} must be increasing positive integers, got {values!r}")
    return out


@dataclass
class CostModel:
    """Median forward seconds per number of new tokens (and rows), plus per-step overheads."""

    sizes: list[int]
    target: list[float]
    draft: list[float]
    overhead: float = 0.0  # seconds per row per speculative step outside model forwards
    overhead_plain: float = 0.0  # seconds per row per target-only step outside the forward
    meta: dict[str, Any] = field(default_factory=dict)
    #: measured batch sizes (rows per forward); with them ``target_batch[b][i]`` is the forward
    #: time of ``batch_sizes[b]`` rows with ``sizes[i]`` new tokens each (the same for the draft)
    batch_sizes: list[int] = field(default_factory=list)
    target_batch: list[list[float]] = field(default_factory=list)
    draft_batch: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sizes = _check_sizes("CostModel sizes", self.sizes)
        n = len(self.sizes)
        self.target = _check_curve("target", self.target, n)
        self.draft = _check_curve("draft", self.draft, n)
        for name in ("overhead", "overhead_plain"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise CostModelError(f"CostModel {name} must be seconds >= 0, got {v!r}")
        if self.batch_sizes:
            self.batch_sizes = _check_sizes("CostModel batch_sizes", self.batch_sizes)
            for name in ("target_batch", "draft_batch"):
                rows = getattr(self, name)
                if not isinstance(rows, list | tuple) or len(rows) != len(self.batch_sizes):
                    raise CostModelError(
                        f"CostModel {name} needs one curve per batch size "
                        f"({len(self.batch_sizes)}), got {rows!r}"
                    )
                setattr(
                    self, name, [_check_curve(f"{name}[{b}]", r, n) for b, r in enumerate(rows)]
                )
        elif self.target_batch or self.draft_batch:
            raise CostModelError("CostModel target_batch/draft_batch need batch_sizes")

    def _cost(self, base: list[float], by_batch: list[list[float]], n: float, batch: int) -> float:
        if not self.batch_sizes:
            return _interp(self.sizes, base, n * batch)  # stacked: one row of B·n tokens
        per_b = [_interp(self.sizes, curve, n) for curve in by_batch]
        return max(_interp(self.batch_sizes, per_b, batch), 0.0)

    def target_cost(self, n: float, batch: int = 1) -> float:
        """Seconds of one target forward with ``n`` new tokens in each of ``batch`` rows."""
        return self._cost(self.target, self.target_batch, n, batch)

    def draft_cost(self, n: float, batch: int = 1) -> float:
        """Seconds of one draft forward with ``n`` new tokens in each of ``batch`` rows."""
        return self._cost(self.draft, self.draft_batch, n, batch)

    def step_time(self, shape: TreeShape, batch: int = 1) -> float:
        """Predicted seconds of one speculative step with ``shape`` in each of ``batch`` rows."""
        expanded = [0] * (shape.depth + 1)  # expanded[d]: nodes at depth d with children
        for i, p in enumerate(shape.paths):
            if shape.child_nodes(i):
                expanded[len(p)] += 1
        draft = self.draft_cost(1, batch) + sum(
            self.draft_cost(w, batch) for w in expanded[1:] if w
        )
        return self.target_cost(shape.num_nodes + 1, batch) + draft + self.overhead * batch

    def target_only_rate(self, batch: int = 1) -> float:
        """Predicted tokens per second of target-only decoding over ``batch`` rows."""
        return batch / (self.target_cost(1, batch) + self.overhead_plain * batch)

    def cheap_target_only_rate(self, batch: int = 1) -> float:
        """Target-only decoding that pays a two-token forward per token (the cheaper kernel)."""
        return batch / (self.target_cost(2, batch) + self.overhead_plain * batch)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> CostModel:
        """A cost model from :meth:`to_dict` output (unknown keys are an error)."""
        if isinstance(data, CostModel):
            return data
        if not isinstance(data, dict):
            raise CostModelError(f"cost model must be a JSON object, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(data) - known)
        missing = sorted({"sizes", "target", "draft"} - set(data))
        if extra or missing:
            raise CostModelError(
                f"cost model keys: unknown {extra}, missing {missing}; expected the fields of "
                "ersd.costs.CostModel (as written by `ersd bench calibrate`)"
            )
        return cls(**data)


@dataclass
class TreePrediction:
    spec: str
    num_nodes: int
    depth: int
    block_efficiency: float  # expected tokens per target call (i.i.d.-rank model)
    step_time: float
    tokens_per_second: float  # over the batch
    speedup: float  # vs predicted target-only decoding at the same batch size
    batch: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict(
    shape: TreeShape | None,
    depth_rank_probs: Sequence[Any],
    costs: CostModel,
    spec: str = "",
    batch: int = 1,
) -> TreePrediction:
    """Predicted tokens per target call, step time and throughput of ``shape`` at ``batch`` rows
    (``shape=None``: target-only decoding, one token per call)."""
    plain = costs.target_only_rate(batch)
    if shape is None:
        step = batch / plain
        return TreePrediction(spec or "none", 0, 0, 1.0, step, plain, 1.0, batch)
    tau = expected_block_efficiency_by_depth(shape.paths, depth_rank_probs)
    step = costs.step_time(shape, batch)
    rate = batch * tau / step
    return TreePrediction(
        spec=spec or shape.spec,
        num_nodes=shape.num_nodes,
        depth=shape.depth,
        block_efficiency=tau,
        step_time=step,
        tokens_per_second=rate,
        speedup=rate / plain,
        batch=batch,
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
    depth_rank_probs: Sequence[Any],
    costs: CostModel,
    budgets: Sequence[int],
    max_nodes: int,
    batch: int = 1,
) -> dict[str, Any]:
    """Per budget K the optimal-per-call tree (``optimal:K``) and its prediction; overall the
    cost-aware tree (highest predicted tokens/s among :func:`candidate_trees`) at ``batch``."""
    per_call = {}
    for k in budgets:
        shape = TreeShape.from_paths(optimal_tree_by_depth(depth_rank_probs, k))
        per_call[str(k)] = predict(shape, depth_rank_probs, costs, f"optimal:{k}", batch).to_dict()
    preds = [
        predict(shape, depth_rank_probs, costs, spec, batch)
        for spec, shape in candidate_trees(depth_rank_probs, max_nodes).items()
    ]
    preds.sort(key=lambda p: -p.tokens_per_second)
    return {
        "optimal_per_call": per_call,
        "cost_aware": preds[0].to_dict(),
        "top_candidates": [p.to_dict() for p in preds[:8]],
        "target_only_rate": costs.target_only_rate(batch),
        "cheap_target_only_rate": costs.cheap_target_only_rate(batch),
        "batch": batch,
    }


# --- measurement -----------------------------------------------------------------------------


def measure_curve(
    model: Any,
    prompt: Sequence[int],
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    batch: int = 1,
    repeats: int = MEASURE_REPEATS,
) -> list[float]:
    """Median seconds of one forward of ``model`` with ``s`` new tokens in each of ``batch`` fresh
    sessions of ``prompt``, for ``s`` in ``sizes``.

    Uses the public session protocol: after a prefill, each timed call feeds every row's pending
    token plus ``s - 1`` chained nodes (one :func:`~ersd.models.batch.score_many`), then each row
    commits one token, so the context grows by one per timing and stays near the prompt length
    (the prompt plus ``len(sizes) · (repeats + 1) + 1`` tokens must fit the model's window).
    The sizes are timed in rounds, one forward of each per round (the first round is a warm-up),
    so a slow stretch of the machine touches every size alike -- the online correction scales
    a curve, it cannot reshape one -- and the median over rounds drops it.
    The sessions are dropped afterwards: nothing touches any generation's state.
    """
    from ersd.models.batch import score_many

    prompt = [int(t) for t in prompt]
    if not prompt:
        raise CostModelError("measuring forward costs needs a non-empty prompt")
    if repeats < 1:
        raise CostModelError(f"measuring forward costs needs repeats >= 1, got {repeats}")
    sessions = [model.start(list(prompt)) for _ in range(batch)]
    score_many(model, sessions, [([], [])] * batch)
    tok = prompt[-1]
    for s in sessions:
        s.commit([tok], [])
    times: list[list[float]] = [[] for _ in sizes]
    for _ in range(repeats + 1):
        for i, size in enumerate(sizes):
            nodes = int(size) - 1
            call = ([tok] * nodes, list(range(-1, nodes - 1)))
            t0 = time.perf_counter()
            score_many(model, sessions, [call] * batch)
            times[i].append(time.perf_counter() - t0)
            for s in sessions:
                s.commit([tok], [])
    return [statistics.median(t[1:]) for t in times]


def measure_costs(
    target: Any,
    draft: Any,
    prompt: Sequence[int],
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = MEASURE_REPEATS,
    batch_sizes: Sequence[int] = (),
) -> CostModel:
    """Forward-cost curves of a target and a draft model (:func:`measure_curve`).

    ``batch_sizes`` (e.g. ``[1, 4, 8]``) also measures curves at those batch sizes; ``draft=None``
    (a model-free drafter) costs nothing.
    """
    sizes = list(sizes)

    def curve(model: Any, batch: int) -> list[float]:
        if model is None:
            return [0.0] * len(sizes)
        return measure_curve(model, prompt, sizes, batch=batch, repeats=repeats)

    costs = CostModel(sizes=sizes, target=curve(target, 1), draft=curve(draft, 1))
    bs = sorted({int(b) for b in batch_sizes})
    if bs:
        costs.batch_sizes = bs
        costs.target_batch = [costs.target if b == 1 else curve(target, b) for b in bs]
        costs.draft_batch = [costs.draft if b == 1 else curve(draft, b) for b in bs]
    return costs


__all__ = [
    "DEFAULT_SIZES",
    "MEASURE_REPEATS",
    "CostModel",
    "CostModelError",
    "TreePrediction",
    "candidate_trees",
    "choose_trees",
    "measure_costs",
    "measure_curve",
    "predict",
]
