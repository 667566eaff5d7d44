"""research/watermark_detection_field.py computes issue 52's null p-values from one evaluation of
the PRF per chunk; they must be the library's own (detect, detect_weighted, scan), and the
library check must catch a wrong one."""

from __future__ import annotations

import numpy as np
import pytest
from research import watermark_detection_field as field


def _chunk() -> tuple[np.ndarray, dict[float, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 300, size=field.PREFIX + field.PER_CHUNK * field.WINDOW)
    ids[100:140] = ids[40:80]  # repeated windows: the first occurrence rule matters
    probs = {t: rng.uniform(0.01, 1.0, size=len(ids) - field.PREFIX) for t in (1.0, 0.7)}
    alone = rng.uniform(0.01, 1.0, size=(field.PER_CHUNK, field.WINDOW))
    alone[:, 0] = np.nan
    return ids, probs, alone


def test_chunk_p_values_are_the_library_s() -> None:
    wm = field.watermark()
    ids, probs, alone = _chunk()
    windows, doc = field.chunk_stats(wm, ids, probs, alone)
    assert len(windows) == field.PER_CHUNK and set(windows[0]) == set(field.MODES)
    assert set(doc) == set(field.DOC_MODES)
    field.library_check(wm, ids, probs, alone, windows, doc)  # raises SystemExit on a mismatch
    # the broken scan is the corrected one without the window factor: never larger
    assert doc["BROKEN_scan_uncorrected"] <= doc["scan_no_prompt"]
    windows[3]["weighted_T1_prompt"] *= 1.001
    with pytest.raises(SystemExit, match="weighted_T1_prompt"):
        field.library_check(wm, ids, probs, alone, windows, doc)


def test_rates_carry_clopper_pearson_intervals() -> None:
    r = field.rate(10, 1000)
    assert r["rate"] == 0.01 and r["ci95"][0] < 0.01 < r["ci95"][1]
    assert field.rate(0, 50)["ci95"][0] == 0.0 and field.rate(50, 50)["ci95"][1] == 1.0
    s = field.summarise([0.005, 0.5, 0.0005, 0.9])
    assert s["fpr_1pct"]["k"] == 2 and s["fpr_0.1pct"]["k"] == 1


# --- the resumable null run (issue 52: the model-weighted FPR on >= 10k windows) -------------


def _f32_probs(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Probabilities as batch_probs gives them: float32 values widened to float64."""
    p = rng.uniform(0.01, 1.0, size=shape).astype(np.float32).astype(np.float64)
    p[..., 0] = np.nan
    return p


def test_prob_cache_is_lossless_and_refuses_what_it_cannot_vouch_for(tmp_path) -> None:
    rng = np.random.default_rng(3)
    cache = field.ProbCache(tmp_path / "c")
    ids = rng.integers(0, 999, size=field.PREFIX + field.PER_CHUNK * field.WINDOW)
    pp = {t: _f32_probs(rng, (field.PER_CHUNK * field.WINDOW,)) for t in (1.0, 0.7)}
    alone = _f32_probs(rng, (field.PER_CHUNK, field.WINDOW))
    assert cache.load("man-pages", 4, ids, False) is None
    cache.save("man-pages", 4, ids, pp, None)
    got, got_alone = cache.load("man-pages", 4, ids, True)  # the alone forward not stored yet:
    assert got_alone is None  # the prompted probabilities come back, the alone slot is empty
    assert all(np.array_equal(got[t], pp[t], equal_nan=True) for t in pp)
    got, got_alone = cache.load("man-pages", 4, ids, False)
    assert got_alone is None
    assert all(np.array_equal(got[t], pp[t], equal_nan=True) for t in pp)  # bit for bit
    cache.save("man-pages", 4, ids, pp, alone)
    got, got_alone = cache.load("man-pages", 4, ids, True)
    assert np.array_equal(got_alone, alone, equal_nan=True)
    other = ids.copy()
    other[7] += 1
    with pytest.raises(SystemExit, match="other token ids"):
        cache.load("man-pages", 4, other, False)
    wide = {t: v + 1e-12 for t, v in pp.items()}  # not float32 values: storing would round
    with pytest.raises(SystemExit, match="not float32"):
        cache.save("man-pages", 5, ids, wide, None)


def _fake_run(monkeypatch: pytest.MonkeyPatch, forwards: list[int]) -> None:
    """part_fpr without the real model and corpus: synthetic tokens, float32 probabilities
    from the token ids, 4 salts (the statistics are the same functions)."""
    import types

    from research.watermark_v2 import KEY

    import ersd
    from ersd.watermark import Watermark

    def tokens(tok: object, source: str, count: int, skip: int = 0) -> list[int]:
        rng = np.random.default_rng(len(source))
        return rng.integers(0, 5000, size=skip + count)[skip:].tolist()

    def probs(model: object, seqs: np.ndarray, temps: tuple[float, ...]) -> dict:
        forwards.append(seqs.shape[0])
        base = ((seqs * 2654435761) % 997 + 1) / 999.0
        out = {}
        for t in temps:
            p = (base ** (1.0 / t)).astype(np.float32).astype(np.float64)
            p[:, 0] = np.nan
            out[t] = p
        return out

    monkeypatch.setattr(field, "human_tokens", tokens)
    monkeypatch.setattr(field, "batch_probs", probs)
    monkeypatch.setattr(field, "watermark", lambda: Watermark(key=KEY, version=2, num_salts=4))
    monkeypatch.setattr(ersd, "load_model", lambda *a, **k: types.SimpleNamespace(tokenizer=None))


def _run(tmp_path, *flags: str) -> dict:
    import json

    field.main([str(tmp_path / "out"), "fpr", "--chunks", "6", "--check", "0", *flags])
    return json.loads((tmp_path / "out" / "fpr.json").read_text())


def test_fpr_run_resumes_from_its_records_and_cache(tmp_path, monkeypatch) -> None:
    forwards: list[int] = []
    _fake_run(monkeypatch, forwards)
    cache = ["--cache", str(tmp_path / "cache"), "--alone-every", "2", "--checkpoint", "2"]
    # a run stopped before the model: every chunk model-free only
    first = _run(tmp_path, *cache, "--model-seconds", "0")
    assert forwards == [] and first["model_chunks"] == 0 and first["chunks_done"] == 6
    assert first["modes"]["model_free_prompt"]["n"] == 6 * field.PER_CHUNK
    assert "weighted_T1_prompt" not in first["modes"]
    # resumed with the model: every chunk upgraded, one forward with the prompt per chunk
    # and the windows-alone forward (8 rows) on chunks 0 and 2 of each source
    second = _run(tmp_path, *cache)
    assert sorted(forwards) == [1] * 6 + [field.PER_CHUNK] * 4 and second["complete"]
    assert second["modes"]["weighted_T1_prompt"]["n"] == 6 * field.PER_CHUNK
    assert second["modes"]["weighted_T1_no_prompt"]["n"] == 4 * field.PER_CHUNK
    assert second["model_alone_chunks"] == 4
    # the model-free p-values did not change with the model
    for key in ("model_free_prompt", "scan_no_prompt"):
        assert second["modes"][key]["p_values"] == first["modes"][key]["p_values"]
    # which chunks each mode covers, by source
    assert second["modes"]["weighted_T1_no_prompt"]["chunks"] == {
        "man-pages": [0, 2],
        "pypi-docstrings": [0, 2],
    }
    # run again: nothing to do, no forward; the same numbers
    forwards.clear()
    third = _run(tmp_path, *cache)
    assert forwards == []
    assert third["modes"] == second["modes"]
    # a run stopped while writing a record: that chunk is redone, the rest kept
    journal = tmp_path / "cache" / "chunks.jsonl"
    text = journal.read_text()
    journal.write_text(text + text.splitlines()[0][:50])
    assert _run(tmp_path, *cache)["modes"] == second["modes"]
    assert journal.read_text() == text  # the cut line dropped, nothing to redo (a later copy)
    journal.write_text(text.splitlines()[0][:50] + "\n" + text)
    with pytest.raises(SystemExit, match="line 1 is not JSON"):
        _run(tmp_path, *cache)
    journal.write_text(text)
    # a fresh journal over the cached probabilities: no forward, bit-identical p-values
    (tmp_path / "cache" / "chunks.jsonl").unlink()
    fourth = _run(tmp_path, *cache)
    assert forwards == [] and fourth["modes"] == second["modes"]
    # the windows alone on every chunk later: only the missing alone forwards run (chunk 1 of
    # each source), none with the prompt; the modes with the prompt keep their p-values
    every = [*cache[:2], "--alone-every", "1", "--checkpoint", "2"]
    fifth = _run(tmp_path, *every)
    assert sorted(forwards) == [field.PER_CHUNK] * 2
    assert fifth["modes"]["weighted_T1_no_prompt"]["n"] == 6 * field.PER_CHUNK
    for key in ("weighted_T1_prompt", "weighted_T0.7_prompt", "model_free_prompt"):
        assert fifth["modes"][key]["p_values"] == second["modes"][key]["p_values"]


@pytest.mark.realmodel
def test_run_s_probabilities_are_the_no_grad_path_s_bit_for_bit(tmp_path) -> None:
    """inference_mode (the run) and no_grad (before it) give the same bits, row by row of a
    batch, and the cache stores them exactly; a p-value cannot move."""
    import ersd

    model = ersd.load_model("smollm2-135m", dtype="float32")
    rng = np.random.default_rng(11)
    seqs = rng.integers(0, 49152, size=(2, 96))
    new = field.batch_probs(model, seqs, (1.0, 0.7))
    old = field.batch_probs(model, seqs, (1.0, 0.7), no_grad=True)
    one = field.batch_probs(model, seqs[1:], (1.0, 0.7))
    for t in (1.0, 0.7):
        assert np.array_equal(new[t], old[t], equal_nan=True)
        assert np.array_equal(new[t][1], one[t][0], equal_nan=True)
        assert np.isnan(new[t][:, 0]).all() and np.isfinite(new[t][:, 1:]).all()
    assert not np.array_equal(new[1.0], new[0.7], equal_nan=True)  # the temperature is used
    cache = field.ProbCache(tmp_path)
    ids = np.arange(field.PREFIX + 64)
    pp = {t: new[t][0, :64] for t in (1.0, 0.7)}
    cache.save("man-pages", 0, ids, pp, None)
    got, _ = cache.load("man-pages", 0, ids, False)
    assert all(np.array_equal(got[t], pp[t], equal_nan=True) for t in pp)
