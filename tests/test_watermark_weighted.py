"""Model-weighted watermark detection (ersd.watermark.weighted): the exact hypoexponential law,
the null calibration with a broken variant, power on low-entropy text, "not enough signal".

Null tests: on ``N_NULL`` random unwatermarked sequences with random weights, the p-values are
tested against U(0, 1) by Kolmogorov-Smirnov at ``KS_ALPHA = 1e-3``, and the false-positive
counts at nominal 1% and 0.1% by a one-sided exact binomial test at ``BINOM_ALPHA = 1e-3``.  The
same tests at the same size must reject a detector whose weights peek at the race score.  Seeds
are fixed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import gammainc

import ersd
from ersd.errors import WatermarkError
from ersd.watermark import Watermark, detect
from ersd.watermark.detect import scored_windows, sidak
from ersd.watermark.weighted import (
    chernoff_log_cdf,
    detect_weighted,
    detect_with_model,
    hypoexp_cdf,
    hypoexp_log_cdf,
    hypoexp_quantile,
    model_token_probs,
)
from tests.toy import table_model

KS_ALPHA = 1e-3
BINOM_ALPHA = 1e-3
N_NULL = 3000
KEY = bytes(range(32))


def _wm(**kw: object) -> Watermark:
    return Watermark(key=KEY, **kw)  # type: ignore[arg-type]


def keyed_race(wm: Watermark, dists: np.ndarray, prompt: list[int], salt: int, seed: int) -> list:
    """Tokens drawn by the keyed race from ``dists[t]`` (one row per position) as the generator
    draws them: ``argmin -log U / p`` with ``U`` the PRF of the window; a repeated window uses
    fresh noise (keyed.py)."""
    rng = np.random.default_rng(seed)
    prf = wm.prf(salt)
    window = wm.initial_window(prompt)
    seen: set[tuple[int, ...]] = set()
    out: list[int] = []
    for p in dists:
        u = rng.random(len(p)) if window in seen else prf.uniforms(window, len(p))
        seen.add(window)
        with np.errstate(divide="ignore"):
            x = int(np.argmin(-np.log(u) / p))
        out.append(x)
        window = (*window[1:], x)
    return out


def low_entropy_dists(n: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """Rows that are mostly near-deterministic (top token 0.9-0.999), a fifth uncertain (a few
    plausible tokens)."""
    rows = []
    for _ in range(n):
        if rng.random() < 0.2:
            p = np.full(vocab, 1e-4)
            p[rng.choice(vocab, 3, replace=False)] += rng.dirichlet(np.ones(3))
        else:
            top = rng.uniform(0.9, 0.999)
            p = rng.dirichlet(np.ones(vocab)) * (1 - top)
            p[rng.integers(vocab)] += top
        rows.append(p / p.sum())
    return np.asarray(rows)


# --- the exact law -----------------------------------------------------------------------------


def test_hypoexp_equals_gamma_for_equal_weights_and_the_two_rate_formula() -> None:
    for n, w, s in [(5, 2.0, 1.0), (64, 1.0, 20.0), (64, 1.0, 64.0), (200, 3.0, 100.0)]:
        assert hypoexp_cdf(s, [w] * n) == pytest.approx(gammainc(n, s / w), rel=1e-9)
    a, b, s = 1.0, 3.0, 2.0
    exact = 1 - (b * math.exp(-s / b) - a * math.exp(-s / a)) / (b - a)
    assert hypoexp_cdf(s, [a, b]) == pytest.approx(exact, rel=1e-10)
    # close weights: the distinct-rate formula loses every digit, uniformisation does not
    close = [1.0, 1.0 + 1e-12, 1.0 - 1e-12]
    assert hypoexp_cdf(0.5, close) == pytest.approx(gammainc(3, 0.5), rel=1e-9)


def test_hypoexp_matches_monte_carlo_with_uneven_weights() -> None:
    rng = np.random.default_rng(1)
    w = rng.uniform(0.02, 20, 30)
    sums = rng.exponential(size=(200_000, 30)) @ w
    for q in (0.01, 0.2, 0.5, 0.9):
        s = float(np.quantile(sums, q))
        se = math.sqrt(q * (1 - q) / len(sums))
        assert abs(hypoexp_cdf(s, w) - q) < 5 * se
    s01 = hypoexp_quantile(0.01, w)
    assert hypoexp_cdf(s01, w) == pytest.approx(0.01, rel=1e-5)


def test_the_chernoff_fallback_is_conservative_and_long_texts_stay_cheap() -> None:
    rng = np.random.default_rng(2)
    w = rng.uniform(0.05, 20, 50)
    for s in (1.0, 20.0, 100.0, float(w.sum())):
        assert chernoff_log_cdf(s, w) >= hypoexp_log_cdf(s, w)
    # 6,000 tokens whose exact tail would need ~1e10 cells: the bound answers, at most 1
    ids = rng.integers(0, 5000, 6000).tolist()
    res = detect_weighted(ids, _wm(num_salts=2), np.exp(rng.uniform(-9, 0, 6000)))
    assert 0 < res.p_value <= 1 and not res.watermarked


# --- null calibration --------------------------------------------------------------------------


def _null_sequences(n_seq: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Random ids (vocab 5000, length 24-40) and random token probabilities (log-uniform)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_seq):
        n = int(rng.integers(24, 41))
        out.append((rng.integers(0, 5000, n), np.exp(rng.uniform(np.log(0.01), 0, n))))
    return out


def _peeking_p_value(ids: np.ndarray, wm: Watermark, probs: np.ndarray) -> float:
    """The broken variant: weights multiplied by 4 where the race score is large (``E`` small),
    i.e. weights that depend on the key."""
    windows, tokens, positions = scored_windows(ids, wm.context_width, None, wm.context_width)
    salts = list(range(wm.num_salts))
    e = -np.log(wm.prf(0).uniform_at(windows, np.asarray(tokens), salts=salts))
    w = np.minimum(1 / probs[positions] - 1, 20.0)
    best = 1.0
    for row in e:
        wk = np.where(w > 0.02, w, 0.02) * np.where(row < 0.7, 4.0, 1.0)
        best = min(best, hypoexp_cdf(float(row @ wk), wk))
    return sidak(best, len(salts))


def _calibration(p_values: np.ndarray) -> tuple[float, float, float]:
    """(KS p-value vs U(0,1), binomial p of the FP count at 1%, at 0.1%) -- one-sided."""
    ks = stats.kstest(p_values, "uniform").pvalue
    b1 = stats.binomtest(int((p_values <= 0.01).sum()), len(p_values), 0.01, "greater").pvalue
    b2 = stats.binomtest(int((p_values <= 0.001).sum()), len(p_values), 0.001, "greater").pvalue
    return float(ks), float(b1), float(b2)


def test_weighted_null_is_calibrated_and_peeking_weights_are_caught() -> None:
    wm = _wm(num_salts=4)
    seqs = _null_sequences(N_NULL, seed=7)
    good = np.array(
        [detect_weighted(i.tolist(), wm, p, min_tokens=1, expected=False).p_value for i, p in seqs]
    )
    ks, b1, b2 = _calibration(good)
    assert ks > KS_ALPHA and b1 > BINOM_ALPHA and b2 > BINOM_ALPHA, (ks, b1, b2)
    # the FPR at 1% within its 99.9% Clopper-Pearson interval around the nominal rate
    lo, hi = stats.binomtest(int((good <= 0.01).sum()), N_NULL).proportion_ci(0.999)
    assert lo <= 0.01 <= hi
    broken = np.array([_peeking_p_value(i, wm, p) for i, p in seqs[:1000]])
    ks_b, b1_b, _ = _calibration(broken)
    assert ks_b < KS_ALPHA and b1_b < BINOM_ALPHA, (ks_b, b1_b)


# --- power, "not enough signal" ----------------------------------------------------------------


def test_weighting_beats_the_model_free_score_on_low_entropy_text() -> None:
    """Texts drawn by the keyed race from mostly near-deterministic distributions: with the true
    probabilities as weights, more texts are detected at 1% than by the model-free detector
    (paired over the same 60 texts, one-sided sign test at 1e-3)."""
    wm = _wm(num_salts=4)
    rng = np.random.default_rng(3)
    prompt = [11, 12, 13, 14]
    better = worse = 0
    hits_w = hits_f = 0
    for i in range(60):
        dists = low_entropy_dists(40, 200, rng)
        ids = keyed_race(wm, dists, prompt, salt=i % 4, seed=i)
        probs = dists[np.arange(len(ids)), ids]
        pw = detect_weighted(ids, wm, probs, prompt=prompt, expected=False).p_value
        pf = detect(ids, wm, prompt=prompt).p_value
        hits_w += pw <= 0.01
        hits_f += pf <= 0.01
        better += pw < pf
        worse += pw > pf
    assert hits_w > hits_f, (hits_w, hits_f)
    assert stats.binomtest(better, better + worse, 0.5, "greater").pvalue < 1e-3


def test_near_deterministic_text_is_not_enough_signal() -> None:
    wm = _wm(num_salts=4)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 500, 40).tolist()
    # unmarked, every token nearly certain: undetected and too little signal to say "not marked"
    sure = detect_weighted(ids, wm, np.full(40, 0.995), min_tokens=1)
    assert not sure.watermarked and sure.expected_power < 0.2
    assert sure.verdict == "not enough signal"
    # the same ids with uncertain tokens: enough signal, so the verdict is "not watermarked"
    open_ = detect_weighted(ids, wm, np.full(40, 0.05), min_tokens=1)
    assert open_.expected_power > 0.99 and open_.verdict == "not watermarked"
    # a marked text with the same high entropy is "watermarked"
    dists = rng.dirichlet(np.full(300, 0.3), size=40)
    marked = keyed_race(wm, dists, [1, 2, 3, 4], salt=2, seed=0)
    probs = dists[np.arange(40), marked]
    found = detect_weighted(marked, wm, probs, prompt=[1, 2, 3, 4])
    assert found.verdict == "watermarked" and found.salt == 2


def test_probabilities_from_distributions_logits_and_a_model() -> None:
    torch.manual_seed(0)
    model = table_model(40, seed=2)
    wm = _wm(num_salts=2)
    prompt = [3, 4, 5]
    out = ersd.generate(model, None, prompt, max_new_tokens=60, seed=1, watermark=wm).tokens
    probs = model_token_probs(model, out, prompt=prompt)
    seqs = [prompt + out[:t] for t in range(len(out))]
    direct = torch.softmax(model.fn(seqs), dim=-1).numpy()
    np.testing.assert_allclose(probs, direct[np.arange(len(out)), out], rtol=1e-5)
    via_probs = detect_weighted(out, wm, direct, prompt=prompt)
    via_logits = detect_weighted(out, wm, model.fn(seqs), kind="logits", prompt=prompt)
    via_model = detect_with_model(out, wm, model, prompt=prompt)
    assert via_probs.p_value == pytest.approx(via_logits.p_value, rel=1e-4)
    assert via_model.p_value == pytest.approx(via_probs.p_value, rel=1e-4)
    assert via_model.watermarked
    blind = model_token_probs(model, out)  # no prompt: the first token has no probability
    alone = torch.softmax(model.fn([out[:t] for t in range(1, len(out))]), dim=-1).numpy()
    assert math.isnan(blind[0])
    np.testing.assert_allclose(blind[1:], alone[np.arange(len(out) - 1), out[1:]], rtol=1e-5)


@pytest.mark.parametrize(
    ("probs", "kw", "match"),
    [
        ([0.5] * 10, {}, "one row per token"),
        (np.full((20, 30), 2.0), {}, "look like logits"),
        (np.full((20, 3), 0.5), {}, "tokenizer mismatch"),
        ([0.5] * 20, {"kind": "logits"}, "logits must be"),
        ([0.5] * 20, {"kind": "z"}, "kind must be"),
        ([1.5] * 20, {}, "must lie in"),
        ("abc", {}, "must be numbers|one row per token"),
        ([0.5] * 20, {"max_weight": -1}, "max_weight"),
        ([0.5] * 20, {"temperature": 0}, "temperature"),
    ],
)
def test_weighted_refuses_bad_input(probs: object, kw: dict, match: str) -> None:
    with pytest.raises(WatermarkError, match=match):
        detect_weighted(list(range(20)), _wm(num_salts=2), probs, **kw)
