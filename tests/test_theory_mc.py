"""Monte Carlo cross-checks of :mod:`ersd.theory` against the actual samplers of the core.

Every exact acceptance formula is compared with the acceptance frequency of the registered method
(``ersd.METHODS[name].draft`` / ``verify_node`` with :class:`ersd.methods.NodeNoise` over
:class:`ersd.race.RaceNoise` at distinct keys) on the same ``(p, q)`` as float64 tensors.

Statistics: each comparison is a two-sided z-test of a binomial proportion at significance level
``ALPHA = 1e-5`` (|z| <= 4.42); the rank distribution is a chi-square goodness-of-fit test at the
same level.  Seeds are fixed, so the tests are deterministic; the stated level is the chance that a
correct formula would fail at a fresh seed.  Two deliberately broken samplers ("mutants") must be
rejected by the same tests at the same sample sizes, showing that the tests have power.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from scipy import stats

import ersd.theory as T
from ersd import METHODS
from ersd.methods import NodeDecision, NodeNoise
from ersd.methods.ersd import ERSD
from ersd.methods.specinfer import SpecInfer
from ersd.race import RaceNoise, root_key

ALPHA = 1e-5
Z_CRIT = float(stats.norm.isf(ALPHA / 2))  # 4.417

# One (p, q) pair with the edge cases in it: p has a zero (token 5), q has a zero where p does not
# (token 4 is never drafted: rank "V + 1"), and the acceptances are mid-range where methods differ.
P = np.array([0.30, 0.25, 0.20, 0.15, 0.10, 0.00])
Q = np.array([0.10, 0.32, 0.05, 0.25, 0.00, 0.28])
V = P.size

# Methods whose verifier tries the children in a fixed order: one run with the largest m gives
# every smaller m on the same realisations (the first j children, lanes and coins are the same).
PREFIX = {"ersd", "specinfer", "rrs-wor"}
# method -> (numbers of children to check, samples per run)
PLAN: dict[str, tuple[tuple[int, ...], int]] = {
    "ersd": ((1, 2, 4), 6000),
    "sd": ((1,), 3000),
    "specinfer": ((1, 2, 4), 4000),
    "rrs-wor": ((1, 2, 4), 4000),
    "spectr": ((1, 2, 4), 1500),
    "spechub": ((1, 2), 3000),
    "gls": ((1, 2, 4), 3000),
}


def _tensor(x: np.ndarray) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def run_sampler(method, m: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Accepted child index (-1 = none) and ERSD rank (0 if not ERSD) of ``n`` keyed trials."""
    pt, qt = _tensor(P), _tensor(Q)
    source = RaceNoise(V)
    child = np.empty(n, dtype=np.int64)
    rank = np.zeros(n, dtype=np.int64)
    for i in range(n):
        noise = NodeNoise(source, root_key(seed, [m, i]))
        kids = method.draft(qt, m, noise)
        d = method.verify_node(pt, qt, kids, noise)
        child[i] = -1 if d.child is None else d.child
        r = method.rank(pt, qt, d.token, noise)
        rank[i] = 0 if r is None else r
    return child, rank


def z_score(successes: int, n: int, prob: float) -> float:
    if prob <= 0.0 or prob >= 1.0:
        return 0.0 if successes == round(prob * n) else float("inf")
    return (successes - n * prob) / np.sqrt(n * prob * (1 - prob))


def acceptance_z_scores(
    name: str, method, seed: int = 2025
) -> dict[int, tuple[float, float, float]]:
    """``m -> (exact, Monte Carlo, z)`` for the plan of ``name`` run with ``method``."""
    ms, n = PLAN[name]
    out: dict[int, tuple[float, float, float]] = {}
    if name in PREFIX:
        child, _ = run_sampler(method, max(ms), n, seed)
        runs = {m: child for m in ms}
    else:
        runs = {m: run_sampler(method, m, n, seed)[0] for m in ms}
    for m in ms:
        exact = T.acceptance_probability(P, Q, m, name)
        hits = int(np.sum((runs[m] >= 0) & (runs[m] < m)))
        out[m] = (exact, hits / n, z_score(hits, n, exact))
    return out


def test_every_registered_method_is_planned() -> None:
    assert set(METHODS) == set(PLAN) == set(T.ACCEPTANCE_METHODS)


@pytest.mark.parametrize("name", sorted(PLAN))
def test_acceptance_matches_monte_carlo(name: str) -> None:
    results = acceptance_z_scores(name, METHODS[name])
    bad = {m: r for m, r in results.items() if abs(r[2]) > Z_CRIT}
    assert not bad, f"{name}: (exact, MC, z) off at alpha={ALPHA}: {bad}"


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square GOF; bins with expected count < 5 are pooled into one."""
    n = counts.sum()
    expected = n * probs
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    assert np.all(obs[~keep] == 0), "observed an outcome of probability 0"
    obs, exp = obs[keep], exp[keep]
    stat = float(np.sum((obs - exp) ** 2 / exp))
    return float(stats.chi2.sf(stat, obs.size - 1))


def test_rank_distribution_matches_the_race() -> None:
    _, ranks = run_sampler(METHODS["ersd"], 1, 6000, seed=7)
    probs = T.rank_distribution(P, Q)
    # ranks 1..V and V + 1 ("never drafted": the target's token has q = 0)
    full = np.append(probs, 1.0 - probs.sum())
    counts = np.bincount(ranks - 1, minlength=V + 1)
    assert counts.size == V + 1
    assert chi_square_p_value(counts, full) > ALPHA


# --- mutants: the same tests at the same sample sizes must reject them -------------------------


class SpecInferWithoutResidual(SpecInfer):
    """Broken RRS: keeps the target unchanged after a rejection (so it is no longer exact)."""

    def residual(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        return target_probs


class ERSDIndependentTarget(ERSD):
    """Broken ERSD: the target races on noise independent of the drafter's race."""

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        other = NodeNoise(noise.source, noise.key ^ 0x5DEECE66D)
        return super().verify_node(target_probs, draft_probs, children, other)


@pytest.mark.parametrize(
    ("name", "mutant"),
    [("specinfer", SpecInferWithoutResidual()), ("ersd", ERSDIndependentTarget())],
)
def test_mutant_is_rejected(name: str, mutant) -> None:
    results = acceptance_z_scores(name, mutant)
    assert max(abs(r[2]) for r in results.values()) > Z_CRIT, results
