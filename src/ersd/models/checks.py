"""The finite-logits check every backend runs on what a forward returns.

A NaN in one weight (a damaged file, an overflow in float16) makes every logit NaN; softmax then
yields NaN probabilities and the race picks token 0 — text that is silently wrong.  So each
backend's ``score`` passes the rows it returns (the rows the loop uses: the root and the new
nodes) through :func:`check_scored_logits` once per call: one ``isfinite`` pass over
``[1 + n, vocab]`` values, small next to the forward that made them.
"""

from __future__ import annotations

import torch

from ersd.errors import InvalidLogitsError


def check_scored_logits(logits: torch.Tensor, model: str, *, dtype: str | None = None) -> None:
    """Raise :class:`InvalidLogitsError` naming ``model`` when ``logits`` hold NaN, +inf or a row
    of only -inf (``dtype``: the weights' dtype, named in the repair advice)."""
    finite = torch.isfinite(logits)
    if bool(finite.all()):  # the common case: one pass, one sync
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
