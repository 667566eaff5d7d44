"""The markdown of ``ersd bench report``: tables per temperature with 95% intervals."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ersd.bench.aggregate import Row, best_per_method
from ersd.bench.stats import Interval


def _fmt(iv: Interval | None, digits: int = 2) -> str:
    return "–" if iv is None or math.isnan(iv.mean) else iv.format(digits)


def markdown(
    rows: list[Row],
    metas: list[dict[str, Any]],
    figures: Iterable[str] = (),
    comparisons: Sequence[tuple[float, int, Row, Interval]] = (),
    dependence: dict[float, dict[str, float]] | None = None,
) -> str:
    lines = run_header(metas).splitlines()
    lines += [
        "",
        "Intervals: Student-t 95% over prompts (per-prompt values averaged over seeds). "
        "Block efficiency = tokens per target call including the bonus token. "
        "**speedup** = tokens/s ÷ plain target-only decoding (one-token forwards); "
        "**vs 2-tok** = tokens/s ÷ target-only decoding that pays a two-token forward per token "
        "(the cheaper CPU kernel: the honest denominator). Both baselines ran in the same "
        "process on the same prompts, temperatures and seeds.",
        "",
    ]
    for temp in sorted({r.temperature for r in rows}, reverse=True):
        trs = [r for r in rows if r.temperature == temp]
        lines += [f"## Temperature {temp:g}", ""]
        lines += [
            "| configuration | k | block efficiency | tokens/s | speedup | vs 2-tok | "
            "theory τ (gap) | predicted speedup (meas./pred.) | draft/target/other | "
            "identical to target-only |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in trs:
            theory = "–"
            if r.theory_be is not None:
                gap = r.block_efficiency.mean - r.theory_be
                theory = f"{r.theory_be:.2f} ({gap:+.2f})"
            pred = "–"
            if r.prediction and r.speedup is not None:
                ps = r.prediction.get("speedup")
                if ps:
                    pred = f"{ps:.2f}x ({r.speedup.mean / ps:.0%})"
            ident = f"{r.identical[0]}/{r.identical[1]}" if r.identical else "–"
            d, t, o = r.time_split
            alias = f" (= {', '.join(r.aliases)})" if r.aliases else ""
            lines.append(
                f"| {r.label}{alias} | {r.k or '–'} | {_fmt(r.block_efficiency)} | "
                f"{_fmt(r.tokens_per_second, 1)} | {_fmt(r.speedup)} | {_fmt(r.speedup_2tok)} | "
                f"{theory} | {pred} | {d:.0%}/{t:.0%}/{o:.0%} | {ident} |"
            )
        lines.append("")
        for metric, title in (("speedup", "speedup"), ("block_efficiency", "block efficiency")):
            best = best_per_method(trs, metric)
            if not best:
                continue
            lines += [
                f"Best shape per method and budget, by mean {title}:",
                "",
                "| k | " + " | ".join(m for m in best) + " |",
                "|---|" + "---|" * len(best),
            ]
            ks = sorted({k for v in best.values() for k in v})
            for k in ks:
                cells = []
                for name in best:
                    b = best[name].get(k)
                    cells.append(
                        _fmt(getattr(b, metric)) + (f" ({b.tree})" if b.tree else "") if b else "–"
                    )
                lines.append(f"| {k} | " + " | ".join(cells) + " |")
            lines.append("")
        vs_hf = [c for c in comparisons if c[0] == temp]
        if vs_hf:
            lines += [
                "ERSD (best shape at budget k) ÷ Hugging Face assisted generation "
                "(num_assistant_tokens = k), tokens/s, per-prompt ratios: "
                + "; ".join(f"k={k}: {iv.format()} ({row.tree})" for _, k, row, iv in vs_hf),
                "",
            ]
        lines += [
            "Time per target call (ms, summed over runs ÷ calls; prefill included):",
            "",
            "| configuration | draft | target | other | total | other / total |",
            "|---|---|---|---|---|---|",
        ]
        for r in trs:
            ms = r.extra.get("ms_per_call")
            if ms:
                lines.append(
                    f"| {r.label} | {ms['draft']:.0f} | {ms['target']:.0f} | {ms['other']:.1f} | "
                    f"{ms['wall']:.0f} | {ms['other'] / ms['wall'] if ms['wall'] else 0:.1%} |"
                )
        lines.append("")
        lines += _sources_table(trs)
        dep = (dependence or {}).get(temp)
        if dep:
            lines += [
                "Rank dependence in the ERSD runs (i.i.d. ranks would make these equal; the gap "
                f"between theory τ and measurement follows it): P(R=1) = {dep['P(R=1)']:.3f}, "
                f"P(R=1 | previous context R=1) = {dep['P(R=1 | prev=1)']:.3f}, "
                f"P(R=1 | previous context R>1) = {dep['P(R=1 | prev>1)']:.3f} "
                f"({int(dep['pairs'])} consecutive pairs).",
                "",
            ]
        bounds = sorted({(r.k, r.bound) for r in trs if r.bound is not None and r.k})
        if bounds:
            lines.append(
                "Paper's upper bound (log|Ω| + log(k+1)) / H[R] from the calibrated profile: "
                + ", ".join(f"k={k}: {b:.1f}" for k, b in bounds)
            )
            lines.append("")
    for f in figures:
        lines += [f"![{Path(f).stem}]({Path(f).name})", ""]
    return "\n".join(lines)


def run_header(metas: list[dict[str, Any]]) -> str:
    """The report's title and the run's metadata (models, machine, prompts)."""
    lines = ["# Benchmark report", ""]
    for m in metas[:1]:
        run = m.get("run", {})
        cfg = m.get("config", {})
        prompts = m.get("prompts", [])
        sets = sorted({p["set"] for p in prompts})
        sizes = run.get("batch_sizes") or [1]
        batch = "batch size 1" if sizes == [1] else f"batch sizes {sizes}"
        lines += [
            f"- config: `{cfg.get('name')}` ({cfg.get('source', '')})",
            f"- models: {run.get('models')}; dtype {run.get('dtype')}; {batch}; "
            f"{run.get('sampling')}",
            f"- machine: {run.get('cpu')} ({run.get('cpu_count')} CPUs), torch threads "
            f"{run.get('torch_threads')}; torch {run.get('torch')}, transformers "
            f"{run.get('transformers')}, ersd {run.get('ersd')}; {run.get('date')}",
            f"- prompts: {len(prompts)} evaluation prompts from {', '.join(sets)}; "
            f"{cfg.get('run', {}).get('max_new_tokens')} new tokens each; seeds "
            f"{cfg.get('run', {}).get('seeds')}",
        ]
    return "\n".join([*lines, ""])


def _sources_table(rows: list[Row]) -> list[str]:
    """Per-source acceptance of the model-free / hybrid drafters (empty without drafter runs)."""
    with_sources = [r for r in rows if r.extra.get("sources")]
    if not with_sources:
        return []
    lines = [
        "Per-source acceptance of the drafters (draft tokens over all runs; a token two "
        "sources proposed counts for both; the last step of a run is not counted):",
        "",
        "| configuration | source | proposed | accepted | accepted / proposed | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in with_sources:
        for name, st in r.extra["sources"].items():
            lines.append(
                f"| {r.label} | {name} | {st['proposed']:.0f} | {st['accepted']:.0f} | "
                f"{st['acceptance_rate']:.1%} | {st['seconds']:.2f} |"
            )
    lines.append("")
    return lines
