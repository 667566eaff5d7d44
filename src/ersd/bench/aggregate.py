"""Aggregation of benchmark records into one :class:`Row` per configuration (see
:mod:`ersd.bench.report` for the definitions), best shapes per method and ERSD against HF
assisted generation."""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ersd.bench.stats import Interval, t_interval
from ersd.errors import ErsdError
from ersd.methods.catalog import report_order
from ersd.theory import (
    RankProfile,
    block_efficiency_bound,
    expected_block_efficiency_by_depth,
    tree_depth_probs,
)

BASELINE_METHODS = ("target-only", "target-only-2tok")


class ReportError(ErsdError):
    """Records could not be read or hold nothing to report."""


def read_all(
    paths: Sequence[str | Path],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(meta records, per-prompt result records, batch records) of one or more JSONL files;
    failed runs (field ``error``) are left out with a warning."""
    metas: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    batches: list[dict[str, Any]] = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise ReportError(f"records file {str(p)!r} does not exist; run `ersd bench run` first")
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ReportError(
                    f"{p}:{n} is not a JSON line ({exc.msg}); was the run interrupted mid-line? "
                    "delete the last line and retry"
                ) from None
            kind = rec.get("kind")
            (metas if kind == "meta" else batches if kind == "batch" else results).append(rec)
    failed = [r for r in results + batches if "error" in r]
    if failed:
        warnings.warn(
            f"{len(failed)} records are failed runs (field 'error', e.g. {failed[0]['error']!r}); "
            "they are left out of the report",
            RuntimeWarning,
            stacklevel=3,
        )
        results = [r for r in results if "error" not in r]
        batches = [r for r in batches if "error" not in r]
    if not results and not batches:
        raise ReportError("no result records found: the run wrote only metadata (or nothing)")
    return metas, results, batches


def read_records(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(meta records, per-prompt result records) of one or more JSONL files (batch records:
    :func:`read_all`)."""
    metas, results, _ = read_all(paths)
    if not results:
        raise ReportError(
            "no per-prompt result records found (only batch runs): use read_all for those"
        )
    return metas, results


@dataclass
class Row:
    """Summary of one configuration."""

    temperature: float
    method: str
    tree: str | None
    k: int | None
    choice: str | None
    aliases: list[str]
    n_prompts: int
    block_efficiency: Interval
    tokens_per_second: Interval
    speedup: Interval | None
    speedup_2tok: Interval | None
    time_split: tuple[float, float, float]  # draft, target, other fractions of wall time
    prediction: dict[str, Any] | None = None
    theory_be: float | None = None
    bound: float | None = None
    identical: tuple[int, int] | None = None  # (runs identical to target-only, runs)
    extra: dict[str, Any] = field(default_factory=dict)
    drafter: str | None = None  # drafter spec (model-free / hybrid); None: the draft model

    @property
    def label(self) -> str:
        if self.method in BASELINE_METHODS or self.method == "hf-generate":
            return self.method
        if self.method in ("hf-assisted", "hf-prompt-lookup"):
            return f"{self.method} (k={self.k})"
        tree = self.tree or ""
        if len(tree) > 28:
            tree = tree[:25] + "..."
        tag = f" [{self.choice}]" if self.choice else ""
        return f"{self.method} {tree}{tag}" + (f" @{self.drafter}" if self.drafter else "")


Key = tuple[float, str, str | None, int | None, str | None]


def _key(r: dict[str, Any]) -> Key:
    return (float(r["temperature"]), r["method"], r.get("tree"), r.get("k"), r.get("drafter"))


def _per_prompt(values: dict[str, list[float]]) -> list[float]:
    return [float(np.mean(v)) for v in values.values() if v]


def summarise(
    results: list[dict[str, Any]], metas: list[dict[str, Any]] | None = None
) -> list[Row]:
    """One :class:`Row` per configuration (see module docstring)."""
    metas = metas or []
    base: dict[tuple[str, str, float, int], dict[str, Any]] = {}
    for r in results:
        if r["method"] in BASELINE_METHODS:
            base[(r["method"], r["prompt_id"], float(r["temperature"]), int(r["seed"]))] = r
    profiles, vocab = _profiles(metas)
    groups: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[_key(r)].append(r)
    rows = []
    for key, recs in groups.items():
        temp, method, tree, k, drafter = key
        be: dict[str, list[float]] = defaultdict(list)
        tps: dict[str, list[float]] = defaultdict(list)
        sp: dict[str, list[float]] = defaultdict(list)
        sp2: dict[str, list[float]] = defaultdict(list)
        ident = [0, 0]
        for r in recs:
            pid = r["prompt_id"]
            be[pid].append(r["block_efficiency"])
            tps[pid].append(r["tokens_per_second"])
            for name, store in (("target-only", sp), ("target-only-2tok", sp2)):
                b = base.get((name, pid, temp, int(r["seed"])))
                if b is not None and b["tokens_per_second"] > 0:
                    store[pid].append(r["tokens_per_second"] / b["tokens_per_second"])
            b1 = base.get(("target-only", pid, temp, int(r["seed"])))
            if method == "ersd" and b1 is not None:
                ident[1] += 1
                ident[0] += int(r.get("tokens") == b1.get("tokens"))
        wall = sum(r["wall_time"] for r in recs) or 1.0
        split = (
            sum(r["draft_time"] for r in recs) / wall,
            sum(r["target_time"] for r in recs) / wall,
            sum(r["other_time"] for r in recs) / wall,
        )
        row = Row(
            temperature=temp,
            method=method,
            tree=tree,
            k=k,
            choice=recs[0].get("choice"),
            aliases=list(recs[0].get("aliases") or []),
            n_prompts=len(be),
            block_efficiency=t_interval(_per_prompt(be)),
            tokens_per_second=t_interval(_per_prompt(tps)),
            speedup=t_interval(_per_prompt(sp)) if sp else None,
            speedup_2tok=t_interval(_per_prompt(sp2)) if sp2 else None,
            time_split=split,
            extra={
                "ms_per_call": {
                    part: 1e3
                    * sum(r[f"{part}_time"] for r in recs)
                    / max(sum(r["target_calls"] for r in recs), 1)
                    for part in ("draft", "target", "other", "wall")
                }
            },
            prediction=recs[0].get("prediction"),
            identical=(ident[0], ident[1]) if ident[1] else None,
            drafter=drafter,
        )
        sources = source_totals(recs)
        if sources:
            row.extra["sources"] = sources
        prof = profiles.get(temp)  # theory only where a profile was measured at this T
        if method == "ersd" and prof is not None:
            paths = _paths(recs[0], metas)
            if paths is not None:
                row.theory_be = expected_block_efficiency_by_depth(paths, tree_depth_probs(prof))
            if k and vocab:
                row.bound = block_efficiency_bound(prof.rank_probs(), k, vocab)
        rows.append(row)
    rows.sort(
        key=lambda r: (
            -r.temperature,
            report_order(r.method),
            r.k or 0,
            r.drafter or "",
            r.tree or "",
        )
    )
    return rows


def source_totals(recs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per-source proposed / accepted / seconds summed over records (drafter runs only)."""
    out: dict[str, dict[str, float]] = {}
    for r in recs:
        for name, st in (r.get("drafter_stats") or {}).items():
            tot = out.setdefault(name, {"proposed": 0, "accepted": 0, "seconds": 0.0})
            for f in tot:
                tot[f] += st[f]
    for tot in out.values():
        tot["acceptance_rate"] = tot["accepted"] / tot["proposed"] if tot["proposed"] else 0.0
    return out


def _profiles(metas: list[dict[str, Any]]) -> tuple[dict[float, RankProfile], int | None]:
    profiles: dict[float, RankProfile] = {}
    vocab = None
    for m in metas:
        cal = m.get("calibration") or {}
        for t, d in (cal.get("profiles") or {}).items():
            profiles[float(t)] = RankProfile.from_dict(d)
            vocab = vocab or d.get("vocab_size")
    return profiles, vocab


def _paths(rec: dict[str, Any], metas: list[dict[str, Any]]) -> list[list[int]] | None:
    for m in metas:
        for entry in (m.get("plans") or {}).get(str(rec["temperature"]), []):
            if entry["method"] == rec["method"] and entry["tree"] == rec.get("tree"):
                paths: list[list[int]] | None = entry.get("paths")
                return paths
    return None


def rank_dependence(results: list[dict[str, Any]]) -> dict[float, dict[str, float]]:
    """How far ERSD's ranks are from i.i.d.: ``P(R = 1)`` overall and given the previous context's
    rank (1, or > 1), from the ranks of every ERSD run at T > 0.

    Consecutive contexts are consecutive ranks within a call, and the last rank of a call that
    ended in a rejection followed by the first rank of the next call (a call that accepted its
    whole path ends on a bonus token, whose context has no rank).  Under the i.i.d.-rank model the
    three probabilities are equal; "easy stretches" make ``P(R=1 | prev = 1)`` larger.
    """
    out: dict[float, dict[str, float]] = {}
    counts: dict[float, list[int]] = defaultdict(lambda: [0] * 6)
    for r in results:
        if r["method"] != "ersd" or float(r["temperature"]) <= 0 or not r.get("ranks"):
            continue
        c = counts[float(r["temperature"])]
        prev_last: int | None = None
        for rk in r["ranks"]:
            for x in rk:
                c[0] += 1
                c[1] += x == 1
            pairs = list(itertools.pairwise(rk))
            if prev_last is not None and prev_last > 1 and rk:
                pairs.append((prev_last, rk[0]))
            for a, b in pairs:
                if a == 1:
                    c[2] += 1
                    c[3] += b == 1
                else:
                    c[4] += 1
                    c[5] += b == 1
            prev_last = rk[-1] if rk else None
    for t, c in counts.items():
        if c[0]:
            out[t] = {
                "P(R=1)": c[1] / c[0],
                "P(R=1 | prev=1)": c[3] / c[2] if c[2] else math.nan,
                "P(R=1 | prev>1)": c[5] / c[4] if c[4] else math.nan,
                "pairs": float(c[2] + c[4]),
            }
    return out


def best_per_method(rows: list[Row], metric: str = "speedup") -> dict[str, dict[int, Row]]:
    """For each speculative method and budget k the configuration with the best mean ``metric``
    (``speedup`` or ``block_efficiency``)."""
    out: dict[str, dict[int, Row]] = {}
    for r in rows:
        value = getattr(r, metric)
        if r.method in BASELINE_METHODS or r.k is None or value is None:
            continue
        name = r.method + (f" @{r.drafter}" if r.drafter else "")
        cur = out.setdefault(name, {}).get(r.k)
        if cur is None or value.mean > getattr(cur, metric).mean:
            out[name][r.k] = r
    return out


def ersd_vs_hf(
    results: list[dict[str, Any]], rows: list[Row]
) -> list[tuple[float, int, Row, Interval]]:
    """Per temperature and k: ERSD's best configuration at budget k (by mean speedup) against
    Hugging Face assisted generation with ``num_assistant_tokens = k``, as a t-interval of
    per-prompt tokens/s ratios (same prompt, temperature and seed)."""
    hf = {
        (float(r["temperature"]), r["k"], r["prompt_id"], int(r["seed"])): r["tokens_per_second"]
        for r in results
        if r["method"] == "hf-assisted"
    }
    out = []
    for temp in sorted({r.temperature for r in rows}, reverse=True):
        best = best_per_method([r for r in rows if r.temperature == temp]).get("ersd", {})
        for k, row in sorted(best.items()):
            ratios: dict[str, list[float]] = defaultdict(list)
            for r in results:
                if r.get("drafter"):
                    continue
                if (float(r["temperature"]), r["method"], r.get("tree"), r.get("k")) != (
                    temp,
                    "ersd",
                    row.tree,
                    k,
                ):
                    continue
                den = hf.get((temp, k, r["prompt_id"], int(r["seed"])))
                if den:
                    ratios[r["prompt_id"]].append(r["tokens_per_second"] / den)
            if ratios:
                out.append((temp, k, row, t_interval(_per_prompt(ratios))))
    return out


def row_dict(r: Row) -> dict[str, Any]:
    def iv(x: Interval | None) -> dict[str, Any] | None:
        if x is None:
            return None
        return {
            "mean": x.mean,
            "low": _num(x.low),
            "high": _num(x.high),
            "n": x.n,
            "interval": x.method,
        }

    return {
        "temperature": r.temperature,
        "method": r.method,
        "tree": r.tree,
        "k": r.k,
        "choice": r.choice,
        "aliases": r.aliases,
        "drafter": r.drafter,
        "n_prompts": r.n_prompts,
        "block_efficiency": iv(r.block_efficiency),
        "tokens_per_second": iv(r.tokens_per_second),
        "speedup": iv(r.speedup),
        "speedup_vs_2tok": iv(r.speedup_2tok),
        "time_split": {
            "draft": r.time_split[0],
            "target": r.time_split[1],
            "other": r.time_split[2],
        },
        "theory_block_efficiency": r.theory_be,
        "bound": _num(r.bound) if r.bound else None,
        "prediction": r.prediction,
        "identical_to_target_only": list(r.identical) if r.identical else None,
        **r.extra,
    }


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else x
