"""Model-weighted watermark detection: each token weighted by the signal its distribution carries.

**The weight.**  At a keyed position the race emits ``x = argmin_i E_i / p_i`` with
``E_i = -log U_i`` (:mod:`ersd.watermark.keyed`).  Given the emitted token ``x``, its exponential
``E_x = -log r_x`` (``r_x`` the keyed uniform of ``x``) is ``p_x * Exp(1)`` under the watermark
(``min_i E_i / p_i`` is ``Exp(1)`` and independent of the argmin) and ``Exp(1)`` under the null
(text not written with this key and salt).  The log-likelihood ratio of one position is
``-log p_x - (1/p_x - 1) E_x``, so the Neyman-Pearson statistic of a text is

    ``S = sum_t w_t E_t``, ``w_t = 1/p_t - 1``,  small ``S`` = evidence of the mark,

most powerful when ``p_t`` is the generator's probability of the emitted token.  A
near-deterministic token (``p_t -> 1``) gets weight ``-> 0``: it carries no signal, where the
model-free score (:func:`ersd.watermark.detect`) counts it in full.  ``p_t`` comes from any
model with the same tokenizer (the target at the generation temperature is best); the weights
depend on the text and the model, **never on the key**, so under the null the ``E_t`` are i.i.d.
``Exp(1)`` independent of the weights and ``S`` has the generalised hypoexponential law of the
weights.  Two key-independent safeguards: weights are capped at ``max_weight`` (a token the
weighting model finds very unlikely but the generator did not would otherwise dominate), and
positions whose weight is below ``max(w) / weight_ratio`` are left out (they carry under
``1/weight_ratio`` of a full token's evidence; this bounds the cost below).

**The exact p-value** ``P(sum_i w_i E_i <= s)`` (:func:`hypoexp_cdf`), by uniformisation: with
``L = max_i 1/w_i``, ``sum_i w_i E_i`` is the time a Poisson process of rate ``L`` takes to
finish ``T = sum_i G_i`` trials, ``G_i`` geometric with success probability ``q_i = 1/(w_i L)``,
so ``P(S <= s) = sum_t P(T = t) P(N >= t)`` with ``N ~ Poisson(L s)``.  Every term is
non-negative (no cancellation, unlike the distinct-rate formula, whose alternating terms lose
every digit when weights are close): ``P(T = t)`` is built by ``n`` first-order recurrences
(:func:`scipy.signal.lfilter`, rescaled per stage), the Poisson tail by
:func:`scipy.stats.poisson.logsf`.  The sum is truncated where the Poisson tail bound is below
``1e-12`` of the result (checked, else extended), so the p-value is exact to about 1e-11
relative, down to ~1e-290 (below that it is reported as 0).  Cost ``O(n * L * s)``; where that
would exceed :data:`MAX_WORK` (long texts with a large ``s``, i.e. p-values far from small) the
p-value is Chernoff's bound instead, conservative (:func:`chernoff_log_cdf`).

**Expected evidence** (:attr:`WeightedDetection.expected_power`): had the same tokens been
written with the key, ``S`` would be ``sum_t w_t p_t Exp(1)``, again hypoexponential; the
probability that it falls below the null's ``threshold`` quantile (per salt, Šidák-adjusted) is
the power this text's entropy allows.  A text not detected whose expected power is under
``min_power`` is reported as **not enough signal**, not as *not watermarked*.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.signal import lfilter
from scipy.stats import poisson

from ersd.errors import WatermarkError
from ersd.watermark.detect import DEFAULT_MIN_TOKENS, _check_number, _checked_input, sidak
from ersd.watermark.settings import Watermark

#: default cap of a token's weight ``1/p - 1`` (p below ~0.048 counts as 0.048)
DEFAULT_MAX_WEIGHT = 20.0
#: positions weighing under ``max(w) / DEFAULT_WEIGHT_RATIO`` are left out
DEFAULT_WEIGHT_RATIO = 1000.0
#: below this expected power an undetected text is "not enough signal"
DEFAULT_MIN_POWER = 0.9
_TINY = 1e-290
#: the exact tail's work bound (array cells x stages); beyond it, Chernoff's conservative bound
MAX_WORK = 3e8


def hypoexp_log_cdf(s: float, weights: Sequence[float] | np.ndarray) -> float:
    """``log P(sum_i w_i E_i <= s)`` for i.i.d. ``E_i ~ Exp(1)``, positive ``w_i`` (module doc:
    uniformisation, non-negative terms only; ``-inf`` below ~1e-290)."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if len(w) == 0:
        return 0.0
    if not np.all(np.isfinite(w)) or w.min() <= 0:
        raise WatermarkError("hypoexponential weights must be positive and finite")
    if not s > 0:
        return -math.inf
    rate = 1.0 / w.min()
    q = (1.0 / w) / rate  # in (0, 1]
    mu = rate * float(s)
    n = len(w)
    if (mu + 12.0 * math.sqrt(mu) + n) * n > MAX_WORK:
        return chernoff_log_cdf(s, w)
    extra = 12.0 * math.sqrt(mu) + 40.0
    while True:
        k = math.ceil(max(mu, 0.0) + extra) + n + 1
        f = np.zeros(k + 1)
        f[0] = 1.0
        log_scale = 0.0
        for qi in q:
            # T_i = T_{i-1} + G_i, G_i >= 1 geometric(qi): g[t] = (1 - qi) g[t-1] + qi f[t-1]
            f = lfilter([0.0, qi], [1.0, -(1.0 - qi)], f)
            top = f.max()
            if top <= 0:
                return -math.inf
            f /= top
            log_scale += math.log(top)
        t = np.arange(k + 1)
        live = f > 0
        terms = np.log(f[live]) + poisson.logsf(t[live] - 1, mu)
        terms = terms[np.isfinite(terms)]
        if len(terms) == 0:
            return -math.inf
        top_term = terms.max()
        log_sum = top_term + math.log(np.exp(terms - top_term).sum()) + log_scale
        # the truncated terms sum to at most P(T > k) P(N >= k+1) <= P(N >= k + 1)
        log_err = float(poisson.logsf(k, mu))
        if log_err < log_sum + math.log(1e-12) or log_sum < math.log(_TINY):
            return min(0.0, log_sum) if log_sum >= math.log(_TINY) else -math.inf
        extra *= 2.0


def chernoff_log_cdf(s: float, weights: np.ndarray) -> float:
    """A conservative bound on ``log P(sum_i w_i E_i <= s)``: Chernoff's
    ``min_{theta > 0} theta s - sum_i log(1 + theta w_i)`` (0 at or above the mean)."""
    w = np.asarray(weights, dtype=np.float64)
    if s >= w.sum():
        return 0.0
    from scipy.optimize import brentq

    def slope(theta: float) -> float:
        return float(s - (w / (1.0 + theta * w)).sum())

    hi = 1.0
    while slope(hi) < 0:
        hi *= 2.0
    theta = brentq(slope, 0.0, hi, xtol=1e-12 * hi)
    return min(0.0, float(theta * s - np.log1p(theta * w).sum()))


def hypoexp_cdf(s: float, weights: Sequence[float] | np.ndarray) -> float:
    """``P(sum_i w_i E_i <= s)`` for i.i.d. ``E_i ~ Exp(1)`` (:func:`hypoexp_log_cdf`)."""
    return float(math.exp(hypoexp_log_cdf(s, weights)))


def hypoexp_quantile(alpha: float, weights: Sequence[float] | np.ndarray) -> float:
    """The ``s`` with ``P(sum_i w_i E_i <= s) = alpha`` (bisection on ``log s``, to 1e-7)."""
    w = np.asarray(weights, dtype=np.float64)
    target = math.log(alpha)
    lo, hi = 0.0, float(w.sum())
    while hypoexp_log_cdf(hi, w) < target:
        lo, hi = hi, hi * 2.0
    lo = max(lo, hi * 1e-12)
    while hypoexp_log_cdf(lo, w) > target:
        lo /= 4.0
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if hypoexp_log_cdf(mid, w) < target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-7:
            break
    return hi


def weights_from_probs(probs: np.ndarray, max_weight: float = DEFAULT_MAX_WEIGHT) -> np.ndarray:
    """The likelihood-ratio weight ``min(1/p - 1, max_weight)`` of each emitted token's
    probability (``nan`` -- no probability known -- gives weight 0)."""
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.minimum(1.0 / p - 1.0, max_weight)
    return np.where(np.isfinite(w) & (w > 0), w, 0.0)


@dataclass(frozen=True)
class WeightedDetection:
    """What :func:`detect_weighted` found: ``p_value`` exact and corrected for the salts tried;
    ``score`` the best salt's ``sum w_t E_t`` (small = marked); ``scored`` positions scored by
    the model-free rule, ``weighted`` those with a weight kept; ``expected_power`` the chance a
    text with these tokens written with the key would be detected at ``threshold``; ``verdict``
    one of ``watermarked``, ``not watermarked``, ``not enough signal``."""

    p_value: float
    score: float
    scored: int
    weighted: int
    salt: int
    salt_p_value: float
    salts_tried: int
    threshold: float
    expected_power: float
    min_power: float
    weights: list[float]
    positions: list[int]

    @property
    def watermarked(self) -> bool:
        return self.p_value <= self.threshold

    @property
    def verdict(self) -> str:
        if self.watermarked:
            return "watermarked"
        if self.expected_power < self.min_power:  # False for nan (not computed)
            return "not enough signal"
        return "not watermarked"

    def as_dict(self) -> dict[str, object]:
        return {
            "verdict": self.verdict,
            "watermarked": self.watermarked,
            "p_value": self.p_value,
            "score": self.score,
            "scored_tokens": self.scored,
            "weighted_tokens": self.weighted,
            "salt": self.salt,
            "salt_p_value": self.salt_p_value,
            "salts_tried": self.salts_tried,
            "threshold": self.threshold,
            "expected_power": self.expected_power,
        }


def token_probabilities(
    probs_or_logits: Any, token_ids: np.ndarray, kind: str, temperature: float
) -> np.ndarray:
    """Each emitted token's probability from ``probs_or_logits`` (module doc of
    :func:`detect_weighted`), checked."""
    if kind not in ("probs", "logits"):
        raise WatermarkError(f"kind must be 'probs' or 'logits', got {kind!r}")
    try:
        arr = np.asarray(
            probs_or_logits.detach().float().cpu().numpy()
            if hasattr(probs_or_logits, "detach")
            else probs_or_logits,
            dtype=np.float64,
        )
    except (TypeError, ValueError):
        raise WatermarkError(
            "probs_or_logits must be numbers: one probability per token, or a [tokens, vocab] "
            f"array of distributions or logits; got {type(probs_or_logits).__name__}"
        ) from None
    n = len(token_ids)
    if arr.ndim not in (1, 2) or arr.shape[0] != n:
        raise WatermarkError(
            f"probs_or_logits must have one row per token ({n}), got shape {arr.shape}"
        )
    if arr.ndim == 1:
        if kind == "logits":
            raise WatermarkError("logits must be a [tokens, vocab] array (one row per token)")
        p = arr
    else:
        if int(token_ids.max()) >= arr.shape[1]:
            raise WatermarkError(
                f"a token id ({int(token_ids.max())}) is outside the {arr.shape[1]}-wide "
                "distributions: a tokenizer mismatch?"
            )
        rows = np.arange(n)
        if kind == "logits":
            z = arr / temperature
            z = z - np.nanmax(z, axis=1, keepdims=True)
            log_p = z[rows, token_ids] - np.log(np.exp(z).sum(axis=1))
            p = np.exp(log_p)
        else:
            sums = arr.sum(axis=1)
            ok = np.isnan(sums) | (np.abs(sums - 1.0) < 1e-3)
            if not ok.all():
                raise WatermarkError(
                    "probability rows must sum to 1 (these look like logits: pass kind='logits')"
                )
            p = arr[rows, token_ids]
    bad = ~np.isnan(p) & ((p < 0) | (p > 1))
    if bad.any():
        raise WatermarkError(
            f"token probabilities must lie in [0, 1] (nan: unknown), got {p[bad][0]!r}"
        )
    return p


def detect_weighted(
    token_ids: Sequence[int],
    watermark: Watermark,
    probs_or_logits: Any,
    *,
    kind: str = "probs",
    temperature: float = 1.0,
    salt: int | None = None,
    threshold: float = 0.01,
    vocab_size: int | None = None,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    prompt: Sequence[int] | None = None,
    max_weight: float = DEFAULT_MAX_WEIGHT,
    weight_ratio: float = DEFAULT_WEIGHT_RATIO,
    min_power: float = DEFAULT_MIN_POWER,
    expected: bool = True,
) -> WeightedDetection:
    """Detect ``watermark`` in ``token_ids`` with each token weighted by a model's probability of
    it (module doc).  ``probs_or_logits``: one probability per token (``nan`` where unknown), or
    a ``[len(token_ids), vocab]`` array of next-token distributions (``kind="probs"``) or logits
    (``kind="logits"``, softmaxed at ``temperature``) whose row ``t`` predicts token ``t``.
    Positions scored are :func:`ersd.watermark.detect`'s; other arguments as there.
    ``expected=False`` skips the expected power (``nan``; the verdict is then never *not enough
    signal*), which costs a quantile search."""
    max_weight = _check_number(max_weight, "max_weight", 1e-6, 1e6, integer=False)
    weight_ratio = _check_number(weight_ratio, "weight_ratio", 1.0, 1e6, integer=False)
    min_power = _check_number(min_power, "min_power", 0.0, 1.0, integer=False)
    temperature = _check_number(temperature, "temperature", 1e-3, 1e3, integer=False)
    ids, windows, tokens, positions, salts, _ = _checked_input(
        token_ids, watermark, salt, threshold, vocab_size, min_tokens, prompt
    )
    p = token_probabilities(probs_or_logits, ids, kind, temperature)
    w = weights_from_probs(p[positions], max_weight)
    keep = w >= (w.max() / weight_ratio if w.max() > 0 else math.inf)
    kept = np.flatnonzero(keep)
    if len(kept) == 0:
        return WeightedDetection(
            p_value=1.0, score=0.0, scored=len(tokens), weighted=0, salt=salts[0],
            salt_p_value=1.0, salts_tried=len(salts), threshold=float(threshold),
            expected_power=0.0, min_power=min_power, weights=[], positions=[],
        )  # fmt: skip
    wk = w[kept]
    prf = watermark.prf(salts[0])
    u = prf.uniform_at(windows[kept], np.asarray(tokens, dtype=np.int64)[kept], salts=salts)
    scores = (-np.log(u)) @ wk  # [salts]
    i = int(np.argmin(scores))  # the smallest S has the smallest p-value (same weights)
    log_p = hypoexp_log_cdf(float(scores[i]), wk)
    p_salt = math.exp(log_p)
    power = math.nan
    if expected:
        per_salt = -math.expm1(math.log1p(-threshold) / len(salts))
        s_alpha = hypoexp_quantile(per_salt, wk)
        alt = wk * p[np.asarray(positions)[kept]]
        # floored up to 1/weight_ratio of the largest: S only grows, so the power is at worst
        # underestimated (towards "not enough signal"), and the cost stays bounded
        alt = np.maximum(alt, alt.max() / weight_ratio)
        power = hypoexp_cdf(s_alpha, alt)
    return WeightedDetection(
        p_value=sidak(p_salt, len(salts)),
        score=float(scores[i]),
        scored=len(tokens),
        weighted=len(kept),
        salt=salts[i],
        salt_p_value=p_salt,
        salts_tried=len(salts),
        threshold=float(threshold),
        expected_power=float(power),
        min_power=min_power,
        weights=wk.tolist(),
        positions=np.asarray(positions)[kept].tolist(),
    )


def model_token_probs(
    model: Any, token_ids: Sequence[int], prompt: Sequence[int] | None = None,
    temperature: float = 1.0,
) -> np.ndarray:  # fmt: skip
    """Each token's probability under ``model`` (an :class:`ersd.LanguageModel`) at
    ``temperature``, after ``prompt`` when given, else after the text's own earlier tokens (the
    first token then has no probability: ``nan``).  One forward pass over the text."""
    import torch

    ids = [int(t) for t in token_ids]
    head = [int(t) for t in prompt] if prompt else ids[:1]
    rest = ids if prompt else ids[1:]
    session = model.start(head)
    with torch.no_grad():
        logits = session.score(rest, list(range(-1, len(rest) - 1)))
    z = logits[: len(rest)].float() / temperature
    logp = torch.log_softmax(z, dim=-1)
    probs = logp.gather(1, torch.tensor(rest, dtype=torch.long).view(-1, 1)).exp()
    out = probs.view(-1).cpu().numpy().astype(np.float64)
    return out if prompt else np.concatenate([[np.nan], out])


def detect_with_model(
    token_ids: Sequence[int],
    watermark: Watermark,
    model: Any,
    *,
    temperature: float = 1.0,
    prompt: Sequence[int] | None = None,
    **kwargs: Any,
) -> WeightedDetection:
    """:func:`detect_weighted` with the probabilities of ``model`` run over the text (after
    ``prompt`` when known) at ``temperature`` -- the generation's, when known."""
    temperature = _check_number(temperature, "temperature", 1e-3, 1e3, integer=False)
    p = model_token_probs(model, token_ids, prompt, temperature)
    return detect_weighted(token_ids, watermark, p, prompt=prompt, **kwargs)
