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
