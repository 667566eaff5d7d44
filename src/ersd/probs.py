"""The one path from logits to probabilities, shared by drafter and target.

Temperature, then top-k, then top-p (nucleus), then min-p, in float64 — the order of Hugging Face's
logits warpers.  Temperature 0 means greedy: a one-hot distribution on the first argmax.  Using this
single function on both sides is what keeps the draft distribution the verifier divides by equal to
the one the draft was sampled from (a classic silent-losslessness bug).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ersd.errors import InvalidLogitsError


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings applied identically to draft and target."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        # one set of rules for every entry point (ersd.validation), normalised to plain numbers
        from ersd.validation import check_sampling

        t, k, p, m = check_sampling(self.temperature, self.top_k, self.top_p, self.min_p)
        object.__setattr__(self, "temperature", t)
        object.__setattr__(self, "top_k", k)
        object.__setattr__(self, "top_p", p)
        object.__setattr__(self, "min_p", m)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_logits(logits: torch.Tensor, vocab_size: int | None = None, who: str = "model") -> None:
    """Raise :class:`InvalidLogitsError` on NaN, +inf, all -inf rows or a wrong vocabulary size."""
    if vocab_size is not None and logits.shape[-1] != vocab_size:
        raise InvalidLogitsError(
            f"{who} returned logits with {logits.shape[-1]} columns but its vocab_size is "
            f"{vocab_size}; the model function must return one logit per vocabulary entry"
        )
    if bool(torch.isfinite(logits.sum())):
        return  # the common case: one reduction (a finite sum proves every entry finite)
    # a masked token (-inf) or a sum that overflowed: one more pass, the rows' maxima, decides
    # (a row's maximum is finite exactly when it has no NaN, no +inf and a finite entry)
    if bool(torch.isfinite(logits.amax(dim=-1)).all()):
        return
    if torch.isnan(logits).any():
        raise InvalidLogitsError(
            f"{who} returned NaN logits; check the model's dtype (try float32) and its inputs"
        )
    if torch.isposinf(logits).any():
        raise InvalidLogitsError(
            f"{who} returned +inf logits; mask tokens with -inf instead, and check the dtype"
        )
    if torch.isneginf(logits).all(dim=-1).any():
        raise InvalidLogitsError(f"{who} returned a row of logits that are all -inf")


def _softmax_own(x: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(x, -1)`` written over ``x``, a float64 temporary of
    :func:`logits_to_probs`' own (never the caller's logits): the same kernel, so the same
    bits, without a second row-sized allocation (~20% of a 152k-token row's softmax on the CPU).
    Elsewhere (a device, autograd, a strided row) the ordinary call."""
    if x.device.type != "cpu" or x.requires_grad or not x.is_contiguous():
        return torch.softmax(x, dim=-1)
    return torch.ops.aten._softmax.out(x, -1, False, out=x)


def logits_to_probs(
    logits: torch.Tensor, params: SamplingParams, *, rowwise_sum: bool = False
) -> torch.Tensor:
    """Probabilities (float64, same leading shape as ``logits``) after all sampling filters.

    ``rowwise_sum`` (a ``[N, V]`` batch): renormalise a filtered row by the sum of that row alone,
    as a ``[V]`` call does.  On the CPU torch may split a single row's sum over threads but sums
    the rows of a batch one thread each, so the last bit of a filtered (top-p, min-p) row can
    otherwise differ from the same row's ``[V]`` call; with it a batch's rows are the single
    rows' bits (:mod:`ersd.verify_batch`, tested)."""
    if params.greedy:
        # the first argmax of the logits as they are: widening to float64 is exact and keeps
        # the order, so it is the float64 row's (without a row-sized float64 copy to find it)
        out = torch.zeros(logits.shape, dtype=torch.float64, device=logits.device)
        out.scatter_(-1, first_argmax(logits).unsqueeze(-1), 1.0)
        return out
    x = logits.to(torch.float64)
    if params.temperature != 1.0:
        x = x / params.temperature
    vocab = x.shape[-1]
    filtered = False
    if params.top_k is not None and params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))  # softmax renormalises
    probs = _softmax_own(x) if x is not logits else torch.softmax(x, dim=-1)
    if params.top_p is not None and params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        # keep a token if the mass strictly before it is below top_p (always keeps the first)
        remove_sorted = (cum - sorted_p) >= params.top_p
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        probs = probs.masked_fill(remove, 0.0)
        filtered = True
    if params.min_p is not None and params.min_p > 0:
        top = probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < params.min_p * top, 0.0)
        filtered = True
    if not filtered:
        return probs
    if rowwise_sum and probs.dim() == 2 and probs.device.type == "cpu":
        total = torch.stack([row.sum() for row in probs]).unsqueeze(-1)
    else:
        total = probs.sum(dim=-1, keepdim=True)
    return probs / total


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """``torch.argmax(x, dim=-1)`` (int64, the first maximum; NaN counts as the largest): on a
    CPU float32 / float64 tensor by NumPy's, the same index ~7x faster on a 152k row (torch's
    CPU argmax: ~0.4 ms); elsewhere torch's."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.dim():
        return torch.from_numpy(np.asarray(np.argmax(x.detach().numpy(), axis=-1), np.int64))
    return torch.argmax(x, dim=-1)


def plain_temperature(params: SamplingParams, vocab_size: int) -> float | None:
    """``T`` when :func:`logits_to_probs` is exactly ``softmax(logits / T)`` for ``params`` over
    ``vocab_size`` tokens (no top-k below the vocabulary, no top-p, no min-p, not greedy); else
    None.  Then the race winner is invariant to the normaliser
    (:func:`ersd.race_v2.v2_winner_from_logits`)."""
    if params.greedy:
        return None
    if params.top_k is not None and params.top_k < vocab_size:
        return None
    if params.top_p is not None and params.top_p < 1.0:
        return None
    if params.min_p is not None and params.min_p > 0:
        return None
    return float(params.temperature)
