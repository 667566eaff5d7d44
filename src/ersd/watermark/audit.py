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

**From text** (:func:`audit_text`): a text does not always re-tokenize to the ids that were
generated (a made-up word the model spelled in other pieces than the tokenizer's merges). A mismatch
whose race winner *continues the text as written* is such a re-tokenization, not an edit: the audit
re-aligns on the winner and goes on, and reports the positions it re-aligned (a winner that writes
no characters -- a special token the decoded text skips -- is inserted). Only a winner whose
characters depart from the text is a forgery; when that cannot be told (a token that decodes to part
of a character), the result says ``retokenized`` and names the position -- never a forgery. Auditing
the ids themselves (``ersd generate --json`` prints them) needs none of this.

The race key is made by :meth:`ersd.Request.root_key` and the noise by
:meth:`ersd.Request.resolve`, as generation makes them; the method must be one whose every token
is its race's winner (the catalog's ``race_output``,
:func:`ersd.methods.catalog.race_winners_only`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    #: :func:`audit_text`: positions where the text re-tokenized otherwise than generated and
    #: the audit re-aligned on the race's winner (its string continues the text)
    realigned: list[int] = field(default_factory=list)
    #: :func:`audit_text`: a position where the ids differ from the winner's and the characters
    #: cannot tell an edit from a re-tokenization (None: none)
    undecided: int | None = None

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
        return self.first_forgery is None and self.undecided is None

    @property
    def status(self) -> str:
        """``"verified"``, ``"forgery"`` (a token that is not its race's winner, beyond a near
        tie, whose characters depart from the winner's) or ``"retokenized"`` (undecided: audit
        the generated ids)."""
        if self.undecided is not None:
            return "retokenized"
        return "verified" if self.verified else "forgery"

    def as_dict(self, per_position: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verified": self.verified,
            "status": self.status,
            "realigned": self.realigned,
            "undecided": self.undecided,
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


def _checked_tolerance(tie_tolerance: Any) -> float:
    if (
        isinstance(tie_tolerance, bool)
        or not isinstance(tie_tolerance, int | float | np.floating)
        or not tie_tolerance >= 0
    ):
        raise GenerationInputError(
            f"tie_tolerance must be a number >= 0, got {tie_tolerance!r:.40}",
            param="tie_tolerance",
        )
    return float(tie_tolerance)


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
    method: str = "ersd",
) -> AuditReport:
    """Check that ``text`` (generated token ids) is what ``target`` samples after ``prompt`` with
    ``seed`` and these settings (and ``watermark``): one target forward, every race re-derived.
    ``method``: the generation's method, one whose every token is its race's winner."""
    from ersd.methods.catalog import race_winners_only
    from ersd.race import STREAM_RACE, extend_key, race_scores
    from ersd.request import Request, check_target
    from ersd.validation import check_token_ids

    check_target(target)
    tol = _checked_tolerance(tie_tolerance)
    if not isinstance(method, str) or not race_winners_only(method):
        raise GenerationInputError(
            f"method {method!r}: the audit checks that every token is its race's winner, which "
            "holds for methods whose text is all race winners (ersd) and for target-only "
            "sampling; other methods emit draft samples",
            param="method",
        )
    out = check_token_ids(text, target.vocab_size, name="text")
    request = Request.of(
        prompt,
        max_new_tokens=max(len(out), 1),
        seed=seed,
        method=method,
        tree=None,
        watermark=watermark,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
    )
    settings = request.resolve(target, None)
    ids = list(request.prompt)
    params, noise = settings.params, settings.noise
    window = target.max_length
    if window is not None and len(ids) + len(out) > window:
        raise GenerationInputError(
            f"prompt + text are {len(ids) + len(out)} tokens, past the target's context window "
            f"of {window}; audit a shorter text"
        )
    from ersd.probs import logits_to_probs

    session = target.start(ids)
    logits = session.score(out, list(range(-1, len(out) - 1)))
    close = getattr(session, "close", None)
    if callable(close):
        close()
    key: int = request.root_key()
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
        positions.append(PositionAudit(t, token, winner, margin, bool(margin <= tol)))
        key = extend_key(key, token)
    return AuditReport(positions, tol, watermark is not None)


#: re-alignments :func:`audit_text` tries before it calls the text undecided
MAX_REALIGN = 32


def audit_text(
    target: Any,
    tokenizer: Any,
    prompt: Sequence[int],
    text: str,
    **settings: Any,
) -> AuditReport:
    """:func:`audit` of a generated *text*: tokenized, then re-aligned on the race's winner
    wherever the text re-tokenizes otherwise than the generator emitted (module doc).  Never
    calls authentic text a forgery: a mismatch is a forgery only when the winner's characters
    depart from the text's; when that cannot be told the report's ``status`` is
    ``"retokenized"``.  ``settings``: :func:`audit`'s keywords."""
    from ersd.watermark.detect import encode_text

    if not isinstance(text, str):
        raise GenerationInputError(f"text must be a str, got {type(text).__name__}", param="text")

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    ids = encode_text(tokenizer, text)
    realigned: list[int] = []
    for _ in range(MAX_REALIGN + 1):
        rep = audit(target, prompt, ids, **settings)
        t = rep.first_forgery
        if t is None:
            return replace(rep, realigned=realigned)
        winner = rep.positions[t].winner
        head = decode(ids[:t])
        ahead = decode([*ids[:t], winner])
        if "\ufffd" in ahead[len(head) :] or not text.startswith(head):
            return replace(rep, realigned=realigned, undecided=t)  # part of a character
        if not text.startswith(ahead):
            return replace(rep, realigned=realigned)  # the winner writes other characters
        realigned.append(t)
        if len(ahead) == len(head):  # a token the text does not show (a skipped special one)
            ids = [*ids[:t], winner, *ids[t:]]
            continue
        ids = [*ids[:t], winner, *encode_text(tokenizer, text[len(ahead) :])]
        if decode(ids) != text:  # the tail re-tokenized across the cut: cannot re-align
            return replace(rep, realigned=realigned[:-1], undecided=t)
    return replace(rep, realigned=realigned, undecided=t)
