"""Block efficiency of draft trees under the i.i.d.-rank model, the speed-up bound, optimal trees.

Kobus & Gündüz, "Speculative Sampling via Exponential Races" (arXiv 2504.15475), §3 of the method
notes.  A tree is a list of **child-index paths** (0-based, the Medusa / vLLM convention of
:mod:`ersd.tree`): ``(0,)`` is the root's first child; for ERSD child index ``j`` is the rank-
``j + 1`` token of the drafter's race.  Under the i.i.d.-rank model the ranks ``R`` at successive
contexts are independent with law ``P_R`` (``rank_probs[r − 1] = P(R = r)``), so the node with path
``(j_1..j_d)`` is reached with probability ``Π_t P_R(j_t + 1)`` and

    E[#tokens per target call] = 1 + Σ_{v in tree} Π_t P_R(j_t(v) + 1).

The best ``k``-node tree holds the ``k`` most probable paths (a Tunstall dictionary), found with a
max-heap in ``O(k log k)``.  The paper's bound is ``(log|Ω| + log(k + 1)) / H[R]``: a call's outcome
(last accepted node, final token) has at most ``(k + 1)|Ω|`` values and, by Wald's identity for
entropy, carries ``E[N] H[R]`` nats about the emitted ranks.  Entropies are in nats.

A rank profile may depend on depth: the ``by_depth`` variants take a list of rank vectors, one per
depth (the last one is reused below the deepest listed depth).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ersd.errors import ErsdError
from ersd.theory.distributions import as_probs, check_count, rank_entropy
from ersd.tree import check_paths

Path = tuple[int, ...]


def _check_paths(paths: Iterable[Sequence[int]]) -> list[Path]:
    """Validate child-index paths (:func:`ersd.tree.check_paths`; gaps between siblings and the
    empty tree are fine here)."""
    return check_paths(paths, siblings=False, allow_empty=True)


def _depth_profiles(depth_rank_probs: Sequence[Any]) -> list[np.ndarray]:
    if len(depth_rank_probs) == 0:
        raise ErsdError("a per-depth rank profile needs at least one depth")
    return [
        as_probs(r, f"rank_probs[depth {d + 1}]", allow_deficit=True)
        for d, r in enumerate(depth_rank_probs)
    ]


def _at(profiles: list[np.ndarray], depth: int, index: int) -> float:
    """``P(R = index + 1)`` at 0-based ``depth`` (the last profile is reused deeper down)."""
    prof = profiles[min(depth, len(profiles) - 1)]
    return float(prof[index]) if index < prof.size else 0.0


def expected_block_efficiency_by_depth(
    paths: Iterable[Sequence[int]], depth_rank_probs: Sequence[Any]
) -> float:
    """:func:`expected_block_efficiency` with a rank profile per depth."""
    profiles = _depth_profiles(depth_rank_probs)
    total = 1.0
    for path in _check_paths(paths):
        prob = 1.0
        for depth, j in enumerate(path):
            prob *= _at(profiles, depth, j)
        total += prob
    return total


def expected_block_efficiency(paths: Iterable[Sequence[int]], rank_probs: Any) -> float:
    """``1 + Σ_{v in tree} Π_t P(R = j_t(v) + 1)``: expected tokens per target call.

    ``paths`` are 0-based child-index paths (an empty list is "no draft": 1 token per call);
    ``rank_probs[r − 1] = P(R = r)`` (a sub-probability vector is fine: missing mass = never
    drafted).
    """
    return expected_block_efficiency_by_depth(paths, [rank_probs])


def optimal_tree_by_depth(
    depth_rank_probs: Sequence[Any], num_draft_tokens: int
) -> list[tuple[int, ...]]:
    """:func:`optimal_tree` with a rank profile per depth."""
    profiles = _depth_profiles(depth_rank_probs)
    k = check_count(num_draft_tokens, "num_draft_tokens", minimum=0)
    # heap entries: (-prob, depth, path, parent_prob); ties: shallower, then lexicographic path
    heap: list[tuple[float, int, Path, float]] = [(-_at(profiles, 0, 0), 1, (0,), 1.0)]
    chosen: list[Path] = []
    while len(chosen) < k and heap:
        neg, depth, path, parent_prob = heapq.heappop(heap)
        chosen.append(path)
        prob = -neg
        # first child of this node
        heapq.heappush(heap, (-prob * _at(profiles, depth, 0), depth + 1, (*path, 0), prob))
        # next sibling of this node
        sib = path[-1] + 1
        heapq.heappush(
            heap,
            (-parent_prob * _at(profiles, depth - 1, sib), depth, (*path[:-1], sib), parent_prob),
        )
    return sorted(chosen, key=lambda t: (len(t), t))


def optimal_tree(rank_probs: Any, num_draft_tokens: int) -> list[tuple[int, ...]]:
    """The best ``k``-node tree under the i.i.d.-rank model (Tunstall coding, max-heap).

    Pops the most probable path and pushes its first child and its next sibling: ``O(k log k)``.
    The result is closed under parents and elder siblings (a valid :mod:`ersd.tree` shape), sorted
    by depth then path.  It maximises :func:`expected_block_efficiency` over all ``k``-node trees
    when ``rank_probs`` is non-increasing (then the ``k`` most probable paths form a tree); for
    other profiles it is the greedy best among trees grown this way.
    """
    return optimal_tree_by_depth([rank_probs], num_draft_tokens)


def block_efficiency_bound(rank_probs: Any, num_draft_tokens: int, vocab_size: int) -> float:
    """The paper's bound ``(log|Ω| + log(k + 1)) / H[R]`` on expected tokens per target call.

    ``H[R]`` in nats (missing mass of a sub-probability vector counts as one more outcome);
    ``inf`` when ``H[R] = 0`` (the drafter always ranks the target's token first).
    """
    k = check_count(num_draft_tokens, "num_draft_tokens", minimum=0)
    v = check_count(vocab_size, "vocab_size")
    h = rank_entropy(rank_probs)
    num = math.log(v) + math.log(k + 1)
    return math.inf if h <= 0 else num / h


def bound_asymptote(rank_probs: Any, num_draft_tokens: int) -> float:
    """Large-``k`` behaviour of the bound: ``log k / H[R]`` (nats / nats)."""
    k = check_count(num_draft_tokens, "num_draft_tokens")
    h = rank_entropy(rank_probs)
    return math.inf if h <= 0 else math.log(k) / h


# ---------------------------------------------------------------------------------------------
# standard shapes (the same paths as ersd.tree.parse_tree, without importing torch)


def chain_paths(k: int) -> list[tuple[int, ...]]:
    """``chain:K``: one draft sequence of ``k`` tokens."""
    return [(0,) * d for d in range(1, check_count(k, "k", minimum=0) + 1)]


def batch_paths(k: int) -> list[tuple[int, ...]]:
    """``batch:K``: ``k`` siblings at the root."""
    return [(r,) for r in range(check_count(k, "k", minimum=0))]


def multi_paths(num_drafts: int, length: int) -> list[tuple[int, ...]]:
    """``multi:MxL``: ``M`` children at the root, each continued by a chain (``M·L`` nodes)."""
    m = check_count(num_drafts, "num_drafts")
    n = check_count(length, "length")
    return sorted([(r,) + (0,) * d for r in range(m) for d in range(n)], key=lambda t: (len(t), t))


def per_node_block_efficiency(
    children_per_depth: Sequence[int], acceptance: Sequence[float]
) -> float:
    """Tokens per call of a depth-uniform tree under the i.i.d. per-node model.

    Every node at depth ``d`` (0 = root) has ``children_per_depth[d]`` children and accepts one of
    them with probability ``acceptance[c − 1]`` for ``c`` children, independently across depths:
    ``E = 1 + Σ_d Π_{t <= d} α(c_t)``.  Covers chain (``[1]*k``), batch (``[k]``) and M×L
    (``[M] + [1]*(L−1)``) for methods whose acceptance has no child-index structure (SpecTr, GLS,
    SpecHub).
    """
    total, reach = 1.0, 1.0
    for c in children_per_depth:
        if c <= 0:
            break
        if c > len(acceptance):
            raise ErsdError(
                f"no acceptance probability for {c} children (got {len(acceptance)} values)"
            )
        reach *= float(acceptance[c - 1])
        total += reach
    return total
