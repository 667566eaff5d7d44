"""Issue 53: the field's multi-draft protocol — the i.i.d. optimum, the preset, the resumable
runner and the exact (variance-reduced) one-step column."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ersd.errors import ErsdError
from ersd.theory.acceptance import acceptance_probability, iid_optimal_acceptance
from ersd.theory.distributions import total_variation
from ersd.theory.optimal_transport import iid_optimum, iid_optimum_lp, iid_optimum_set

# --- the i.i.d. optimum -----------------------------------------------------------------------


def _pairs(v: int, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        alpha = 0.3 if i % 2 else 1.0  # peaked and flat pairs
        p, q = rng.dirichlet([alpha] * v), rng.dirichlet([alpha] * v)
        if i % 5 == 0:  # a zero in each: tokens only one side can produce
            p[0], q[-1] = 0.0, 0.0
            p, q = p / p.sum(), q / q.sum()
        out.append((p, q))
    return out


@pytest.mark.parametrize("v,k", [(3, 1), (3, 2), (3, 3), (4, 2), (4, 3), (5, 2)])
def test_closed_form_equals_the_transport_lp(v, k):
    for p, q in _pairs(v, 12, seed=10 * v + k):
        lp = iid_optimum_lp(p, q, k)
        assert iid_optimum(p, q, k) == pytest.approx(lp, abs=1e-9)
        # and the 2^V subset enumeration of ersd.theory.acceptance
        assert iid_optimal_acceptance(p, q, k) == pytest.approx(lp, abs=1e-9)


def test_the_minimising_set_is_a_ratio_prefix_and_scores_the_value():
    for p, q in _pairs(6, 20, seed=3):
        for k in (1, 2, 4, 8):
            s = iid_optimum_set(p, q, k)
            brute = min(
                p[list(sub)].sum() + 1 - q[list(sub)].sum() ** k
                for r in range(7)
                for sub in itertools.combinations(range(6), r)
            )
            assert p[s].sum() + 1 - q[s].sum() ** k == pytest.approx(brute, abs=1e-12)


def test_a_wrong_order_of_prefixes_is_caught_by_the_lp():
    # the deliberately broken variant: prefixes by p descending instead of p/q ascending
    def broken(p, q, k):
        order = np.argsort(-p)
        ps = np.concatenate([[0], np.cumsum(p[order])])
        qs = np.concatenate([[0], np.cumsum(q[order])])
        return float(np.min(ps + 1 - qs**k))

    misses = sum(
        abs(broken(p, q, 2) - iid_optimum_lp(p, q, 2)) > 1e-6 for p, q in _pairs(4, 12, seed=7)
    )
    assert misses >= 3


def test_one_draft_is_one_minus_tv_and_more_drafts_never_hurt():
    for p, q in _pairs(50, 10, seed=5):
        assert iid_optimum(p, q, 1) == pytest.approx(1 - total_variation(p, q), abs=1e-12)
        vals = [iid_optimum(p, q, k) for k in (1, 2, 4, 6, 8)]
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(vals))


def test_iid_methods_stay_below_the_optimum_at_support_50():
    for p, q in _pairs(50, 4, seed=9):
        for k in (2, 4):
            opt = iid_optimum(p, q, k)
            for method in ("specinfer", "spectr", "gls"):
                assert acceptance_probability(p, q, k, method) <= opt + 1e-7, method


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(ErsdError, match="num_drafts"):
        iid_optimum([0.5, 0.5], [0.5, 0.5], 0)
    with pytest.raises(ErsdError, match="same vocabulary"):
        iid_optimum([0.5, 0.5], [1.0], 2)
    with pytest.raises(ErsdError, match="closed form"):
        iid_optimum_lp(np.full(50, 0.02), np.full(50, 0.02), 4)
