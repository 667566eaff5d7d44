"""The paired estimator of `research/paired.py`: its two pieces of probability.

* ``conditioned_race(p, x)`` draws race noise conditioned on the target's winner being ``x``;
  drawing ``x ~ p`` first must give back i.i.d. ``Exp(1)`` noise (Kolmogorov-Smirnov, alpha =
  1e-3, fixed seed), and the winner must always be ``x``.  A broken conditioning (``E_x`` not
  scaled by ``p_x``) is rejected by the same test.
* ``sd_calls(accept, K)``: SD's expected target calls over a text; exact at the two extremes and
  equal to a Monte Carlo run of the step process elsewhere (within 4 standard errors).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from research import paired
from ersd.race import race_winner

ALPHA = 1e-3
P = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03], dtype=torch.float64)


def _unconditioned(draw, n: int = 4000) -> np.ndarray:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(5)
    out = np.empty((n, P.numel()))
    for i in range(n):
        x = int(rng.choice(P.numel(), p=P.numpy()))
        e = draw(P, x, rng)
        assert race_winner(P, e) == x
        out[i] = e.numpy()
    return out


def test_conditioned_noise_is_exponential_once_the_winner_is_drawn() -> None:
    e = _unconditioned(paired.conditioned_race)
    for i in range(P.numel()):
        assert stats.kstest(e[:, i], "expon").pvalue >= ALPHA, i


def test_a_broken_conditioning_is_rejected() -> None:
    def broken(p: torch.Tensor, x: int, rng: np.random.Generator) -> torch.Tensor:
        w = rng.standard_exponential()
        e = torch.from_numpy(rng.standard_exponential(p.numel())) + w * p
        e[x] = w * p[x] * 0.5  # still the winner, but the wrong law
        return e

    e = _unconditioned(broken)
    assert min(stats.kstest(e[:, i], "expon").pvalue for i in range(P.numel())) < ALPHA


@pytest.mark.parametrize("k", [1, 3, 8])
def test_sd_calls_at_the_extremes(k: int) -> None:
    assert paired.sd_calls(np.ones(20), k) == pytest.approx(math.ceil(20 / (k + 1)))
    assert paired.sd_calls(np.zeros(20), k) == pytest.approx(20)


def test_sd_calls_matches_the_step_process() -> None:
    rng = np.random.default_rng(1)
    accept = rng.uniform(0.3, 1.0, 40)
    k, runs = 4, 20_000
    calls = np.empty(runs)
    for r in range(runs):
        t = n = 0
        while t < len(accept):
            m = 0
            while m < k and t + m < len(accept) and rng.random() < accept[t + m]:
                m += 1
            n += 1
            t += m + 1
        calls[r] = n
    se = calls.std() / math.sqrt(runs)
    assert abs(paired.sd_calls(accept, k) - calls.mean()) < 4 * se


def test_chain_acceptance_is_one_where_the_sharpened_draft_is_the_target() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3000, generator=g, dtype=torch.float64) * 2
    q = torch.softmax(logits, -1)
    p = torch.softmax(1.5 * logits, -1)
    x = int(torch.multinomial(p, 1, generator=g))
    rng = np.random.default_rng(0)
    # the whole vocabulary kept: exact
    ersd_acc, sd_acc = paired.chain_acceptance(p, q, x, [1.0, 1.5], 400, rng, top=3000)
    assert ersd_acc[1.5] == 1.0 and sd_acc[1.5] == pytest.approx(1.0)
    assert ersd_acc[1.0] < 1.0
    # a cut vocabulary with the rest as one runner errs against ERSD, less the more is kept
    small, _ = paired.chain_acceptance(p, q, x, [1.5], 4000, np.random.default_rng(1), top=300)
    large, _ = paired.chain_acceptance(p, q, x, [1.5], 4000, np.random.default_rng(1), top=2000)
    assert small[1.5] < large[1.5] <= 1.0
    assert large[1.5] >= 0.995
