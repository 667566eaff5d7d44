"""Audit a transcript: did this target, with this seed (and key), write exactly this text?

ERSD's text is a deterministic function of (seed, prompt, target, sampling settings[, watermark
key]): every emitted token is the race winner at its context.  With the target at hand, one
forward over prompt + text (the text scored as a chain, :meth:`ModelSession.score`) re-derives the
target's distribution at every position; regenerating each position's race gives its winner.
The report names the first position whose token is not the winner (an edit or another source)
and, for every position, the race **margin**: ``log`` of the runner-up's score over the
winner's, i.e. how far the winner was from losing.  Another kernel (a batched tree forward, a
GPU, bfloat16) moves log-probabilities by a little, so a mismatch whose margin is below
``tie_tolerance`` is a **near tie** another kernel could flip, reported as such and not called a
forgery.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ersd.errors import GenerationInputError
from ersd.watermark.settings import Watermark

#: default tie tolerance on the log race score (float32 forwards differ by ~1e-5 here)
DEFAULT_TIE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class PositionAudit:
    index: int
    token: int
    winner: int
    #: log(score of the runner-up / score of the winner) when the token won; log(score of the
    #: token / score of the winner) when it did not -- in both cases how close the call was
    margin: float
    near_tie: bool

    @property
    def matches(self) -> bool:
        return self.token == self.winner


@dataclass(frozen=True)
class AuditReport:
    """Per-position audit of a transcript (see the module doc)."""

    positions: list[PositionAudit] = field(repr=False)
    tie_tolerance: float
    watermarked: bool

    @property
    def mismatches(self) -> list[int]:
        return [p.index for p in self.positions if not p.matches]

    @property
    def first_mismatch(self) -> int | None:
        m = self.mismatches
        return m[0] if m else None

    @property
    def first_forgery(self) -> int | None:
        """The first mismatch that is not a near tie: the text was not (only) written so."""
        for p in self.positions:
            if not p.matches and not p.near_tie:
                return p.index
        return None

    @property
    def near_ties(self) -> list[int]:
        return [p.index for p in self.positions if p.near_tie]

    @property
    def verified(self) -> bool:
        """Every token is its race's winner, up to near ties."""
        return self.first_forgery is None

    def as_dict(self, per_position: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verified": self.verified,
            "tokens": len(self.positions),
            "mismatches": self.mismatches,
            "first_mismatch": self.first_mismatch,
            "first_forgery": self.first_forgery,
            "near_ties": self.near_ties,
            "min_margin": min((p.margin for p in self.positions), default=None),
            "tie_tolerance": self.tie_tolerance,
            "watermarked": self.watermarked,
        }
        if per_position:
            out["positions"] = [
                {"token": p.token, "winner": p.winner, "margin": p.margin, "near_tie": p.near_tie}
                for p in self.positions
            ]
        return out


def audit(
    target: Any,
    prompt: Sequence[int],
    text: Sequence[int],
    *,
    seed: int = 0,
    watermark: Watermark | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
) -> AuditReport:
    """Check that ``text`` (generated token ids) is what ``target`` samples after ``prompt`` with
    ``seed`` and these settings (and ``watermark``): one target forward, every race re-derived."""
    from ersd.probs import SamplingParams, logits_to_probs
    from ersd.race import STREAM_RACE, extend_key, race_scores, root_key
    from ersd.request import check_target
    from ersd.validation import check_seed, check_token_ids
    from ersd.watermark.keyed import WatermarkKey, race_noise
    from ersd.watermark.settings import check_watermark

    check_target(target)
    ids = check_token_ids(prompt, target.vocab_size)
    out = check_token_ids(text, target.vocab_size, name="text")
    seed = check_seed(seed)
    wm = check_watermark(watermark)
    params = SamplingParams(temperature, top_k, top_p, min_p)
    if not tie_tolerance >= 0:
        raise GenerationInputError(f"tie_tolerance must be >= 0, got {tie_tolerance!r}")
    window = target.max_length
    if window is not None and len(ids) + len(out) > window:
        raise GenerationInputError(
            f"prompt + text are {len(ids) + len(out)} tokens, past the target's context window "
            f"of {window}; audit a shorter text"
        )
    session = target.start(ids)
    logits = session.score(out, list(range(-1, len(out) - 1)))
    close = getattr(session, "close", None)
    if callable(close):
        close()
    noise = race_noise(target.vocab_size, wm)
    key: int = root_key(seed, ids)
    if wm is not None:
        key = WatermarkKey.root(key, wm, seed)
    positions: list[PositionAudit] = []
    for t, token in enumerate(out):
        row = logits[t]
        if params.greedy:
            values = row.to(dtype=logits.dtype).double().numpy()
            order = np.argsort(-values, kind="stable")[:2]
            winner = int(order[0])
            if token == winner:
                margin = float(values[winner] - values[order[1]]) if len(order) > 1 else np.inf
            else:
                margin = float(values[winner] - values[token])
        else:
            p = logits_to_probs(row, params)
            scores = race_scores(p, noise.exponentials(key, STREAM_RACE)).numpy()
            winner = int(scores.argmin())
            best = scores[winner]
            if token == winner:
                two = np.partition(scores, 1)[:2]
                margin = float(np.log(two[1]) - np.log(best))
            else:
                margin = float(np.log(scores[token]) - np.log(best))
        positions.append(PositionAudit(t, token, winner, margin, bool(margin <= tie_tolerance)))
        key = extend_key(key, token)
    return AuditReport(positions, tie_tolerance, wm is not None)
