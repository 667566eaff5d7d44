"""Localized watermark detection: which spans of a long input carry the mark.

A watermarked paragraph pasted into a longer human document is diluted away when the whole input
is tested (:func:`ersd.watermark.detect`).  :func:`scan` tests windows instead: over the scored
positions (first occurrences of their window, as :func:`~ersd.watermark.detect`), for each length
``L`` in ``lengths`` the windows of ``L`` consecutive scored positions starting every ``L / 2``
(and one ending at the last), each with the exact model-free p-value ``Q(L, S_window)`` of its
score.  Under the null every window's p-value is uniform, so with ``m`` windows in all the
**scan p-value** ``min(1, m * min_window p)`` is a conservative (Bonferroni) bound, valid however
the overlapping windows depend on each other; across the ``k`` salts tried (independent under the
null) Šidák's correction is exact, as in :func:`~ersd.watermark.detect`.  Overlapping windows
are positively dependent, so the bound is loose by a factor that the tests measure by simulation
(docs/watermark.md).  A **span** is a maximal union of overlapping windows each of whose own
corrected p-value is at most ``threshold``, reported as token positions (``start``, ``end``
exclusive, in the input) and, given a tokenizer, character offsets in the decoded text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import gammaincc

from ersd.errors import WatermarkError
from ersd.watermark.detect import (
    DEFAULT_MIN_TOKENS,
    _checked_input,
    sidak,
    token_scores,
)
from ersd.watermark.settings import Watermark

#: window lengths (scored tokens) of the scan
DEFAULT_LENGTHS = (32, 64, 128, 256)


@dataclass(frozen=True)
class Span:
    """A marked span: input token positions ``[start, end)``, its best window's corrected
    p-value, and character offsets ``[char_start, char_end)`` when a tokenizer was given."""

    start: int
    end: int
    p_value: float
    char_start: int | None = None
    char_end: int | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"start": self.start, "end": self.end, "p_value": self.p_value}
        if self.char_start is not None:
            out["char_start"], out["char_end"] = self.char_start, self.char_end
        return out


@dataclass(frozen=True)
class Localization:
    """What :func:`scan` found: ``p_value`` corrected for the windows (Bonferroni) and salts
    (Šidák); ``window_p_value`` the best window's uncorrected p-value; ``windows`` how many were
    tested per salt; ``spans`` the marked spans under the best ``salt``."""

    p_value: float
    window_p_value: float
    windows: int
    lengths: tuple[int, ...]
    scored: int
    salt: int
    salts_tried: int
    threshold: float
    spans: list[Span] = field(default_factory=list)

    @property
    def watermarked(self) -> bool:
        return self.p_value <= self.threshold

    def as_dict(self) -> dict[str, object]:
        return {
            "watermarked": self.watermarked,
            "p_value": self.p_value,
            "window_p_value": self.window_p_value,
            "windows_per_salt": self.windows,
            "window_lengths": list(self.lengths),
            "scored_tokens": self.scored,
            "salt": self.salt,
            "salts_tried": self.salts_tried,
            "threshold": self.threshold,
            "spans": [s.as_dict() for s in self.spans],
        }


def scan_windows(n: int, lengths: Sequence[int]) -> list[tuple[int, int]]:
    """The ``(start, end)`` windows over ``n`` scored positions (module doc); one window of all
    ``n`` when every length exceeds ``n``."""
    out: list[tuple[int, int]] = []
    for length in sorted(set(lengths)):
        if length > n:
            continue
        step = max(length // 2, 1)
        starts = list(range(0, n - length + 1, step))
        if starts[-1] != n - length:
            starts.append(n - length)
        out.extend((s, s + length) for s in starts)
    return out or [(0, n)]


def _check_lengths(lengths: Any) -> tuple[int, ...]:
    try:
        vals = tuple(lengths)
    except TypeError:
        vals = ()
    if not vals or any(
        isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1 for v in vals
    ):
        raise WatermarkError(
            f"lengths must be a non-empty list of positive window lengths, got {lengths!r:.60}"
        )
    return tuple(int(v) for v in vals)


def _spans(
    scores: np.ndarray, starts: np.ndarray, ends: np.ndarray, corrected: np.ndarray, level: float
) -> list[Span]:
    """Disjoint spans (scored indices): the most significant window at most ``level``, then the
    next not overlapping it, ...; each one's bounds then refined to the sub-interval, within the
    window widened by half its length each side (on a grid of 1/16 of it), whose own Gamma
    p-value is smallest.  A span's p-value is its window's corrected one (the refinement only
    moves the bounds reported)."""
    n = len(scores)
    cum = np.concatenate([[0.0], np.cumsum(scores)])
    taken: list[tuple[int, int, float]] = []
    for j in np.argsort(corrected, kind="stable"):
        if corrected[j] > level:
            break
        a, b = int(starts[j]), int(ends[j])
        if any(a < e and s < b for s, e, _ in taken):
            continue
        taken.append((a, b, float(corrected[j])))
    out = []
    for a, b, p in sorted(taken):
        length = b - a
        step = max(length // 16, 1)
        lo_a, hi_b = max(a - length // 2, 0), min(b + length // 2, n)
        cand_a = np.arange(lo_a, b, step)
        cand_b = np.append(np.arange(a + step, hi_b, step), hi_b)
        aa, bb = np.meshgrid(cand_a, cand_b, indexing="ij")
        ok = bb > aa
        sizes = np.where(ok, bb - aa, 1).astype(np.float64)
        sums = np.where(ok, cum[bb] - cum[aa], 0.0)
        logq = np.where(ok, np.log(np.maximum(gammaincc(sizes, sums), 1e-300)), 0.0)
        k = int(np.argmin(logq))
        a2, b2 = int(aa.flat[k]), int(bb.flat[k])
        if any(a2 < e and s < b2 for s, e, _ in taken if (s, e) != (a, b)):
            a2, b2 = a, b  # the refined bounds would run into another span: keep the window's
        out.append(Span(a2, b2, p))
    return out


def char_offsets(tokenizer: Any, ids: Sequence[int], start: int, end: int) -> tuple[int, int]:
    """Character offsets of tokens ``[start, end)`` in ``tokenizer.decode(ids)``: the lengths of
    the decoded prefixes (exact for tokenizers whose decoding of a prefix is a prefix of the
    decoding, as byte-level BPE away from split multi-byte characters)."""
    return len(tokenizer.decode(list(ids[:start]))), len(tokenizer.decode(list(ids[:end])))


def scan(
    token_ids: Sequence[int],
    watermark: Watermark,
    *,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    salt: int | None = None,
    threshold: float = 0.01,
    vocab_size: int | None = None,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    prompt: Sequence[int] | None = None,
    tokenizer: Any = None,
) -> Localization:
    """Scan ``token_ids`` for spans that carry ``watermark`` (module doc).  ``lengths``: window
    lengths in scored tokens; ``tokenizer``: to report character offsets of the spans.  Other
    arguments as :func:`ersd.watermark.detect`."""
    lengths = _check_lengths(lengths)
    ids, windows, tokens, positions, salts, _ = _checked_input(
        token_ids, watermark, salt, threshold, vocab_size, min_tokens, prompt
    )
    scores = token_scores(watermark, salts, windows, tokens)  # [salts, n]
    n = len(tokens)
    wins = scan_windows(n, lengths)
    cum = np.concatenate([np.zeros((len(salts), 1)), np.cumsum(scores, axis=1)], axis=1)
    starts = np.array([a for a, _ in wins])
    ends = np.array([b for _, b in wins])
    sums = cum[:, ends] - cum[:, starts]  # [salts, windows]
    sizes = (ends - starts).astype(np.float64)
    window_p = gammaincc(sizes[None, :], np.maximum(sums, 0.0))
    best_per_salt = window_p.min(axis=1)
    i = int(np.argmin(best_per_salt))
    m = len(wins)
    corrected = np.array([sidak(min(1.0, m * float(p)), len(salts)) for p in window_p[i]])
    spans = _spans(scores[i], starts, ends, corrected, threshold)
    # scored indices -> input positions (end exclusive)
    pos = np.asarray(positions)
    spans = [Span(int(pos[s.start]), int(pos[s.end - 1]) + 1, s.p_value) for s in spans]
    if tokenizer is not None:
        spans = [
            Span(s.start, s.end, s.p_value, *char_offsets(tokenizer, ids.tolist(), s.start, s.end))
            for s in spans
        ]
    best = float(best_per_salt[i])
    return Localization(
        p_value=sidak(min(1.0, m * best), len(salts)),
        window_p_value=best,
        windows=m,
        lengths=tuple(sorted({b - a for a, b in wins})),
        scored=n,
        salt=salts[i],
        salts_tried=len(salts),
        threshold=float(threshold),
        spans=spans,
    )


def highlight(text: str, spans: Sequence[Span], start: str = "[[", end: str = "]]") -> str:
    """``text`` with each span's characters wrapped in ``start`` / ``end`` markers (spans need
    character offsets: :func:`scan` with a tokenizer)."""
    out, at = [], 0
    for s in sorted(spans, key=lambda s: s.start):
        if s.char_start is None or s.char_end is None:
            raise WatermarkError("spans have no character offsets: scan with tokenizer=...")
        out += [text[at : s.char_start], start, text[s.char_start : s.char_end], end]
        at = s.char_end
    out.append(text[at:])
    return "".join(out)


__all__ = ["DEFAULT_LENGTHS", "Localization", "Span", "highlight", "scan", "scan_windows"]
