"""Race scheme v2 (the blocked splitmix64 race, :mod:`ersd.race`): its generator, its lazy race,
its device twin, and its selection.

* ``unit_log`` is accurate (a few ulps of ``math.log``) and gives NumPy's bits in torch.
* The lazy race (:meth:`RaceNoise.winner`, ``ranking``, ``rank``: only the blocks that can win)
  equals the race on the whole row (``race_winner`` etc. over ``exponentials``) token for token,
  over sharp, flat, sparse and tied rows, vocabularies that are and are not multiples of 64.
* CPU ≡ torch: :func:`ersd.race_torch.v2_exponentials_torch` (the device draw) equals the NumPy
  rows bit for bit.
* Statistics (fixed seeds, ``ALPHA = 1e-3`` each): the uniforms behind ``E`` are uniform
  (Kolmogorov-Smirnov), adjacent tokens and consecutive contexts are independent and the block
  minimum's place is uniform (chi-square), and the race's winner follows ``p`` over a vocabulary
  of many blocks (chi-square).  Deliberately broken generators — no splitmix finaliser, a block
  minimum at the wrong rate, a lazy race that stops at the first block — are rejected by the same
  tests.
* Selection: ``race_scheme`` is checked (one-line error naming the field), recorded in the result,
  refused with a watermark; under v2 ERSD still equals target-only sampling whatever the drafter
  (drafter invariance) and a batch equals its rows run alone (batch invariance).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

import ersd
from ersd.errors import GenerationInputError
from ersd.race import RaceNoise, extend_key, race_rank, race_ranking, race_winner, root_key
from ersd.race_torch import race_exponentials_torch, v2_exponentials_torch
from ersd.race_v2 import (
    V2_BLOCK,
    _exp_of_words,
    unit_log,
    v2_block_minima,
    v2_exponentials,
    v2_seed,
    v2_words,
)
from tests.exactness_util import make_drafts, make_target

ALPHA = 1e-3


# --- the logarithm -------------------------------------------------------------------------------


def test_unit_log_is_accurate_and_the_same_in_torch() -> None:
    rng = np.random.default_rng(0)
    u = np.concatenate(
        [
            rng.random(20000),
            np.exp(-rng.random(2000) * 36),
            [1.0, 0.5, 2.0**-53, 1 - 2.0**-53, 0.7071067811865476, 0.7071067811865475],
        ]
    )
    u = u[u > 0]
    got = unit_log(u)
    want = np.array([math.log(x) for x in u])
    ulps = np.abs(got - want) / np.spacing(np.abs(want) + (want == 0))
    assert float(ulps.max()) <= 4, float(ulps.max())
    assert got[u == 1.0].tolist() == [0.0]
    assert np.array_equal(unit_log(torch.from_numpy(u), torch).numpy(), got)
    # element-wise: an element's bits do not depend on where it sits in the array
    assert np.array_equal(np.array([unit_log(u[i : i + 1])[0] for i in range(0, 300)]), got[:300])


# --- the lazy race equals the whole row ----------------------------------------------------------


def _rows(vocab: int, rng: np.random.Generator) -> list[torch.Tensor]:
    rows = []
    for scale in (0.5, 2.0, 4.0, 9.0):
        logits = torch.from_numpy(rng.standard_normal(vocab) * scale)
        rows.append(torch.softmax(logits, -1))
    sparse = rows[1].clone()
    sparse[torch.from_numpy(rng.random(vocab) < 0.5)] = 0.0
    rows.append(sparse / sparse.sum())
    one = torch.zeros(vocab, dtype=torch.float64)
    one[vocab - 1] = 1.0  # all mass in the (partial) last block
    rows.append(one)
    rows.append(torch.full((vocab,), 1.0 / vocab, dtype=torch.float64))  # a flat row
    few = torch.zeros(vocab, dtype=torch.float64)
    few[[0, 3, vocab // 2]] = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    rows.append(few)
    return rows


@pytest.mark.parametrize("vocab", [5, 64, 1000, 4099, 151936])
def test_lazy_race_equals_the_whole_row(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    noise = RaceNoise(vocab, scheme="v2")
    n_keys = 3 if vocab > 10000 else 12
    checked = 0
    for row in _rows(vocab, rng):
        for j in range(n_keys):
            key = int(rng.integers(0, 2**63)) + j
            for stream in (0, 1 << 20):
                e = noise.exponentials(key, stream)
                assert torch.equal(e, torch.from_numpy(v2_exponentials(key, stream, vocab)))
                assert noise.winner(key, row, stream) == race_winner(row, e)
                for m in (1, 2, 4):
                    assert noise.ranking(key, row, m, stream) == race_ranking(row, e, m)
                w = race_winner(row, e)
                other = int(rng.integers(0, vocab))
                for tok in (w, other):
                    assert noise.rank(key, row, tok, stream) == race_rank(row, e, tok)
                checked += 1
    assert checked == len(_rows(vocab, rng)) * n_keys * 2


@pytest.mark.parametrize("exact_minima_first", [False, True])
def test_drawn_blocks_have_the_whole_rows_bits(exact_minima_first: bool) -> None:
    """Blocks drawn a few at a time (their minima from the same log pass as their tokens, or
    from the race's exact minima when those were read first) hold exactly the whole row's E."""
    from ersd.race_v2 import V2Race

    vocab = 4099  # a padded last block
    rng = np.random.default_rng(7)
    for key in (0, 3, 2**62 + 11):
        full = v2_exponentials(key, 5, vocab)
        race = V2Race(key, 5, vocab)
        if exact_minima_first:
            _ = race.minima
        n_blocks = -(-vocab // 64)
        for _ in range(6):
            blocks = np.sort(rng.choice(n_blocks, size=int(rng.integers(1, 9)), replace=False))
            ids, e = race.block_exponentials(blocks, vocab)
            assert np.array_equal(e.view(np.uint64), full[ids].view(np.uint64))


def test_lazy_race_ties_resolve_to_the_lowest_id() -> None:
    """Exact ties (two blocks' minimum tokens weighted by their own noise: both score 1.0) go to
    the lowest id, as argmin's first minimum on the whole row does, in the lazy race too."""
    vocab = 300
    noise = RaceNoise(vocab, scheme="v2")
    for key in range(40):
        m, a = v2_block_minima(key, 0, -(-vocab // V2_BLOCK))
        i, j = int(a[1] + V2_BLOCK), int(a[3] + 3 * V2_BLOCK)
        w = torch.zeros(vocab, dtype=torch.float64)
        w[j], w[i] = float(m[3]), float(m[1])  # unnormalised weights: E / w = 1.0 for both
        w[int(a[0])] = float(m[0]) / 2  # scores 2.0: behind the tie
        e = noise.exponentials(key)
        assert float(e[i] / w[i]) == float(e[j] / w[j]) == 1.0
        assert noise.winner(key, w) == race_winner(w, e) == i
        assert noise.ranking(key, w, 2) == race_ranking(w, e, 2) == [i, j]
        assert noise.rank(key, w, j) == race_rank(w, e, j) == 1


def test_lazy_race_accepts_float32_and_unnormalised_weights() -> None:
    vocab = 777
    noise = RaceNoise(vocab, scheme="v2")
    w = torch.rand(vocab, generator=torch.Generator().manual_seed(1)) ** 8 * 5  # float32
    for key in range(20):
        e = noise.exponentials(key)
        assert noise.winner(key, w) == race_winner(w, e)
        assert noise.ranking(key, w, 3) == race_ranking(w, e, 3)


# --- CPU ≡ torch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [1, 63, 1000, 151936])
def test_torch_draw_is_bit_identical_to_numpy(vocab: int) -> None:
    keys = [0, 1, 2**64 - 1, root_key(7, [1, 2, 3]), extend_key(root_key(7, [1, 2, 3]), 99)]
    for stream in (0, 1 << 20, 3 << 20):
        got = v2_exponentials_torch(keys, vocab, stream, "cpu")
        assert got.dtype == torch.float64 and got.shape == (len(keys), vocab)
        for i, k in enumerate(keys):
            assert torch.equal(got[i], torch.from_numpy(v2_exponentials(k, stream, vocab)))
        assert torch.equal(race_exponentials_torch(keys, vocab, stream, scheme="v2"), got)
    noise = RaceNoise(vocab, scheme="v2")
    many = noise.exponentials_many(keys, 0, via_torch=True)
    assert torch.equal(many, torch.stack([noise.exponentials(k) for k in keys]))


def test_unknown_scheme_is_refused_everywhere() -> None:
    with pytest.raises(ValueError, match="race_scheme must be one of 'v1', 'v2'"):
        RaceNoise(10, scheme="v3")
    with pytest.raises(ValueError, match="race_scheme must be one of"):
        race_exponentials_torch([1], 10, scheme="philox")


# --- statistics of the generator -----------------------------------------------------------------


def _v2_rows(keys: list[int], vocab: int) -> np.ndarray:
    return np.stack([v2_exponentials(k, 0, vocab) for k in keys])


def _no_finaliser(keys: list[int], vocab: int) -> np.ndarray:
    """Broken: splitmix64's state sequence without its finaliser (consecutive words are an
    arithmetic progression mod 2^64: adjacent tokens strongly dependent)."""
    out = []
    for k in keys:
        seed = np.uint64(v2_seed(k, 0, 0))
        x = (np.arange(vocab, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        out.append(_exp_of_words(x + seed))
    return np.stack(out)


def _wrong_block_rate(keys: list[int], vocab: int) -> np.ndarray:
    """Broken: the block minimum drawn as Exp(1) instead of Exp(64) (too large minima)."""
    out = []
    for k in keys:
        m, a = v2_block_minima(k, 0, -(-vocab // V2_BLOCK))
        m = m * V2_BLOCK
        ids = np.arange(vocab)
        e = _exp_of_words(v2_words(v2_seed(k, 0, 0), ids)) + m[ids // V2_BLOCK]
        out.append(np.where(ids % V2_BLOCK == a[ids // V2_BLOCK], m[ids // V2_BLOCK], e))
    return np.stack(out)


def _uniformity_pvalue(rows: np.ndarray) -> float:
    """KS test of ``1 - exp(-E)`` (uniform iff E ~ Exp(1)) over every value."""
    return float(stats.kstest(-np.expm1(-rows.ravel()), "uniform").pvalue)


def _pair_pvalue(a: np.ndarray, b: np.ndarray, bins: int = 8) -> float:
    """Chi-square test of independence (and uniformity) of the pairs ``(U(a), U(b))`` binned
    into ``bins x bins`` equal cells."""
    ua = np.minimum((-np.expm1(-a) * bins).astype(int), bins - 1)
    ub = np.minimum((-np.expm1(-b) * bins).astype(int), bins - 1)
    counts = np.bincount(ua * bins + ub, minlength=bins * bins)
    return float(stats.chisquare(counts).pvalue)


def _adjacent_pvalue(rows: np.ndarray) -> float:
    return _pair_pvalue(rows[:, :-1].ravel(), rows[:, 1:].ravel())


GENERATORS = {"v2": _v2_rows, "no-finaliser": _no_finaliser, "wrong-block-rate": _wrong_block_rate}


def _keys(n: int, salt: int) -> list[int]:
    return [root_key(salt, [i, i + 1]) for i in range(n)]


@pytest.mark.parametrize("name", list(GENERATORS))
def test_generator_statistics(name: str) -> None:
    """v2 passes; each broken generator fails at least one of the same tests."""
    rows = GENERATORS[name](_keys(40, 5), 1000)  # 40,000 values, 16 blocks a row (last partial)
    p_uniform = _uniformity_pvalue(rows)
    p_adjacent = _adjacent_pvalue(rows)
    if name == "v2":
        assert p_uniform >= ALPHA, p_uniform
        assert p_adjacent >= ALPHA, p_adjacent
    else:
        assert min(p_uniform, p_adjacent) < ALPHA, (name, p_uniform, p_adjacent)


def test_consecutive_contexts_and_streams_are_independent() -> None:
    """The same token in a context and in its one-token extension, and in two streams of one
    context: independent uniform pairs."""
    vocab = 500
    keys = _keys(60, 9)
    a = _v2_rows(keys, vocab)
    b = _v2_rows([extend_key(k, 17) for k in keys], vocab)
    assert _pair_pvalue(a.ravel(), b.ravel()) >= ALPHA
    c = np.stack([v2_exponentials(k, 1 << 20, vocab) for k in keys])
    assert _pair_pvalue(a.ravel(), c.ravel()) >= ALPHA
    # the broken pairing (the same row twice) is rejected by the same test
    assert _pair_pvalue(a.ravel(), a.ravel()) < ALPHA


def test_block_minimum_sits_uniformly() -> None:
    places = np.concatenate([v2_block_minima(k, 0, 200)[1] for k in _keys(50, 3)])
    assert stats.chisquare(np.bincount(places, minlength=V2_BLOCK)).pvalue >= ALPHA
    low = places & 0x0F  # a broken place (16 positions only) is rejected by the same test
    assert stats.chisquare(np.bincount(low, minlength=V2_BLOCK)).pvalue < ALPHA


def _first_block_only(noise: RaceNoise, key: int, p: torch.Tensor) -> int:
    """Broken lazy race: the winner of the block of smallest bound only (no refinement)."""
    m, _ = noise.block_minima(key, 0)
    v = p.shape[0]
    pm = torch.nn.functional.pad(p, (0, -v % V2_BLOCK)).view(-1, V2_BLOCK).amax(1).numpy()
    with np.errstate(divide="ignore"):
        b = int(np.argmin(m / pm))
    e = noise.exponentials(key)
    ids = torch.arange(b * V2_BLOCK, min(b * V2_BLOCK + V2_BLOCK, v))
    return int(ids[torch.argmin(e[ids] / p[ids])])


def test_lazy_winner_follows_p_over_many_blocks() -> None:
    """The lazy race's winner is a sample of ``p`` (chi-square over tokens with expected count
    >= 5, the rest pooled) on a 1,000-token vocabulary with mass spread over its 16 blocks; the
    broken lazy race that stops at its first block is rejected by the same test."""
    vocab, n = 1000, 6000
    g = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 1.5, -1)
    p[5] = p.sum() * 0.3  # one sharp token among many mid ones
    p = p / p.sum()
    noise = RaceNoise(vocab, scheme="v2")
    keys = _keys(n, 21)

    def pvalue(draws: list[int]) -> float:
        counts = np.bincount(draws, minlength=vocab)
        expected = p.numpy() * n
        big = expected >= 5
        obs = np.append(counts[big], counts[~big].sum())
        exp = np.append(expected[big], expected[~big].sum())
        return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)

    assert pvalue([noise.winner(k, p) for k in keys]) >= ALPHA
    assert pvalue([_first_block_only(noise, k, p) for k in keys]) < ALPHA


# --- selection, recording, invariance ------------------------------------------------------------

TARGET = make_target(6, seed=3)
DRAFTS = make_drafts(TARGET, seed=7)


def test_race_scheme_is_checked_and_recorded() -> None:
    t = TARGET.model()
    with pytest.raises(GenerationInputError, match="race_scheme must be one of") as info:
        ersd.generate(t, None, [1, 2], max_new_tokens=3, race_scheme="V2")
    assert info.value.param == "race_scheme"
    assert "\n" not in str(info.value)
    with pytest.raises(GenerationInputError, match="watermark") as info:
        ersd.generate(
            t,
            None,
            [1, 2],
            max_new_tokens=3,
            race_scheme="v2",
            watermark=ersd.Watermark(key=b"k" * 16),
        )
    assert info.value.param == "race_scheme"
    v1 = ersd.generate(t, None, [1, 2], max_new_tokens=12, seed=4)
    v2 = ersd.generate(t, None, [1, 2], max_new_tokens=12, seed=4, race_scheme="v2")
    assert v1.race_scheme == "v1" and v2.race_scheme == "v2"
    assert v2.stats()["race_scheme"] == "v2" and v1.to_dict()["race_scheme"] == "v1"
    same = ersd.generate(t, None, [1, 2], max_new_tokens=12, seed=4, race_scheme="v1")
    assert same.tokens == v1.tokens  # the default is v1: old seeds reproduce
    texts = {
        s: [
            ersd.generate(t, None, [1, 2], max_new_tokens=12, seed=k, race_scheme=s).tokens
            for k in range(8)
        ]
        for s in ("v1", "v2")
    }
    assert texts["v1"] != texts["v2"]  # the scheme is used


@pytest.mark.parametrize("shape", ["chain:4", "multi:3x2", "batch:4", "paths:[[0],[1],[0,0]]"])
def test_ersd_under_v2_equals_target_only(shape: str) -> None:
    t = TARGET.model()
    for name, draft in DRAFTS.items():
        for seed in range(12):
            kw = {"max_new_tokens": 10, "seed": seed, "race_scheme": "v2", "temperature": 0.9}
            want = ersd.generate(t, None, [1, 2], **kw).tokens
            got = ersd.generate(t, draft.model(), [1, 2], tree=shape, **kw)
            assert got.tokens == want, (shape, name, seed)
            assert got.race_scheme == "v2"


def test_ersd_under_v2_large_vocabulary_invariance() -> None:
    """V = 3000 (47 blocks): the lazy race decides drafts and verification."""
    vocab = 3000
    g = torch.Generator().manual_seed(2)
    table = torch.randn(vocab, vocab, generator=g) * 2.5

    def target_fn(seqs: list[list[int]]) -> torch.Tensor:
        return table[[s[-1] for s in seqs]]

    def draft_fn(seqs: list[list[int]]) -> torch.Tensor:
        return table[[s[-1] for s in seqs]] * 0.8 + 0.3

    target = ersd.FunctionModel(target_fn, vocab)
    draft = ersd.FunctionModel(draft_fn, vocab)
    # top-p: the float64 probabilities decide; temperature only: the target's winners come from
    # its logits (ersd.race_v2.v2_winner_from_logits) while target-only sampling uses the
    # probabilities -- the same tokens either way
    for sampling in ({"top_p": 0.95}, {"temperature": 0.8}):
        for seed in range(6):
            kw = {"max_new_tokens": 16, "seed": seed, "race_scheme": "v2", **sampling}
            want = ersd.generate(target, None, [1, 2], **kw).tokens
            for shape in ("chain:4", "multi:2x2"):
                assert ersd.generate(target, draft, [1, 2], tree=shape, **kw).tokens == want


def test_batch_under_v2_equals_rows_alone() -> None:
    t, d = TARGET.model(), DRAFTS["mild"].model()
    prompts = [[1, 2], [3], [0, 4, 5], [2, 2]]
    seeds = [11, 12, 13, 14]
    batch = ersd.generate_batch(
        t, d, prompts, seeds=seeds, max_new_tokens=9, tree="multi:2x2", race_scheme="v2"
    )
    for prompt, seed, res in zip(prompts, seeds, batch, strict=True):
        alone = ersd.generate(
            t, d, prompt, seed=seed, max_new_tokens=9, tree="multi:2x2", race_scheme="v2"
        )
        assert res.tokens == alone.tokens and res.race_scheme == "v2"
    streamed: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    for i, rec in ersd.generate_batch_stream(
        t, d, prompts, seeds=seeds, max_new_tokens=9, tree="multi:2x2", race_scheme="v2"
    ):
        streamed[i].extend(rec.tokens)
    assert [streamed[i] for i in range(len(prompts))] == [r.tokens for r in batch]
    # one engine serves both schemes side by side, each row its own
    with ersd.BatchEngine(t, d) as engine:
        a = engine.add([1, 2], max_new_tokens=9, seed=11, tree="chain:3", race_scheme="v2")
        b = engine.add([1, 2], max_new_tokens=9, seed=11, tree="chain:3")
        done = {}
        while len(engine):
            for rid, _, res in engine.step():
                if res is not None:
                    done[rid] = res
    assert (
        done[a].tokens
        == ersd.generate(
            t, d, [1, 2], max_new_tokens=9, seed=11, tree="chain:3", race_scheme="v2"
        ).tokens
    )
    assert (
        done[b].tokens
        == ersd.generate(t, d, [1, 2], max_new_tokens=9, seed=11, tree="chain:3").tokens
    )
    assert (done[a].race_scheme, done[b].race_scheme) == ("v2", "v1")


def test_scalar_exponential_has_the_array_bits() -> None:
    """The one-token path (Python floats: a rank's score, the largest logit's token's score before
    its block is drawn) equals the array path, block minimum included."""
    from ersd.race_v2 import (
        V2Race,
        _block_words,
        _minima_of_words,
        _minimum_of_word,
        _unit_log_scalar,
        _v2_exponential_at,
        v2_seed,
    )

    rng = np.random.default_rng(8)
    u = np.concatenate([rng.random(3000), np.exp(-rng.random(300) * 36), [1.0, 2.0**-53]])
    u = u[u > 0]
    assert [_unit_log_scalar(float(x)) for x in u] == unit_log(u).tolist()
    # block words at the extremes too: U = 1 (-log U = 0, the minimum is then the floor) and 2^-53
    words = np.concatenate(
        [
            rng.integers(0, 2**64, 2000, dtype=np.uint64),
            np.array([2**64 - 1, 0, 2**11 - 1], np.uint64),
        ]
    )
    assert [_minimum_of_word(int(w)) for w in words] == _minima_of_words(words).tolist()
    vocab = 1000
    for key in (3, 2**64 - 5, root_key(1, [4])):
        stream = 1 << 20
        minima, places = v2_block_minima(key, stream, -(-vocab // V2_BLOCK))
        row = v2_exponentials(key, stream, vocab)
        seed = v2_seed(key, stream, 0)
        got = [
            _v2_exponential_at(seed, t, float(minima[t // V2_BLOCK]), int(places[t // V2_BLOCK]))
            for t in range(vocab)
        ]
        assert got == row.tolist()
        words = _block_words(key, stream, minima.size)
        assert [_minimum_of_word(int(w)) for w in words] == minima.tolist()
        # a fresh race per token (its block not drawn: the scalar minimum) and one race drawn
        # block by block first (the array path) give the row's bits
        assert [V2Race(key, stream, vocab).exponential(t) for t in range(0, vocab, 7)] == row[
            ::7
        ].tolist()
        race = V2Race(key, stream, vocab)
        race.block_exponentials(np.arange(minima.size), vocab)
        assert [race.exponential(t) for t in range(vocab)] == row.tolist()


def test_block_bounds_are_not_reused_for_a_changed_row() -> None:
    """The bounds kept for a row are used again only for that very tensor, unmodified: after an
    in-place change that gives a weak block most of the mass (its old bound would skip it), and
    for another tensor, the lazy race still equals the whole row."""
    vocab = 1000
    noise = RaceNoise(vocab, scheme="v2")
    g = torch.Generator().manual_seed(3)
    moved = 0
    for key in range(40):
        p = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 4, -1)
        e = noise.exponentials(key)
        assert noise.winner(key, p) == race_winner(p, e)
        weak = int(p[: vocab - vocab % V2_BLOCK].view(-1, V2_BLOCK).amax(1).argmin())
        t = weak * V2_BLOCK + 7
        p[t] = 1.0  # in place: about half the mass now sits in the weakest block
        want = race_winner(p, e)
        assert noise.winner(key, p) == want
        assert noise.rank(key, p, t) == race_rank(p, e, t)
        moved += want == t
        other = torch.zeros(vocab, dtype=torch.float64)
        other[5] = 1.0
        assert noise.ranking(key, other, 1) == [5]
    assert moved >= 10  # the changed row's winner often sits where the old bounds never looked
