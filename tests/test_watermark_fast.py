"""The fast model-free detector (issue 52 item 4): the vectorised BLAKE2b, the in-place Philox
lane and the sort-keyed window dedupe give the *same bits* as the first releases' path
(``hashlib`` per window, the whole Philox block, a row-wise ``np.unique``), kept in the package as
the reference (``ErsdPRF.uniform_at_reference``, ``scored_windows_reference``).

These are equality tests, not statistical ones: every comparison is ``==`` on bits (digests,
Philox words, uniforms, p-values, scores), over fixed-seed random keys, texts and settings. Each
has a perturbed variant (a different personalization, a flipped lane, one repeated window
counted) that the same comparison must reject, so a comparison that could never fail would show.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from ersd.watermark import Watermark, detect, detect_dual
from ersd.watermark import blake as blake_mod
from ersd.watermark.blake import KeyedBlake2b, compress_int
from ersd.watermark.detect import (
    _ROW_MIX,
    _first_rows,
    gamma_p_value,
    scored_windows,
    scored_windows_reference,
    sidak,
)
from ersd.watermark.prf import ErsdPRF, philox4x64, philox4x64_lanes


def _hashlib_digests(key: bytes, person: bytes, size: int, msgs: np.ndarray) -> list[bytes]:
    return [
        hashlib.blake2b(
            row.astype("<i8").tobytes(), digest_size=size, key=key, person=person
        ).digest()
        for row in msgs
    ]


# --- BLAKE2b -------------------------------------------------------------------------------------


@pytest.mark.parametrize("words", [1, 2, 4, 8, 15, 16, 17, 31, 32, 33, 64])
def test_vectorised_blake2b_equals_hashlib(words: int) -> None:
    """Every message length the watermark can use (h = 1..64 words: 1 to 4 blocks, a block
    boundary exactly at 16, 32, 64 words), random keys of 1-64 bytes, people of 0-16 bytes and
    digest sizes 1-64."""
    rng = np.random.default_rng(words)
    for trial in range(4):
        key = rng.bytes(int(rng.integers(1, 65)) if trial else 64)
        person = rng.bytes(int(rng.integers(0, 17)))
        size = int(rng.choice([1, 8, 16, 20, 32, 64]))
        msgs = rng.integers(-(2**63), 2**63 - 1, size=(37, words), dtype=np.int64)
        msgs[0] = -1  # the -1 padding of the first windows
        got = KeyedBlake2b(key, person, size).digest_words(msgs)
        want = _hashlib_digests(key, person, size, msgs)
        assert [row.tobytes()[:size] for row in got] == want
        # the variant that must fail: a different personalization gives other digests
        other = KeyedBlake2b(key, person + b"x" if len(person) < 16 else b"", size)
        assert [row.tobytes()[:size] for row in other.digest_words(msgs)] != want


def test_vectorised_blake2b_across_chunks() -> None:
    rng = np.random.default_rng(1)
    n = blake_mod.CHUNK * 2 + 5
    msgs = rng.integers(0, 151_936, size=(n, 4), dtype=np.int64)
    key = rng.bytes(32)
    got = KeyedBlake2b(key, b"ersd-watermark1", 16).digest_words(msgs)
    assert [row.tobytes() for row in got] == _hashlib_digests(key, b"ersd-watermark1", 16, msgs)


def test_scalar_compression_is_rfc7693() -> None:
    """The key block's scalar compression against RFC 7693's appendix A ("abc", BLAKE2b-512)."""
    h = [iv ^ p for iv, p in zip(blake_mod._IV, [0x01010040] + [0] * 7, strict=True)]
    m = [int.from_bytes(b"abc".ljust(128, b"\0")[i : i + 8], "little") for i in range(0, 128, 8)]
    digest = b"".join(w.to_bytes(8, "little") for w in compress_int(h, m, 3, True))
    assert digest == hashlib.blake2b(b"abc").digest()
    assert digest != hashlib.blake2b(b"abd").digest()


def test_blake2b_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError, match="key must be 1 to 64 bytes"):
        KeyedBlake2b(b"", b"")
    with pytest.raises(ValueError, match="personalization is at most 16"):
        KeyedBlake2b(b"k", b"x" * 17)
    with pytest.raises(ValueError, match=r"messages must be \[n, words >= 1\]"):
        KeyedBlake2b(b"k").digest_words(np.zeros(4, dtype=np.int64))


# --- Philox and the uniforms ---------------------------------------------------------------------


def test_philox_lanes_equal_the_whole_block() -> None:
    rng = np.random.default_rng(2)
    n = 2 * 8192 + 7  # several chunks
    counter = rng.integers(0, 2**62, n, dtype=np.uint64) + np.uint64(1)
    k0 = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    k1 = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    lane = rng.integers(0, 4, n).astype(np.intp)
    salts = [0, 1, 255, 4095]
    got = philox4x64_lanes(counter, k0, k1, salts, lane)
    assert got.shape == (4, n)
    for i, salt in enumerate(salts):
        want = np.choose(lane, philox4x64(counter, k0, k1, salt))
        assert np.array_equal(got[i], want)
        # the variant that must fail: another lane of the same block
        shifted = philox4x64_lanes(counter, k0, k1, [salt], (lane + 1) % 4)[0]
        assert not np.array_equal(shifted, want)
    assert np.array_equal(philox4x64_lanes(counter, k0, k1, [255], lane)[0], got[2])


@pytest.mark.parametrize("width", [1, 4, 16])
def test_uniform_at_equals_reference(width: int) -> None:
    rng = np.random.default_rng(width)
    prf = ErsdPRF(rng.bytes(32), 3, width)
    for n in (1, 63, 1023, 1024, 5000):  # both sides of the hashlib / vectorised switch
        windows = rng.integers(-1, 151_936, size=(n, width))
        toks = rng.integers(0, 151_936, size=n)
        want = prf.uniform_at_reference(windows, toks)
        assert np.array_equal(prf.uniform_at(windows, toks), want)
        salts = [0, 3, 7, 200]
        got = prf.uniform_at(windows, toks, salts=salts)
        assert got.shape == (4, n)
        assert np.array_equal(got, prf.uniform_at_reference(windows, toks, salts=salts))
    assert prf.uniform_at(np.zeros((0, width)), np.zeros(0, dtype=np.int64)).shape == (0,)


# --- the window dedupe ---------------------------------------------------------------------------


def test_first_rows_equals_row_unique() -> None:
    rng = np.random.default_rng(3)
    for trial in range(60):
        h = int(rng.integers(1, 7))
        vocab = int(rng.choice([2, 3, 5, 50, 151_936]))  # small vocabularies repeat windows
        ids = rng.integers(0, vocab, int(rng.integers(1, 400)))
        start = int(rng.integers(0, min(h, len(ids)) + 1))
        initial = None if trial % 2 else rng.integers(-1, vocab, h).tolist()
        want = scored_windows_reference(ids, h, initial, start)
        got = scored_windows(ids, h, initial, start)
        assert np.array_equal(got[0], want[0]) and got[1:] == want[1:]


def test_first_rows_survives_a_key_collision() -> None:
    """Two different windows with the same 64-bit sort key: the exact row sort decides."""
    a, b, a2 = 5, 7, 11

    def mix(x: int) -> int:
        x = (x * _ROW_MIX[1]) % 2**64
        return x ^ (x >> 29)

    b2 = (b + mix(a) - mix(a2)) % 2**64
    b2 = b2 - 2**64 if b2 >= 2**63 else b2
    assert (mix(a) + b) % 2**64 == (mix(a2) + b2) % 2**64  # the keys really collide
    rows = np.array([[a, b], [a2, b2], [a, b], [a2, b2], [1, 2]], dtype=np.int64)
    # trusting the key alone (the broken variant) would merge the two windows: [0, 4]
    assert np.array_equal(_first_rows(rows), [0, 1, 4])


# --- detect: the same p-values -------------------------------------------------------------------


def _reference(ids: np.ndarray, wm: Watermark, salt: int | None, prompt: list[int] | None):  # type: ignore[no-untyped-def]
    """The first releases' detect: (p-value, score, scored, salt, salt p-value)."""
    h = wm.context_width
    if not wm.prompt_windows:
        initial, start = None, 0
    elif prompt is None:
        initial, start = None, min(h, len(ids))
    else:
        initial, start = wm.initial_window(prompt), 0
    windows, tokens, _ = scored_windows_reference(ids, h, initial, start)
    if not tokens:  # nothing scored: detect refuses the text (tested elsewhere)
        return None
    salts = [salt] if salt is not None else list(range(wm.num_salts))
    prf = wm.prf(salts[0])
    toks = np.asarray(tokens, dtype=np.int64)
    if isinstance(prf, ErsdPRF):
        u = prf.uniform_at_reference(windows, toks, salts=salts)
    else:
        u = prf.uniform_at(windows, toks, salts=salts)
    totals = (-np.log1p(-u)).sum(axis=1)
    i = int(np.argmax(totals))
    p = gamma_p_value(float(totals[i]), len(tokens))
    return sidak(p, len(salts)), float(totals[i]), len(tokens), salts[i], p


def _cases(seed: int, count: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    for i in range(count):
        scheme = "vllm-philox" if i % 5 == 4 else "ersd-v1"
        key = int(rng.integers(0, 2**63)) if scheme == "vllm-philox" else rng.bytes(16 + i % 49)
        version = int(rng.integers(1, 3))
        h = int(rng.choice([1, 2, 4, 4, 8]))
        wm = Watermark(key=key, scheme=scheme, version=version, context_width=h, num_salts=8)
        vocab = int(rng.choice([4, 30, 49_152, 151_936]))
        n = int(rng.choice([1, 3, 9, 60, 300, 5000]))
        ids = rng.integers(0, vocab, n)
        if i % 7 == 0 and n > 20:  # a repeated stretch: windows seen before
            ids[n // 2 : n // 2 + 10] = ids[:10]
        prompt = rng.integers(0, vocab, int(rng.integers(0, 6))).tolist() if i % 2 else None
        salt = None if i % 3 == 0 else int(rng.integers(0, 8))
        yield wm, ids, prompt, salt


def test_detect_p_values_are_bit_identical() -> None:
    """Random keys, both schemes, versions 1 and 2, widths 1-8, texts of 1-5000 tokens with and
    without repeated windows, with and without the prompt, the salt known or all 8 tried."""
    checked = 0
    for wm, ids, prompt, salt in _cases(4, 120):
        want = _reference(ids, wm, salt, prompt)
        if want is None:
            continue
        d = detect(ids.tolist(), wm, salt=salt, min_tokens=1, prompt=prompt, per_token=True)
        assert (d.p_value, d.score, d.scored, d.salt, d.salt_p_value) == want
        checked += 1
    assert checked >= 90


def test_detect_all_256_salts_and_dual_are_bit_identical() -> None:
    rng = np.random.default_rng(5)
    wm = Watermark(key=rng.bytes(32))  # 256 salts, version 2
    ids = rng.integers(0, 49_152, 700)
    for prompt in (None, [1, 2, 3, 4, 5]):
        want = _reference(ids, wm, None, prompt)
        d = detect(ids, wm, prompt=prompt)
        assert (d.p_value, d.score, d.scored, d.salt, d.salt_p_value) == want
    # the dual-key detector reads the same uniforms under the derived keys
    dual = detect_dual(ids, wm, salt=9)
    assert dual.scored == _reference(ids, wm, 9, None)[2]
    windows, toks, _ = scored_windows_reference(ids, 4, None, 4)
    ua = wm.derive("key_a").prf(9).uniform_at_reference(windows, np.asarray(toks), salts=[9])
    ub = wm.derive("key_b").prf(9).uniform_at_reference(windows, np.asarray(toks), salts=[9])
    total = float(((1.0 - 0.1) * -np.log1p(-ua) + 0.1 * -np.log1p(-ub)).sum(axis=1)[0])
    assert dual.score == total


def test_reference_comparison_can_fail() -> None:
    """The broken variant: scoring a repeated window (what a dedupe bug would do) changes the
    p-value, and the comparison above sees it."""
    rng = np.random.default_rng(6)
    wm = Watermark(key=rng.bytes(32), num_salts=1)
    ids = rng.integers(0, 100, 400)
    ids[200:260] = ids[:60]
    windows, _, _ = scored_windows_reference(ids, 4, None, 4)
    all_rows = np.lib.stride_tricks.sliding_window_view(ids, 4)[: len(ids) - 4]
    assert len(all_rows) > len(windows)  # repeats exist
    u_all = wm.prf(0).uniform_at(all_rows, ids[4:])
    broken = sidak(gamma_p_value(float((-np.log1p(-u_all)).sum()), len(all_rows)), 1)
    assert broken != _reference(ids, wm, 0, None)[0] == detect(ids, wm, salt=0).p_value


def test_speed_study_times_the_reference_against_the_fast_path() -> None:
    """``research/watermark_detector_speed.py``: its "old" arm really runs the reference path
    (swapped in, then restored) and its report says whether the two agreed."""
    from research.watermark_detector_speed import compare, reference_path

    fast = ErsdPRF.uniform_at
    with reference_path():
        assert ErsdPRF.uniform_at is ErsdPRF.uniform_at_reference
    assert ErsdPRF.uniform_at is fast
    toks = np.random.default_rng(7).integers(0, 151_936, 3000).tolist()
    r = compare(toks, Watermark(key=bytes(range(32)), num_salts=3), None, 2)
    assert r["p_values_identical"] and r["scored"] == 2996 and r["salts_tried"] == 3
    assert len(r["cpu"]["old_s"]) == len(r["wall"]["new_s"]) == 2
