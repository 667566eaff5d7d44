"""Localized watermark detection (ersd.watermark.localize): a marked span found in a constructed
mixed document, and the scan's false-positive rate on purely unmarked documents.

The FPR test counts false positives of the scan at nominal ``ALPHA_DOC = 0.05`` on ``N_DOCS``
unmarked documents and rejects when a one-sided exact binomial test against 0.05 gives p below
``BINOM_ALPHA = 1e-3``; the same test must reject the scan without its correction for the
windows (the best window's p-value alone).  Seeds are fixed.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ersd.errors import WatermarkError
from ersd.watermark import Watermark, detect
from ersd.watermark.detect import sidak
from ersd.watermark.localize import highlight, scan, scan_windows
from tests.test_watermark_weighted import keyed_race

KEY = bytes(range(32))
BINOM_ALPHA = 1e-3
ALPHA_DOC = 0.05
N_DOCS = 600


def _wm(**kw: object) -> Watermark:
    return Watermark(key=KEY, **kw)  # type: ignore[arg-type]


def _mixed(
    seed: int, before: int, span: int, after: int, vocab: int = 300, conc: float = 0.3
) -> tuple[list, int]:
    """Human (uniformly random) ids, a span written by the keyed race (salt 1) after them, more
    human ids: (document, where the span starts)."""
    rng = np.random.default_rng(seed)
    wm = _wm(num_salts=4)
    head = rng.integers(0, vocab, before).tolist()
    dists = rng.dirichlet(np.full(vocab, conc), size=span)
    marked = keyed_race(wm, dists, head, salt=1, seed=seed)
    return head + marked + rng.integers(0, vocab, after).tolist(), before


def test_a_marked_span_is_found_in_a_long_human_document() -> None:
    wm = _wm(num_salts=4)
    doc, at = _mixed(seed=0, before=1500, span=64, after=1500, conc=0.02)
    whole = detect(doc, wm)
    found = scan(doc, wm)
    assert found.watermarked and found.salt == 1 and found.p_value < whole.p_value
    assert len(found.spans) == 1
    s = found.spans[0]
    overlap = max(0, min(s.end, at + 64) - max(s.start, at))
    union = max(s.end, at + 64) - min(s.start, at)
    assert overlap / union >= 0.5, (s, at)


def test_the_scan_is_conservative_on_unmarked_documents_and_the_uncorrected_one_is_not() -> None:
    wm = _wm(num_salts=2)
    rng = np.random.default_rng(9)
    fp = fp_raw = 0
    for _ in range(N_DOCS):
        doc = rng.integers(0, 5000, 400).tolist()
        res = scan(doc, wm, threshold=ALPHA_DOC)
        fp += res.watermarked
        assert res.spans == [] or res.watermarked
        fp_raw += sidak(res.window_p_value, res.salts_tried) <= ALPHA_DOC
    ok = stats.binomtest(fp, N_DOCS, ALPHA_DOC, "greater").pvalue
    broken = stats.binomtest(fp_raw, N_DOCS, ALPHA_DOC, "greater").pvalue
    assert ok > BINOM_ALPHA and broken < BINOM_ALPHA, (fp, fp_raw)


class _CharTokenizer:
    """Token ``i`` decodes to the letter ``chr(97 + i % 26)`` repeated ``1 + i % 3`` times."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) * (1 + i % 3) for i in ids)


def test_spans_carry_character_offsets_and_highlight() -> None:
    wm = _wm(num_salts=4)
    doc, _ = _mixed(seed=2, before=400, span=96, after=300)
    tok = _CharTokenizer()
    res = scan(doc, wm, tokenizer=tok)
    assert res.spans
    text = tok.decode(doc)
    for s in res.spans:
        assert text[s.char_start : s.char_end] == tok.decode(doc[s.start : s.end])
    marked = highlight(text, res.spans)
    assert (
        marked.count("[[") == len(res.spans) and marked.replace("[[", "").replace("]]", "") == text
    )
    with pytest.raises(WatermarkError, match="character offsets"):
        highlight(text, scan(doc, wm).spans)


def test_scan_windows_cover_every_position_and_short_texts() -> None:
    wins = scan_windows(100, (32, 64))
    assert (0, 32) in wins and (68, 100) in wins and (36, 100) in wins
    assert scan_windows(10, (32,)) == [(0, 10)]
    with pytest.raises(WatermarkError, match="lengths must be"):
        scan(list(range(50)), _wm(), lengths=[0])
    with pytest.raises(WatermarkError, match="lengths must be"):
        scan(list(range(50)), _wm(), lengths=5)  # type: ignore[arg-type]
