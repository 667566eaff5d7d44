"""Named synthetic (target, draft) pairs for ``ersd theory --family NAME``.

Every family is a Zipf-like target ``p_i ∝ i^(−s)`` over a small vocabulary (default ``V = 8``,
small enough that every acceptance formula, including the ``rrs-wor`` enumeration and the
i.i.d.-draft optimum over all subsets, is exact) with a draft derived from it:

* ``zipf``      — draft ``∝ p^0.7 · exp(0.5 z)``, ``z ~ N(0, 1)`` from ``seed``: flatter and noisy,
  the closest of these to a small draft model of the same family as the target.
* ``tempered``  — draft ``∝ p^(1/2)``: the target at temperature 2 (an under-confident draft).
* ``sharp``     — draft ``∝ p^2``: an over-confident draft.
* ``swap``      — the target with its two most likely tokens swapped, mixed 80/20 with uniform:
  the draft's favourite is the target's runner-up.
* ``uniform``   — a uniform draft (no knowledge).
* ``dirichlet`` — ``p`` and ``q`` drawn independently from Dirichlet(1) with ``seed``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ersd.errors import ErsdError
from ersd.theory.distributions import check_count

ZIPF_EXPONENT = 1.1


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    make: Callable[[np.ndarray, np.random.Generator], np.ndarray]  # (p, rng) -> q (unnormalised)
    random_target: bool = False


def _norm(x: np.ndarray) -> np.ndarray:
    return np.asarray(x / x.sum(), dtype=np.float64)


def _swap(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    s = p.copy()
    order = np.argsort(-p, kind="stable")
    s[order[0]], s[order[1]] = p[order[1]], p[order[0]]
    return 0.8 * s + 0.2 / p.size


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "zipf",
            "Zipf(1.1) target; draft ∝ p^0.7·exp(0.5 z), z ~ N(0,1) (flatter, noisy)",
            lambda p, rng: p**0.7 * np.exp(0.5 * rng.standard_normal(p.size)),
        ),
        Family(
            "tempered", "Zipf(1.1) target; draft ∝ p^(1/2) (temperature 2)", lambda p, r: p**0.5
        ),
        Family("sharp", "Zipf(1.1) target; draft ∝ p^2 (over-confident)", lambda p, r: p**2),
        Family("swap", "Zipf(1.1) target; top-2 swapped, mixed 80/20 with uniform", _swap),
        Family("uniform", "Zipf(1.1) target; uniform draft", lambda p, r: np.ones_like(p)),
        Family(
            "dirichlet",
            "p, q ~ Dirichlet(1) independently",
            lambda p, rng: rng.dirichlet(np.ones(p.size)),
            random_target=True,
        ),
    )
}


def family_pair(name: str, vocab_size: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(target_probs, draft_probs)`` of the named family (deterministic given ``seed``)."""
    fam = FAMILIES.get(name)
    if fam is None:
        raise ErsdError(f"unknown family {name!r}; known families: {', '.join(FAMILIES)}")
    v = check_count(vocab_size, "vocab_size", minimum=2)
    rng = np.random.default_rng(seed)
    if fam.random_target:
        p = rng.dirichlet(np.ones(v))
    else:
        p = _norm(np.arange(1, v + 1, dtype=np.float64) ** -ZIPF_EXPONENT)
    q = _norm(np.asarray(fam.make(p, rng), dtype=np.float64))
    return _norm(p), q
