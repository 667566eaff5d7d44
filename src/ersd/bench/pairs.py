"""Paired comparisons of benchmark records (``ersd bench pairs``).

At T > 0 each configuration samples its own text, and on a few dozen prompts the intervals of two
independent means are wider than the gaps that matter.  Pairing every configuration with a
reference run on the **same prompt, temperature and seed** removes the prompt-to-prompt spread:
per run the ratio of tokens per target call and of tokens/s to the reference, then Student-t 95%
intervals over runs (:func:`ersd.bench.stats.t_interval`).  The table gives each configuration's
per-run mean tokens per call (with its interval) and the pooled one (all tokens ÷ all calls).

A configuration is labelled ``method tree`` (``@drafter`` when a drafter other than the draft
model drafted; baselines by their method alone).  A reference label may hold ``{k}``, the
configuration's budget (the number in ``chain:K`` / ``dynamic:K`` / ``multi:MxL``'s ``M·L``...),
so ``--against "sd chain:{k}"`` pairs every configuration with SD's chain of the same budget.
ERSD's text is a function of the seed, the prompt and the target alone, so the report also counts
the runs in which every ERSD configuration gave one text (drafter and tree invariance).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ersd.bench.stats import t_interval

Run = dict[str, dict[str, Any]]  # configuration label -> its record, for one (prompt, seed)


def label(rec: dict[str, Any]) -> str:
    """``method tree[ @drafter]`` of a result record (a baseline: its method)."""
    name = str(rec["method"])
    if rec.get("tree"):
        name += f" {rec['tree']}"
    if rec.get("drafter"):
        name += f" @{rec['drafter']}"
    return name


def budget(name: str) -> int | None:
    """The drafted-token budget a label names (``chain:8``, ``dynamic:8@4`` -> 8), else None."""
    m = re.search(r"(?:chain|dynamic|dynamic-cost|batch|binary|optimal):(\d+)", name)
    if m:
        return int(m.group(1))
    m = re.search(r"multi:(\d+)x(\d+)", name)
    return int(m.group(1)) * int(m.group(2)) if m else None


def runs_by_temperature(records: Iterable[dict[str, Any]]) -> dict[float, list[Run]]:
    """The successful per-prompt result records grouped by temperature, then by (prompt, seed)."""
    by: dict[tuple[float, str, Any], Run] = defaultdict(dict)
    for r in records:
        if r.get("kind", "result") == "result" and "error" not in r and "tokens" in r:
            by[(float(r["temperature"]), str(r["prompt_id"]), r.get("seed"))][label(r)] = r
    out: dict[float, list[Run]] = defaultdict(list)
    for (temp, _, _), run in by.items():
        out[temp].append(run)
    return dict(sorted(out.items()))


def _lookup_share(recs: list[dict[str, Any]]) -> str:
    """The lookup drafter's own seconds as a share of the runs' wall time ("–": no lookup)."""
    stats = [r.get("drafter_stats") or {} for r in recs]
    if not any("lookup" in s for s in stats):
        return "–"
    seconds = sum(s.get("lookup", {}).get("seconds", 0.0) for s in stats)
    return f"{100 * seconds / sum(r['wall_time'] for r in recs):.2f}%"


def _per_call(rec: dict[str, Any]) -> float:
    return float(rec["num_tokens"]) / float(rec["target_calls"])


def pairs_report(records: Iterable[dict[str, Any]], against: Sequence[str]) -> str:
    """A markdown report: per temperature, every configuration's tokens per call, tokens/s and
    draft forwards per call, its paired ratios to each reference of ``against``, and the ERSD
    text-invariance count (see the module docstring)."""
    lines: list[str] = []
    for temp, runs in runs_by_temperature(records).items():
        names = sorted({n for run in runs for n in run})
        recs = [r for run in runs for r in run.values()]
        lookup = any("lookup" in (r.get("drafter_stats") or {}) for r in recs)
        head = (
            "| configuration | runs | tokens/call | tokens/s | pooled tokens/call "
            "| draft forwards / call |"
        )
        lines += [
            f"\n### T = {temp:g} ({len(runs)} prompt × seed runs)\n",
            head + (" lookup time (share of wall) |" if lookup else ""),
            "|---|---|---|---|---|---|" + ("---|" if lookup else ""),
        ]
        for n in names:
            mine = [run[n] for run in runs if n in run]
            calls = sum(r["target_calls"] for r in mine)
            forwards = sum(r.get("draft_forwards") or 0 for r in mine) / calls if calls else 0.0
            per_call = t_interval([_per_call(r) for r in mine]).format(2)
            tps = t_interval([float(r["tokens_per_second"]) for r in mine]).format(2)
            pooled = sum(r["num_tokens"] for r in mine) / calls if calls else 0.0
            row = f"| {n} | {len(mine)} | {per_call} | {tps} | {pooled:.2f} | {forwards:.2f} |"
            if lookup:
                row += f" {_lookup_share(mine)} |"
            lines.append(row)
        lines.append("")
        for ref_pattern in against:
            for n in names:
                ref = ref_pattern.replace("{k}", str(budget(n)))
                pair = [run for run in runs if n in run and ref in run and n != ref]
                if not pair:
                    continue
                calls_ratio = t_interval([_per_call(r[n]) / _per_call(r[ref]) for r in pair])
                tps_ratio = t_interval(
                    [r[n]["tokens_per_second"] / r[ref]["tokens_per_second"] for r in pair]
                )
                same = sum(r[n]["tokens"] == r[ref]["tokens"] for r in pair)
                lines.append(
                    f"- {n} ÷ {ref}: tokens/call {calls_ratio.format(3)}, tokens/s "
                    f"{tps_ratio.format(3)} ({len(pair)} runs; same text in {same})"
                )
        ersd = [n for n in names if n.startswith("ersd")]
        if ersd:
            one = sum(len({tuple(run[n]["tokens"]) for n in ersd if n in run}) <= 1 for run in runs)
            lines.append(f"- every ERSD configuration gave one text in {one} of {len(runs)} runs")
    return "\n".join(lines).lstrip("\n") + "\n"
