"""Detecting the watermark from token ids and the key alone (no model).

At every generated position ``t`` the window ``w_t`` is the ``h`` tokens before it (give the
detector the generated tokens only, from their first). Version 2 keys (the default,
:attr:`Watermark.version`) count the prompt's last tokens in the first ``h`` windows: given the
``prompt`` (its last ``h`` tokens suffice) every position is scored, else the first ``h`` positions,
whose windows reach into the unknown prompt, are left out (``opening``) and scoring starts at
position ``h``. Version 1 keys pad the first windows with ``-1`` and score every position. A
position whose window occurred at an earlier scored position is skipped (the generator used unkeyed
noise there, :mod:`ersd.watermark.keyed`; without the prompt, a window that repeats one of the
opening's is scored -- a term that is uniform under the null as every other, so the p-value stays
exact, and only a little power is lost). Every scored position scores ``-log(1 - r_t)``, ``r_t`` the
keyed uniform of the emitted token; the sum ``S`` over ``n`` scored positions is ``Gamma(n, 1)``
under the null (text not written with this key and salt: each ``r_t`` is uniform and independent of
the others because the windows differ), so the exact p-value is the regularised upper incomplete
gamma ``Q(n, S)`` (:func:`scipy.special.gammaincc`). A watermarked token has a large ``r_t`` (it won
a race whose noise favours large ``U``), so ``S`` grows with the text's entropy.

Salts: a text was written with one of ``num_salts`` salts, unknown to the detector unless given;
with ``k`` salts tried, the reported p-value is Šidák's ``1 - (1 - min_s p_s)**k``, exact under the
null (the salts' uniforms are independent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import gammaincc

from ersd.errors import ErsdError, WatermarkError
from ersd.validation import check_token_ids
from ersd.watermark.settings import Watermark

#: texts with fewer scored positions than this are refused unless ``min_tokens`` is lowered
DEFAULT_MIN_TOKENS = 8


@dataclass(frozen=True)
class Detection:
    """What :func:`detect` found in one text.

    ``p_value`` is corrected for the salts tried; ``salt`` is the best one, ``score`` and
    ``salt_p_value`` its score and uncorrected p-value; ``scored`` the positions scored (first
    occurrences of their window), ``skipped`` the repeated windows left out; ``token_scores`` (on
    request) each scored position's ``-log(1 - r_t)`` under the best salt, ``positions`` their
    indices in the input.
    """

    p_value: float
    score: float
    scored: int
    skipped: int
    salt: int
    salt_p_value: float
    salts_tried: int
    threshold: float
    positions: list[int] = field(default_factory=list, repr=False)
    token_scores: list[float] = field(default_factory=list, repr=False)
    #: opening positions not scored (version 2 without the prompt: their windows hold it)
    opening: int = 0

    @property
    def watermarked(self) -> bool:
        """The verdict at ``threshold``: p-value at most the threshold."""
        return self.p_value <= self.threshold

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "watermarked": self.watermarked,
            "p_value": self.p_value,
            "score": self.score,
            "scored_tokens": self.scored,
            "skipped_repeated": self.skipped,
            "skipped_opening": self.opening,
            "salt": self.salt,
            "salt_p_value": self.salt_p_value,
            "salts_tried": self.salts_tried,
            "threshold": self.threshold,
        }
        if self.token_scores:
            out["positions"] = self.positions
            out["token_scores"] = self.token_scores
        return out


#: odd 64-bit multipliers of the windows' sort key (any odd constants serve: equal keys are
#: checked row by row)
_ROW_MIX = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9)


def _first_rows(rows: np.ndarray) -> np.ndarray:
    """Sorted indices of the first occurrence of each distinct row of ``rows`` (``[m, h]``
    int64): ``np.unique(rows, axis=0, return_index=True)[1]`` sorted, without its row-wise sort.

    Rows are keyed by a 64-bit mix of their tokens and sorted by the key; rows sharing a key are
    compared token by token, and if two *different* rows ever share one (a collision) the exact
    row sort decides instead, so the result never depends on the mix."""
    m, h = rows.shape
    if h == 1:
        return np.sort(np.unique(rows[:, 0], return_index=True)[1])
    key = rows[:, 0].astype(np.uint64)
    with np.errstate(over="ignore"):
        for j in range(1, h):
            key *= np.uint64(_ROW_MIX[j % len(_ROW_MIX)])
            key ^= key >> np.uint64(29)
            key += rows[:, j].astype(np.uint64)
    order = np.argsort(key)
    sk = key[order]
    new_key = sk[1:] != sk[:-1]
    if new_key.all():  # every key distinct, so every row is (the usual case in real text)
        return np.arange(m)
    starts = np.flatnonzero(np.concatenate(([True], new_key)))
    sizes = np.diff(np.append(starts, m))
    first = np.minimum.reduceat(order, starts)  # the earliest position with each key
    shared = np.repeat(sizes > 1, sizes)
    if shared.any():
        members = order[shared]
        leaders = np.repeat(first, sizes)[shared]
        if not np.array_equal(rows[members], rows[leaders]):  # a collision: sort exactly
            _, exact = np.unique(rows, axis=0, return_index=True)
            return np.sort(exact)
    first.sort()
    return first


def _window_rows(
    ids: np.ndarray, context_width: int, initial: Sequence[int] | None, start: int
) -> np.ndarray:
    """The window of every position ``>= start`` (a read-only ``[n, h]`` view): the ``h`` tokens
    before it, ``initial`` (default ``h`` times ``-1``) before the first."""
    head = (
        np.full(context_width, -1, dtype=np.int64)
        if initial is None
        else np.asarray(initial, dtype=np.int64).reshape(-1)
    )
    if len(head) != context_width:
        raise WatermarkError(f"the initial window must hold {context_width} tokens")
    padded = np.concatenate([head, ids])
    return np.lib.stride_tricks.sliding_window_view(padded, context_width)[start : len(ids)]


def _scored_arrays(
    ids: np.ndarray, context_width: int, initial: Sequence[int] | None, start: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`scored_windows` as arrays (windows, tokens, positions)."""
    rows = _window_rows(ids, context_width, initial, start)
    if len(rows) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros((0, context_width), dtype=np.int64), empty, empty
    first = _first_rows(rows)
    if len(first) == len(rows):  # no repeated window: the rows themselves (a read-only view)
        return rows, ids[start:], np.arange(start, len(ids))
    return rows[first], ids[first + start], first + start


def scored_windows(
    token_ids: Sequence[int] | np.ndarray,
    context_width: int,
    initial: Sequence[int] | None = None,
    start: int = 0,
) -> tuple[np.ndarray, list[int], list[int]]:
    """(windows ``[n, h]``, tokens, positions) of the first occurrence of each window in
    ``token_ids`` among positions ``>= start`` (window of position ``i``: the ``h`` tokens
    before it, ``initial`` -- default ``h`` times ``-1`` -- before the first)."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    windows, tokens, positions = _scored_arrays(ids, context_width, initial, start)
    return np.ascontiguousarray(windows), tokens.tolist(), positions.tolist()


def scored_windows_reference(
    token_ids: Sequence[int] | np.ndarray,
    context_width: int,
    initial: Sequence[int] | None = None,
    start: int = 0,
) -> tuple[np.ndarray, list[int], list[int]]:
    """:func:`scored_windows` as the first releases computed it (a row-wise ``np.unique``): the
    reference the fast path is tested against (``tests/test_watermark_fast.py``)."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    rows = _window_rows(ids, context_width, initial, start)
    if len(rows) == 0:
        return np.zeros((0, context_width), dtype=np.int64), [], []
    _, first = np.unique(rows, axis=0, return_index=True)
    first.sort()
    return rows[first], ids[first + start].tolist(), (first + start).tolist()


def _as_ids(token_ids: Any, vocab_size: int | None, name: str = "text") -> np.ndarray:
    """Token ids as int64 (a fast path for lists and arrays of ints; anything else goes through
    :func:`ersd.validation.check_token_ids` for its error message)."""
    if isinstance(token_ids, str | bytes) or not hasattr(token_ids, "__len__"):
        what = type(token_ids).__name__
        raise WatermarkError(
            f"{name} must be a list of token ids, got {what}"
            + ("; tokenize it first (ersd watermark detect does)" if what == "str" else "")
        )
    try:
        arr = np.asarray(token_ids)
    except (ValueError, TypeError, OverflowError):
        arr = None
    limit = vocab_size if vocab_size is not None else 2**62
    if (
        arr is None
        or arr.ndim != 1
        or arr.dtype.kind not in "iu"
        or len(arr) == 0
        or int(arr.min()) < 0
        or int(arr.max()) >= limit
    ):
        try:
            return np.asarray(check_token_ids(token_ids, limit, name=name), dtype=np.int64)
        except ErsdError as exc:
            raise WatermarkError(str(exc), param=name) from None
    return arr.astype(np.int64, copy=False)


def gamma_p_value(score: float, n: int) -> float:
    """``P(Gamma(n, 1) >= score)``, exact (regularised upper incomplete gamma)."""
    if n <= 0:
        return 1.0
    return float(gammaincc(n, max(score, 0.0)))


def sidak(p: float, k: int) -> float:
    """Šidák's correction of the smallest of ``k`` independent p-values: ``1 - (1 - p)**k``."""
    if k <= 1:
        return p
    return float(-math.expm1(k * math.log1p(-p))) if p < 1 else 1.0


def token_scores(
    watermark: Watermark,
    salts: Sequence[int],
    windows: Sequence[Sequence[int]] | np.ndarray,
    tokens: Sequence[int] | np.ndarray,
) -> np.ndarray:
    """``-log(1 - r_t)`` of each (window, token) under each salt: ``[len(salts), n]``."""
    if len(tokens) == 0:
        return np.zeros((len(salts), 0))
    prf = watermark.prf(salts[0])
    u = prf.uniform_at(windows, np.asarray(tokens, dtype=np.int64), salts=salts)
    return -np.log1p(-u)


def _check_number(value: Any, name: str, lo: float, hi: float, *, integer: bool) -> Any:
    """``value`` if it is a (whole, with ``integer``) number in ``[lo, hi]``, else a
    :class:`WatermarkError` naming it -- a float salt is refused, never rounded."""
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )
    if integer:
        ok = isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)
    if not ok or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise WatermarkError(f"{name} must be {kind} in [{lo:g}, {hi:g}], got {value!r:.40}")
    return int(value) if integer else float(value)


def _checked_input(
    token_ids: Sequence[int],
    watermark: Watermark,
    salt: int | None,
    threshold: float,
    vocab_size: int | None,
    min_tokens: int,
    prompt: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray, list[int], list[int], list[int], int]:
    """The checks the detectors share: (ids, scored windows, their tokens, their positions, the
    salts to try, the opening left unscored)."""
    ids, windows, tokens, positions, salts, start = _checked_arrays(
        token_ids, watermark, salt, threshold, vocab_size, min_tokens, prompt
    )
    return ids, windows, tokens.tolist(), positions.tolist(), salts, start


def _checked_arrays(
    token_ids: Sequence[int],
    watermark: Watermark,
    salt: int | None,
    threshold: float,
    vocab_size: int | None,
    min_tokens: int,
    prompt: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[int], int]:
    """:func:`_checked_input` with the tokens and positions as arrays."""
    if not isinstance(watermark, Watermark):
        raise WatermarkError(
            f"watermark must be an ersd.Watermark (ersd.load_watermark(FILE)), got "
            f"{type(watermark).__name__}"
        )
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float | np.floating)
        or not 0 < threshold < 1
    ):
        raise WatermarkError(f"threshold must be a number in (0, 1), got {threshold!r:.40}")
    min_tokens = _check_number(min_tokens, "min_tokens", 1, 2**62, integer=True)
    if vocab_size is not None:
        vocab_size = _check_number(vocab_size, "vocab_size", 1, 2**62, integer=True)
    if token_ids is None or (hasattr(token_ids, "__len__") and len(token_ids) == 0):
        raise WatermarkError("nothing to score: the text has no tokens")
    ids = _as_ids(token_ids, vocab_size)
    h = watermark.context_width
    if not watermark.prompt_windows:
        initial, start = None, 0
    elif prompt is None:
        initial, start = None, min(h, len(ids))
    else:
        p = _as_ids(prompt, vocab_size, "prompt") if len(prompt) else np.zeros(0, np.int64)
        initial, start = watermark.initial_window(p.tolist()), 0
    windows, tokens, positions = _scored_arrays(ids, h, initial, start)
    if len(tokens) < min_tokens:
        opening = (
            f" after the first {start} (version-2 windows reach into the prompt there: pass "
            "the prompt to score them)"
            if start
            else ""
        )
        raise WatermarkError(
            f"the text is too short to score: {len(tokens)} scored token(s) (first occurrences "
            f"of their {h}-token window) of {len(ids)}{opening}, at least {min_tokens} needed; "
            "score a longer text or lower min_tokens"
        )
    if salt is not None:
        salts = [_check_number(salt, "salt", 0, watermark.num_salts - 1, integer=True)]
    elif watermark.salt is not None:
        salts = [watermark.salt]
    else:
        salts = list(range(watermark.num_salts))
    return ids, windows, tokens, positions, salts, start


def detect(
    token_ids: Sequence[int],
    watermark: Watermark,
    *,
    salt: int | None = None,
    threshold: float = 0.01,
    vocab_size: int | None = None,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    per_token: bool = False,
    prompt: Sequence[int] | None = None,
) -> Detection:
    """Score ``token_ids`` (the generated tokens, from the first) for ``watermark``'s key.

    ``salt``: the sample's salt when known (then no correction), else every salt is tried (or the
    watermark's pinned ``salt``).  ``vocab_size``: the tokenizer's, to refuse ids it cannot have
    made (a tokenizer mismatch).  ``prompt``: the prompt's ids (its last ``h`` suffice), to
    score the opening of a version-2 text too (module doc).  Raises
    :class:`~ersd.errors.WatermarkError` on empty input, bad types, or fewer than ``min_tokens``
    scored positions.
    """
    ids, windows, tokens, positions, salts, opening = _checked_arrays(
        token_ids, watermark, salt, threshold, vocab_size, min_tokens, prompt
    )
    all_scores = token_scores(watermark, salts, windows, tokens)
    totals = all_scores.sum(axis=1)
    i = int(np.argmax(totals))  # the largest score has the smallest p-value (same n)
    s, scores, total = salts[i], all_scores[i], float(totals[i])
    p = gamma_p_value(total, len(tokens))
    return Detection(
        p_value=sidak(p, len(salts)),
        score=total,
        scored=len(tokens),
        skipped=int(len(ids) - opening - len(tokens)),
        salt=s,
        salt_p_value=p,
        salts_tried=len(salts),
        threshold=float(threshold),
        positions=positions.tolist() if per_token else [],
        token_scores=scores.tolist() if per_token else [],
        opening=opening,
    )


#: vLLM's default weight of key B in the dual-key detector (``WatermarkConfig.alpha``)
DEFAULT_DUAL_ALPHA = 0.1


def weighted_gamma_p_value(score: float, n: int, alpha: float) -> float:
    """``P((1 - alpha) X + alpha Y >= score)`` for independent ``X, Y ~ Gamma(n, 1)``, exact.

    The null law of the dual-key score (:func:`detect_dual`).  ``alpha`` 0, 1: one Gamma;
    ``alpha = 1/2``: ``Gamma(2n, 1)`` scaled by 1/2; otherwise one integral over ``Y`` of the
    Gamma density times ``X``'s survival, by adaptive quadrature to a relative 1e-10 (vLLM
    moment-matches a single Gamma instead, which is exact only at 0, 1/2 and 1).
    """
    if n <= 0:
        return 1.0
    score = max(float(score), 0.0)
    a, b = 1.0 - alpha, alpha
    if b == 0.0 or a == 0.0:
        return gamma_p_value(score, n)
    if a == b:
        return gamma_p_value(score / a, 2 * n)
    from scipy import integrate

    if a < b:  # X and Y are exchangeable: integrate over the one with the smaller weight
        a, b = b, a
    cut = score / b  # Y beyond this alone passes the score
    log_norm = math.lgamma(n)

    def f(y: float) -> float:  # Gamma(n, 1) density of Y times X's survival
        if y <= 0.0:
            return 0.0
        dens = math.exp((n - 1) * math.log(y) - y - log_norm)
        return dens * float(gammaincc(n, (score - b * y) / a))

    tail = float(gammaincc(n, cut))
    # the integrand's mass sits near Y's mode and near the cut: tell the quadrature
    points = [p for p in (max(n - 1.0, 0.0), cut * 0.5) if 0 < p < cut]
    body, _ = integrate.quad(f, 0.0, cut, epsabs=0.0, epsrel=1e-10, limit=400, points=points)
    return float(min(1.0, max(0.0, body + tail)))


def detect_dual(
    token_ids: Sequence[int],
    watermark: Watermark,
    *,
    alpha: float = DEFAULT_DUAL_ALPHA,
    salt: int | None = None,
    threshold: float = 0.01,
    vocab_size: int | None = None,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    prompt: Sequence[int] | None = None,
) -> Detection:
    """The two-key detector of the dual-key baseline (``sd-dual-key``), as vLLM's
    ``DualKeyGumbelWatermarkDetector``: each scored position (first occurrences of their window,
    as :func:`detect`) scores ``(1 - alpha) s_A + alpha s_B`` with ``s_K = -log(1 - r_K)`` under
    the derived keys A and B (:meth:`Watermark.derive`); the p-value of the sum is exact
    (:func:`weighted_gamma_p_value`), Šidák-corrected over the salts tried.  ``alpha``: the
    weight of key B, vLLM's default 0.1.  Other arguments as :func:`detect`."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
        raise WatermarkError(f"alpha (key B's weight) must lie in [0, 1], got {alpha!r}")
    ids, windows, tokens, _, salts, opening = _checked_arrays(
        token_ids, watermark, salt, threshold, vocab_size, min_tokens, prompt
    )
    sa = token_scores(watermark.derive("key_a"), salts, windows, tokens)
    sb = token_scores(watermark.derive("key_b"), salts, windows, tokens)
    totals = ((1.0 - alpha) * sa + alpha * sb).sum(axis=1)
    i = int(np.argmax(totals))
    total = float(totals[i])
    p = weighted_gamma_p_value(total, len(tokens), float(alpha))
    return Detection(
        p_value=sidak(p, len(salts)),
        score=total,
        scored=len(tokens),
        skipped=int(len(ids) - opening - len(tokens)),
        salt=salts[i],
        salt_p_value=p,
        salts_tried=len(salts),
        threshold=float(threshold),
        opening=opening,
    )


def encode_text(tokenizer: object, text: str) -> list[int]:
    """Token ids of a generated text as the generator emitted them: no special tokens added (an
    :class:`ersd.Tokenizer` or a Hugging Face tokenizer)."""
    hf = getattr(tokenizer, "hf_tokenizer", tokenizer)
    try:
        ids = hf.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    except TypeError:
        ids = hf.encode(text)  # type: ignore[attr-defined]
    return [int(t) for t in ids]
