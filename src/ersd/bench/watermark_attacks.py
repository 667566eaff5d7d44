"""The watermark's attack suite (issue 52): ``ersd bench watermark attacks``.

Watermarked texts from the target (target-only sampling with the benchmark key, the same texts
watermarked ERSD writes) are attacked, and each attacked text is scored by the model-free detector
(:func:`ersd.watermark.detect`) and the model-weighted one
(:func:`ersd.watermark.weighted.detect_with_model`, the target at the generation's temperature),
both over the text alone (no prompt: what an operator handed a text has); documents with a pasted
span also by the localized scan (:func:`ersd.watermark.localize.scan`).  The attacks:

* ``replace`` / ``insert`` / ``delete`` -- ``round(rate * n)`` of a text's ``n`` tokens: distinct
  positions replaced by a different token drawn uniformly from the vocabulary; new tokens
  (uniform) inserted at uniformly drawn gaps of the original (several may share a gap); distinct
  positions deleted.  Token level, each draw seeded by (seed, attack, rate, text, temperature);
* ``cut-paste`` -- the text's first ``span`` tokens (64-256) pasted at a uniformly drawn token
  boundary inside ``human`` tokens (1k-4k) of human-written text (the ``fpr`` part's: Python
  stdlib docstrings and comments, licence texts, man pages); the same human chunks alone are the
  control (``human-only``: a false-positive check of all three detectors);
* ``paraphrase`` -- a local instruct model (default the bundled ``qwen2.5-coder-0.5b``) asked,
  through its chat template, to rewrite the decoded text (:data:`PARAPHRASE_INSTRUCTION`),
  sampled at ``paraphrase_temperature``; its reply is re-encoded with the target's tokenizer.

``none`` (the texts unattacked) is the reference.  A text *detected* has p <= 0.01: both
detectors' nulls are exact (the scan's is conservative), so this is the TPR at 1% FPR; rates
carry Clopper-Pearson 95% intervals (:func:`ersd.bench.stats.rate`, scipy).  ``kept_windows`` is
the share of an attacked text's scored (window, token) pairs -- ``h + 1``-grams -- that occur in
the original: roughly the share of positions still carrying the mark.

Every scored text is one JSON line of ``attacks.jsonl``, written (and flushed) as it is made, so
a run cut short keeps what it did; :func:`summarize` and :func:`report_lines` rebuild the table
from the lines alone.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ersd.bench.errors import BenchConfigError
from ersd.bench.stats import rate as rate_record
from ersd.watermark import Watermark, detect
from ersd.watermark.detect import encode_text

ATTACKS = ("replace", "insert", "delete", "cut-paste", "paraphrase")
TOKEN_ATTACKS = ("replace", "insert", "delete")
DEFAULT_RATES = (0.1, 0.2, 0.3, 0.5)
DEFAULT_SPAN_TOKENS = (64, 256)
DEFAULT_HUMAN_TOKENS = (1024, 4096)
DEFAULT_PARAPHRASER = "qwen2.5-coder-0.5b"
#: the detection threshold: p <= 1% (the nulls are exact, so 1% FPR)
THRESHOLD = 0.01
#: marked texts shorter than this (stopped early at end-of-text) are left out, and counted
MIN_TEXT_TOKENS = 16
PARAPHRASE_INSTRUCTION = (
    "Rewrite the following text in your own words. Keep its meaning and roughly its length. "
    "Reply with the rewritten text only.\n\n"
)
_CODES = {"none": 0, "replace": 1, "insert": 2, "delete": 3, "cut-paste": 4, "paraphrase": 5}


# --- settings -----------------------------------------------------------------------------------


def check_rate(rate: Any) -> float:
    """``rate`` if it is a fraction in (0, 1), else a one-line :class:`BenchConfigError`."""
    ok = isinstance(rate, int | float | np.floating) and not isinstance(rate, bool)
    if not ok or not 0 < rate < 1:
        raise BenchConfigError(
            f"an attack rate is the fraction of a text's tokens edited and must lie in (0, 1), "
            f"got {rate!r:.40}; e.g. --attack-rates 0.1,0.3,0.5"
        )
    return float(rate)


@dataclass(frozen=True)
class AttackSettings:
    """What the attack part runs (module doc); :meth:`checked` refuses bad values, one line each."""

    attacks: tuple[str, ...] = ATTACKS
    rates: tuple[float, ...] = DEFAULT_RATES
    span_tokens: tuple[int, ...] = DEFAULT_SPAN_TOKENS
    human_tokens: tuple[int, ...] = DEFAULT_HUMAN_TOKENS
    texts: int = 40
    paraphraser: str = DEFAULT_PARAPHRASER
    paraphrase_temperature: float = 0.7
    #: paraphrase only the first this many texts (``None``: all; the paraphraser is the slow part)
    paraphrase_texts: int | None = None
    seed: int = 20261206

    def checked(self) -> AttackSettings:
        bad = [a for a in self.attacks if a not in ATTACKS]
        if bad or not self.attacks:
            raise BenchConfigError(
                f"unknown attack(s) {bad or '(none given)'}; choose among {', '.join(ATTACKS)}"
            )
        for r in self.rates:
            check_rate(r)
        if any(a in TOKEN_ATTACKS for a in self.attacks) and not self.rates:
            raise BenchConfigError("no attack rates given; e.g. --attack-rates 0.1,0.3,0.5")
        if not isinstance(self.texts, int) or self.texts < 1:
            raise BenchConfigError(f"--attack-texts must be a positive integer, got {self.texts}")
        if "cut-paste" in self.attacks:
            if not self.span_tokens or not self.human_tokens:
                raise BenchConfigError(
                    "cut-paste needs --span-tokens and --human-tokens, e.g. 64,256 and 1024,4096"
                )
            for s in self.span_tokens:
                if not isinstance(s, int) or s < MIN_TEXT_TOKENS:
                    raise BenchConfigError(
                        f"--span-tokens must be integers >= {MIN_TEXT_TOKENS}, got {s!r}"
                    )
            for h in self.human_tokens:
                if not isinstance(h, int) or h < 1:
                    raise BenchConfigError(f"--human-tokens must be positive integers, got {h!r}")
        n = self.paraphrase_texts
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise BenchConfigError(f"--paraphrase-texts must be a positive integer, got {n!r}")
        pt = self.paraphrase_temperature
        if isinstance(pt, bool) or not isinstance(pt, int | float) or not 0 < pt <= 10:
            raise BenchConfigError(
                f"--paraphrase-temperature must be a number in (0, 10], got {pt!r}"
            )
        return self


def parse_settings(
    attacks: str,
    rates: str,
    span_tokens: str,
    human_tokens: str,
    texts: int,
    paraphraser: str,
    paraphrase_temperature: float,
    paraphrase_texts: int | None = None,
) -> AttackSettings:
    """:class:`AttackSettings` from the command line's comma-separated lists, checked."""

    def items(s: str) -> list[str]:
        return [x.strip() for x in s.split(",") if x.strip()]

    try:
        rate_list = tuple(float(x) for x in items(rates))
    except ValueError:
        raise BenchConfigError(
            f"--attack-rates must be comma-separated fractions such as 0.1,0.3,0.5, got {rates!r}"
        ) from None
    try:
        spans = tuple(int(x) for x in items(span_tokens))
        human = tuple(int(x) for x in items(human_tokens))
    except ValueError:
        raise BenchConfigError(
            "--span-tokens and --human-tokens are comma-separated token counts such as 64,256 and "
            f"1024,4096, got {span_tokens!r} and {human_tokens!r}"
        ) from None
    chosen = tuple(items(attacks))
    return AttackSettings(
        attacks=tuple(ATTACKS) if chosen == ("all",) else chosen,
        rates=rate_list,
        span_tokens=spans,
        human_tokens=human,
        texts=texts,
        paraphraser=paraphraser,
        paraphrase_temperature=paraphrase_temperature,
        paraphrase_texts=paraphrase_texts,
    ).checked()


# --- the attacks --------------------------------------------------------------------------------


def attack_rng(seed: int, attack: str, setting: int, text: int, temperature: float) -> Any:
    """The generator of one attack on one text (``setting``: the rate in thousandths, or the span
    and human lengths): the same arguments, the same draws."""
    return np.random.default_rng([seed, _CODES[attack], setting, text, round(temperature * 1000)])


def _edits(n: int, rate: float) -> int:
    return round(check_rate(rate) * n)


def replace_tokens(tokens: Sequence[int], rate: float, vocab_size: int, rng: Any) -> list[int]:
    """``tokens`` with ``round(rate * n)`` distinct positions replaced, each by a token drawn
    uniformly among the ``vocab_size - 1`` others."""
    if vocab_size < 2:
        raise BenchConfigError(f"replacing tokens needs a vocabulary of >= 2, got {vocab_size}")
    out = [int(t) for t in tokens]
    k = _edits(len(out), rate)
    pos = rng.choice(len(out), size=k, replace=False)
    new = rng.integers(0, vocab_size - 1, size=k)
    for i, t in zip(pos.tolist(), new.tolist(), strict=True):
        out[i] = t + (t >= out[i])  # skip the original: uniform over the others
    return out


def insert_tokens(tokens: Sequence[int], rate: float, vocab_size: int, rng: Any) -> list[int]:
    """``tokens`` with ``round(rate * n)`` uniform tokens inserted, each at a gap (``0..n``) of
    the original drawn uniformly; the original stays a subsequence, in order."""
    ids = [int(t) for t in tokens]
    k = _edits(len(ids), rate)
    gaps = np.sort(rng.integers(0, len(ids) + 1, size=k)).tolist()
    new = rng.integers(0, vocab_size, size=k).tolist()
    out: list[int] = []
    j = 0
    for i in range(len(ids) + 1):
        while j < k and gaps[j] == i:
            out.append(new[j])
            j += 1
        if i < len(ids):
            out.append(ids[i])
    return out


def delete_tokens(tokens: Sequence[int], rate: float, rng: Any) -> list[int]:
    """``tokens`` without ``round(rate * n)`` distinct positions drawn uniformly (order kept)."""
    ids = [int(t) for t in tokens]
    k = _edits(len(ids), rate)
    if k >= len(ids):
        raise BenchConfigError(
            f"deleting {k} of {len(ids)} tokens leaves nothing: lower the rate ({rate})"
        )
    drop = set(rng.choice(len(ids), size=k, replace=False).tolist())
    return [t for i, t in enumerate(ids) if i not in drop]


def paste_into(marked: Sequence[int], human: Sequence[int], rng: Any) -> tuple[list[int], int, int]:
    """(document, start, end): ``marked`` inserted at a token boundary of ``human`` drawn
    uniformly; ``[start, end)`` are the marked tokens' positions in the document."""
    at = int(rng.integers(0, len(human) + 1))
    doc = [int(t) for t in human[:at]] + [int(t) for t in marked] + [int(t) for t in human[at:]]
    return doc, at, at + len(marked)


def kept_windows(original: Sequence[int], attacked: Sequence[int], context_width: int) -> float:
    """The share of ``attacked``'s (``h`` tokens, next token) pairs that occur in ``original``."""
    g = context_width + 1

    def grams(ids: Sequence[int]) -> list[tuple[int, ...]]:
        return [tuple(int(t) for t in ids[i : i + g]) for i in range(len(ids) - g + 1)]

    mine = grams(attacked)
    if not mine:
        return math.nan
    theirs = set(grams(original))
    return sum(x in theirs for x in mine) / len(mine)


def paraphrase(
    paraphraser: Any, text: str, *, temperature: float, seed: int, max_new_tokens: int
) -> str:
    """``paraphraser`` (an instruct :class:`ersd.TextModel`) asked through its chat template to
    rewrite ``text``; its reply, sampled at ``temperature``, as text."""
    import ersd

    tok = paraphraser.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": PARAPHRASE_INSTRUCTION + text}])
    res = ersd.generate(
        paraphraser,
        None,
        prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        eos_token_id=getattr(paraphraser, "eos_token_ids", None),
    )
    return str(tok.decode(res.tokens, skip_special_tokens=True)).strip()


# --- scoring ------------------------------------------------------------------------------------


def score(
    ids: Sequence[int],
    wm: Watermark,
    model: Any,
    temperature: float,
    *,
    expected: bool = True,
    localize: bool = False,
) -> dict[str, Any]:
    """One text's p-values: ``p_model_free``, ``p_weighted`` (with ``verdict_weighted`` and, when
    ``expected``, ``expected_power``) and, with ``localize``, ``p_scan`` and ``spans``.  A text
    with no scored position (a window of ``h`` tokens needs ``h + 1``) scores p = 1."""
    from ersd.errors import WatermarkError
    from ersd.watermark.weighted import detect_with_model

    out: dict[str, Any] = {"tokens": len(ids)}
    if len(ids) <= wm.context_width:
        out.update(p_model_free=1.0, p_weighted=1.0, verdict_weighted="not enough signal")
        if localize:
            out.update(p_scan=1.0, spans=[])
        out["unscorable"] = True
        return out
    try:
        d = detect(ids, wm, min_tokens=1)
        out["p_model_free"], out["scored"] = d.p_value, d.scored
        w = detect_with_model(
            ids, wm, model, temperature=temperature, min_tokens=1, expected=expected
        )
        out["p_weighted"], out["verdict_weighted"] = w.p_value, w.verdict
        if expected:
            out["expected_power"] = w.expected_power
        if localize:
            from ersd.watermark.localize import scan

            loc = scan(ids, wm, min_tokens=1)
            out["p_scan"] = loc.p_value
            out["spans"] = [[s.start, s.end, s.p_value] for s in loc.spans]
    except WatermarkError as exc:  # e.g. every window repeated: nothing to score
        out.update(p_model_free=1.0, p_weighted=1.0, unscorable=str(exc))
        if localize:
            out.update(p_scan=1.0, spans=[])
    return out


def span_iou(spans: Iterable[Sequence[float]], start: int, end: int) -> float:
    """The largest intersection-over-union of a reported span ``[a, b, p]`` with
    ``[start, end)`` (0 when none overlaps)."""
    best = 0.0
    for a, b, *_ in spans:
        inter = max(0, min(b, end) - max(a, start))
        union = max(b, end) - min(a, start)
        best = max(best, inter / union if union else 0.0)
    return best


# --- the part -----------------------------------------------------------------------------------

Texts = list[tuple[int, list[int]]]


def _token_records(
    usable: Texts, settings: AttackSettings, wm: Watermark, target: Any, temp: float
) -> Iterator[dict[str, Any]]:
    vocab = int(target.vocab_size)
    for attack in (a for a in TOKEN_ATTACKS if a in settings.attacks):
        for r in settings.rates:
            for i, ids in usable:
                rng = attack_rng(settings.seed, attack, round(r * 1000), i, temp)
                if attack == "replace":
                    new = replace_tokens(ids, r, vocab, rng)
                elif attack == "insert":
                    new = insert_tokens(ids, r, vocab, rng)
                else:
                    new = delete_tokens(ids, r, rng)
                yield {
                    "attack": attack,
                    "setting": f"{round(r * 100)}%",
                    "rate": r,
                    "text": i,
                    "tokens_in": len(ids),
                    "kept_windows": kept_windows(ids, new, wm.context_width),
                    **score(new, wm, target, temp),
                }


def _paste_records(
    full: Texts,
    human: dict[int, list[list[int]]],
    settings: AttackSettings,
    wm: Watermark,
    target: Any,
    temp: float,
) -> Iterator[dict[str, Any]]:
    """Text ``j`` of ``full`` meets human chunk ``j`` (the control, after the pastes, scores that
    chunk alone)."""
    for h in settings.human_tokens:
        chunks = human[h]
        for span in settings.span_tokens:
            for j, (i, ids) in enumerate(full):
                if len(ids) < span:
                    continue
                rng = attack_rng(settings.seed, "cut-paste", span * 10**6 + h, i, temp)
                doc, a, b = paste_into(ids[:span], chunks[j % len(chunks)], rng)
                rec = score(doc, wm, target, temp, expected=False, localize=True)
                yield {
                    "attack": "cut-paste",
                    "setting": f"{span} in {h}",
                    "span_tokens": span,
                    "human_tokens": h,
                    "text": i,
                    "span": [a, b],
                    "iou": span_iou(rec["spans"], a, b),
                    **rec,
                }
        for j, (i, _) in enumerate(full):
            chunk = chunks[j % len(chunks)]
            yield {
                "attack": "human-only",
                "setting": f"{h} human tokens",
                "human_tokens": h,
                "text": i,
                **score(chunk, wm, target, temp, expected=False, localize=True),
            }


def _paraphrase_records(
    usable: Texts,
    paraphraser: Any,
    tokenizer: Any,
    settings: AttackSettings,
    wm: Watermark,
    target: Any,
    temp: float,
) -> Iterator[dict[str, Any]]:
    name = getattr(paraphraser, "name", settings.paraphraser)
    pt = settings.paraphrase_temperature
    for i, ids in usable[: settings.paraphrase_texts]:
        text = str(tokenizer.decode(ids, skip_special_tokens=True))
        budget = 2 * len(encode_text(paraphraser.tokenizer, text)) + 16
        new_text = paraphrase(paraphraser, text, temperature=pt, seed=i, max_new_tokens=budget)
        new = encode_text(tokenizer, new_text)
        yield {
            "attack": "paraphrase",
            "setting": f"{name}, T={pt:g}",
            "paraphraser": name,
            "text": i,
            "tokens_in": len(ids),
            "kept_windows": kept_windows(ids, new, wm.context_width),
            "paraphrase": new_text[:4000],
            **score(new, wm, target, temp),
        }


def attacks_part(
    marked: dict[float, list[dict[str, Any]]],
    human: dict[int, list[list[int]]],
    target: Any,
    tokenizer: Any,
    wm: Watermark,
    settings: AttackSettings,
    records_path: Path,
    *,
    paraphraser: Any = None,
    max_tokens: int | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Attack the watermarked texts ``marked`` (by temperature: ``{"tokens": ids, ...}``; the first
    ``max_tokens`` of each, the cut-paste spans excepted), write one JSON line per scored text to
    ``records_path`` as it goes, and return :func:`summarize` of them.  ``human``: chunks of
    human-written token ids by length (``settings.human_tokens``); ``paraphraser``: a loaded
    instruct model (needed for ``paraphrase``)."""
    if "paraphrase" in settings.attacks and paraphraser is None:
        raise BenchConfigError("the paraphrase attack needs a paraphraser model")
    missing = [h for h in settings.human_tokens if not human.get(h)]
    if "cut-paste" in settings.attacks and missing:
        raise BenchConfigError(f"cut-paste needs human text chunks of {missing} tokens")
    records: list[dict[str, Any]] = []
    records_path.parent.mkdir(parents=True, exist_ok=True)
    with records_path.open("w") as f:

        def emit(rec: dict[str, Any]) -> None:
            records.append(rec)
            f.write(json.dumps(rec) + "\n")
            f.flush()

        for temp, texts in marked.items():
            full = [(i, [int(t) for t in x["tokens"]]) for i, x in enumerate(texts)]
            dropped = [i for i, ids in full if len(ids) < MIN_TEXT_TOKENS]
            full = [(i, ids) for i, ids in full if len(ids) >= MIN_TEXT_TOKENS]
            usable = [(i, ids[:max_tokens] if max_tokens else ids) for i, ids in full]
            emit({"kind": "texts", "temperature": temp, "texts": len(texts), "dropped": dropped})
            log(
                f"[attacks] T={temp}: {len(usable)} texts ({len(dropped)} under "
                f"{MIN_TEXT_TOKENS} tokens left out)"
            )
            parts: list[Iterable[dict[str, Any]]] = [
                ({"attack": "none", "setting": "-", "text": i, **score(ids, wm, target, temp)}
                 for i, ids in usable),
                _token_records(usable, settings, wm, target, temp),
            ]  # fmt: skip
            if "paraphrase" in settings.attacks:
                parts.append(
                    _paraphrase_records(usable, paraphraser, tokenizer, settings, wm, target, temp)
                )
            if "cut-paste" in settings.attacks:  # last: the long documents cost the most
                parts.append(_paste_records(full, human, settings, wm, target, temp))
            last = None
            for part in parts:
                for rec in part:
                    emit({"kind": "score", "temperature": temp, **rec})
                    if (rec["attack"], rec["setting"]) != last:
                        last = (rec["attack"], rec["setting"])
                        log(f"[attacks] T={temp} {last[0]} {last[1]}")
    return summarize(records)


# --- summary and report -------------------------------------------------------------------------


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``attacks.jsonl`` (a last line cut short by a killed run is skipped)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


_ORDER = {
    "none": 0,
    "replace": 1,
    "insert": 2,
    "delete": 3,
    "cut-paste": 4,
    "paraphrase": 5,
    "human-only": 6,
}


def _median(xs: Sequence[float | None]) -> float:
    vals = [float(x) for x in xs if x is not None and not math.isnan(x)]
    return float(statistics.median(vals)) if vals else math.nan


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per (temperature, attack, setting): texts, detection rates at p <= 0.01 with
    Clopper-Pearson 95% intervals for each detector (for ``human-only``: false-positive rates),
    median tokens, kept windows and span IoU."""
    groups: dict[tuple[float, str, str], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "score":
            groups.setdefault((r["temperature"], r["attack"], r["setting"]), []).append(r)
    cells = []
    for (temp, attack, setting), rs in groups.items():
        cell: dict[str, Any] = {
            "temperature": temp,
            "attack": attack,
            "setting": setting,
            "texts": len(rs),
            "median_tokens": _median([r["tokens"] for r in rs]),
        }
        for det in ("model_free", "weighted", "scan"):
            ps = [r[f"p_{det}"] for r in rs if f"p_{det}" in r]
            if ps:
                cell[f"rate_{det}"] = rate_record(sum(p <= THRESHOLD for p in ps), len(ps))
        if any("kept_windows" in r for r in rs):
            cell["median_kept_windows"] = _median([r.get("kept_windows") for r in rs])
        if any("iou" in r for r in rs):
            cell["median_iou"] = _median([r["iou"] for r in rs])
            cell["span_found"] = rate_record(sum(r["iou"] > 0 for r in rs), len(rs))
        weak = [r for r in rs if r.get("verdict_weighted") == "not enough signal"]
        if any("expected_power" in r for r in rs):
            cell["not_enough_signal"] = len(weak)
        cells.append(cell)
    cells.sort(key=lambda c: (c["temperature"], _ORDER.get(c["attack"], 9), _sort_key(c)))
    return {"threshold": THRESHOLD, "cells": cells}


def _sort_key(cell: dict[str, Any]) -> tuple[float, ...]:
    nums = [
        float(x.rstrip("%"))
        for x in cell["setting"].replace(",", " ").split()
        if x.rstrip("%").replace(".", "", 1).isdigit()
    ]
    return tuple(nums)


def _ci(r: dict[str, Any] | None) -> str:
    if not r or not r["n"]:
        return "-"
    lo, hi = r["ci95"]
    return f"{r['rate']:.2f} [{lo:.2f}, {hi:.2f}]"


def report_lines(summary: dict[str, Any]) -> list[str]:
    """The attack tables (markdown): TPR at 1% FPR per attack, and the human-only control."""
    cells = summary["cells"]
    lines = [
        "## Attacks: TPR at 1% FPR (p <= 0.01), Clopper-Pearson 95% intervals",
        "",
        "Each text scored alone (no prompt). Model-weighted: the target's probabilities at the "
        "generation's temperature. Localized: the scan over windows (cut-paste only). Kept: "
        "median share of the attacked text's (window, token) pairs found in the original.",
        "",
        "| T | attack | setting | texts | tokens (median) | model-free | model-weighted "
        "| localized | span found (median IoU) | kept |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        if c["attack"] == "human-only":
            continue
        found = f"{_ci(c['span_found'])} ({c['median_iou']:.2f})" if "median_iou" in c else "-"
        kept = f"{c['median_kept_windows']:.2f}" if "median_kept_windows" in c else "-"
        lines.append(
            f"| {c['temperature']:g} | {c['attack']} | {c['setting']} | {c['texts']} | "
            f"{c['median_tokens']:.0f} | {_ci(c.get('rate_model_free'))} | "
            f"{_ci(c.get('rate_weighted'))} | {_ci(c.get('rate_scan'))} | {found} | {kept} |"
        )
    ctrl = [c for c in cells if c["attack"] == "human-only"]
    if ctrl:
        lines += [
            "",
            "False positives on the human chunks alone (the cut-paste documents without the "
            "paste), p <= 0.01:",
            "",
            "| T | human tokens | documents | model-free | model-weighted | localized |",
            "|---|---|---|---|---|---|",
        ]
        for c in ctrl:
            lines.append(
                f"| {c['temperature']:g} | {c['setting'].split()[0]} | {c['texts']} | "
                f"{_ci(c.get('rate_model_free'))} | {_ci(c.get('rate_weighted'))} | "
                f"{_ci(c.get('rate_scan'))} |"
            )
    weak = [c for c in cells if c.get("not_enough_signal")]
    if weak:
        lines += [
            "",
            "Texts the model-weighted detector called *not enough signal* (not detected, expected "
            "power < 0.9): "
            + "; ".join(
                f"T={c['temperature']:g} {c['attack']} {c['setting']}: "
                f"{c['not_enough_signal']}/{c['texts']}"
                for c in weak
            )
            + ".",
        ]
    lines.append("")
    return lines


__all__ = [
    "ATTACKS",
    "AttackSettings",
    "attacks_part",
    "delete_tokens",
    "insert_tokens",
    "kept_windows",
    "paraphrase",
    "parse_settings",
    "paste_into",
    "replace_tokens",
    "report_lines",
    "summarize",
]
