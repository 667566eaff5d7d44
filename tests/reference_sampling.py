"""An independent reference of the sampling transforms, written from their definitions.

The exactness suite's oracle: the target's law is enumerated with these functions, not with
:func:`ersd.logits_to_probs`, so a bug in the library's temperature / top-k / top-p / min-p
handling changes the generated law but not the oracle, and is caught.  Plain Python floats over
lists, no torch, no ersd.

Definitions (the order and conventions of Hugging Face's logits warpers):

* **temperature** ``T > 0``: ``p(i) ∝ exp(l(i) / T)``.  ``T = 0`` is greedy decoding: all mass on
  the first index of the largest logit.
* **top-k** ``k``: keep the tokens whose logit is at least the ``k``-th largest logit (tokens
  tied with it are kept), drop the rest, renormalise.
* **top-p** ``P``: sort tokens by probability, largest first (ties: lower index first); keep a
  token iff the probability mass of the tokens *before* it is below ``P`` — the smallest prefix
  whose mass reaches ``P``, always including the first token.
* **min-p** ``m``: keep the tokens whose probability is at least ``m`` times the largest
  probability; drop the rest, renormalise.

Applied in that order: temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _normalise(weights: list[float]) -> list[float]:
    total = math.fsum(weights)
    return [w / total for w in weights]


def softmax(values: Sequence[float]) -> list[float]:
    top = max(values)
    return _normalise([0.0 if v == -math.inf else math.exp(v - top) for v in values])


def reference_probs(
    logits: Sequence[float],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> list[float]:
    """Next-token probabilities after temperature, top-k, top-p and min-p (see module doc)."""
    logits = [float(x) for x in logits]
    n = len(logits)
    if temperature == 0:
        best = max(range(n), key=lambda i: (logits[i], -i))  # first index of the maximum
        return [1.0 if i == best else 0.0 for i in range(n)]
    scaled = [x / temperature for x in logits]
    if top_k is not None and top_k < n:
        kth = sorted(scaled, reverse=True)[top_k - 1]
        scaled = [x if x >= kth else -math.inf for x in scaled]
    probs = softmax(scaled)
    if top_p is not None and top_p < 1.0:
        order = sorted(range(n), key=lambda i: (-probs[i], i))
        keep = set()
        before = 0.0
        for i in order:
            if before < top_p:
                keep.add(i)
            before += probs[i]
        probs = _normalise([p if i in keep else 0.0 for i, p in enumerate(probs)])
    if min_p is not None and min_p > 0:
        threshold = min_p * max(probs)
        probs = _normalise([p if p >= threshold else 0.0 for p in probs])
    return probs
