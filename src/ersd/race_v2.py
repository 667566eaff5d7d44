"""Race scheme "v2" (the blocked splitmix64 race) and the scheme names; the splitmix64 mix.

:mod:`ersd.race` draws the default scheme "v1" (NumPy's Philox) and dispatches to this module
for "v2"; :mod:`ersd.race_torch` draws the same bits on a device. Both import this module, and
it imports neither. docs/race-schemes.md explains the scheme and why it is exact.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
import torch

from ersd import blockmax

_MASK64 = (1 << 64) - 1
_TINY = float(np.finfo(np.float64).tiny)

#: The race schemes: how a (key, stream) becomes the race's exponentials.  ``"v1"`` (the default)
#: is NumPy's Philox feeding its ziggurat over the whole vocabulary; ``"v2"`` is the blocked
#: splitmix64 race (:func:`v2_exponentials`), whose winner is found by evaluating only the blocks
#: of tokens that can win.  A text reproduces only under the scheme it was made with.
RACE_SCHEMES = ("v1", "v2")
DEFAULT_RACE_SCHEME = "v1"


def check_race_scheme(scheme: object) -> str:
    """``scheme`` if it names a race scheme, else a one-line :class:`ValueError` naming them."""
    if not isinstance(scheme, str) or scheme not in RACE_SCHEMES:
        raise ValueError(
            f"race_scheme must be one of {', '.join(map(repr, RACE_SCHEMES))} (v1: the default "
            f"NumPy Philox race; v2: the faster blocked race), got {scheme!r}"
        )
    return scheme


def _mix64(x: int) -> int:
    """The splitmix64 finaliser: a bijective avalanche mix of a 64-bit integer."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


# --- race scheme "v2": the blocked splitmix64 race --------------------------------------------
#
# The vocabulary is cut into blocks of V2_BLOCK = 64 token ids (the last block is padded with ids
# past the vocabulary, whose noise is never used).  For block b, splitmix64 of the race's block
# seed gives one word: its top 53 bits a uniform U_b, its low 6 bits a position a_b; the block's
# minimum is M_b = -log(U_b) / 64 and token 64 b + a_b holds it.  Every other token j of the block
# gets E_j = M_b + (-log U_j), U_j from splitmix64 of the race's token seed at j.  This is the law
# of 64 i.i.d. Exp(1) (the minimum of n is Exp(n), sits at a uniform place independent of its
# value, and by memorylessness the others are the minimum plus i.i.d. Exp(1)), and it gives a
# bound without drawing a block: every token of block b scores E_j / p_j >= M_b / max_b p.  The
# race winner then needs only the blocks whose bound is at most the best score found
# (:func:`v2_race_winner`); the full row (:func:`v2_exponentials`) is the reference it equals.
#
# Logarithms are :func:`unit_log` (frexp, +, *, / only, each correctly rounded in IEEE
# arithmetic), so NumPy and torch on any device compute the same bits
# (:func:`ersd.race_torch.v2_exponentials_torch`), element by element, wherever an element sits.

V2_BLOCK = blockmax.BLOCK  # 64
_V2_SALT = 0x52414345_56320000  # "RACEV2"
_TAG_TOKEN, _TAG_BLOCK, _TAG_UNIFORM = 0, 1, 2
_SQRT_HALF = 0.7071067811865476
_LN2_HI = 6.93147180369123816490e-01  # fdlibm's split of log(2): e * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
#: 2 / (2n + 1): log(m) = z * sum_n (2 / (2n + 1)) w^n, z = (m - 1) / (m + 1), w = z^2
_LOG_COEFFS = tuple(2.0 / (2 * n + 1) for n in range(11))
_U53 = 1.0 / 9007199254740992.0  # 2^-53
#: a v2 race's per-block minima and their places in the blocks (:func:`v2_block_minima`)
Minima = tuple[np.ndarray, np.ndarray]


def v2_seed(key: int, stream: int, tag: int) -> int:
    """The splitmix64 state of a v2 race's tokens, blocks or plain uniforms at (key, stream)."""
    base = _mix64((int(key) & _MASK64) ^ _V2_SALT)
    return _mix64(base ^ _mix64(((int(stream) & _MASK64) << 2) | tag))


def v2_words(seed: int, index: np.ndarray) -> np.ndarray:
    """splitmix64's outputs number ``index + 1`` from state ``seed`` (uint64 array)."""
    x = (index.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    return _finish_words(x, seed)


def _finish_words(x: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64's output from ``(index + 1) * golden`` (``x``, modified in place) and state
    ``seed``: the seed added, then the three xor-shift / multiply rounds."""
    x += np.uint64(seed)
    return _mix_words(x)


_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))
_MULTIPLIERS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _mix_words(x: np.ndarray) -> np.ndarray:
    """:func:`_mix64` of every word of ``x`` (uint64, modified in place and returned)."""
    x ^= x >> _SHIFTS[0]
    x *= _MULTIPLIERS[0]
    x ^= x >> _SHIFTS[1]
    x *= _MULTIPLIERS[1]
    x ^= x >> _SHIFTS[2]
    return x


def unit_log(u: Any, xp: Any = np) -> Any:
    """``log(u)`` for ``u`` in (0, 1] (float64), from operations IEEE rounds exactly: the same bits
    in NumPy (``xp=np``) and torch (``xp=torch``) on any device, for any array layout.  Error
    within a few ulps (checked against ``math.log`` in the tests)."""
    if xp is np and isinstance(u, np.ndarray) and u.ndim and u.dtype == np.float64:
        return _unit_log_np(u)
    m, e = xp.frexp(u)  # u = m 2^e, m in [1/2, 1)
    low = m < _SQRT_HALF
    m = xp.where(low, m * 2.0, m)  # m in [sqrt(1/2), sqrt(2))
    ef = e.astype(np.float64) if xp is np else e.to(u.dtype)
    ef = ef - low.astype(np.float64) if xp is np else ef - low.to(u.dtype)
    z = (m - 1.0) / (m + 1.0)  # m - 1 is exact (Sterbenz)
    w = z * z
    s = w * _LOG_COEFFS[10] + _LOG_COEFFS[9]
    for c in reversed(_LOG_COEFFS[:9]):
        s = s * w + c
    return ef * _LN2_HI + (z * s + ef * _LN2_LO)


def _unit_log_np(u: np.ndarray) -> np.ndarray:
    """:func:`unit_log` in NumPy with its temporaries reused (in-place ufuncs): the same IEEE
    operations on the same operands (+ and * commute exactly), so the same bits, with about half
    the array allocations (a new race's block minima and every drawn block go through it)."""
    m, e = np.frexp(u)  # u = m 2^e, m in [1/2, 1)
    low = m < _SQRT_HALF
    np.multiply(m, 2.0, out=m, where=low)  # m in [sqrt(1/2), sqrt(2))
    ef = e.astype(np.float64)
    ef -= low
    z = m - 1.0  # exact (Sterbenz)
    m += 1.0
    z /= m
    w = z * z
    s = w * _LOG_COEFFS[10]
    s += _LOG_COEFFS[9]
    for c in reversed(_LOG_COEFFS[:9]):
        s *= w
        s += c
    s *= z
    w = np.multiply(ef, _LN2_LO, out=w)
    s += w  # z * s + ef * _LN2_LO
    ef *= _LN2_HI
    ef += s
    return ef


def _unit_log_scalar(u: float) -> float:
    """:func:`unit_log` of one Python float, the same operations in the same order (Python's
    float arithmetic is IEEE double, each operation correctly rounded): the same bits."""
    m, e = math.frexp(u)
    ef = float(e)
    if m < _SQRT_HALF:
        m, ef = m * 2.0, ef - 1.0
    z = (m - 1.0) / (m + 1.0)
    w = z * z
    s = w * _LOG_COEFFS[10] + _LOG_COEFFS[9]
    for c in reversed(_LOG_COEFFS[:9]):
        s = s * w + c
    return ef * _LN2_HI + (z * s + ef * _LN2_LO)


def _v2_exponential_at(token_seed: int, token: int, mb: float, place: int) -> float:
    """v2's ``E`` of one token (:func:`v2_exponentials_at`'s bits, in Python scalars), given the
    race's token seed and its block's minimum ``mb`` and the minimum's ``place`` in the block."""
    if token % V2_BLOCK == place:
        return mb
    x = _mix64((token_seed + (token + 1) * 0x9E3779B97F4A7C15) & _MASK64)
    u = (float(x >> 11) + 1.0) * _U53
    return max(-_unit_log_scalar(u), 0.0) + mb


def _minimum_of_word(word: int) -> float:
    """:func:`_minima_of_words` of one block word in Python scalars: the same operations on the
    same values, so the same bits (a single token's ``E`` needs no array pass)."""
    u = (float(word >> 11) + 1.0) * _U53
    return max(max(-_unit_log_scalar(u), 0.0) * (1.0 / V2_BLOCK), _TINY)


def _exp_of_words(x: np.ndarray) -> np.ndarray:
    """``-log U``, ``U = (top 53 bits + 1) / 2^53`` in (0, 1]: Exp(1) draws >= 0 (float64)."""
    u = (x >> np.uint64(11)).astype(np.float64)
    u += 1.0
    u *= _U53
    e = unit_log(u)
    np.negative(e, out=e)
    np.maximum(e, 0.0, out=e)  # -log(1) is 0; keep the bound E >= M_b exact
    return e


def v2_block_minima(key: int, stream: int, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """``(M, a)``: each block's minimum exponential (float64, > 0) and its place in the block."""
    x = _block_words(key, stream, n_blocks)
    return _minima_of_words(x), _places_of_words(x)


def _minima_of_words(x: np.ndarray) -> np.ndarray:
    """The block minima ``M`` of block words ``x``, element by element (any subset of the
    blocks gives the same bits: every operation is elementwise and correctly rounded)."""
    m = _exp_of_words(x)
    m *= 1.0 / V2_BLOCK  # exact: a power of two
    np.maximum(m, _TINY, out=m)  # E = 0 would make 0 / 0 possible
    return m


def _places_of_words(x: np.ndarray) -> np.ndarray:
    """Where each block's minimum sits in its block (int64, 0..63)."""
    return (x & np.uint64(V2_BLOCK - 1)).astype(np.int64)


_STEPS: dict[int, np.ndarray] = {}


def _block_words(key: int, stream: int, n_blocks: int) -> np.ndarray:
    """:func:`v2_words` of the race's block seed at ``0 .. n_blocks - 1``, the same bits: the
    seed-free ``(index + 1) * golden`` is kept per block count (two of its eight passes)."""
    steps = _STEPS.get(n_blocks)
    if steps is None:
        steps = (np.arange(n_blocks, dtype=np.uint64) + np.uint64(1)) * np.uint64(
            0x9E3779B97F4A7C15
        )
        _STEPS[n_blocks] = steps
    return _mix_words(steps + np.uint64(v2_seed(key, stream, _TAG_BLOCK)))  # a new array


#: bound the block minima from below by NumPy's ``log`` (one vectorised pass) instead of
#: computing them exactly by :func:`unit_log` (~30 passes) for every block of a new race; the
#: exact minima are computed for the blocks drawn only.  False: the bounds are the exact minima
#: (the reference ``research/profile_batch.py --compare-cuts`` compares with; the same tokens).
LOWER_BOUNDS = True
#: the relative margin of :func:`_minima_lower`: NumPy's ``log`` and :func:`unit_log` are each
#: within a few ulps (2^-50) of ``log``; 2^-40 leaves a thousandfold headroom
_LOWER_MARGIN = 2.0**-40


def _minima_lower(x: np.ndarray) -> np.ndarray:
    """A lower bound (> 0) of every block minimum :func:`_minima_of_words` gives for words
    ``x``, from NumPy's ``log`` shrunk by a relative ``_LOWER_MARGIN`` (tested against the
    exact minima, and the races with it against the full rows)."""
    lo = _rough_log_of_words(x)  # the same U as _exp_of_words: (0, 1]
    lo *= -(1.0 - _LOWER_MARGIN) / V2_BLOCK  # -log U >= 0 (0 at U = 1)
    np.maximum(lo, _TINY / 2, out=lo)  # the exact minimum is at least _TINY
    return lo


def v2_exponentials_at(
    key: int, stream: int, tokens: np.ndarray, minima: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """v2's ``E`` at the token ids ``tokens`` (int64), given the race's :func:`v2_block_minima`."""
    m, a = minima
    block = tokens // V2_BLOCK
    e = _exp_of_words(v2_words(v2_seed(key, stream, _TAG_TOKEN), tokens))
    mb = m[block]
    e += mb
    return np.where(tokens - block * V2_BLOCK == a[block], mb, e)


def v2_exponentials(key: int, stream: int, vocab_size: int) -> np.ndarray:
    """The whole v2 race ``E`` (float64) over ``vocab_size`` tokens: the reference."""
    minima = v2_block_minima(key, stream, -(-vocab_size // V2_BLOCK))
    return v2_exponentials_at(key, stream, np.arange(vocab_size, dtype=np.int64), minima)


def v2_uniforms(key: int, stream: int, n: int) -> np.ndarray:
    """``n`` uniforms in [0, 1) (multiples of 2^-53) for (key, stream) under v2."""
    x = v2_words(v2_seed(key, stream, _TAG_UNIFORM), np.arange(n, dtype=np.uint64))
    return (x >> np.uint64(11)).astype(np.float64) * _U53


def _block_bounds(p: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``M_b / max_b p`` (``+inf`` for a block without mass): no token of block ``b`` scores
    below it (correctly rounded division is monotone, and ``E_j >= M_b``, ``p_j <= max_b p``)."""
    v = p.shape[0]
    full = v - v % V2_BLOCK
    top = np.empty(m.shape[0])
    if full:  # torch's reduction over rows of 64 is ~5x NumPy's here
        top[: full // V2_BLOCK] = torch.from_numpy(p[:full]).view(-1, V2_BLOCK).amax(1).numpy()
    if full < v:
        top[-1] = p[full:].max()
    with np.errstate(divide="ignore"):
        return m / top


class V2Race:
    """One v2 race drawn lazily: its block minima's lower bounds, and ``E`` of the tokens and
    blocks drawn so far (kept, so the drafter's and the target's races at one context draw each
    once).  The blocks' buffer is allocated whole on the first block drawn, and written only
    where blocks are drawn."""

    __slots__ = (
        "_bounds",
        "_done",
        "_e",
        "_minima",
        "_one",
        "_places",
        "_token_seed",
        "_words",
        "key",
        "lower",
        "lower_min",
        "stream",
    )

    def __init__(self, key: int, stream: int, vocab_size: int) -> None:
        n_blocks = -(-vocab_size // V2_BLOCK)
        self.key, self.stream = int(key), stream
        self._words = _block_words(self.key, stream, n_blocks)
        self._token_seed = v2_seed(self.key, stream, _TAG_TOKEN)
        self._places: np.ndarray | None = None  # where each block's minimum sits (on first use)
        self._minima: Minima | None = None
        #: a lower bound of each block's minimum (> 0): what the block bounds are made of
        self.lower = _minima_lower(self._words) if LOWER_BOUNDS else self.minima[0]
        #: the smallest of :attr:`lower` (every race's subnormal check reads it)
        self.lower_min = float(self.lower.min())
        self._e: np.ndarray | None = None  # E of the blocks drawn (allocated on the first)
        self._done: np.ndarray | None = None  # which blocks are drawn
        self._bounds: tuple[weakref.ref[torch.Tensor], int, np.ndarray] | None = None
        self._one: dict[int, float] = {}  # E of tokens drawn one by one (their blocks not drawn)

    @property
    def minima(self) -> Minima:
        """The exact :func:`v2_block_minima` of the race (computed on first read, kept)."""
        if self._minima is None:
            self._minima = (_minima_of_words(self._words), self.places)
        return self._minima

    @property
    def token_seed(self) -> int:
        """The splitmix64 state of the race's tokens (:func:`v2_seed`)."""
        return self._token_seed

    def block_words(self, blocks: np.ndarray) -> np.ndarray:
        """The words of ``blocks``: their minima's uniforms (top 53 bits) and places (low 6)."""
        return self._words[blocks]

    @property
    def places(self) -> np.ndarray:
        """Where each block's minimum sits in its block (computed on first read, kept)."""
        if self._places is None:
            self._places = _places_of_words(self._words)
        return self._places

    def bounds(self, probs: torch.Tensor, p: np.ndarray) -> np.ndarray:
        """:func:`_block_bounds` of ``p`` (the float64 host view of ``probs``), kept for the
        last ``probs`` asked about while that very tensor lives unmodified (its ``_version``):
        the draft's race and its rank statistic at one context share one pass over the row."""
        last = self._bounds
        if last is not None and last[0]() is probs and last[1] == probs._version:
            return last[2]
        bound = _block_bounds(p, self.lower)
        self._bounds = (weakref.ref(probs), probs._version, bound)
        return bound

    def block_exponentials(self, blocks: np.ndarray, v: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, E)`` over the tokens of ``blocks`` (ascending) below ``v``, ids ascending;
        the blocks not drawn yet are drawn (and kept)."""
        if self._done is None:
            self._e = np.empty(self._words.shape[0] * V2_BLOCK)
            self._done = np.zeros(self._words.shape[0], dtype=bool)
        assert self._e is not None
        todo = blocks[~self._done[blocks]]
        if todo.size:
            tid = (todo[:, None] * V2_BLOCK + _BLOCK_IDS).ravel()
            words = v2_words(self._token_seed, tid)
            if self._minima is None:  # the blocks' exact minima from the same log pass
                e = _exp_of_words(np.concatenate([words, self._words[todo]]))
                e, mb = e[: tid.size], e[tid.size :]
                mb *= 1.0 / V2_BLOCK  # exactly _minima_of_words' operations, element by element
                np.maximum(mb, _TINY, out=mb)
            else:
                e, mb = _exp_of_words(words), self._minima[0][todo]
            # v2_exponentials_at's bits: E = -log U + M_b, and M_b itself at the block's place
            e = e.reshape(-1, V2_BLOCK)
            e += mb[:, None]
            e[np.arange(todo.size), self.places[todo]] = mb
            self._e[tid] = e.ravel()
            self._done[todo] = True
        ids = _ids_of(blocks, v)
        return ids, self._e[ids]

    def scores(self, blocks: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, E / p)`` over the tokens of ``blocks`` (ascending), ids ascending."""
        ids, e = self.block_exponentials(blocks, p.shape[0])
        with np.errstate(divide="ignore"):
            return ids, e / p[ids]

    def exponential(self, token: int) -> float:
        """``E`` of one token (drawn alone, and kept, if its block is not drawn yet)."""
        b = token // V2_BLOCK
        if self._done is not None and self._done[b]:
            return float(self._e[token])  # type: ignore[index]
        e = self._one.get(token)
        if e is None:
            word = int(self._words[b])
            mb = _minimum_of_word(word) if self._minima is None else float(self._minima[0][b])
            e = _v2_exponential_at(self._token_seed, token, mb, word & (V2_BLOCK - 1))
            self._one[token] = e
        return e

    def exponentials(self, ids: np.ndarray, v: int) -> np.ndarray:
        """``E`` at the token ids ``ids`` (ascending, below ``v``): up to :data:`ONE_BY_ONE` of
        them one by one (:meth:`exponential`), more by drawing their blocks whole."""
        if ids.size > ONE_BY_ONE:
            self.block_exponentials(np.unique(ids // V2_BLOCK), v)
            return self._e[ids]  # type: ignore[index]
        return np.array([self.exponential(i) for i in ids.tolist()], dtype=np.float64)


_BLOCK_IDS = np.arange(V2_BLOCK)


def _ids_of(blocks: np.ndarray, v: int) -> np.ndarray:
    """The token ids of ``blocks`` (ascending block numbers), ascending, below ``v``."""
    ids = (blocks[:, None] * V2_BLOCK + _BLOCK_IDS).ravel()
    return ids[ids < v] if blocks.size and blocks[-1] * V2_BLOCK + V2_BLOCK > v else ids


def _best_blocks(
    race: V2Race, p: np.ndarray, m: int, bound: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, scores)`` of every token that can be among the ``m`` best of the v2 race over
    weights ``p``, ids ascending.  Blocks are drawn in order of their bounds (``bound``:
    :func:`_block_bounds` of ``p``), the 4, 16, 64, ... smallest, until the ``m``-th best score
    drawn is below the next bound: every block not drawn then holds only tokens scoring above it
    (above, not equal: ties stay decidable)."""
    if bound is None:
        bound = _block_bounds(p, race.lower)
    n_blocks = bound.size
    n = 4
    while True:
        if n >= n_blocks:
            return race.scores(np.arange(n_blocks), p)
        part = np.argpartition(bound, n)  # the n smallest bounds first, the next one at n
        ids, sc = race.scores(np.sort(part[:n]), p)
        if m == 1:
            limit = float(sc.min())
        else:
            finite = sc[np.isfinite(sc)]
            limit = float(np.partition(finite, m - 1)[m - 1]) if finite.size >= m else math.inf
        if bound[part[n]] > limit:
            return ids, sc
        n *= 4


def v2_race_winner(race: V2Race, p: np.ndarray, bound: np.ndarray | None = None) -> int:
    """``argmin E / p`` (first minimum) of the v2 race over weights ``p`` (float64, >= 0, not all
    0), drawing only the blocks that can hold it (:func:`_best_blocks`): the token
    ``race_winner`` picks on the full row."""
    ids, sc = _best_blocks(race, p, 1, bound)
    return int(ids[sc.argmin()])


def v2_race_ranking(
    race: V2Race, p: np.ndarray, m: int, bound: np.ndarray | None = None
) -> list[int]:
    """``race_ranking``'s ``m`` best tokens (score, then id; zero weights never) of the v2 race,
    from the blocks that can hold them (:func:`_best_blocks`)."""
    ids, sc = _best_blocks(race, p, m, bound)
    if m == 1:  # a chain's node: the first minimum (ids ascending: the lowest id on ties)
        j = int(sc.argmin())
        return [int(ids[j])] if math.isfinite(sc[j]) else []
    keep = np.isfinite(sc)
    ids, sc = ids[keep], sc[keep]
    best = np.lexsort((ids, sc))[:m]
    return [int(i) for i in ids[best]]


def v2_race_rank(race: V2Race, p: np.ndarray, token: int, bound: np.ndarray | None = None) -> int:
    """``race_rank`` of the v2 race: 1 + the tokens scoring strictly below ``token``, counted in
    the blocks whose bound is below its score (no other token can)."""
    v = p.shape[0]
    w = float(p[token])
    s = race.exponential(token) / w if w > 0 else math.inf
    if math.isinf(s):
        return v + 1
    if bound is None:
        bound = _block_bounds(p, race.lower)
    _, sc = race.scores(np.flatnonzero(bound < s), p)
    return int(np.count_nonzero(sc < s)) + 1


# --- the target's winner from its logits, without the float64 probabilities -------------------
#
# ERSD's target token is ``argmin_j E_j / p_j`` with ``p = softmax(x / T)`` in float64
# (:func:`ersd.probs.logits_to_probs`): a whole-row float64 exp, sum and scaling per context,
# ~0.4 ms on a 152k vocabulary.  The race is invariant to scaling ``p``, so the winner is
# ``argmin_j E_j / w_j`` with ``w_j = exp(x_j / T - max / T)``, the normaliser ``S = sum w``
# dropped -- up to rounding: the reference's score is ``S (E_j / w_j) (1 + eta_j)``, where
# ``eta_j`` gathers the two exps' errors (torch's vectorised float64 exp and NumPy's, each within a
# few ulps), the scaling by ``S`` and the divisions: |eta_j| < 2^-46 for every token whose
# reference probability is a normal float64.  The exps' arguments ``d = x / T - max / T`` are the
# same float64 operations here; were they an ulp apart, that would add |d| 2^-53 < 2^-43 (|d| <
# 745, else the exp is 0 or subnormal, which the guards handle), still far inside the gap.
# :func:`v2_winner_from_logits` finds the winner over ``w`` from the blocks that can hold it (the
# bounds ``M_b / exp(max_b x / T - max / T)`` from each block's largest logit: ``exp`` and the
# division are monotone, so no token of a block scores below its bound by more than the same
# rounding) and answers only when every other token's score, and every block not drawn, is above
# the winner's by a relative gap of LOGIT_GAP = 2^-36 (> 2 |eta| by far), and no token's
# reference probability can be subnormal and win (guards below).  Otherwise it answers None and
# the caller computes the float64 probabilities (:func:`v2_race_winner`): the same token always.

#: the relative gap by which the logits-space winner must beat every other token (and every
#: block not drawn) for :func:`v2_winner_from_logits` to answer; within it the caller falls back
#: to the float64 probabilities (a near-tie: probability ~1e-10 a context)
LOGIT_GAP = 2.0**-36
_MIN_WINNER_WEIGHT = 2.0**-900  # the winner's w: its reference probability is then normal
_SUBNORMAL = 2.0**-1022  # below it a reference probability loses relative precision


def logit_block_max(logits: torch.Tensor) -> np.ndarray:
    """Each block's largest logit (float64) of a 1-D CPU row of any float dtype (a maximum is
    exact in its own dtype, and every float dtype widens to float64 exactly)."""
    kept = blockmax.lookup(logits)  # computed with the backend's finiteness check
    return kept if kept is not None else _read_block_max(logits)


def _block_max_top(logits: torch.Tensor, t: float) -> tuple[np.ndarray, int]:
    """:func:`logit_block_max` of a row divided by ``t`` (``max(x / t) = max(x) / t``: a
    correctly rounded division is monotone) and the first block holding the largest (``argmax``:
    the first NaN where there is one); at ``t = 1`` both as the finiteness check kept them."""
    kept = blockmax.lookup_top(logits)
    if kept is not None and t == 1.0:
        return kept
    bm = kept[0] if kept is not None else _read_block_max(logits)
    if t != 1.0:
        bm = bm / t  # two maxima may round together: the first block holding the largest anew
    return bm, int(bm.argmax())


def _read_block_max(logits: torch.Tensor) -> np.ndarray:
    """:func:`logit_block_max` read from the row itself."""
    v = logits.shape[0]
    full = v - v % V2_BLOCK
    if full == v and logits.dtype in (torch.float32, torch.float64):
        # the common case (152k = 2,374 x 64): NumPy widens the maxima (one copy, no torch cast)
        return logits.reshape(-1, V2_BLOCK).amax(1).numpy().astype(np.float64)
    out = np.empty(-(-v // V2_BLOCK))
    if full:
        top = logits[:full].reshape(-1, V2_BLOCK).amax(1)
        out[: full // V2_BLOCK] = top.to(torch.float64).numpy()
    if full < v:
        out[-1] = float(logits[full:].max())
    return out


def _host_logits(logits: torch.Tensor) -> np.ndarray:
    """A NumPy view (float32 / float64) or exact float32 copy (bfloat16, float16) of a row."""
    if logits.dtype in (torch.float32, torch.float64):
        return logits.numpy()
    return logits.to(torch.float32).numpy()


#: find a single winner (a chain's child, the target's token) by first bounding its score with
#: the row's largest logit's token (:func:`_blocks_below_top`); False: the rounds alone (the
#: reference ``research/profile_batch.py --compare-kept`` compares with; the same tokens)
TOP_FIRST = True
#: the most blocks :func:`_blocks_below_top` draws at once (beyond, the rounds of 4, 16, ...)
TOP_BLOCKS = 64


def _blocks_below_top(
    race: V2Race, x: np.ndarray, b: int, mx: float, t: float, bound: np.ndarray
) -> tuple[np.ndarray, float] | None:
    """The blocks that can hold a token scoring within ``LOGIT_GAP`` of the row's largest logit's
    token (the first one, in block ``b``, the first block holding the largest logit): every block
    whose bound is within the gap of that token's score.  The
    winner scores at most that, so every other block's bound is above the winner's score by more
    than the gap (what the rounds of :func:`_best_blocks` stop at) and one draw finds it.  None
    when that token's weight is not 1 (a partial last block, or ``x / t`` not ``mx`` in float64)
    or more than :data:`TOP_BLOCKS` blocks qualify (a flat row: the rounds may stop sooner).
    Returns those blocks and the score limit they were chosen by (the token's score, widened by
    the gap): every token outside them, and every token :func:`_scores_within` leaves out of
    them, scores above it."""
    lo = b * V2_BLOCK
    if lo + V2_BLOCK > x.shape[0]:
        return None
    j = lo + int(x[lo : lo + V2_BLOCK].argmax())
    d = float(x[j])
    if t != 1.0:
        d /= t
    if d - mx != 0.0:
        return None
    limit = race.exponential(j) * (1.0 + LOGIT_GAP)  # its score is E / exp(0), widened
    blocks = np.flatnonzero(bound <= limit)
    return (blocks, limit) if blocks.size <= TOP_BLOCKS else None


#: draw only the tokens of the chosen blocks whose score can be within the limit
#: (:func:`_scores_within`) instead of the blocks whole; False: whole blocks (the reference
#: ``research/profile_batch.py --compare-prune`` compares with; the same tokens and ranks)
PRUNE_TOKENS = True
#: the most tokens :meth:`V2Race.exponentials` draws one by one (Python floats, ~5 us each);
#: beyond, their blocks are drawn whole (NumPy, ~30 passes over 64 entries a block)
ONE_BY_ONE = 16
#: the relative margin by which a left-out token's lower bound exceeds the limit (2^-40: the
#: products and divisions involved round by a few 2^-53; see :func:`_scores_within`)
_PRUNE_MARGIN = 2.0**-40


def _candidates(
    race: V2Race, x: np.ndarray, t: float, mx: float, blocks: np.ndarray, limit: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, x / t - max / t, w)``, ``w = exp(x / t - max / t)``, of the tokens of ``blocks``
    (ascending) whose score ``E / w`` can be at most ``limit``; every token left out scores above
    it.  A token's ``E`` is at least its block's lower bound ``L`` (:attr:`V2Race.lower`), so it
    is left out where ``L > limit (1 + 2^-40) w`` (rounded: at least ``limit w (1 + 2^-41)``
    exactly), and its score, computed as ``E / w`` from the same ``w``, is then above ``limit``;
    the tokens kept get the very ``d`` and ``w`` a whole-block draw gives them."""
    v = x.shape[0]
    if blocks.size == 1:  # one block: a slice, and its one lower bound
        first = int(blocks[0]) * V2_BLOCK
        d = x[first : min(first + V2_BLOCK, v)].astype(np.float64)
        low = race.lower[blocks[0]]
    else:
        ids = _ids_of(blocks, v)
        d = x[ids].astype(np.float64)
        low = race.lower[ids // V2_BLOCK]
    if t != 1.0:
        d /= t
    d -= mx
    with np.errstate(divide="ignore", under="ignore", over="ignore"):
        w = np.exp(d)
        keep = np.flatnonzero(low <= (limit * (1.0 + _PRUNE_MARGIN)) * w)
    return (keep + first if blocks.size == 1 else ids[keep]), d[keep], w[keep]


def _scores_within(
    race: V2Race, x: np.ndarray, t: float, mx: float, blocks: np.ndarray, limit: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, E / w, x / t - max / t)`` over the tokens of ``blocks`` (ascending) whose score
    can be at most ``limit`` (:func:`_candidates`; every token left out scores above it), with
    the very scores a whole-block draw gives them.  With :data:`PRUNE_TOKENS` off, every token of
    the blocks (the reference)."""
    v = x.shape[0]
    if PRUNE_TOKENS:
        ids, d, w = _candidates(race, x, t, mx, blocks, limit)
        e = race.exponentials(ids, v)
    else:
        ids, e = race.block_exponentials(blocks, v)
        d = x[ids].astype(np.float64)
        if t != 1.0:
            d /= t
        d -= mx
    with np.errstate(divide="ignore", under="ignore", over="ignore"):
        if not PRUNE_TOKENS:
            w = np.exp(d)
        return ids, e / w, d


#: find a single winner among few candidates in Python floats (:func:`_few_within`) instead of
#: NumPy arrays: the same scores (IEEE division either way), order and checks; False: the arrays
#: (the reference ``research/profile_batch.py --compare-prune`` compares with; the same tokens)
FEW_IN_PYTHON = True


def _few_within(
    race: V2Race, x: np.ndarray, t: float, mx: float, blocks: np.ndarray, limit: float
) -> list[tuple[float, int, float]] | None:
    """:func:`_scores_within`'s tokens as ``(score, id, x / t - max / t)`` in Python floats,
    sorted by score, then id (the first minimum first, as ``argmin``), the same floats; None
    where more than :data:`ONE_BY_ONE` tokens are kept, :data:`PRUNE_TOKENS` or
    :data:`FEW_IN_PYTHON` is off, or the best score is not finite (the caller's arrays)."""
    if not (PRUNE_TOKENS and FEW_IN_PYTHON):
        return None
    ids, d, w = _candidates(race, x, t, mx, blocks, limit)
    if ids.size > ONE_BY_ONE or not ids.size:
        return None
    out = [
        (race.exponential(i) / wi, i, di)
        for i, di, wi in zip(ids.tolist(), d.tolist(), w.tolist(), strict=True)
    ]
    out.sort()
    return out if math.isfinite(out[0][0]) else None


def v2_winner_from_logits(race: V2Race, logits: torch.Tensor, temperature: float) -> int | None:
    """The winner of ``race`` over ``p = softmax(logits / temperature)`` as
    :func:`ersd.probs.logits_to_probs` computes it in float64 (no top-k, top-p or min-p), found
    from the logits without ``p``: the token :func:`v2_race_winner` picks on ``p``, or None when
    that cannot be shown within rounding (the block comment above); ``logits``: a 1-D CPU row."""
    t = float(temperature)
    logits = logits.detach()
    v = logits.shape[0]
    bm, b = _block_max_top(logits, t)
    mx = float(bm[b])  # bm.max(): NaN where there is one (argmax finds the first)
    if not math.isfinite(mx):
        return None  # NaN or +inf logits: the reference path says what is wrong
    with np.errstate(divide="ignore", under="ignore"):
        bound = race.lower / np.exp(bm - mx)
    x = _host_logits(logits)
    n_blocks = bound.size
    top = _blocks_below_top(race, x, b, mx, t, bound) if TOP_FIRST else None
    few = _few_within(race, x, t, mx, *top) if top is not None else None
    if few:  # the candidates in Python floats: the same scores, order and checks as below
        return _few_answer(race, v, few, math.exp(few[0][2]))
    n = 4
    while True:
        if top is not None:  # one draw: every other token scores beyond the limit (the helpers)
            ids, sc, d = _scores_within(race, x, t, mx, *top)
            if not ids.size:
                return None  # cannot happen (the largest logit's token is kept): the reference
            beyond = math.inf
        else:
            if n >= n_blocks:
                blocks, beyond = np.arange(n_blocks), math.inf
            else:
                part = np.argpartition(bound, n)  # the n smallest bounds first, the next at n
                blocks, beyond = np.sort(part[:n]), float(bound[part[n]])
            ids, e = race.block_exponentials(blocks, v)
            d = x[ids].astype(np.float64)
            if t != 1.0:
                d /= t
            d -= mx
            with np.errstate(divide="ignore", under="ignore"):
                sc = e / np.exp(d)
        j = int(sc.argmin())
        best = float(sc[j])
        if not math.isfinite(best):
            return None
        limit = best * (1.0 + LOGIT_GAP)
        if beyond > limit:
            break
        n *= 4
    if sc.size > 1 and float(np.partition(sc, 1)[1]) <= limit:
        return None  # a near-tie among the drawn tokens: rounding could decide it
    if math.exp(float(d[j])) < _MIN_WINNER_WEIGHT:
        return None  # the winner's reference probability might not be a normal float
    if not _no_subnormal_below(race, v, best):
        return None
    return int(ids[j])


# --- the drafter's race from its logits, without the float64 probabilities --------------------
#
# ERSD's drafter proposes the best ``m`` tokens of its race ``E_j / q_j`` and its rank statistic
# counts the tokens scoring below the target's winner in that race, both over ``q =
# logits_to_probs(draft logits)`` in float64.  As for the target's winner (the block comment
# above), the race is invariant to scaling ``q``: the same comparisons over ``w_j = exp(x_j / T -
# max / T)`` give the same answer wherever no two compared scores are within a relative
# LOGIT_GAP of each other, no block left undrawn comes within it, and no token involved can have a
# subnormal reference probability.  :func:`v2_ranking_from_logits` and :func:`v2_rank_from_logits`
# answer only then (None otherwise: the caller computes ``q`` and asks :func:`v2_race_ranking` /
# :func:`v2_race_rank`, the same tokens and ranks).


class LogitRow:
    """One 1-D CPU row of logits at temperature ``t`` (plain temperature sampling), prepared for
    v2 races in logit space: its host view, each block's largest ``x / t`` and the row's maximum
    (the softmax's shift, the same float64 value as :func:`ersd.probs.logits_to_probs`'s), and
    the block bounds of the last race asked about."""

    __slots__ = ("_bound", "bm", "mx", "t", "top_block", "x")

    def __init__(self, logits: torch.Tensor, temperature: float) -> None:
        self.t = float(temperature)
        logits = logits.detach()
        # the block maxima of x / t, and the first block holding the largest logit
        self.bm, self.top_block = _block_max_top(logits, self.t)
        self.mx = float(self.bm[self.top_block])  # bm.max(): NaN where there is one
        self.x = _host_logits(logits)
        self._bound: tuple[tuple[int, int], np.ndarray] | None = None

    @property
    def usable(self) -> bool:
        """False for NaN or +inf logits (the probability path says what is wrong)."""
        return math.isfinite(self.mx)

    def bound(self, race: V2Race) -> np.ndarray:
        """``M_b / exp(max_b x / t - max / t)``: no token of block ``b`` scores below it in
        ``race`` (up to rounding, far inside LOGIT_GAP); kept for the last race."""
        last, which = self._bound, (race.key, race.stream)  # (key, stream) fix the minima
        if last is not None and last[0] == which:
            return last[1]
        with np.errstate(divide="ignore", under="ignore", over="ignore"):
            b = race.lower / np.exp(self.bm - self.mx)
        self._bound = (which, b)
        return b

    def shifted(self, ids: np.ndarray) -> np.ndarray:
        """``x / t - max / t`` at ``ids`` (float64), the operations of the target's path."""
        d = self.x[ids].astype(np.float64)
        if self.t != 1.0:
            d /= self.t
        d -= self.mx
        return d

    def scores(self, race: V2Race, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, E / w, x / t - max / t)`` over the tokens of ``blocks`` (ascending)."""
        ids, e = race.block_exponentials(blocks, self.x.shape[0])
        d = self.shifted(ids)
        with np.errstate(divide="ignore", under="ignore", over="ignore"):
            return ids, e / np.exp(d), d


def _no_subnormal_below(race: V2Race, v: int, score: float) -> bool:
    """No token whose reference probability is subnormal (or 0) can score below ``score`` (a
    logit-space score): such a token's reference score is at least ``M_min / 2^-1022``, and a
    token scoring ``score`` here scores at most ``v score (1 + eta)`` in the reference."""
    return race.lower_min / _SUBNORMAL > 2.0 * v * score


def _few_answer(
    race: V2Race, v: int, few: list[tuple[float, int, float]], weight: float
) -> int | None:
    """The single winner of :func:`_few_within`'s candidates (sorted, best first), or None where
    rounding could decide: a near-tie with the next, a winner ``weight`` (its ``w``, computed as
    the caller's array path computes it) below a normal reference probability, or a token with a
    subnormal reference probability able to score below it."""
    score, token, _ = few[0]
    if len(few) > 1 and not few[1][0] > score * (1.0 + LOGIT_GAP):
        return None  # a near-tie among the drawn tokens: rounding could decide it
    if weight < _MIN_WINNER_WEIGHT:
        return None  # the winner's reference probability might not be a normal float
    if not _no_subnormal_below(race, v, score):
        return None
    return token


def v2_ranking_from_logits(race: V2Race, row: LogitRow, m: int) -> list[int] | None:
    """:func:`v2_race_ranking`'s ``m`` best tokens (best first) of ``race`` over ``q =
    softmax(x / t)`` as :func:`ersd.probs.logits_to_probs` computes it, found from the logits; or
    None where rounding could decide (a near-tie among the ``m + 1`` best, a block not drawn
    within the gap, fewer than ``m`` tokens with mass, a token whose ``q`` might be subnormal)."""
    v = row.x.shape[0]
    if m < 1 or m > v or not row.usable:
        return None
    bound = row.bound(race)
    n_blocks = bound.size
    top = (
        _blocks_below_top(race, row.x, row.top_block, row.mx, row.t, bound)
        if m == 1 and TOP_FIRST
        else None
    )
    few = _few_within(race, row.x, row.t, row.mx, *top) if top is not None else None
    if few:  # the candidates in Python floats: the same scores, order and checks as below
        token = _few_answer(race, v, few, float(np.exp(few[0][2])))
        return None if token is None else [token]
    n = 4
    while True:
        if top is not None:  # one draw: every other token scores beyond the limit (the helpers)
            ids, sc, d = _scores_within(race, row.x, row.t, row.mx, *top)
            if not ids.size:
                return None  # cannot happen (the largest logit's token is kept): the reference
            beyond = math.inf
        else:
            if n >= n_blocks:
                blocks, beyond = np.arange(n_blocks), math.inf
            else:
                part = np.argpartition(bound, n)  # the n smallest bounds first, the next at n
                blocks, beyond = np.sort(part[:n]), float(bound[part[n]])
            ids, sc, d = row.scores(race, blocks)
        if m == 1:
            limit = float(sc.min())
        else:
            finite = sc[np.isfinite(sc)]
            limit = float(np.partition(finite, m - 1)[m - 1]) if finite.size >= m else math.inf
        if not math.isfinite(limit):
            if n >= n_blocks:
                return None  # fewer than m tokens with mass
            n, top = n * 4, None
            continue
        if beyond > limit * (1.0 + LOGIT_GAP):
            break
        n *= 4
    if sc.size > m + 1:  # the m + 1 best, then in argsort(kind="stable")'s order among them
        part = np.argpartition(sc, m)[: m + 1]
        order = part[np.lexsort((part, sc[part]))]  # by score, ties by id: a stable sort's order
    else:
        order = np.argsort(sc, kind="stable")[: m + 1]  # ids ascending: ties keep the lowest first
    ordered = sc[order]
    for i in range(min(m, ordered.size - 1)):
        if not ordered[i + 1] > ordered[i] * (1.0 + LOGIT_GAP):
            return None  # a near-tie decides the order or the set
    best = order[:m]
    if float(np.exp(d[best]).min()) < _MIN_WINNER_WEIGHT:
        return None  # a proposed token's reference probability might not be a normal float
    if not _no_subnormal_below(race, v, float(ordered[m - 1])):
        return None
    return [int(i) for i in ids[best]]


def v2_rank_from_logits(race: V2Race, row: LogitRow, token: int) -> int | None:
    """:func:`v2_race_rank` of ``token`` in ``race`` over ``q = softmax(x / t)`` (1 + the tokens
    scoring strictly below it), counted from the logits; or None where rounding could decide (a
    token within the gap of ``token``'s score, or a reference probability that might be
    subnormal)."""
    v = row.x.shape[0]
    if not row.usable or not 0 <= token < v:
        return None
    d_y = float(row.shifted(np.array([token]))[0])
    if math.exp(d_y) < _MIN_WINNER_WEIGHT or math.isnan(d_y):
        return None  # the token's reference probability might be 0 or subnormal
    s = race.exponential(token) / math.exp(d_y)
    if not math.isfinite(s) or not _no_subnormal_below(race, v, s):
        return None
    hi = s * (1.0 + LOGIT_GAP)
    blocks = np.flatnonzero(row.bound(race) <= hi)
    lo = s * (1.0 - LOGIT_GAP)
    if ROUGH_RANKS:  # the tokens that can score below hi, scores within _ROUGH (the rest above)
        sc = _rough_scores_within(race, row, blocks, hi)
        lo, hi = lo * (1.0 - _ROUGH), hi * (1.0 + _ROUGH)
    else:
        _, sc, _ = _scores_within(race, row.x, row.t, row.mx, blocks, hi)  # the rest above hi
    if int(np.count_nonzero((sc >= lo) & (sc <= hi))) != 1:
        return None  # another token within the gap (the token itself is the one)
    return int(np.count_nonzero(sc < lo)) + 1


#: count a rank from scores within a relative :data:`_ROUGH` of the exact ones (NumPy's ``log``
#: instead of :func:`unit_log`'s ~25 passes) where more than :data:`ONE_BY_ONE` tokens can score
#: below it; False: the exact scores (the reference ``research/profile_batch.py
#: --compare-prune`` compares with; the same ranks)
ROUGH_RANKS = True
#: how far a rough score may be from the exact one, relatively: NumPy's ``log`` and
#: :func:`unit_log` are each within a few ulps (2^-50) of ``log``; the window it widens is
#: LOGIT_GAP = 2^-36 wide, so a token the exact scores would count the same way is never moved
_ROUGH = 2.0**-40


def _rough_scores_within(
    race: V2Race, row: LogitRow, blocks: np.ndarray, limit: float
) -> np.ndarray:
    """The scores of the tokens of ``blocks`` that can score at most ``limit`` (the others score
    above it: :func:`_scores_within`'s test), each within a relative :data:`_ROUGH` of its exact
    score: the exact ones where at most :data:`ONE_BY_ONE` tokens qualify, else ``E`` from NumPy's
    ``log`` (the same uniforms and block minima's places, the same ``w``)."""
    v = row.x.shape[0]
    ids, _, w = _candidates(race, row.x, row.t, row.mx, blocks, limit)
    with np.errstate(divide="ignore", under="ignore", over="ignore"):
        if ids.size <= ONE_BY_ONE:
            return race.exponentials(ids, v) / w
        words = race.block_words(ids // V2_BLOCK)
        m = _rough_log_of_words(words)  # each token's block minimum: -log U_b / 64
        m *= -1.0 / V2_BLOCK
        np.maximum(m, _TINY, out=m)
        e = _rough_log_of_words(v2_words(race.token_seed, ids))
        np.negative(e, out=e)
        np.maximum(e, 0.0, out=e)
        e += m
        at = np.flatnonzero(ids % V2_BLOCK == (words & np.uint64(V2_BLOCK - 1)))
        e[at] = m[at]  # the block's minimum itself
        return e / w


def _rough_log_of_words(x: np.ndarray) -> np.ndarray:
    """NumPy's ``log(U)``, ``U = (top 53 bits + 1) / 2^53`` (a few ulps from :func:`unit_log`'s)."""
    u = (x >> np.uint64(11)).astype(np.float64)
    u += 1.0
    u *= _U53
    return np.log(u, out=u)
