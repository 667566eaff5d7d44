"""The watermark's keyed pseudo-random functions: a uniform per (window, token), in NumPy.

A watermarked race at a context draws ``E_i = -log U_i`` with ``U_i = PRF(key, salt, window, i)``
where ``window`` is the last ``h`` generated tokens (``-1`` before the first one).  Detection needs
only the emitted token's ``U``, so every PRF here is *counter-based*: one token's value costs one
block of the underlying generator, not a draw over the whole vocabulary.

Two schemes:

* :class:`ErsdPRF` (``"ersd-v1"``, the default) — a keyed BLAKE2b (RFC 7693, Python's
  :mod:`hashlib`) of the window under the secret key (16-64 bytes, so 128-512-bit key security)
  gives a 128-bit per-window key; Philox4x64-10 (Salmon et al., SC 2011) in counter mode under
  that key expands it to one 64-bit word per token and salt (token ``i`` of salt ``s``: counter
  ``(i // 4 + 1, s, 0, 0)``, word ``i % 4``, exactly NumPy's ``Philox(key=..., counter=[0, s, 0,
  0]).random_raw()`` order, so generation draws the whole vocabulary with NumPy's C generator and
  detection computes single words here, all salts from one hash per token).
  ``U = (w >> 11 + 1/2) / 2**53`` lies strictly inside (0, 1).  The secret key only enters
  BLAKE2b; Philox is a statistical expander of a per-window key, so learning one window's noise
  says nothing about another window's or about the key.
* :class:`VllmPRF` (``"vllm-philox"``) — vLLM 0.32's ``vllm.v1.watermarking.PhiloxPRF``
  (Philox4x32-10 over a 64-bit key, the window's tokens and the token id, 24-bit float32 uniforms)
  reproduced bit for bit, so vLLM's ``GumbelWatermarkDetector`` checks our text and our detector
  checks vLLM's (tests in the vLLM environment compare the two).  Its key is only 64 bits and its
  uniforms have 2**24 levels: interoperability, not the default.  Salt ``s > 0`` turns the key
  into ``sha256("ersd-salt" || s || key)[:8]`` (salt 0 is vLLM's own key).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ersd.watermark.blake import KeyedBlake2b


class WatermarkPRF(Protocol):
    """A keyed PRF bound to one salt: a whole race's uniforms at a window (generation) and single
    (window, token) uniforms under one or several salts (detection)."""

    scheme: str

    def uniforms(self, window: Sequence[int], vocab_size: int) -> np.ndarray: ...

    def uniform_at(
        self,
        windows: Sequence[Sequence[int]] | np.ndarray,
        tokens: np.ndarray,
        salts: Sequence[int] | None = None,
    ) -> np.ndarray: ...


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
#: the ersd-v1 window hash's BLAKE2b personalization
_PERSON = b"ersd-watermark1"
#: fewer windows than this are hashed by hashlib (the vectorised hash has a fixed cost of ~0.3 ms)
_VECTOR_MIN_WINDOWS = 1024
#: entries of one [salts, tokens] block of the detector's Philox (memory ~ 30 words each)
_BLOCK = 1 << 16
_M32 = np.uint64(0xFFFFFFFF)
_U32 = 0xFFFFFFFF


def _u64(x: int) -> np.uint64:
    return np.uint64(x & 0xFFFFFFFFFFFFFFFF)


# --- Philox4x64-10 (the default scheme's expander) ------------------------------------------

_P64_M0 = 0xD2E7470EE14C6C93
_P64_M1 = 0xCA5A826395121157
_P64_W0 = 0x9E3779B97F4A7C15
_P64_W1 = 0xBB67AE8584CAA73B


def _mulhilo64(a: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) 64-bit words of ``a * m`` from 32-bit halves (uint64 arithmetic wraps)."""
    m_lo, m_hi = _u64(m & _U32), _u64(m >> 32)
    a_lo, a_hi = a & _M32, a >> np.uint64(32)
    p0, p1, p2, p3 = a_lo * m_lo, a_lo * m_hi, a_hi * m_lo, a_hi * m_hi
    s32 = np.uint64(32)
    mid = (p0 >> s32) + (p1 & _M32) + (p2 & _M32)
    hi = p3 + (p1 >> s32) + (p2 >> s32) + (mid >> s32)
    return hi, a * _u64(m)


def philox4x64(
    counter0: np.ndarray, key0: np.ndarray, key1: np.ndarray, counter1: int | np.ndarray = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Philox4x64-10 of counters ``(counter0, counter1, 0, 0)`` under keys ``(key0, key1)``
    (uint64 arrays, broadcast together -- ``counter1`` may be an array, e.g. a column of
    salts): NumPy's ``Philox(key=key1 << 64 | key0)`` at that counter."""
    c1_arr = np.asarray(counter1, dtype=np.uint64) if not isinstance(counter1, int) else None
    shape = np.broadcast_shapes(
        np.shape(counter0), np.shape(key0), np.shape(key1), () if c1_arr is None else c1_arr.shape
    )
    zero = np.zeros(shape, dtype=np.uint64)
    c0 = zero + np.asarray(counter0).astype(np.uint64)
    c1 = zero + (_u64(counter1) if c1_arr is None else c1_arr)  # type: ignore[arg-type]
    c2, c3 = zero, zero
    k0, k1 = key0.astype(np.uint64), key1.astype(np.uint64)
    with np.errstate(over="ignore"):
        for rnd in range(10):
            if rnd:
                k0 = k0 + _u64(_P64_W0)
                k1 = k1 + _u64(_P64_W1)
            hi0, lo0 = _mulhilo64(c0, _P64_M0)
            hi1, lo1 = _mulhilo64(c2, _P64_M1)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


_MUL = {m: (np.uint64(m), np.uint64(m & _U32), np.uint64(m >> 32)) for m in (_P64_M0, _P64_M1)}
_S32 = np.uint64(32)
#: tokens per pass of :func:`philox4x64_lanes` (its 13 scratch words each stay in L2; 8192 measured
#: ~10% faster than 4096, 32768 slower)
_CHUNK = 8192


def _mulhilo64_into(a: np.ndarray, m: int, hi: np.ndarray, lo: np.ndarray, t: np.ndarray) -> None:
    """:func:`_mulhilo64` into ``hi``, ``lo`` (``t``: scratch of four rows of ``a``'s shape;
    ``a`` is left unchanged unless it is ``hi`` or ``lo``)."""
    m64, m_lo, m_hi = _MUL[m]
    a_lo, a_hi, mid, x = t[0], t[1], t[2], t[3]
    np.bitwise_and(a, _M32, out=a_lo)
    np.right_shift(a, _S32, out=a_hi)
    np.multiply(a, m64, out=lo)
    np.multiply(a_lo, m_lo, out=mid)  # p0
    np.right_shift(mid, _S32, out=mid)
    np.multiply(a_lo, m_hi, out=a_lo)  # p1
    np.multiply(a_hi, m_lo, out=hi)  # p2
    np.multiply(a_hi, m_hi, out=a_hi)  # p3
    np.right_shift(hi, _S32, out=x)
    np.add(a_hi, x, out=a_hi)
    np.bitwise_and(hi, _M32, out=hi)
    np.add(mid, hi, out=mid)
    np.right_shift(a_lo, _S32, out=x)
    np.add(a_hi, x, out=a_hi)
    np.bitwise_and(a_lo, _M32, out=a_lo)
    np.add(mid, a_lo, out=mid)
    np.right_shift(mid, _S32, out=mid)
    np.add(a_hi, mid, out=hi)


def philox4x64_lanes(
    counter0: np.ndarray,
    key0: np.ndarray,
    key1: np.ndarray,
    salts: Sequence[int],
    lane: np.ndarray,
) -> np.ndarray:
    """``[len(salts), n]``: row ``i``, column ``j`` is word ``lane[j]`` of :func:`philox4x64` of
    counter ``(counter0[j], salts[i], 0, 0)`` under ``(key0[j], key1[j])`` (1-D arrays of one
    length) -- the same words, computed in place over chunks of :data:`_CHUNK` tokens so the
    working set stays in cache.

    The counter's words 2 and 3 are 0, so round 1's second product is 0, and the salt (word 1)
    first meets a product in round 2: round 1 and half of round 2 are computed once for all salts,
    as are the ten round keys."""
    n = len(counter0)
    out = np.empty((len(salts), n), dtype=np.uint64)
    w0, w1 = _u64(_P64_W0), _u64(_P64_W1)
    with np.errstate(over="ignore"):
        for lo in range(0, n, _CHUNK):
            hi_ = min(n, lo + _CHUNK)
            m = hi_ - lo
            k0 = np.empty((10, m), dtype=np.uint64)
            k1 = np.empty((10, m), dtype=np.uint64)
            k0[0], k1[0] = key0[lo:hi_], key1[lo:hi_]
            for r in range(1, 10):
                np.add(k0[r - 1], w0, out=k0[r])
                np.add(k1[r - 1], w1, out=k1[r])
            t = np.empty((4, m), dtype=np.uint64)
            hi0, lo0, hi1, lo1, c0, c1, c2, c3 = np.empty((8, m), dtype=np.uint64)
            # round 1, shared: (c0, salt, 0, 0) -> (k0 ^ salt, 0, hi(c0) ^ k1, lo(c0))
            _mulhilo64_into(np.asarray(counter0[lo:hi_], dtype=np.uint64), _P64_M0, hi0, lo0, t)
            r1_c2 = hi0 ^ k1[0]
            r1_c3 = lo0.copy()
            # round 2, the half without the salt: c0 = hi(r1_c2) ^ 0 ^ k0, c1 = lo(r1_c2)
            _mulhilo64_into(r1_c2, _P64_M1, hi1, lo1, t)
            r2_c0 = hi1 ^ k0[1]
            r2_c1 = lo1.copy()
            lanes = lane[lo:hi_]
            for i, salt in enumerate(salts):
                np.bitwise_xor(k0[0], _u64(int(salt)), out=c0)  # round 1's c0
                _mulhilo64_into(c0, _P64_M0, hi0, lo0, t)  # round 2, the salt's half
                np.bitwise_xor(hi0, r1_c3, out=c2)
                np.bitwise_xor(c2, k1[1], out=c2)
                c3[...] = lo0
                c0[...] = r2_c0
                c1[...] = r2_c1
                for r in range(2, 10):
                    _mulhilo64_into(c0, _P64_M0, hi0, lo0, t)
                    _mulhilo64_into(c2, _P64_M1, hi1, lo1, t)
                    np.bitwise_xor(hi1, c1, out=c0)
                    np.bitwise_xor(c0, k0[r], out=c0)
                    np.bitwise_xor(hi0, c3, out=c2)
                    np.bitwise_xor(c2, k1[r], out=c2)
                    c1, lo1 = lo1, c1
                    c3, lo0 = lo0, c3
                np.choose(lanes, (c0, c1, c2, c3), out=out[i, lo:hi_])
    return out


def _words_to_uniform(words: np.ndarray) -> np.ndarray:
    """53-bit uniforms strictly inside (0, 1): ``((w >> 11) + 1/2) / 2**53``."""
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)


class ErsdPRF:
    """The default scheme: keyed BLAKE2b per window, Philox4x64-10 per token (module doc)."""

    scheme = "ersd-v1"

    def __init__(self, key: bytes, salt: int, context_width: int) -> None:
        self._key = bytes(key)
        self.salt = int(salt)
        self._fmt = f"<{int(context_width)}q"
        self._blake: KeyedBlake2b | None = None

    def __repr__(self) -> str:  # never the key
        return f"ErsdPRF(context_width={struct.calcsize(self._fmt) // 8}, salt={self.salt})"

    def window_key(self, window: Sequence[int]) -> bytes:
        """The 128-bit per-window key: BLAKE2b-128 keyed by the secret, of the window."""
        return hashlib.blake2b(
            struct.pack(self._fmt, *window),
            digest_size=16,
            key=self._key,
            person=_PERSON,
        ).digest()

    def window_keys(self, windows: Sequence[Sequence[int]] | np.ndarray) -> bytes:
        """:meth:`window_key` of every window, concatenated (16 bytes each)."""
        rows = np.ascontiguousarray(np.asarray(windows, dtype="<i8").reshape(len(windows), -1))
        buf = memoryview(rows.tobytes())
        step = rows.shape[1] * 8
        key, person = self._key, _PERSON
        blake = hashlib.blake2b
        return b"".join(
            [
                blake(buf[i : i + step], digest_size=16, key=key, person=person).digest()
                for i in range(0, len(buf), step)
            ]
        )

    def window_key_words(self, windows: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
        """:meth:`window_keys` as ``[n, 2]`` uint64 words (little-endian halves of each 128-bit
        key): :mod:`hashlib` for a few windows, else every window at once with the NumPy BLAKE2b
        of :mod:`ersd.watermark.blake` (the same bits)."""
        rows = np.asarray(windows, dtype=np.int64)
        if len(rows) < _VECTOR_MIN_WINDOWS:
            return np.frombuffer(self.window_keys(rows), dtype="<u8").reshape(-1, 2)
        if self._blake is None:
            self._blake = KeyedBlake2b(self._key, _PERSON, digest_size=16)
        return self._blake.digest_words(rows.reshape(len(rows), -1))

    def uniforms(self, window: Sequence[int], vocab_size: int) -> np.ndarray:
        """``U_i`` for every token ``i < vocab_size`` at ``window`` (float64)."""
        n = -(-vocab_size // 4) * 4
        key = int.from_bytes(self.window_key(window), "little")
        gen = np.random.Philox(key=key, counter=[0, self.salt, 0, 0])
        return _words_to_uniform(gen.random_raw(n)[:vocab_size])

    def uniform_at(
        self,
        windows: Sequence[Sequence[int]] | np.ndarray,
        tokens: np.ndarray,
        salts: Sequence[int] | None = None,
    ) -> np.ndarray:
        """``U`` of ``tokens[j]`` at ``windows[j]`` for every j (float64), one block each; with
        ``salts``, a ``[len(salts), n]`` array (one hash per window serves every salt).  The same
        bits as :meth:`uniform_at_reference`, vectorised over the windows."""
        t = np.asarray(tokens, dtype=np.int64).astype(np.uint64)
        if len(t) == 0:
            return np.zeros(0) if salts is None else np.zeros((len(list(salts)), 0))
        keys = self.window_key_words(windows)
        k0, k1 = np.ascontiguousarray(keys[:, 0]), np.ascontiguousarray(keys[:, 1])
        lane = (t & np.uint64(3)).astype(np.intp)
        counter = (t >> np.uint64(2)) + np.uint64(1)
        salt_list = [self.salt] if salts is None else [int(s) for s in salts]
        out = _words_to_uniform(philox4x64_lanes(counter, k0, k1, salt_list, lane))
        return out[0] if salts is None else out

    def uniform_at_reference(
        self,
        windows: Sequence[Sequence[int]] | np.ndarray,
        tokens: np.ndarray,
        salts: Sequence[int] | None = None,
    ) -> np.ndarray:
        """:meth:`uniform_at` as the first releases computed it (one :mod:`hashlib` call per
        window, the whole Philox block then a lane): the reference the fast path is tested
        against (``tests/test_watermark_fast.py``)."""
        keys = np.frombuffer(self.window_keys(windows), dtype="<u8").reshape(-1, 2)
        k0, k1 = keys[:, 0].astype(np.uint64), keys[:, 1].astype(np.uint64)
        t = np.asarray(tokens, dtype=np.uint64)
        lane = (t % np.uint64(4)).astype(np.int64)
        counter = t // np.uint64(4) + np.uint64(1)
        if salts is None:
            return _words_to_uniform(np.choose(lane, philox4x64(counter, k0, k1, self.salt)))
        # every salt at once: a [salts, tokens] block per call, bounded to ~1M entries
        col = np.asarray(list(salts), dtype=np.uint64).reshape(-1, 1)
        step = max(1, _BLOCK // max(len(t), 1))
        out = []
        for i in range(0, len(col), step):
            words = philox4x64(counter, k0, k1, col[i : i + step])
            out.append(_words_to_uniform(np.choose(lane, words)))
        return np.concatenate(out, axis=0) if out else np.zeros((0, len(t)))


# --- vLLM's Philox4x32-10 PRF -----------------------------------------------------------------

_P32_M0 = 0xD2511F53
_P32_M1 = 0xCD9E8D57
_P32_W0 = 0x9E3779B9
_P32_W1 = 0xBB67AE85
_CONTEXT_DOMAIN = 0x574D4358
_TOKEN_DOMAIN = 0x574D544B


def _philox4x32(
    c: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], k0: np.ndarray, k1: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Philox4x32-10 on 32-bit words held in uint64 arrays (vLLM's round and key schedule)."""
    c0, c1, c2, c3 = c
    s32 = np.uint64(32)
    for rnd in range(10):
        p0 = c0 * np.uint64(_P32_M0)  # < 2**64: exact
        p1 = c2 * np.uint64(_P32_M1)
        c0, c1, c2, c3 = (
            ((p1 >> s32) ^ c1 ^ k0) & _M32,
            p1 & _M32,
            ((p0 >> s32) ^ c3 ^ k1) & _M32,
            p0 & _M32,
        )
        if rnd != 9:
            k0 = (k0 + np.uint64(_P32_W0)) & _M32
            k1 = (k1 + np.uint64(_P32_W1)) & _M32
    return c0, c1, c2, c3


def salted_vllm_key(key: int, salt: int) -> int:
    """The 64-bit vLLM key of ``salt``: the key itself for salt 0, else a SHA-256 derivation."""
    if salt == 0:
        return key
    digest = hashlib.sha256(b"ersd-salt" + struct.pack(">IQ", salt, key)).digest()
    return int.from_bytes(digest[:8], "big")


class VllmPRF:
    """vLLM 0.32's ``PhiloxPRF`` (``philox4x32-10-v1``), bit for bit, in NumPy (module doc)."""

    scheme = "vllm-philox"

    def __init__(self, key: int, salt: int, context_width: int) -> None:
        self._key = int(key)
        k = salted_vllm_key(int(key), int(salt))
        self._k0 = np.uint64(k & _U32)
        self._k1 = np.uint64(k >> 32)
        self.context_width = int(context_width)

    def __repr__(self) -> str:  # never the key
        return f"VllmPRF(context_width={self.context_width})"

    def _states(
        self, contexts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Philox state after absorbing each context row (``[n, width]`` ints, -1 padded)."""
        ctx = contexts.astype(np.int64).astype(np.uint64) & _M32
        n, width = ctx.shape
        state = (
            np.full(n, _CONTEXT_DOMAIN, dtype=np.uint64),
            np.full(n, width, dtype=np.uint64),
            np.zeros(n, dtype=np.uint64),
            np.zeros(n, dtype=np.uint64),
        )
        k1 = np.full(n, self._k1, dtype=np.uint64)
        for offset in range(0, width, 4):
            block = [
                ctx[:, offset + i] if offset + i < width else np.full(n, _U32 - i, dtype=np.uint64)
                for i in range(4)
            ]
            counter = (
                (state[0] ^ block[0]) & _M32,
                (state[1] ^ block[1]) & _M32,
                (state[2] ^ block[2]) & _M32,
                (state[3] ^ block[3]) & _M32,
            )
            k0 = np.full(n, (self._k0 ^ np.uint64(offset)) & _M32, dtype=np.uint64)
            state = _philox4x32(counter, k0, k1)
        return state

    def _token_words(
        self,
        state: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        groups: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The four words of token group ``groups`` (token >> 2) under each state (broadcast)."""
        s0, s1, s2, s3 = state
        k0 = (self._k0 ^ s3) & _M32
        k1 = (self._k1 ^ np.uint64(_TOKEN_DOMAIN)) & _M32
        zero = np.zeros_like(groups)
        return _philox4x32((groups, s0 + zero, s1 + zero, s2 + zero), k0 + zero, k1 + zero)

    @staticmethod
    def _to_uniform(words: np.ndarray) -> np.ndarray:
        """vLLM's ``uint32_to_uniform``: ``float32((w >> 8) + 1) / (2**24 + 1))``, as float64."""
        u = ((words >> np.uint64(8)).astype(np.float64) + 1.0) / float(2**24 + 1)
        return u.astype(np.float32).astype(np.float64)

    def uniforms(self, window: Sequence[int], vocab_size: int) -> np.ndarray:
        state = self._states(np.asarray([window], dtype=np.int64))
        groups = np.arange(-(-vocab_size // 4), dtype=np.uint64)
        words = np.stack(self._token_words(state, groups), axis=1).reshape(-1)[:vocab_size]
        return self._to_uniform(words)

    def uniform_at(
        self,
        windows: Sequence[Sequence[int]] | np.ndarray,
        tokens: np.ndarray,
        salts: Sequence[int] | None = None,
    ) -> np.ndarray:
        if salts is not None:
            return np.stack(
                [
                    VllmPRF._salted(self._key, s, self.context_width).uniform_at(windows, tokens)
                    for s in salts
                ]
            )
        if len(windows) == 0:
            return np.zeros(0)
        state = self._states(np.asarray(windows, dtype=np.int64).reshape(len(windows), -1))
        t = np.asarray(tokens, dtype=np.int64).astype(np.uint64)
        words = np.choose((t & np.uint64(3)).astype(np.int64), self._token_words(state, t >> 2))
        return self._to_uniform(words)

    @staticmethod
    def _salted(key: int, salt: int, context_width: int) -> VllmPRF:
        return VllmPRF(key, salt, context_width)
