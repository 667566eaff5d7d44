"""ERSD's race over many rows at once: the one computation every patch of the plugin calls.

Row ``r`` holds the logits of one context whose race key is ``keys[r]`` (:mod:`ersd.race`: the key
of the committed context extended by the draft tokens before that row).  Its winner is exactly
``ersd.race.race_winner(logits_to_probs(logits[r], params), RaceNoise.exponentials(keys[r]))``:
the same probabilities (one float64 ``logits_to_probs`` call per group of rows with equal settings),
the same keyed noise, the same ``argmin E / p`` with the first index on ties.  So a vLLM ERSD run
and ``ersd.generate`` emit the same tokens for the same seed whenever the two models' logits give
the same probabilities.

In Gumbel form the winner is ``argmax(log p - log E)`` (``-log E`` is Gumbel); it is computed as
``argmin(E / p)`` here because that is the form ``ersd.race`` uses, so outcomes are bit-identical
rather than equal up to rounding at near-ties.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from ersd.integrations.vllm.params import ErsdRequestParams
from ersd.probs import logits_to_probs
from ersd.race import STREAM_RACE, RaceNoise, extend_key, root_key
from ersd.watermark.keyed import WatermarkKey, race_noise
from ersd.watermark.settings import Watermark

_NOISE: dict[tuple[int, Watermark | None, str], RaceNoise] = {}
#: Memory for cached races per vocabulary (bytes): the drafter races the contexts the verifier
#: checks next, so a cache that holds a step's races halves the noise work with a draft model.
NOISE_CACHE_BYTES = 512 << 20


def noise_for(vocab_size: int, watermark: Watermark | None = None, scheme: str = "v1") -> RaceNoise:
    """The process-wide :class:`~ersd.race.RaceNoise` of a vocabulary and race scheme (its cache
    is shared by the drafter and the verifier, which race the same contexts); with a watermark,
    that watermark's keyed noise (:func:`ersd.watermark.keyed.race_noise`, as ``ersd.generate``
    uses; its scheme is the key's)."""
    noise = _NOISE.get((vocab_size, watermark, scheme))
    if noise is None:
        size = max(16, NOISE_CACHE_BYTES // (8 * vocab_size))
        if watermark is not None or scheme != "v1":  # each its own share of the budget
            size = max(16, size // 4)
        if watermark is not None:
            noise = race_noise(vocab_size, watermark, size)
        else:
            noise = RaceNoise(vocab_size, size, scheme=scheme)
        _NOISE[(vocab_size, watermark, scheme)] = noise
    return noise


def noise_backend() -> str:
    """``ERSD_VLLM_NOISE``: ``numpy`` (default; :class:`~ersd.race.RaceNoise` on the host, cached)
    or ``torch`` (:mod:`ersd.race_torch` on the logits' device, bit-identical)."""
    backend = os.environ.get("ERSD_VLLM_NOISE", "numpy")
    if backend not in ("numpy", "torch"):
        raise ValueError(f"ERSD_VLLM_NOISE must be 'numpy' or 'torch', got {backend!r}")
    return backend


def race_exponentials(
    keys: Sequence[int], vocab_size: int, device: torch.device | str = "cpu", scheme: str = "v1"
) -> torch.Tensor:
    """``E`` for each key as one float64 ``[len(keys), vocab_size]`` tensor (stream 0), drawn
    under race scheme ``scheme``."""
    if noise_backend() == "torch":
        from ersd.race_torch import race_exponentials_torch

        return race_exponentials_torch(list(keys), vocab_size, STREAM_RACE, device, scheme=scheme)
    noise = noise_for(vocab_size, None, scheme)
    return torch.stack([noise.exponentials(k, STREAM_RACE) for k in keys]).to(device)


def race_winners(
    logits: torch.Tensor,
    keys: Sequence[int],
    params: Sequence[ErsdRequestParams],
) -> torch.Tensor:
    """Race winner of every row of ``logits`` (``[R, V]``, any device), as an int64 CPU tensor."""
    n_rows, vocab = logits.shape
    if n_rows != len(keys) or n_rows != len(params):
        raise ValueError(f"{n_rows} rows but {len(keys)} keys and {len(params)} params")
    if n_rows == 0:
        return torch.empty(0, dtype=torch.int64)
    rows = logits.detach()
    probs = torch.empty((n_rows, vocab), dtype=torch.float64, device=rows.device)
    groups: dict[tuple, list[int]] = {}
    for r, p in enumerate(params):
        groups.setdefault(p.group, []).append(r)
    for idx in groups.values():
        sampling = params[idx[0]].sampling
        if len(idx) == n_rows:
            probs = logits_to_probs(rows, sampling)
        else:
            t = torch.tensor(idx, device=rows.device)
            probs[t] = logits_to_probs(rows[t], sampling)
    return race_argmin(probs, row_exponentials(keys, params, vocab, rows.device))


def row_exponentials(
    keys: Sequence[int],
    params: Sequence[ErsdRequestParams],
    vocab_size: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``E`` of every row: :func:`race_exponentials` for plain rows (each its request's race
    scheme), the watermark's keyed noise (on the host, then moved) for watermarked ones."""
    marked = [r for r, p in enumerate(params) if p.watermark is not None]
    schemes: dict[str, list[int]] = {}
    for r, p in enumerate(params):
        if p.watermark is None:
            schemes.setdefault(p.race_scheme, []).append(r)
    if not marked and len(schemes) <= 1:
        scheme = next(iter(schemes), "v1")
        return race_exponentials(keys, vocab_size, device, scheme)
    out = torch.empty((len(keys), vocab_size), dtype=torch.float64, device=device)
    for scheme, plain in schemes.items():
        idx = torch.tensor(plain, device=device)
        out[idx] = race_exponentials([keys[r] for r in plain], vocab_size, device, scheme)
    for r in marked:
        noise = noise_for(vocab_size, params[r].watermark)
        out[r] = noise.exponentials(keys[r], STREAM_RACE).to(device)
    return out


def race_argmin(probs: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """The race: ``argmin(E / p)`` per row, as an int64 CPU tensor."""
    return torch.argmin(e / probs, dim=-1).cpu()


class ContextKeys:
    """Race key of each request's committed context (seed, prompt, output so far), kept
    incrementally: a step costs one :func:`~ersd.race.extend_key` per new token."""

    def __init__(self) -> None:
        # req_id -> (seed, watermark, n_output, key)
        self._state: dict[str, tuple[int, Watermark | None, int, int]] = {}

    def key(
        self,
        req_id: str,
        seed: int,
        prompt: Sequence[int],
        output: Sequence[int],
        watermark: Watermark | None = None,
    ) -> int:
        """The key of (seed, prompt, output so far); with a watermark a
        :class:`~ersd.watermark.keyed.WatermarkKey` whose window holds the output's last tokens,
        exactly as :meth:`ersd.Request.root_key` then the loop's extensions make it."""
        st = self._state.get(req_id)
        n = len(output)
        key: int
        if st is None or st[0] != seed or st[1] != watermark or st[2] > n:
            key, done = root_key(seed, prompt), 0
            if watermark is not None:
                key = WatermarkKey.root(key, watermark, seed, prompt)
        else:
            _, _, done, key = st
        for t in output[done:n]:
            key = extend_key(key, int(t))
        self._state[req_id] = (seed, watermark, n, key)
        return key

    def retain(self, live: set[str]) -> None:
        """Forget requests that left the batch."""
        for rid in [r for r in self._state if r not in live]:
            del self._state[rid]
