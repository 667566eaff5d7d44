"""The finite-logits check every backend runs on what a forward returns.

A NaN in one weight (a damaged file, an overflow in float16) makes every logit NaN; softmax then
yields NaN probabilities and the race picks token 0 — text that is silently wrong.  So each
backend's ``score`` passes the rows it returns (the rows the loop uses: the root and the new
nodes) through :func:`check_scored_logits` once per call: one reduction over ``[1 + n, vocab]``
values, small next to the forward that made them.  On the CPU it is the rows' block maxima
(:mod:`ersd.blockmax`), which decide finiteness and are kept for the races (which would
otherwise read each row again for them); elsewhere one sum (:func:`all_finite`).
"""

from __future__ import annotations

import torch

from ersd import blockmax
from ersd.errors import InvalidLogitsError


def all_finite(logits: torch.Tensor) -> bool:
    """Whether every entry is finite, from one sum: a NaN or an infinity makes the sum NaN or
    infinite, so a finite sum proves every entry finite (~15x cheaper than ``isfinite().all()``
    over 152k-token rows, which builds a boolean copy: ~1.4 ms a row on this CPU, paid outside
    the forwards).  A sum that overflows although every entry is finite falls back to the
    entry-wise test."""
    if bool(torch.isfinite(logits.sum())):
        return True
    return bool(torch.isfinite(logits).all())


def check_scored_logits(logits: torch.Tensor, model: str, *, dtype: str | None = None) -> None:
    """Raise :class:`InvalidLogitsError` naming ``model`` when ``logits`` hold NaN, +inf or a row
    of only -inf (``dtype``: the weights' dtype, named in the repair advice)."""
    # a CPU float row: decided from its block maxima (a NaN or +inf entry makes its block's
    # maximum so, a row of only -inf has only -inf ones), which are kept for the races
    finite = blockmax.all_finite(logits)
    if finite or (finite is None and all_finite(logits)):  # elsewhere: one reduction, one sync
        return
    if bool(torch.isnan(logits).any()):
        what = "NaN"
    elif bool(torch.isposinf(logits).any()):
        what = "+inf"
    elif bool(torch.isneginf(logits).all(dim=-1).any()):
        what = "all -inf"
    else:
        return  # -inf on some tokens only: a masked vocabulary, a valid distribution
    flat = logits.reshape(-1, logits.shape[-1])
    bad = (torch.isnan(flat) | torch.isposinf(flat)).any(dim=-1) | torch.isneginf(flat).all(dim=-1)
    rows = int(bad.sum())
    in_dtype = f" in {dtype}" if dtype else ""
    raise InvalidLogitsError(
        f"model {model!r} returned {what} logits ({rows} of {bad.numel()} rows of one forward), "
        f"so its next token would be meaningless. Its weights are damaged or its activations "
        f"overflow{in_dtype}: for a bundled model run `ersd models prepare NAME` (it re-hashes "
        "the prepared files and converts a damaged folder again); otherwise re-download the "
        "weights, or load the model with --dtype float32"
    )
