"""Keyed exponential races: the shared randomness of ERSD.

Kobus & Gündüz, "Speculative Sampling via Exponential Races" (arXiv 2504.15475, ACL Findings 2025).

Every token ``i`` of the vocabulary gets an ``E_i ~ Exp(1)``; the token with the smallest
``E_i / p_i`` wins the race and is an exact sample from ``p``.  ERSD shares one race per context
between drafter and target, so the races must be a deterministic function of (seed, context):

* A **context key** is a 64-bit rolling hash of the seed and the full token context, extended one
  token at a time (:func:`root_key`, :func:`extend_key`).  Keying by the full context keeps
  successive realised races independent, which is what makes ERSD exact; it also makes the
  noise independent of batch slot, of how many races were drawn before, and of the device.
* A key and a **stream** number select a counter-based Philox generator (NumPy), from which the
  race's uniforms are drawn on the CPU in float64.  Stream 0 is the shared race of ERSD; other
  streams give independent noise at the same context (draft lanes and verification coins of the
  rejection-based baselines, which must not reuse the race).

Scores are ``E_i / p_i`` in float64 (a division, no logarithm: the noise is drawn once per race and
cached, and the per-distribution work stays one pass): tokens with ``p_i = 0`` score ``+inf`` and
never win, and ties resolve to the lowest token id (``argmin`` returns the first minimum).  The
draws are clamped away from 0 so that ``0 / 0`` can never occur.

**Watermarked races** (:mod:`ersd.watermark`) use the same loop with a richer key: a
:class:`ersd.watermark.WatermarkKey` *is* the int of the full-context hash (so every cache, tree and
record keyed by ints keeps working) and also carries the last ``h`` generated tokens; its own
:meth:`extend` replaces :func:`extend_key`'s mix, and a :class:`ersd.watermark.WatermarkNoise`
draws stream 0 from the secret-keyed PRF of that window instead of from this module's Philox.
A plain :class:`RaceNoise` refuses such a key rather than silently dropping the watermark.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from ersd.race_v2 import (  # noqa: F401 -- the v2 names stay importable from ersd.race
    _MASK64,
    _TINY,
    DEFAULT_RACE_SCHEME,
    RACE_SCHEMES,
    V2_BLOCK,
    Minima,
    V2Race,
    _mix64,
    check_race_scheme,
    unit_log,
    v2_block_minima,
    v2_exponentials,
    v2_exponentials_at,
    v2_race_rank,
    v2_race_ranking,
    v2_race_winner,
    v2_seed,
    v2_uniforms,
    v2_winner_from_logits,
    v2_words,
)

#: Stream of the shared race (ERSD drafting and verification, bonus tokens, target-only sampling).
STREAM_RACE = 0
#: First stream of the independent draft lanes of the baselines (lane k uses STREAM_DRAFT + k).
STREAM_DRAFT = 1 << 20
#: Stream of verification coins (uniforms) of the rejection-based baselines.
STREAM_VERIFY = 2 << 20
#: Stream of residual ("recovered token") races of the rejection-based baselines.
STREAM_RESIDUAL = 3 << 20
#: Races of the dual-key watermark baseline: drafts race on key A, residual and bonus on key B
#: (keyed by the watermark's derived keys, :mod:`ersd.watermark.keyed`; unkeyed otherwise).
STREAM_KEY_A = 4 << 20
STREAM_KEY_B = 5 << 20


def root_key(seed: int, prompt: Iterable[int]) -> int:
    """Key of the context made of ``prompt`` under ``seed``: a rolling hash over the prompt."""
    key = _mix64(0x5EED5EED5EED5EED ^ _mix64(int(seed) & _MASK64))
    for token in prompt:
        key = extend_key(key, token)
    return key


def extend_key(key: int, token: int) -> int:
    """Key of the context ``c || token`` given the key of ``c``.

    A key object that extends itself (an int subclass with an ``extend`` method, such as
    :class:`ersd.watermark.WatermarkKey`) does so; a plain int is mixed here."""
    if type(key) is not int:
        return key.extend(token)  # type: ignore[attr-defined]
    return _mix64((key * 0x9E3779B97F4A7C15 + int(token) + 1) & _MASK64)


def mix_token(key: int, token: int) -> int:
    """The plain mix :func:`extend_key` applies to an int key (the full-context hash)."""
    return _mix64((int(key) * 0x9E3779B97F4A7C15 + int(token) + 1) & _MASK64)


def extend_key_many(key: int, tokens: Iterable[int]) -> int:
    """Key of ``c || tokens`` given the key of ``c``."""
    for token in tokens:
        key = extend_key(key, token)
    return key


class RaceNoise:
    """Source of keyed race noise over a vocabulary of ``vocab_size`` tokens.

    ``exponentials(key, stream)`` returns ``E`` (float64, CPU) for every token.  The same
    (key, stream) always gives the same vector, whichever order races are asked for in; a small
    LRU cache lets drafter and target share one computation.  It may be used from several threads
    at once (the batched engine works on its rows side by side): the cache is locked, the draws
    are not (NumPy fills them without the GIL).

    ``scheme`` (:data:`RACE_SCHEMES`) picks how the noise is drawn: ``"v1"``, NumPy's Philox
    (the default; every text made before v2 existed), or ``"v2"``, the blocked splitmix64 race
    whose :meth:`winner`, :meth:`ranking` and :meth:`rank` draw only the blocks that can win.
    """

    def __init__(self, vocab_size: int, cache_size: int = 64, *, scheme: str = "v1") -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = int(vocab_size)
        self.scheme = check_race_scheme(scheme)
        self._lazy: OrderedDict[tuple[int, int], V2Race] = OrderedDict()
        self._cache: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # races drawn on a device (exponentials_many): (key, stream, device) -> row there
        self._device_cache: OrderedDict[tuple[int, int, str], torch.Tensor] = OrderedDict()

    @staticmethod
    def _generator(key: int, stream: int) -> np.random.Generator:
        return np.random.Generator(np.random.Philox(key=(int(stream) << 64) | (key & _MASK64)))

    def uniforms(self, key: int, stream: int, n: int) -> np.ndarray:
        """``n`` independent uniforms in [0, 1) for (key, stream), float64."""
        if self.scheme == "v2":
            return v2_uniforms(int(key), stream, n)
        return self._generator(int(key), stream).random(n)

    def _draw(self, key: int, stream: int) -> np.ndarray:
        """The race's ``E`` for (key, stream), uncached (subclasses key stream 0 otherwise)."""
        if type(key) is not int and getattr(key, "watermarked", False):
            raise TypeError(
                "a watermarked race key reached an unwatermarked RaceNoise; build the noise "
                "with ersd.watermark.WatermarkNoise (ersd.generate(..., watermark=...) does)"
            )
        if self.scheme == "v2":
            return v2_exponentials(int(key), stream, self.vocab_size)
        e = self._generator(int(key), stream).standard_exponential(self.vocab_size)
        np.maximum(e, _TINY, out=e)  # E = 0 has probability ~1e-16; keep 0/0 impossible
        return e

    def exponentials(self, key: int, stream: int = STREAM_RACE) -> torch.Tensor:
        """``E_i ~ Exp(1)`` i.i.d. over the vocabulary (float64, CPU), keyed by (key, stream)."""
        cache_key = (int(key), stream)
        with self._lock:
            hit = self._cache.get(cache_key)
            if hit is not None:
                self._cache.move_to_end(cache_key)
                return hit
        out = torch.from_numpy(self._draw(key, stream))
        with self._lock:
            self._cache[cache_key] = out
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return out

    def lazy(self) -> bool:
        """Whether :meth:`winner`, :meth:`ranking` and :meth:`rank` may draw only the blocks
        that can win (v2 with this class's own draw)."""
        return self.scheme == "v2" and type(self)._draw is RaceNoise._draw

    def lazy_race(self, key: int, stream: int) -> V2Race:
        """The lazily drawn v2 race of (key, stream), cached (its block minima and drawn blocks)."""
        cache_key = (int(key), stream)
        with self._lock:
            hit = self._lazy.get(cache_key)
            if hit is not None:
                self._lazy.move_to_end(cache_key)
                return hit
        if type(key) is not int and getattr(key, "watermarked", False):
            self._draw(key, stream)  # refuses a watermarked key, naming the fix
        out = V2Race(int(key), stream, self.vocab_size)
        with self._lock:
            self._lazy[cache_key] = out
            if len(self._lazy) > max(self._cache_size, 64):
                self._lazy.popitem(last=False)
        return out

    def block_minima(self, key: int, stream: int) -> Minima:
        """v2's per-block minima and their places for (key, stream) (:func:`v2_block_minima`)."""
        return self.lazy_race(key, stream).minima

    def _host_weights(self, probs: torch.Tensor) -> np.ndarray | None:
        """``probs`` as a float64 NumPy row when the lazy v2 race applies to it, else None."""
        if not self.lazy() or probs.device.type != "cpu" or probs.dim() != 1:
            return None
        p = probs if probs.dtype == torch.float64 else probs.to(torch.float64)
        return p.numpy()

    def winner(self, key: int, probs: torch.Tensor, stream: int = STREAM_RACE) -> int:
        """:func:`race_winner` of ``probs`` against (key, stream)'s race; under v2 on the CPU
        only the blocks that can win are drawn (the same token as the full row)."""
        p = self._host_weights(probs)
        if p is None:
            return race_winner(probs, self._row_for(key, stream, probs.device))
        race = self.lazy_race(key, stream)
        return v2_race_winner(race, p, race.bounds(probs, p))

    def winner_from_logits(
        self, key: int, logits: torch.Tensor, temperature: float, stream: int = STREAM_RACE
    ) -> int | None:
        """:meth:`winner` over ``softmax(logits / temperature)`` (float64, as
        :func:`ersd.probs.logits_to_probs` computes it without top-k, top-p or min-p) found from
        the logits, without the probabilities: under v2 on the CPU only
        (:func:`ersd.race_v2.v2_winner_from_logits`).  None where it does not apply or rounding
        could decide the race: the caller then computes the probabilities (the same token)."""
        if not self.lazy() or logits.device.type != "cpu" or logits.dim() != 1:
            return None
        return v2_winner_from_logits(self.lazy_race(key, stream), logits, temperature)

    def ranking(
        self, key: int, probs: torch.Tensor, m: int, stream: int = STREAM_RACE
    ) -> list[int]:
        """:func:`race_ranking` (the ``m`` best tokens) against (key, stream)'s race."""
        p = self._host_weights(probs)
        if p is None:
            return race_ranking(probs, self._row_for(key, stream, probs.device), m)
        race = self.lazy_race(key, stream)
        return v2_race_ranking(race, p, m, race.bounds(probs, p))

    def rank(self, key: int, probs: torch.Tensor, token: int, stream: int = STREAM_RACE) -> int:
        """:func:`race_rank` of ``token`` against (key, stream)'s race."""
        p = self._host_weights(probs)
        if p is None:
            return race_rank(probs, self._row_for(key, stream, probs.device), token)
        race = self.lazy_race(key, stream)
        return v2_race_rank(race, p, int(token), race.bounds(probs, p))

    def _row_for(self, key: int, stream: int, device: torch.device) -> torch.Tensor:
        """The race's ``E`` where ``device``'s probabilities are (the host row on the CPU)."""
        if device.type == "cpu":
            return self.exponentials(key, stream)
        return self.exponentials_many([key], stream, device)[0]

    def draws_on_device(self) -> bool:
        """Whether this noise's races may be drawn by :mod:`ersd.race_torch` on a device: True for
        this class's own Philox draw; a subclass that draws otherwise (a watermark's keyed PRF)
        overrides ``_draw`` and is drawn on the host, then copied (one transfer per call)."""
        return type(self)._draw is RaceNoise._draw

    def exponentials_many(
        self,
        keys: Sequence[int],
        stream: int = STREAM_RACE,
        device: torch.device | str | None = None,
        *,
        via_torch: bool | None = None,
    ) -> torch.Tensor:
        """``E`` of every key's race, ``[len(keys), vocab_size]`` float64 on ``device`` (default
        the CPU): row ``i`` equals ``exponentials(keys[i], stream)`` bit for bit.

        On the CPU the rows come from :meth:`exponentials` (NumPy's Philox, cached: ~45x faster
        there than the tensor version).  On another device the races not cached for that device
        are drawn together where they are used, by :func:`ersd.race_torch.race_exponentials_torch`
        (one small host transfer per call, for the ziggurat's tail values); a noise whose
        ``_draw`` is overridden (:class:`ersd.watermark.WatermarkNoise`) draws on the host and
        copies the rows over once.  ``via_torch`` forces the device schedule on or off (the tests
        run it on the CPU)."""
        dev = torch.device("cpu") if device is None else torch.device(device)
        if not (dev.type != "cpu" if via_torch is None else via_torch):
            if not keys:
                return torch.empty(0, self.vocab_size, dtype=torch.float64)
            return torch.stack([self.exponentials(k, stream) for k in keys])
        if not self.draws_on_device():
            rows = [self.exponentials(k, stream) for k in keys]
            if not rows:
                return torch.empty(0, self.vocab_size, dtype=torch.float64, device=dev)
            return torch.stack(rows).to(dev, non_blocking=True)
        from ersd.race_torch import race_exponentials_torch

        for k in keys:
            if type(k) is not int and getattr(k, "watermarked", False):
                self._draw(k, stream)  # refuses a watermarked key, naming the fix
        cache_keys = [(int(k), stream, str(dev)) for k in keys]
        with self._lock:
            found = {ck: self._device_cache[ck] for ck in cache_keys if ck in self._device_cache}
        missing = list(dict.fromkeys(ck for ck in cache_keys if ck not in found))
        if missing:
            drawn = race_exponentials_torch(
                [ck[0] for ck in missing], self.vocab_size, stream, dev, scheme=self.scheme
            )
            with self._lock:
                for i, ck in enumerate(missing):
                    found[ck] = self._device_cache[ck] = drawn[i]
                    self._device_cache.move_to_end(ck)
                while len(self._device_cache) > self._cache_size:
                    self._device_cache.popitem(last=False)
        if not cache_keys:
            return torch.empty(0, self.vocab_size, dtype=torch.float64, device=dev)
        return torch.stack([found[ck] for ck in cache_keys])


def race_scores(probs: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """``E_i / p_i`` (float64), ``+inf`` where ``p_i = 0`` (those tokens never win)."""
    p = probs if probs.dtype == torch.float64 else probs.to(torch.float64)
    e = exponentials if exponentials.device == p.device else exponentials.to(p.device)
    return e / p


def _first_min(scores: torch.Tensor) -> int:
    """Index of the first smallest score (lowest id on ties).  On the CPU through NumPy, whose
    SIMD argmin over a 152k vocabulary is ~15x faster than torch's; the same index either way
    (scores are never NaN: ``E > 0`` and ``p`` is finite)."""
    if scores.device.type == "cpu":
        return int(scores.numpy().argmin())
    return int(torch.argmin(scores).item())


def race_winner(probs: torch.Tensor, exponentials: torch.Tensor) -> int:
    """The race winner ``argmin_i E_i / p_i``: an exact sample from ``probs``."""
    return _first_min(race_scores(probs, exponentials))


def race_ranking(probs: torch.Tensor, exponentials: torch.Tensor, m: int) -> list[int]:
    """The ``m`` best tokens of the race, best first (Gumbel-top-m: sampling without replacement).

    Tokens with zero probability are never returned, so fewer than ``m`` tokens come back when
    ``probs`` has fewer than ``m`` non-zero entries.
    """
    scores = race_scores(probs, exponentials)
    m = min(m, scores.numel())
    if m == 1:  # a chain's node: argmin is ~6x cheaper than topk over a large vocabulary
        i = _first_min(scores)  # the first minimum: lowest id on ties, as below
        return [] if scores[i].item() == float("inf") else [i]
    values = torch.topk(scores, m, largest=False, sorted=True).values
    # every token scoring at most the m-th best (topk picks arbitrarily among exact ties), then
    # (score, id) order: on exact ties the lowest token id comes first, as argmin's
    last = values[-1]
    keep = scores <= last if torch.isfinite(last) else torch.isfinite(scores)
    idx = torch.nonzero(keep).flatten()
    return [i for _, i in sorted(zip(scores[idx].tolist(), idx.tolist(), strict=True))[:m]]


def race_rank(probs: torch.Tensor, exponentials: torch.Tensor, token: int) -> int:
    """1-based rank of ``token`` in the race over ``probs`` (``vocab + 1`` if it has zero mass)."""
    scores = race_scores(probs, exponentials)
    s = float(scores[token])
    if math.isinf(s):
        return scores.numel() + 1
    if scores.device.type == "cpu":  # NumPy's count is ~4x cheaper than torch's compare-and-sum
        return int(np.count_nonzero(scores.numpy() < s)) + 1
    return int((scores < s).sum().item()) + 1
