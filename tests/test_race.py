"""Keyed exponential races: determinism, keying, exactness of race sampling and ranking."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from ersd.race import (
    STREAM_DRAFT,
    STREAM_RACE,
    RaceNoise,
    extend_key,
    extend_key_many,
    race_rank,
    race_ranking,
    race_winner,
    root_key,
)

ALPHA = 1e-4  # significance level of every hypothesis test in this module


def test_keys_are_rolling_hashes_of_the_full_context() -> None:
    k = root_key(7, [1, 2, 3])
    assert k == extend_key(root_key(7, [1, 2]), 3)
    assert k == extend_key_many(root_key(7, []), [1, 2, 3])
    assert k != root_key(8, [1, 2, 3])  # the seed matters
    assert k != root_key(7, [2, 1, 3])  # order matters
    assert root_key(7, [0]) != root_key(7, [0, 0])  # length matters


def test_noise_is_deterministic_and_independent_of_draw_order() -> None:
    a, b = RaceNoise(1000), RaceNoise(1000, cache_size=1)
    k1, k2 = root_key(0, [5]), root_key(0, [6])
    x1 = a.exponentials(k1).clone()
    _ = a.exponentials(k2)
    y2 = b.exponentials(k2).clone()
    y1 = b.exponentials(k1)
    assert torch.equal(x1, y1)
    assert torch.equal(a.exponentials(k2), y2)
    assert not torch.equal(x1, a.exponentials(k1, STREAM_DRAFT))


def test_noise_is_exponential() -> None:
    e = RaceNoise(20000).exponentials(root_key(3, [1])).numpy()
    assert stats.kstest(e, "expon").pvalue > ALPHA
    # neighbouring contexts are uncorrelated
    f = RaceNoise(20000).exponentials(root_key(3, [2])).numpy()
    assert abs(stats.pearsonr(e, f).statistic) < 5 / np.sqrt(len(e))


def test_race_winner_is_an_exact_sample() -> None:
    p = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05], dtype=torch.float64)
    noise = RaceNoise(5)
    n = 20000
    counts = np.zeros(5)
    for i in range(n):
        counts[race_winner(p, noise.exponentials(root_key(11, [i])))] += 1
    assert counts[1] == 0  # zero-probability tokens never win
    keep = p.numpy() > 0
    res = stats.chisquare(counts[keep], n * p.numpy()[keep])
    assert res.pvalue > ALPHA


def test_race_ranking_is_sampling_without_replacement() -> None:
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    noise = RaceNoise(4)
    n = 20000
    second = np.zeros(4)
    for i in range(n):
        ranking = race_ranking(p, noise.exponentials(root_key(1, [i])), 2)
        assert len(ranking) == 2 and ranking[0] != ranking[1]
        assert ranking[0] == race_winner(p, noise.exponentials(root_key(1, [i])))
        second[ranking[1]] += 1
    # P(second = j) = sum_{i != j} p_i p_j / (1 - p_i)
    pv = p.numpy()
    expected = np.array(
        [sum(pv[i] * pv[j] / (1 - pv[i]) for i in range(4) if i != j) for j in range(4)]
    )
    assert stats.chisquare(second, n * expected).pvalue > ALPHA


def test_ranking_skips_zero_mass_and_rank_is_consistent() -> None:
    p = torch.tensor([0.0, 0.7, 0.0, 0.3], dtype=torch.float64)
    le = RaceNoise(4).exponentials(root_key(0, [0]))
    ranking = race_ranking(p, le, 4)
    assert sorted(ranking) == [1, 3]
    for r, tok in enumerate(ranking, start=1):
        assert race_rank(p, le, tok) == r
    assert race_rank(p, le, 0) == 5


def test_zero_mass_never_wins_even_against_a_zero_draw() -> None:
    p = torch.tensor([0.0, 1.0], dtype=torch.float64)
    # RaceNoise clamps draws to the smallest normal float, so 0 / 0 cannot occur
    le = torch.tensor([np.finfo(np.float64).tiny, 1.0], dtype=torch.float64)
    assert race_winner(p, le) == 1


def test_bad_vocab_size() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        RaceNoise(0)


def test_streams_of_one_key_are_independent_and_reproducible() -> None:
    """The race and the draft lanes of one context draw from different streams: equal draws
    would correlate a baseline's draft with the target's race."""
    noise, other = RaceNoise(1000), RaceNoise(1000)
    key = root_key(5, [1, 2, 3])
    race, lane0, lane1 = (
        noise.exponentials(key, s) for s in (STREAM_RACE, STREAM_DRAFT, STREAM_DRAFT + 1)
    )
    assert torch.equal(
        race, other.exponentials(key, STREAM_RACE)
    )  # a pure function of (key, stream)
    for a, b in ((race, lane0), (race, lane1), (lane0, lane1)):
        assert not torch.equal(a, b)
        assert (
            abs(stats.pearsonr(a.numpy(), b.numpy())[0]) < 0.15
        )  # |r| of 1000 i.i.d. pairs: sd ~0.03


def test_ranking_of_one_takes_the_same_token_as_the_general_path() -> None:
    """race_ranking(.., 1) has its own argmin path (a chain's node); it must agree with the
    top-m path's first token, ties (lowest id first) and zero-mass tokens included."""
    noise = RaceNoise(6)
    gen = torch.Generator().manual_seed(5)
    for i in range(300):
        p = torch.rand(6, generator=gen, dtype=torch.float64)
        p[torch.rand(6, generator=gen) < 0.3] = 0.0
        if i % 3 == 0:  # exact ties of the score: equal mass, equal draws
            p[:] = 1.0
        e = noise.exponentials(root_key(2, [i]))
        if i % 3 == 0:
            e = torch.ones(6, dtype=torch.float64)
        if p.sum() == 0:
            assert race_ranking(p, e, 1) == [] == race_ranking(p, e, 3)
            continue
        assert race_ranking(p, e, 1) == race_ranking(p, e, 3)[:1] == [race_winner(p, e)]
