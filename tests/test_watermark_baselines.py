"""The engines' watermark schemes as baselines (ersd.methods.watermark_baselines): exactness,
what each marks, the two-key detector and its null, the request checks, the compare benchmark.

Statistical tests state their level: the output-law tests reuse the exactness suite's chi-square
at ``ALPHA = 1e-4`` with ``N = 3000`` draws, one uniformly random key per draw; the detectors'
null tests are Kolmogorov-Smirnov tests against U(0, 1) at ``KS_ALPHA = 1e-3``.  Each has a
deliberately broken variant that the same test at the same size must reject.  Seeds are fixed.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import gammaincc

import ersd
from ersd.errors import UnsupportedTreeError, WatermarkError
from ersd.methods import get_method
from ersd.methods.base import NodeDecision
from ersd.methods.catalog import CATALOG, WATERMARK_BASELINES, method_info
from ersd.methods.watermark_baselines import DualKeySD, TargetOnlyWatermarkSD
from ersd.race import STREAM_KEY_A, STREAM_RACE, race_winner
from ersd.watermark import Watermark, detect, detect_dual
from ersd.watermark.detect import weighted_gamma_p_value
from tests.exactness_util import ALPHA, config_seed, exact_law, gof_test, make_drafts, make_target
from tests.toy import mixed_draft, table_model

KS_ALPHA = 1e-3
N = 3000
KEY = bytes(range(32))


def _random_key(i: int) -> bytes:
    return hashlib.sha256(b"baseline-key" + i.to_bytes(8, "little")).digest()


# --- exactness: each baseline samples the target's law over a random key ----------------------

VOCAB, PROMPT, LENGTH = 4, [1, 2], 4
TARGET = make_target(VOCAB, seed=0)
DRAFT = make_drafts(TARGET, seed=100)["mild"]


def _law_p(method: object, tree: str) -> float:
    law = exact_law(TARGET, PROMPT, LENGTH, {"temperature": 1.0})
    t, d = TARGET.model(), DRAFT.model()
    counts: Counter[tuple[int, ...]] = Counter()
    base = config_seed("watermark-baseline-law", getattr(method, "name", method), tree)
    for s in range(base, base + N):
        wm = Watermark(key=_random_key(s), context_width=1, num_salts=1)
        out = ersd.generate(
            t, d, PROMPT, max_new_tokens=LENGTH, tree=tree, seed=s, method=method, watermark=wm
        ).tokens
        counts[tuple(out)] += 1
    return gof_test(counts, law).pvalue


@pytest.mark.parametrize(
    ("method", "tree"),
    [("sd-wm-target", "chain:3"), ("specinfer-wm-target", "multi:2x2"), ("sd-dual-key", "chain:3")],
)
def test_baseline_output_law_is_the_targets(method: str, tree: str) -> None:
    assert _law_p(method, tree) >= ALPHA


class _ResidualRacesOverP(TargetOnlyWatermarkSD):
    """Mutant: the correction is the keyed race's winner over ``p`` instead of the residual (the
    tempting way to 'watermark the correction')."""

    name = "mutant-residual-over-p"

    def verify_node(self, target_probs, draft_probs, children, noise):  # type: ignore[no-untyped-def]
        d = super().verify_node(target_probs, draft_probs, children, noise)
        if d.child is None:
            return type(d)(None, race_winner(target_probs, noise.exponentials(STREAM_RACE)))
        return d


class _CoinFromTheDraftRace(DualKeySD):
    """Mutant: the acceptance coin is the drafted token's own key-A uniform ``exp(-E_x)``
    instead of an independent one (the draft's noise reused by the verifier)."""

    name = "mutant-coin-from-draft-race"

    def verify_node(self, target_probs, draft_probs, children, noise):  # type: ignore[no-untyped-def]
        x = int(children[0])
        u = float(torch.exp(-noise.exponentials(STREAM_KEY_A)[x]))
        p, q = target_probs.to(torch.float64), draft_probs.to(torch.float64)
        if u < self.acceptance_probability(p, q, x):
            return NodeDecision(0, x)
        return NodeDecision(None, self.sample_residual(self.residual(p, q), noise))


@pytest.mark.parametrize(
    "mutant", [_ResidualRacesOverP(), _CoinFromTheDraftRace()], ids=lambda m: m.name
)
def test_broken_baselines_are_rejected(mutant: object) -> None:
    assert _law_p(mutant, "chain:3") < ALPHA


# --- what each scheme marks ---------------------------------------------------------------------

BIG = table_model(200, 0, scale=1.0)
GOOD = mixed_draft(BIG, table_model(200, 1), 0.3)


def _gen(method: str, wm: Watermark, draft: object = GOOD, **kw: object) -> ersd.GenerationResult:
    tree = "multi:2x3" if method == "specinfer-wm-target" else "chain:4"
    return ersd.generate(
        BIG, draft, [3], max_new_tokens=128, tree=tree, method=method, watermark=wm, **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["sd-wm-target", "specinfer-wm-target"])
def test_target_only_marks_corrections_and_bonus_only(method: str) -> None:
    wm = Watermark(key=KEY, num_salts=1)
    r = _gen(method, wm, seed=4)
    d = detect(r.tokens, wm, per_token=True)
    assert d.p_value < 1e-6  # corrections and bonus tokens carry the mark
    # a perfect draft (q = p) is always accepted: only the bonus after each full chain is marked,
    # so the same text length carries far less evidence than a fully marked one
    perfect = _gen(method, wm, draft=BIG, seed=4)
    full = ersd.generate(BIG, None, [3], max_new_tokens=128, seed=4, watermark=wm)
    assert perfect.block_efficiency > 3
    p_perfect = detect(perfect.tokens, wm).p_value
    assert p_perfect > 1e6 * detect(full.tokens, wm).p_value
    # the scored positions of accepted drafts look unwatermarked: mean score ~1 (Exp(1))
    accepted = {i for s, i in _accepted_positions(perfect)}
    scores = detect(perfect.tokens, wm, per_token=True)
    pairs = zip(scores.positions, scores.token_scores, strict=True)
    acc = [v for pos, v in pairs if pos in accepted]
    assert len(acc) > 40 and abs(np.mean(acc) - 1) < 0.4


def _accepted_positions(r: ersd.GenerationResult) -> list[tuple[int, int]]:
    """(step, position) of every accepted draft token in ``r``."""
    out, pos = [], 0
    for k, step in enumerate(r.steps):
        for j in range(step.num_accepted):
            out.append((k, pos + j))
        pos += len(step.tokens)
    return out


def test_dual_key_text_is_found_by_the_two_key_detector_only() -> None:
    wm = Watermark(key=KEY, num_salts=1)
    r = _gen("sd-dual-key", wm, seed=2)
    assert r.block_efficiency > 1.5  # drafts were accepted: both keys are in the text
    for alpha in (0.1, 0.5):
        assert detect_dual(r.tokens, wm, alpha=alpha).p_value < 1e-6
    # each derived key alone sees part of it; the master key sees nothing
    assert detect(r.tokens, wm).p_value > 1e-3
    assert detect(r.tokens, wm.derive("key_a")).p_value < 1e-3
    # another key sees nothing with the two-key detector either
    assert detect_dual(r.tokens, Watermark(key=_random_key(1), num_salts=1)).p_value > 1e-3


def test_watermarked_ersd_text_is_the_autoregressive_watermarked_text() -> None:
    """Baseline (c) is target-only decoding with a watermark; ERSD equals it, the others do not."""
    wm = Watermark(key=KEY)
    ar = ersd.generate(BIG, None, [3], max_new_tokens=64, seed=1, watermark=wm).tokens
    kw = dict(max_new_tokens=64, seed=1, watermark=wm, tree="chain:4")
    assert ersd.generate(BIG, GOOD, [3], **kw).tokens == ar  # type: ignore[arg-type]
    assert ersd.generate(BIG, GOOD, [3], method="sd-wm-target", **kw).tokens != ar  # type: ignore[arg-type]


# --- derived keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["ersd-v1", "vllm-philox"])
def test_derived_keys_differ_and_keep_the_settings(scheme: str) -> None:
    wm = Watermark(key=KEY if scheme == "ersd-v1" else 987654321, scheme=scheme, context_width=3)
    a, b = wm.derive("key_a"), wm.derive("key_b")
    assert len({a.key, b.key, wm.key}) == 3
    assert a.context_width == 3 and a.scheme == scheme and a.num_salts == wm.num_salts
    other = Watermark(key=_random_key(5) if scheme == "ersd-v1" else 5, scheme=scheme)
    assert other.derive("key_a").key != a.key
    assert wm.derive("key_a") == a  # deterministic
    with pytest.raises(WatermarkError, match="key_a, key_b"):
        wm.derive("key_c")


# --- the two-key detector -------------------------------------------------------------------------


def test_weighted_gamma_p_value_is_exact() -> None:
    rng = np.random.default_rng(0)
    for n, alpha in [(1, 0.1), (20, 0.1), (20, 0.3), (200, 0.9)]:
        x, y = rng.gamma(n, size=400_000), rng.gamma(n, size=400_000)
        s = (1 - alpha) * x + alpha * y
        for q in (0.5, 0.99, 0.999):
            score = float(np.quantile(s, q))
            mc = float(np.mean(s >= score))
            se = np.sqrt(mc * (1 - mc) / len(s))
            assert abs(weighted_gamma_p_value(score, n, alpha) - mc) < 5 * se + 1e-6
    # closed forms at 0, 1/2 and 1
    assert weighted_gamma_p_value(30.0, 20, 0.5) == pytest.approx(gammaincc(40, 60.0), rel=1e-12)
    assert weighted_gamma_p_value(30.0, 20, 0.0) == pytest.approx(gammaincc(20, 30.0), rel=1e-12)
    # tiny p-values keep their relative accuracy (no absolute floor)
    p = weighted_gamma_p_value(300.0, 100, 0.1)
    assert 0 < p < 1e-40
    assert weighted_gamma_p_value(300.0, 100, 0.1 + 1e-9) == pytest.approx(p, rel=1e-5)


def test_dual_detector_null_is_uniform_and_skipping_repeats_matters() -> None:
    """Unwatermarked repetitive text (V = 5), one key per text: p-values U(0, 1) at both weights;
    the same texts scored without skipping repeated windows (the broken detector) are not."""
    small = table_model(5, 3, scale=2.5)
    good: dict[float, list[float]] = {0.1: [], 0.5: []}
    bad: list[float] = []
    for s in range(400):
        wm = Watermark(key=_random_key(s), context_width=2, num_salts=1)
        toks = ersd.generate(small, None, [1], max_new_tokens=64, seed=s).tokens
        for alpha in good:
            good[alpha].append(detect_dual(toks, wm, alpha=alpha, min_tokens=1).p_value)
        windows = [tuple([-1, -1, *toks][i : i + 2]) for i in range(len(toks))]
        ua = wm.derive("key_a").prf(0).uniform_at(windows, np.asarray(toks))
        ub = wm.derive("key_b").prf(0).uniform_at(windows, np.asarray(toks))
        score = (0.9 * -np.log1p(-ua) + 0.1 * -np.log1p(-ub)).sum()
        bad.append(weighted_gamma_p_value(float(score), len(toks), 0.1))
    for ps in good.values():
        assert stats.kstest(ps, "uniform").pvalue >= KS_ALPHA
    assert stats.kstest(bad, "uniform").pvalue < KS_ALPHA


def test_dual_detector_salts_and_refusals() -> None:
    wm = Watermark(key=KEY, num_salts=8)
    rng = np.random.default_rng(3)
    ps = [detect_dual(rng.integers(0, 1000, 40).tolist(), wm).p_value for _ in range(300)]
    assert stats.kstest(ps, "uniform").pvalue >= KS_ALPHA
    r = _gen("sd-dual-key", wm, seed=13)
    d = detect_dual(r.tokens, wm)
    assert d.salt == wm.salt_for(13) and d.salts_tried == 8 and d.p_value < 1e-6
    with pytest.raises(WatermarkError, match="alpha"):
        detect_dual(r.tokens, wm, alpha=1.5)
    with pytest.raises(WatermarkError, match="no tokens"):
        detect_dual([], wm)
    with pytest.raises(WatermarkError, match="too short"):
        detect_dual([1, 2, 3], wm)


# --- the catalog and the request checks -----------------------------------------------------------


def test_baselines_are_catalogued_with_sources_and_allowed_with_a_watermark() -> None:
    wm = Watermark(key=KEY)
    for name, info in WATERMARK_BASELINES.items():
        assert name not in CATALOG and method_info(name) is info
        assert info.source and info.watermark in ("target-only", "dual-key")
        assert get_method(name).name == name
    # plain SD with a watermark and a draft is still refused
    with pytest.raises(WatermarkError, match="method 'sd'"):
        ersd.generate(BIG, GOOD, [1], max_new_tokens=4, tree="chain:2", method="sd", watermark=wm)
    with pytest.raises(UnsupportedTreeError, match="sd-dual-key"):
        ersd.generate(BIG, GOOD, [1], max_new_tokens=4, tree="multi:2x2", method="sd-dual-key")


def test_baselines_without_a_watermark_are_seeded_runs() -> None:
    """No watermark: the keyed streams are plain race noise; the text is the seed's."""
    kw = dict(max_new_tokens=32, tree="chain:4", method="sd-dual-key")
    a = ersd.generate(BIG, GOOD, [2], seed=0, **kw).tokens  # type: ignore[arg-type]
    b = ersd.generate(BIG, GOOD, [2], seed=0, **kw).tokens  # type: ignore[arg-type]
    c = ersd.generate(BIG, GOOD, [2], seed=1, **kw).tokens  # type: ignore[arg-type]
    assert a == b != c


# --- the compare benchmark ----------------------------------------------------------------------


def test_compare_part_runs_every_scheme_and_reports_them() -> None:
    from ersd.bench.watermark_compare import compare_part, report_lines

    wm = Watermark(key=KEY)
    prompts = [("p0", "code", [1, 2]), ("p1", "chat", [3]), ("p2", "math", [4, 5])]
    part = compare_part(
        BIG, GOOD, prompts, wm, ["chain:4", "multi:2x2"], [1.0], 128, lambda m: None
    )
    block = part["summary"]["1.0"]
    assert block["_identity"] == {"identical": 6, "of": 6}
    names = {k for k in block if not k.startswith("_")}
    assert names == {
        "ersd-wm chain:4",
        "sd-wm-target chain:4",
        "sd-dual-key chain:4",
        "ersd-wm multi:2x2",
        "specinfer-wm-target multi:2x2",
        "ar-wm target-only",
        "ersd chain:4",
        "sd chain:4",
        "ersd multi:2x2",
    }
    assert block["ersd-wm chain:4"]["detection"]["128"]["tpr_1pct"]["rate"] == 1.0
    assert block["sd-dual-key chain:4"]["detection"]["128 alpha=0.5"]["tpr_1pct"]["rate"] == 1.0
    assert block["ersd chain:4"]["detection"]["128"]["tpr_1pct"]["rate"] == 0.0
    assert block["ar-wm target-only"]["tokens_per_call"]["mean"] == 1.0
    assert block["ersd chain:4"]["tokens_per_call"]["mean"] > 1.5
    text = "\n".join(report_lines(part))
    assert "sd-dual-key chain:4 (two-key detector, alpha=0.1)" in text and "6/6" in text
