"""The watermarked race inside the loop: :class:`WatermarkKey` and :class:`WatermarkNoise`.

The loop keys every context by an int (:mod:`ersd.race`).  A :class:`WatermarkKey` *is* that int
-- the rolling hash of (seed, salt, full context), so trees, caches and records keep working --
and also carries what the watermark needs: the **window** (the context's last ``h`` tokens, the
prompt's included, in version 2; the last ``h`` generated tokens, ``-1`` before the first, in
version 1 -- :attr:`Watermark.version`) and the set of windows already used at earlier
generated positions.  Version 2 exists because version 1's first ``h`` windows are the same for
every prompt: at one salt, every request's opening races drew the same noise, and a server's
traffic opened with visibly few distinct tokens.
:class:`WatermarkNoise` then draws stream 0 (the shared race) at a context from the secret-keyed
PRF of its window, ``E_i = -log U_i`` -- unless the window was used before in this text:

**Repeated windows.**  A window seen at an earlier position of the same text does not reuse its
noise (that would pull the text towards repeating itself and count correlated terms in the
score); its race draws the unkeyed noise of (seed, salt, full context) instead, which is still a
deterministic function of the context (so ERSD stays drafter invariant) and independent of every
other race.  The detector skips those positions (:func:`ersd.watermark.detect`): it sees the same
windows, so it knows which ones they are.  Streams :data:`~ersd.race.STREAM_KEY_A` and
:data:`~ersd.race.STREAM_KEY_B` (the dual-key baseline's races) are keyed the same way by the
watermark's derived keys A and B (:meth:`Watermark.derive`).  Other streams (the baselines'
lanes and coins) always use the unkeyed noise.

Exactness: each race's noise is fresh given everything before it (a new window's PRF value was
never used in this text; a repeated window's fallback is keyed by a never-seen full context), so
over a uniformly random key every token is an exact sample of the target's distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ersd.race import STREAM_KEY_A, STREAM_KEY_B, STREAM_RACE, RaceNoise, mix_token
from ersd.watermark.prf import WatermarkPRF
from ersd.watermark.settings import Watermark

#: mixed into the full-context hash with the salt, so the fallback noise of different salts differs
_SALT_DOMAIN = 0x57A7E12A5A17


class WatermarkKey(int):
    """The race key of a watermarked context: the full-context hash (the int) plus the window."""

    watermarked = True
    window: tuple[int, ...]
    seen: frozenset[tuple[int, ...]]
    salt: int

    def __new__(
        cls, full: int, window: tuple[int, ...], seen: frozenset[tuple[int, ...]], salt: int
    ) -> WatermarkKey:
        obj = int.__new__(cls, full)
        obj.window = window
        obj.seen = seen
        obj.salt = salt
        return obj

    @classmethod
    def root(
        cls, key: int, watermark: Watermark, seed: int, prompt: Sequence[int] = ()
    ) -> WatermarkKey:
        """The key of a prompt's context (``key``: its unwatermarked :func:`ersd.race.root_key`
        of ``prompt``); the first window is :meth:`Watermark.initial_window` of ``prompt``."""
        salt = watermark.salt_for(seed)
        full = mix_token(int(key), _SALT_DOMAIN + salt)
        return cls(full, watermark.initial_window(prompt), frozenset(), salt)

    @property
    def repeated(self) -> bool:
        """Whether this context's window was used at an earlier generated position."""
        return self.window in self.seen

    def extend(self, token: int) -> WatermarkKey:
        """The key after ``token`` is generated at this context."""
        t = int(token)
        return WatermarkKey(
            mix_token(int(self), t), (*self.window[1:], t), self.seen | {self.window}, self.salt
        )

    def __repr__(self) -> str:
        return f"WatermarkKey({int(self)}, window={self.window}, repeated={self.repeated})"

    def __reduce__(self) -> Any:
        return (WatermarkKey, (int(self), self.window, self.seen, self.salt))


class WatermarkNoise(RaceNoise):
    """Race noise of a watermark: stream 0 from the keyed PRF of the window (module doc)."""

    def __init__(self, vocab_size: int, watermark: Watermark, cache_size: int = 64) -> None:
        super().__init__(vocab_size, cache_size)
        self.watermark = watermark
        self._prfs: dict[tuple[int, int], WatermarkPRF] = {}
        self._keys = {
            STREAM_RACE: watermark,
            STREAM_KEY_A: watermark.derive("key_a"),
            STREAM_KEY_B: watermark.derive("key_b"),
        }

    def __repr__(self) -> str:
        return f"WatermarkNoise(vocab_size={self.vocab_size}, {self.watermark!r})"

    def prf(self, salt: int, stream: int = STREAM_RACE) -> WatermarkPRF:
        """The keyed PRF of ``salt`` for a keyed ``stream`` (the race's, or key A's / B's)."""
        prf = self._prfs.get((salt, stream))
        if prf is None:
            prf = self._prfs[(salt, stream)] = self._keys[stream].prf(salt)
        return prf

    def _draw(self, key: int, stream: int) -> np.ndarray:
        if not isinstance(key, WatermarkKey):
            raise TypeError(
                "WatermarkNoise needs WatermarkKey race keys (the loop makes them from the "
                "request's watermark); got a plain key"
            )
        if stream not in self._keys or key.repeated:
            return super()._draw(int(key), stream)
        u = self.prf(key.salt, stream).uniforms(key.window, self.vocab_size)
        return -np.log(u)  # U lies strictly inside (0, 1): E is finite and > 0


def race_noise(vocab_size: int, watermark: Watermark | None, cache_size: int = 64) -> RaceNoise:
    """The race noise of a generation: keyed by the watermark's secret when there is one."""
    if watermark is None:
        return RaceNoise(vocab_size, cache_size)
    return WatermarkNoise(vocab_size, watermark, cache_size)
