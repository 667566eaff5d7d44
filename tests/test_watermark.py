"""Watermarked ERSD (ersd.watermark): the keyed race, its exactness, drafter / tree / batch
invariance, salts, the detector's null distribution and power, and the audit.

Statistical tests state their level: the sequence-law tests reuse the exactness suite's
chi-square at ``ALPHA = 1e-4`` with ``N = 3000`` draws; the detector's null tests are
Kolmogorov-Smirnov tests of p-values against U(0, 1) at ``KS_ALPHA = 1e-3``.  Each has a
deliberately broken variant that the same test at the same size must reject.  Seeds are fixed.
"""

from __future__ import annotations

import hashlib
import os
import stat

import numpy as np
import pytest
import torch
from scipy import stats

import ersd
from ersd.errors import WatermarkError
from ersd.race import RaceNoise, root_key
from ersd.watermark import Watermark, audit, detect, load_watermark, write_key_file
from ersd.watermark.detect import scored_windows, sidak
from ersd.watermark.keyed import WatermarkKey, WatermarkNoise
from ersd.watermark.prf import ErsdPRF, VllmPRF, philox4x64
from tests.exactness_util import ALPHA, config_seed, exact_law, gof_test, make_drafts, make_target
from tests.toy import mixed_draft, table_model

KS_ALPHA = 1e-3
N = 3000  # as the exactness suite
KEY = bytes(range(32))


def _wm(**kw: object) -> Watermark:
    return Watermark(key=KEY, **kw)  # type: ignore[arg-type]


def _random_key(i: int) -> bytes:
    """A uniformly random 256-bit key per draw (a fixed, reproducible function of i)."""
    return hashlib.sha256(b"test-key" + i.to_bytes(8, "little")).digest()


# --- the PRFs ------------------------------------------------------------------------------------


def test_philox4x64_equals_numpy_random_raw() -> None:
    for key in (0, 1, 2**64 - 1, 2**127 + 12345, 2**128 - 1):
        raw = np.random.Philox(key=key).random_raw(40)
        blocks = np.arange(1, 11, dtype=np.uint64)
        k0 = np.full(10, key & (2**64 - 1), dtype=np.uint64)
        k1 = np.full(10, key >> 64, dtype=np.uint64)
        mine = np.stack(philox4x64(blocks, k0, k1), axis=1).reshape(-1)
        assert np.array_equal(mine, raw)


@pytest.mark.parametrize("scheme", ["ersd-v1", "vllm-philox"])
def test_single_token_uniform_equals_the_whole_race(scheme: str) -> None:
    prf = ErsdPRF(KEY, 3, 4) if scheme == "ersd-v1" else VllmPRF(987654321, 3, 4)
    rng = np.random.default_rng(0)
    vocab = 1003  # not a multiple of 4
    for _ in range(5):
        window = tuple(int(t) for t in rng.integers(-1, vocab, 4))
        full = prf.uniforms(window, vocab)
        assert full.shape == (vocab,) and full.min() > 0 and full.max() < 1
        toks = rng.integers(0, vocab, 50)
        assert np.array_equal(prf.uniform_at([window] * 50, toks), full[toks])


@pytest.mark.parametrize("scheme", ["ersd-v1", "vllm-philox"])
def test_uniforms_are_uniform_and_depend_on_key_salt_and_window(scheme: str) -> None:
    def prf(key: int, salt: int) -> ErsdPRF | VllmPRF:
        if scheme == "ersd-v1":
            return ErsdPRF(_random_key(key), salt, 4)
        return VllmPRF(key, salt, 4)

    u = prf(1, 0).uniforms((5, 6, 7, 8), 20000)
    assert stats.kstest(u, "uniform").pvalue >= KS_ALPHA
    others = [
        prf(2, 0).uniforms((5, 6, 7, 8), 20000),
        prf(1, 1).uniforms((5, 6, 7, 8), 20000),
        prf(1, 0).uniforms((5, 6, 7, 9), 20000),
    ]
    for v in others:
        assert abs(stats.pearsonr(u, v)[0]) < 0.05  # independent streams (|r| ~ 0.007 by chance)
        assert not np.array_equal(u, v)


def test_vllm_salt_zero_is_vllms_own_key() -> None:
    a = VllmPRF(42, 0, 4).uniforms((1, 2, 3, 4), 64)
    b = VllmPRF(42, 1, 4).uniforms((1, 2, 3, 4), 64)
    assert not np.array_equal(a, b)
    assert np.array_equal(a, VllmPRF(42, 0, 4).uniforms((1, 2, 3, 4), 64))


# --- the output law: exact under a uniformly random key --------------------------------------

#: V = 4 and a window of one token: windows repeat within a 4-token text in ~45% of draws, so
#: the repeated-window rule is exercised throughout
VOCAB, PROMPT, LENGTH = 4, [1, 2], 4
TARGET = make_target(VOCAB, seed=0)
DRAFT = make_drafts(TARGET, seed=100)["mild"]


def _law_test(tree: str | None, seeds: range) -> float:
    law = exact_law(TARGET, PROMPT, LENGTH, {"temperature": 1.0})
    t, d = TARGET.model(), DRAFT.model()
    counts: dict[tuple[int, ...], int] = {}
    for s in seeds:
        wm = Watermark(key=_random_key(s), context_width=1, num_salts=1)
        out = ersd.generate(
            t,
            d if tree else None,
            PROMPT,
            max_new_tokens=LENGTH,
            tree=tree or "chain:1",
            seed=s,
            watermark=wm,
        ).tokens
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    from collections import Counter

    return gof_test(Counter(counts), law).pvalue


@pytest.mark.parametrize("tree", [None, "chain:3", "multi:2x2"])
def test_watermarked_output_law_is_the_targets(tree: str | None) -> None:
    base = config_seed("watermark-law", tree)
    assert _law_test(tree, range(base, base + N)) >= ALPHA


def test_reusing_noise_at_repeated_windows_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a repeated window races on its keyed noise again (no fallback)."""
    monkeypatch.setattr(WatermarkKey, "repeated", property(lambda self: False))
    base = config_seed("watermark-law", None)
    assert _law_test(None, range(base, base + N)) < ALPHA


def test_repeated_windows_are_common_in_the_law_test() -> None:
    """The law test above can only catch the mutant if windows repeat: check that they do."""
    t = TARGET.model()
    repeated = 0
    for s in range(200):
        out = ersd.generate(t, None, PROMPT, max_new_tokens=LENGTH, seed=s).tokens
        _, toks, _ = scored_windows(out, 1)
        repeated += len(toks) < len(out)
    assert repeated > 60  # 89 of 200 with these seeds


# --- invariance: drafter, tree, batch ---------------------------------------------------------


BIG = table_model(200, 0, scale=1.0)
DRAFTS = {
    "good": mixed_draft(BIG, table_model(200, 1), 0.3),
    "bad": table_model(200, 7, scale=3.0),
}


@pytest.mark.parametrize("scheme", ["ersd-v1", "vllm-philox"])
@pytest.mark.parametrize("tree", ["chain:4", "multi:2x3", "batch:3", "dynamic:6"])
@pytest.mark.parametrize("draft", list(DRAFTS))
def test_watermarked_ersd_equals_watermarked_target_only(
    scheme: str, tree: str, draft: str
) -> None:
    wm = Watermark(key=KEY if scheme == "ersd-v1" else 123456789, scheme=scheme, context_width=3)
    for seed in range(4):
        kw = dict(max_new_tokens=40, seed=seed, watermark=wm, temperature=0.9, top_k=50)
        solo = ersd.generate(BIG, None, [1, 2, 3], **kw).tokens  # type: ignore[arg-type]
        spec = ersd.generate(BIG, DRAFTS[draft], [1, 2, 3], tree=tree, **kw)  # type: ignore[arg-type]
        assert spec.tokens == solo
        assert spec.target_calls < len(solo) or draft == "bad"


def test_watermark_changes_the_text_and_keys_differ() -> None:
    plain = ersd.generate(BIG, None, [5], max_new_tokens=40, seed=0).tokens
    a = ersd.generate(BIG, None, [5], max_new_tokens=40, seed=0, watermark=_wm()).tokens
    b = ersd.generate(
        BIG, None, [5], max_new_tokens=40, seed=0, watermark=Watermark(key=_random_key(1))
    ).tokens
    assert a != plain and a != b


def test_batch_equals_solo_with_a_watermark_and_mixed_rows() -> None:
    wm = _wm()
    prompts = [[1, 2], [3], [4, 5, 6], [7]]
    res = ersd.generate_batch(
        BIG,
        DRAFTS["good"],
        prompts,
        max_new_tokens=30,
        seeds=[0, 1, 2, 3],
        watermark=wm,
        tree="multi:2x2",
    )
    for p, s, r in zip(prompts, [0, 1, 2, 3], res, strict=True):
        assert (
            r.tokens == ersd.generate(BIG, None, p, max_new_tokens=30, seed=s, watermark=wm).tokens
        )
    # one engine, watermarked and plain rows and two keys side by side
    engine = ersd.BatchEngine(BIG, DRAFTS["good"])
    other = Watermark(key=_random_key(9))
    ids = {
        engine.add([1, 2], max_new_tokens=20, seed=0, watermark=wm): ("a", wm),
        engine.add([1, 2], max_new_tokens=20, seed=0): ("b", None),
        engine.add([1, 2], max_new_tokens=20, seed=0, watermark=other): ("c", other),
    }
    done = {}
    for _ in range(100):
        for rid, _, result in engine.step():
            if result is not None:
                done[rid] = result
        if not len(engine):
            break
    for rid, (_, w) in ids.items():
        solo = ersd.generate(BIG, None, [1, 2], max_new_tokens=20, seed=0, watermark=w).tokens
        assert done[rid].tokens == solo
    assert len({tuple(r.tokens) for r in done.values()}) == 3


def test_different_seeds_give_different_texts_each_detected() -> None:
    wm = _wm(num_salts=8)
    texts = [
        ersd.generate(BIG, None, [1], max_new_tokens=48, seed=s, watermark=wm).tokens
        for s in range(4)
    ]
    assert len({tuple(t) for t in texts}) == 4
    for s, t in enumerate(texts):
        d = detect(t, wm)
        assert d.p_value < 1e-6 and d.salt == s % 8


def test_a_pinned_salt_keys_every_seed_alike() -> None:
    """Same salt, different seeds: the same text wherever no window repeats (the fallback is
    seeded); the documented trade-off of pinning a salt."""
    wm = _wm(salt=2)
    a = ersd.generate(BIG, None, [1], max_new_tokens=12, seed=0, watermark=wm).tokens
    b = ersd.generate(BIG, None, [1], max_new_tokens=12, seed=5, watermark=wm).tokens
    first_repeat = len(scored_windows(a, wm.context_width)[1])
    assert a[:first_repeat] == b[:first_repeat]


# --- refusals -----------------------------------------------------------------------------------


def test_watermark_refuses_methods_whose_text_is_not_the_race_winner() -> None:
    with pytest.raises(WatermarkError, match="method 'sd'"):
        ersd.generate(BIG, DRAFTS["good"], [1], max_new_tokens=4, method="sd", watermark=_wm())
    # target-only sampling is the race for every method name
    ersd.generate(BIG, None, [1], max_new_tokens=4, method="sd", watermark=_wm())


def test_watermark_refuses_greedy_and_bad_settings() -> None:
    with pytest.raises(WatermarkError, match="temperature"):
        ersd.generate(BIG, None, [1], max_new_tokens=4, temperature=0, watermark=_wm())
    with pytest.raises(WatermarkError, match="16 to 64 bytes"):
        Watermark(key=b"short")
    with pytest.raises(WatermarkError, match="2\\*\\*64"):
        Watermark(key=2**64, scheme="vllm-philox")
    with pytest.raises(WatermarkError, match="context width"):
        _wm(context_width=0)
    with pytest.raises(WatermarkError, match="scheme"):
        _wm(scheme="green-list")
    with pytest.raises(WatermarkError, match="salt"):
        _wm(num_salts=4, salt=4)
    with pytest.raises(WatermarkError, match="ersd.Watermark"):
        ersd.generate(BIG, None, [1], max_new_tokens=4, watermark=KEY)  # type: ignore[arg-type]


def test_plain_noise_refuses_a_watermarked_key() -> None:
    key = WatermarkKey.root(root_key(0, [1]), _wm(), 0)
    with pytest.raises(TypeError, match="WatermarkNoise"):
        RaceNoise(10).exponentials(key)
    with pytest.raises(TypeError, match="WatermarkKey"):
        WatermarkNoise(10, _wm()).exponentials(root_key(0, [1]))


# --- the key never shows ------------------------------------------------------------------------


def test_key_never_appears_in_reprs_or_errors(tmp_path: object) -> None:
    wm = _wm()
    noise = WatermarkNoise(50, wm)
    texts = [repr(wm), str(wm), repr(noise), repr(wm.prf(0)), repr(VllmPRF(2**63 + 5, 0, 4))]
    for t in texts:
        assert KEY.hex() not in t and KEY.hex()[:16] not in t and str(2**63 + 5) not in t
    assert wm.fingerprint in repr(wm)


def test_key_files(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "wm.key")
    wm = write_key_file(path, tokenizer="smollm2-135m")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    back = load_watermark(path)
    assert back == wm and back.tokenizer == "smollm2-135m"
    with pytest.raises(WatermarkError, match="never overwritten"):
        write_key_file(path)
    os.chmod(path, 0o644)
    with pytest.raises(WatermarkError, match="chmod 600") as err:
        load_watermark(path)
    assert wm.key.hex() not in str(err.value)  # type: ignore[union-attr]
    os.chmod(path, 0o600)
    assert load_watermark(path, context_width=2).context_width == 2
    hexfile = os.path.join(tmp_path, "hex.key")
    with open(hexfile, "w") as f:
        f.write(KEY.hex() + "\n")
    os.chmod(hexfile, 0o600)
    # a bare hex key is the first releases' format: version-1 windows, 8 salts
    assert load_watermark(hexfile) == _wm(version=1, num_salts=8)
    bad = os.path.join(tmp_path, "bad.key")
    with open(bad, "w") as f:
        f.write('{"key": "zz", "scheme": "ersd-v1"}')
    os.chmod(bad, 0o600)
    with pytest.raises(WatermarkError, match="hex"):
        load_watermark(bad)
    with open(bad, "w") as f:
        f.write('{"key": "00", "colour": 1}')
    with pytest.raises(WatermarkError, match="colour"):
        load_watermark(bad)
    vpath = os.path.join(tmp_path, "v.key")
    v = write_key_file(vpath, scheme="vllm-philox")
    assert load_watermark(vpath) == v and v.num_salts == 1


# --- the detector ---------------------------------------------------------------------------------


def test_detector_null_is_uniform_on_unwatermarked_repetitive_text() -> None:
    """p-values on text nobody watermarked with the key are U(0, 1) (KS at KS_ALPHA): repeated
    windows are skipped, so the scored terms are independent.  The same texts scored without
    skipping repeats (the broken detector) are rejected by the same test.  One key per text:
    these tiny-vocabulary texts share most of their windows, so one key for all would make
    their p-values dependent (and the KS test invalid)."""
    small = table_model(5, 3, scale=2.5)  # V = 5: 64-token texts repeat their 2-token windows
    good, bad = [], []
    for s in range(400):
        wm = Watermark(key=_random_key(s), context_width=2, num_salts=1)
        toks = ersd.generate(small, None, [1], max_new_tokens=64, seed=s).tokens
        good.append(detect(toks, wm, prompt=[1]).p_value)
        u = wm.prf(0).uniform_at(
            [tuple([-1, 1, *toks][i : i + 2]) for i in range(len(toks))], np.asarray(toks)
        )
        bad.append(float(stats.gamma.sf(-np.log1p(-u).sum(), len(toks))))
    assert stats.kstest(good, "uniform").pvalue >= KS_ALPHA
    assert stats.kstest(bad, "uniform").pvalue < KS_ALPHA


def test_detector_null_is_uniform_with_the_salt_correction() -> None:
    wm = _wm(num_salts=8)
    rng = np.random.default_rng(5)
    ps = [detect(rng.integers(0, 1000, 40).tolist(), wm).p_value for _ in range(400)]
    assert stats.kstest(ps, "uniform").pvalue >= KS_ALPHA
    # uncorrected minimum over the 8 salts is not a p-value: the same test rejects it
    raw = [detect(rng.integers(0, 1000, 40).tolist(), wm).salt_p_value for _ in range(400)]
    assert stats.kstest(raw, "uniform").pvalue < KS_ALPHA


def test_detector_finds_watermarked_text_and_matches_a_direct_gamma() -> None:
    wm = _wm()
    toks = ersd.generate(BIG, DRAFTS["good"], [3], max_new_tokens=128, seed=11, watermark=wm).tokens
    d = detect(toks, wm, per_token=True)
    assert d.watermarked and d.p_value < 1e-6
    assert d.salt == wm.salt_for(11)
    assert d.score == pytest.approx(sum(d.token_scores))
    assert d.salt_p_value == pytest.approx(stats.gamma.sf(d.score, d.scored), rel=1e-9)
    assert d.p_value == pytest.approx(sidak(d.salt_p_value, 8), rel=1e-12)
    known = detect(toks, wm, salt=d.salt)
    assert known.p_value == d.salt_p_value and known.salts_tried == 1
    # another key sees nothing
    assert detect(toks, Watermark(key=_random_key(3))).p_value > 1e-3


def test_detector_refuses_bad_input() -> None:
    wm = _wm()
    with pytest.raises(WatermarkError, match="no tokens"):
        detect([], wm)
    with pytest.raises(WatermarkError, match="too short"):
        detect([1, 2, 3], wm)
    with pytest.raises(ersd.ErsdError, match="text"):
        detect([1, 2, 3] * 10, wm, vocab_size=2)
    with pytest.raises(WatermarkError, match="threshold"):
        detect(list(range(20)), wm, threshold=1.5)
    with pytest.raises(WatermarkError, match="salt"):
        detect(list(range(20)), wm, salt=wm.num_salts)


# --- the audit ---------------------------------------------------------------------------------


@pytest.mark.parametrize("watermark", [None, _wm()])
def test_audit_verifies_a_transcript_and_catches_one_swapped_token(
    watermark: Watermark | None,
) -> None:
    res = ersd.generate(BIG, DRAFTS["good"], [1, 2], max_new_tokens=40, seed=7, watermark=watermark)
    rep = audit(BIG, [1, 2], res.tokens, seed=7, watermark=watermark)
    assert rep.verified and rep.first_mismatch is None and len(rep.positions) == 40
    assert all(p.margin > 0 for p in rep.positions)
    for pos in (0, 17, 39):
        forged = list(res.tokens)
        forged[pos] = (forged[pos] + 1) % 200
        bad = audit(BIG, [1, 2], forged, seed=7, watermark=watermark)
        assert bad.first_mismatch == pos and bad.first_forgery == pos and not bad.verified
    wrong_seed = audit(BIG, [1, 2], res.tokens, seed=8, watermark=watermark)
    assert not wrong_seed.verified


def test_audit_calls_a_near_tie_a_near_tie() -> None:
    """A target whose distribution makes two tokens' race scores all but equal at the first
    position (logits set from that race's own noise): the loser is reported as a near tie, not a
    forgery; with a zero tolerance it is a forgery."""
    e = RaceNoise(6).exponentials(root_key(1, [0])).numpy()

    def fn(seqs: list[list[int]]) -> torch.Tensor:
        out = torch.full((len(seqs), 6), -30.0, dtype=torch.float64)
        out[:, 2] = float(np.log(e[2]))
        out[:, 3] = float(np.log(e[3])) + 1e-9  # scores E_i / p_i of tokens 2 and 3 all but tied
        return out.float()

    tied = ersd.FunctionModel(fn, 6)
    text = ersd.generate(tied, None, [0], max_new_tokens=1, seed=1).tokens
    assert text[0] in (2, 3)
    other = [5 - text[0]]
    rep = audit(tied, [0], other, seed=1)
    assert rep.mismatches == [0] and rep.near_ties == [0] and rep.verified
    assert abs(rep.positions[0].margin) < 1e-5
    strict = audit(tied, [0], other, seed=1, tie_tolerance=0.0)
    assert not strict.verified and strict.first_forgery == 0
