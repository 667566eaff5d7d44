"""Margin-conditioned rank statistics: the acceptance predictor of dynamic ERSD trees.

At a drafted context the draft's own race ranks the vocabulary by ``E_i / q_i``; its **margin** is
``m = log(s_2 / s_1)``, the log-ratio of the runner-up's race score to the winner's (``m >= 0``;
``inf`` when the draft has a single token of positive mass).  A small margin means the draft's
race was close, and the target's winner is then often the draft's second or third place; a large
margin means the draft's winner is usually the target's too.

:class:`MarginTable` counts, per depth (1 = children of the root) and margin bucket, how often the
target's race winner had rank ``r`` in the draft's race (``r = 1 .. max_rank``, one more column for
"deeper than ``max_rank``", which also holds never-drafted tokens).  It is stored inside a rank
profile (``RankProfile.margin``, key ``"margin"`` of the ``ersd-rank-profile`` JSON), so a
calibration file written by ``ersd bench calibrate`` carries it and the library's one profile
reader (:meth:`ersd.theory.RankProfile.load`, :func:`ersd.theory.profile.load_profiles`) reads it.

:class:`MarginPredictor` turns a table into ``P(R = r | margin bucket, depth)`` with hierarchical
shrinkage (depth-and-bucket → bucket → all → a geometric prior) so that sparse cells borrow from
their parents; it can learn online (:meth:`MarginPredictor.update`).  numpy only.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ersd.errors import ErsdError

#: bucket edges of the margin ``log(s_2 / s_1)``: bucket ``b`` holds ``edges[b-1] <= m < edges[b]``
DEFAULT_EDGES: tuple[float, ...] = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
DEFAULT_MAX_RANK = 8
DEFAULT_MAX_DEPTH = 8
#: pseudo-count with which each level of the shrinkage hierarchy pulls towards its parent
DEFAULT_STRENGTH = 20.0


class MarginTableError(ErsdError):
    """A margin table (counts, edges or its JSON) is malformed."""


def race_margin(first: float, second: float) -> float:
    """``log(second / first)`` of the two smallest race scores (``inf`` if ``second`` is)."""
    if not math.isfinite(second):
        return math.inf
    return max(math.log(second / first), 0.0) if first > 0 else 0.0


@dataclass
class MarginTable:
    """Counts ``counts[d, b, r]``: depth ``d + 1``, margin bucket ``b``, rank ``r + 1``.

    The last rank column counts ranks above ``max_rank``; the last depth row collects every depth
    at or below ``max_depth``.
    """

    edges: tuple[float, ...]
    counts: np.ndarray

    def __post_init__(self) -> None:
        edges = tuple(float(e) for e in self.edges)
        if not edges or any(not (b > a) for a, b in itertools.pairwise(edges)):
            raise MarginTableError(f"margin edges must increase strictly, got {list(edges)}")
        if edges[0] <= 0:
            raise MarginTableError(f"margin edges must be > 0 (margins are >= 0), got {edges[0]}")
        self.edges = edges
        try:
            arr = np.asarray(self.counts, dtype=np.float64)
        except (TypeError, ValueError):
            raise MarginTableError("margin counts must be a 3-D list of integers") from None
        if arr.ndim != 3 or arr.shape[1] != len(edges) + 1 or arr.shape[2] < 2 or arr.shape[0] < 1:
            raise MarginTableError(
                f"margin counts must be [depths][{len(edges) + 1} buckets][ranks + 1], "
                f"got shape {arr.shape}"
            )
        if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr % 1 != 0):
            raise MarginTableError("margin counts must be non-negative integers")
        self.counts = arr.astype(np.int64)

    @classmethod
    def empty(
        cls,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_rank: int = DEFAULT_MAX_RANK,
        edges: Sequence[float] = DEFAULT_EDGES,
    ) -> MarginTable:
        if max_depth < 1 or max_rank < 1:
            raise MarginTableError("a margin table needs max_depth >= 1 and max_rank >= 1")
        return cls(tuple(edges), np.zeros((max_depth, len(edges) + 1, max_rank + 1), np.int64))

    @property
    def max_depth(self) -> int:
        return int(self.counts.shape[0])

    @property
    def max_rank(self) -> int:
        return int(self.counts.shape[2]) - 1

    @property
    def num_buckets(self) -> int:
        return len(self.edges) + 1

    @property
    def num_observations(self) -> int:
        return int(self.counts.sum())

    def bucket(self, margin: float) -> int:
        """The bucket of ``margin`` (NaN counts as 0)."""
        return bisect.bisect_right(self.edges, margin if margin == margin else 0.0)

    def bucket_label(self, b: int) -> str:
        lo = 0.0 if b == 0 else self.edges[b - 1]
        hi = self.edges[b] if b < len(self.edges) else math.inf
        return f"[{lo:g}, {hi:g})"

    def _cell(self, depth: int, rank: int) -> tuple[int, int]:
        if depth < 1 or rank < 1:
            raise MarginTableError(f"depth and rank are 1-based, got depth={depth} rank={rank}")
        return min(depth, self.max_depth) - 1, min(rank, self.max_rank + 1) - 1

    def add(self, depth: int, margin: float, rank: int) -> None:
        """Count one observation: at a context of ``depth`` with ``margin``, the target's winner
        had ``rank`` in the draft's race."""
        d, r = self._cell(depth, rank)
        self.counts[d, self.bucket(margin), r] += 1

    def merge(self, other: MarginTable) -> MarginTable:
        """The sum of two tables with the same edges and shape."""
        if other.edges != self.edges or other.counts.shape != self.counts.shape:
            raise MarginTableError("cannot merge margin tables with different edges or shapes")
        return MarginTable(self.edges, self.counts + other.counts)

    def observed_top(self, depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per bucket: (observations, empirical ``P(R = 1)``), at one depth or pooled."""
        c = (
            self.counts.sum(axis=0)
            if depth is None
            else self.counts[min(depth, self.max_depth) - 1]
        )
        n = c.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            top = np.where(n > 0, c[:, 0] / np.maximum(n, 1), np.nan)
        return n, top

    def to_dict(self) -> dict[str, Any]:
        return {
            "edges": list(self.edges),
            "max_depth": self.max_depth,
            "max_rank": self.max_rank,
            "counts": self.counts.tolist(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> MarginTable:
        if not isinstance(data, dict) or "edges" not in data or "counts" not in data:
            raise MarginTableError(
                'a margin table is a JSON object with "edges" and "counts" (write one with '
                "MarginTable.to_dict or `ersd bench calibrate`)"
            )
        return cls(tuple(data["edges"]), data["counts"])


def geometric_prior(max_rank: int, ratio: float = 0.5) -> np.ndarray:
    """A weak prior over ranks ``1 .. max_rank`` and the tail: ``P(R = r) ∝ ratio^r``."""
    w = ratio ** np.arange(1, max_rank + 2, dtype=np.float64)
    return w / w.sum()


class MarginPredictor:
    """``P(R = r | depth, margin)`` for ``r = 1 .. max_rank`` from a :class:`MarginTable`.

    Estimates shrink level by level with pseudo-count ``strength``: a (depth, bucket) cell towards
    its bucket pooled over depths, a bucket towards all data, all data towards ``prior``
    (:func:`geometric_prior` by default).  :meth:`depth_prior` is the margin-free estimate at a
    depth, used for contexts whose race is not known yet.  ``predict`` returns a sub-probability
    vector (the tail column is left out).
    """

    def __init__(
        self,
        table: MarginTable | None = None,
        *,
        strength: float = DEFAULT_STRENGTH,
        prior: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        self.table = table if table is not None else MarginTable.empty()
        if strength <= 0:
            raise MarginTableError(f"strength must be > 0, got {strength}")
        self.strength = float(strength)
        base = geometric_prior(self.table.max_rank) if prior is None else np.asarray(prior, float)
        if base.shape != (self.table.max_rank + 1,) or np.any(base < 0) or base.sum() <= 0:
            raise MarginTableError(
                f"prior must hold {self.table.max_rank + 1} non-negative weights (ranks and tail)"
            )
        self.prior = base / base.sum()
        self._probs: np.ndarray | None = None
        self._depth: np.ndarray | None = None

    @classmethod
    def from_profile(cls, profile: Any, **kw: Any) -> MarginPredictor:
        """The predictor of a :class:`~ersd.theory.RankProfile` that carries a margin table."""
        table = getattr(profile, "margin", None)
        if table is None:
            raise MarginTableError(
                "this rank profile has no margin table; calibrate again with `ersd bench "
                "calibrate` (it records margins), or let the dynamic drafter learn online"
            )
        return cls(table, **kw)

    @property
    def max_rank(self) -> int:
        return self.table.max_rank

    def _shrink(self, counts: np.ndarray, parent: np.ndarray) -> np.ndarray:
        n = counts.sum(axis=-1, keepdims=True)
        return (counts + self.strength * parent) / (n + self.strength)

    def _refresh(self) -> None:
        c = self.table.counts.astype(np.float64)
        overall = self._shrink(c.sum(axis=(0, 1)), self.prior)
        per_bucket = self._shrink(c.sum(axis=0), overall[None, :])
        self._probs = self._shrink(c, per_bucket[None, :, :])[..., :-1].copy()
        self._depth = self._shrink(c.sum(axis=1), overall[None, :])[..., :-1].copy()

    def predict(self, depth: int, margin: float) -> np.ndarray:
        """``[P(R = r)]``, r = 1 .. max_rank, at a context of ``depth`` (1-based), ``margin``."""
        if self._probs is None:
            self._refresh()
        assert self._probs is not None
        return self._probs[min(max(depth, 1), self.table.max_depth) - 1, self.table.bucket(margin)]

    def depth_prior(self, depth: int) -> np.ndarray:
        """Margin-free ``[P(R = r)]`` at ``depth`` (for contexts whose race is not drafted yet)."""
        if self._depth is None:
            self._refresh()
        assert self._depth is not None
        return self._depth[min(max(depth, 1), self.table.max_depth) - 1]

    def update(self, depth: int, margin: float, rank: int) -> None:
        """Learn one observation (online calibration); estimates are recomputed lazily."""
        self.table.add(depth, margin, rank)
        self._probs = self._depth = None


def calibration_curve(
    events: Sequence[Sequence[float]], edges: Sequence[float] = DEFAULT_EDGES
) -> list[dict[str, Any]]:
    """Predicted vs observed acceptance per margin bucket.

    ``events`` are ``(margin, predicted, accepted)`` triples: at a verified context with drafted
    children, the predicted probability that the target's winner is among them and whether it
    was (1/0).  Returns one row per non-empty bucket: ``bucket``, ``n``, ``predicted`` (mean),
    ``observed`` (rate) and its 95% Wilson interval ``low``/``high``.
    """
    table = MarginTable.empty(1, 1, edges)
    sums: dict[int, list[float]] = {}
    for margin, pred, acc in events:
        s = sums.setdefault(table.bucket(float(margin)), [0.0, 0.0, 0.0])
        s[0] += 1
        s[1] += float(pred)
        s[2] += float(acc)
    rows = []
    for b in sorted(sums):
        n, pred, acc = sums[b]
        rate = acc / n
        z = 1.959963984540054
        centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        rows.append(
            {
                "bucket": table.bucket_label(b),
                "n": int(n),
                "predicted": pred / n,
                "observed": rate,
                # the Wilson interval holds the rate; clamp rounding (centre - half = 1e-17 at 0)
                "low": min(max(centre - half, 0.0), rate),
                "high": max(min(centre + half, 1.0), rate),
            }
        )
    return rows
