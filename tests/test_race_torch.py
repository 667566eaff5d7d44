"""The torch race (:mod:`ersd.race_torch`) against the NumPy reference (:class:`RaceNoise`).

Whole races over a real vocabulary size, every stream kind, with the tail and wedge words counted
so that a race set without them cannot pass; then crafted word sequences dense in tails and wedge
rejections, decoded by NumPy's own sampler word by word.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ersd.race import (
    STREAM_DRAFT,
    STREAM_RACE,
    STREAM_RESIDUAL,
    STREAM_VERIFY,
    RaceNoise,
    root_key,
)
from ersd.race_torch import (
    _np_exponential_of,
    _s64,
    _shr,
    _ziggurat,
    philox_blocks,
    race_exponentials_torch,
    ziggurat_tables,
)

VOCAB = 151936  # Qwen2.5's: ~80 tail words and ~1,600 slow-path words per race


def _word_kinds(keys: list[int], stream: int, vocab: int) -> tuple[int, int]:
    """(tail words, wedge-path words) among the first ``vocab`` raw words of each key's race."""
    ke, _, _, _ = ziggurat_tables()
    raw = philox_blocks(
        torch.tensor([_s64(k) for k in keys]),
        torch.tensor([_s64(stream)] * len(keys)),
        (vocab + 3) // 4,
    )
    idx = (_shr(raw, 3) & 0xFF).numpy()
    slow = _shr(raw, 11).numpy() >= ke[idx]
    return int((slow & (idx == 0)).sum()), int((slow & (idx != 0)).sum())


@pytest.mark.parametrize("stream", [STREAM_RACE, STREAM_DRAFT + 2, STREAM_VERIFY, STREAM_RESIDUAL])
def test_whole_races_equal_numpy_bit_for_bit(stream: int) -> None:
    keys = [root_key(s, [11, s]) for s in range(3)] + [0, (1 << 64) - 1]
    got = race_exponentials_torch(keys, VOCAB, stream)
    noise = RaceNoise(VOCAB)
    want = torch.stack([noise.exponentials(k, stream) for k in keys])
    assert got.dtype == torch.float64 and got.shape == (len(keys), VOCAB)
    assert torch.equal(got, want)
    tails, wedges = _word_kinds(keys, stream, VOCAB)
    assert tails > 50 * len(keys) and wedges > 1000 * len(keys), (tails, wedges)


def test_small_and_odd_vocabularies() -> None:
    noise_keys = [root_key(3, [t]) for t in range(4)]
    for vocab in (1, 2, 3, 5, 97, 4099):
        got = race_exponentials_torch(noise_keys, vocab)
        noise = RaceNoise(vocab)
        want = torch.stack([noise.exponentials(k) for k in noise_keys])
        assert torch.equal(got, want), vocab


def _crafted_words(n: int, seed: int) -> np.ndarray:
    """Raw words, most of them forced off the fast path: tails (layer 0) and wedge tests (other
    layers), each followed by a random word (the uniform of the tail or the wedge test)."""
    ke, _, _, _ = ziggurat_tables()
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 1 << 63, size=n, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    for j in range(0, n, 2):
        kind = rng.integers(0, 4)
        layer = 0 if kind == 0 else int(rng.integers(1, 256))
        if kind == 3:
            continue  # a random word (fast path most of the time)
        lo = int(ke[layer])
        ri = int(rng.integers(lo, 1 << 53)) if lo < (1 << 53) else (1 << 53) - 1
        low = int(rng.integers(0, 8))
        words[j] = np.uint64((ri << 11) | (layer << 3) | low)
    return words


_FAST_ZERO = 2 << 3  # layer 2, ri = 0: NumPy's fast path returns exactly 0.0 from it


def _numpy_decode(words: np.ndarray) -> tuple[list[float], int, int]:
    """NumPy's sampler run over ``words``, one attempt at a time: each attempt's one or two words
    are fed through Philox's buffer followed by a word that returns exactly 0.0, so a failed
    wedge test (NumPy restarts with the next word) shows as 0.0 after three words.  Returns the
    values, and how many draws took a tail and how many attempts failed a wedge test."""
    out: list[float] = []
    pos = tails = restarts = 0
    while pos + 2 <= len(words):
        w0, w1 = int(words[pos]), int(words[pos + 1])
        value, used = _np_exponential_of([w0, w1, _FAST_ZERO, _FAST_ZERO])
        if used == 3 and value == 0.0:  # the wedge test failed: NumPy draws again
            restarts += 1
            pos += 2
            continue
        assert used in (1, 2), used
        tails += used == 2 and ((w0 >> 3) & 0xFF) == 0
        out.append(value)
        pos += used
    return out, tails, restarts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tails_and_wedge_rejections_follow_numpys_sampler(seed: int) -> None:
    words = _crafted_words(4000, seed)
    want, tails, restarts = _numpy_decode(words)
    assert tails > 100 and restarts > 20, (tails, restarts)  # the cases are there
    ke, we, fe, r = ziggurat_tables()
    raw = torch.from_numpy(words.view(np.int64).copy()).view(1, -1)
    got, ok = _ziggurat(
        raw, len(want), torch.as_tensor(ke), torch.as_tensor(we), torch.as_tensor(fe), r
    )
    assert ok
    assert got[0].tolist() == want


def test_a_broken_tail_is_caught() -> None:
    """The comparison above must reject a sampler whose tail is off by one ulp."""
    words = _crafted_words(2000, 5)
    want, _, _ = _numpy_decode(words)
    ke, we, fe, r = ziggurat_tables()
    raw = torch.from_numpy(words.view(np.int64).copy()).view(1, -1)
    bad_r = float(np.nextafter(r, np.inf))
    got, _ = _ziggurat(
        raw, len(want), torch.as_tensor(ke), torch.as_tensor(we), torch.as_tensor(fe), bad_r
    )
    assert got[0].tolist() != want


def test_exponentials_many_is_the_reference_row_by_row() -> None:
    vocab = 20000
    keys = [root_key(9, [t, t + 1]) for t in range(5)]
    keys.append(keys[1])  # a repeated key
    for via_torch in (False, True):
        noise = RaceNoise(vocab, cache_size=4)
        ref = RaceNoise(vocab)
        got = noise.exponentials_many(keys, STREAM_DRAFT + 1, via_torch=via_torch)
        want = torch.stack([ref.exponentials(k, STREAM_DRAFT + 1) for k in keys])
        assert torch.equal(got, want), via_torch
        # a second call is served from the caches and still equal
        assert torch.equal(noise.exponentials_many(keys[:3], STREAM_DRAFT + 1), want[:3])
    assert RaceNoise(vocab).exponentials_many([]).shape == (0, vocab)


def test_watermarked_keys_go_through_the_watermarks_draw() -> None:
    from ersd.watermark import Watermark
    from ersd.watermark.keyed import WatermarkKey, WatermarkNoise

    vocab = 3000
    wm = Watermark(key=b"k" * 32, context_width=2)
    noise = WatermarkNoise(vocab, wm)
    assert not noise.draws_on_device() and RaceNoise(vocab).draws_on_device()
    key = WatermarkKey.root(root_key(1, [5, 6]), wm, seed=1)
    keys = [key, key.extend(7), key.extend(7).extend(8)]
    got = noise.exponentials_many(keys, via_torch=True)
    want = torch.stack([WatermarkNoise(vocab, wm).exponentials(k) for k in keys])
    assert torch.equal(got, want)
    assert not torch.equal(got[0], RaceNoise(vocab).exponentials(int(key)))  # the PRF, not Philox
    with pytest.raises(TypeError, match="WatermarkNoise"):
        RaceNoise(vocab).exponentials_many(keys, via_torch=True)
