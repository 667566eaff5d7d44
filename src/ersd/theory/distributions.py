"""Probability-vector checks and the divergences the theory needs (TV, KL, entropy).

Everything here is numpy; ``p`` is the target distribution (``target_probs``) and ``q`` the
draft distribution (``draft_probs``) at one context, as in Kobus & Gündüz, "Speculative Sampling
via Exponential Races" (arXiv 2504.15475).  Entropies and divergences are in **nats** unless a
``base`` is given; the paper's bound is a ratio of logarithms, so any base works if it is used
consistently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ersd.errors import ErsdError

#: Tolerance on ``|sum(p) - 1|`` for a probability vector.
SUM_TOLERANCE = 1e-6


class InvalidDistributionError(ErsdError):
    """A probability vector is negative, NaN, does not sum to 1, or has the wrong length."""


def as_probs(values: Any, name: str = "probs", *, allow_deficit: bool = False) -> np.ndarray:
    """Check a 1-D probability vector and return it as float64 numpy.

    ``allow_deficit=True`` accepts a sub-probability vector (sum <= 1); the missing mass then
    means "an outcome not listed" (e.g. a rank beyond the vector's length).
    """
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidDistributionError(
            f"{name} must be a 1-D list or array of probabilities; could not convert: {exc}"
        ) from None
    if arr.ndim != 1:
        raise InvalidDistributionError(
            f"{name} must be a 1-D probability vector, got an array of shape {arr.shape}; "
            f"pass one distribution at a time"
        )
    if arr.size == 0:
        raise InvalidDistributionError(f"{name} is empty; pass at least one probability")
    if not np.all(np.isfinite(arr)):
        raise InvalidDistributionError(
            f"{name} contains NaN or inf; check the logits/probabilities you computed it from"
        )
    if np.any(arr < 0):
        i = int(np.argmin(arr))
        raise InvalidDistributionError(
            f"{name} has a negative entry ({name}[{i}] = {arr[i]:.3g}); probabilities must be >= 0"
        )
    total = float(arr.sum())
    if allow_deficit:
        if total > 1 + SUM_TOLERANCE:
            raise InvalidDistributionError(
                f"{name} sums to {total:.9g} > 1; rank probabilities must sum to at most 1 "
                f"(normalise the histogram by the number of observations)"
            )
    elif abs(total - 1) > SUM_TOLERANCE:
        raise InvalidDistributionError(
            f"{name} sums to {total:.9g}, not 1 (tolerance {SUM_TOLERANCE:g}); normalise it, "
            f"e.g. probs / probs.sum()"
        )
    return arr


def as_pair(target_probs: Any, draft_probs: Any) -> tuple[np.ndarray, np.ndarray]:
    """Check ``(p, q)``: two probability vectors over the same vocabulary."""
    p = as_probs(target_probs, "target_probs")
    q = as_probs(draft_probs, "draft_probs")
    if p.shape != q.shape:
        raise InvalidDistributionError(
            f"target_probs has {p.size} entries but draft_probs has {q.size}; both must be "
            f"distributions over the same vocabulary"
        )
    return p, q


def check_count(value: int, name: str, minimum: int = 1) -> int:
    """An integer argument such as ``num_drafts`` (>= ``minimum``)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ErsdError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def total_variation(target_probs: Any, draft_probs: Any) -> float:
    """``TV(p, q) = ½ Σ |p − q| = 1 − Σ min(p, q)``."""
    p, q = as_pair(target_probs, draft_probs)
    return float(0.5 * np.abs(p - q).sum())


def kl_divergence(target_probs: Any, draft_probs: Any, base: float | None = None) -> float:
    """``D_KL(P ‖ Q) = Σ p log(p / q)`` (nats; ``inf`` if ``p`` puts mass where ``q`` has none)."""
    p, q = as_pair(target_probs, draft_probs)
    mask = p > 0
    if np.any(q[mask] == 0):
        return float("inf")
    d = float(np.sum(p[mask] * (np.log(p[mask]) - np.log(q[mask]))))
    d = max(d, 0.0)
    return d / np.log(base) if base else d


def entropy(probs: Any, base: float | None = None) -> float:
    """Shannon entropy (nats, or in ``base``).

    A sub-probability vector is accepted: the missing mass counts as one more outcome (for a rank
    distribution: "the target's token was never drafted").
    """
    arr = as_probs(probs, "probs", allow_deficit=True)
    deficit = max(0.0, 1.0 - float(arr.sum()))
    full = np.append(arr, deficit) if deficit > 1e-15 else arr
    nz = full[full > 0]
    h = float(-np.sum(nz * np.log(nz)))
    h = max(h, 0.0)
    return h / np.log(base) if base else h


def rank_entropy(rank_probs: Any, base: float | None = None) -> float:
    """``H[R]`` of a rank distribution (nats unless ``base``); see :func:`entropy`."""
    return entropy(rank_probs, base)


def normalise(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """``values / values.sum()`` as float64 (for building synthetic distributions)."""
    arr = np.asarray(values, dtype=np.float64)
    return arr / arr.sum()
