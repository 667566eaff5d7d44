"""The batched part of ``ersd bench report``: throughput per batch size and the time split.

Input: the ``kind = "batch"`` records of :mod:`ersd.bench.batching`.  One :class:`BatchRow` per
(temperature, configuration, batch size).  The unit of replication is the **run** (one batch of
prompts at one seed): total tokens/s is summarised over runs with a Student-t 95% interval, and
the ratio to target-only is the interval of per-run ratios against the target-only run of the
same batch (same prompts, temperature, seed and batch size, side by side in the same process).
The time split sums seconds over the runs: target forwards, draft forwards and everything else
(``other`` = wall − forwards: the race, verification, cache bookkeeping, Python), as shares of
the wall time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ersd.bench.stats import Interval, t_interval
from ersd.methods.catalog import report_order

#: baselines first, in this order, then the methods
_BASE_ORDER = ("target-only", "hf-generate")


@dataclass
class BatchRow:
    temperature: float
    method: str
    tree: str | None
    k: int | None
    choice: str | None
    batch_size: int
    n_runs: int
    tokens_per_second: Interval  # total new tokens of the batch / wall seconds
    ratio: Interval | None  # ÷ target-only at the same batch size (per-run ratios)
    split: tuple[float, float, float]  # forward target, forward draft, other: shares of wall
    ms_per_step: float | None  # wall ms per engine step (target call of the batch)
    block_efficiency: float | None  # tokens per target call, all rows
    time_source: str
    prediction: dict[str, Any] | None = None
    auto_predicted: float | None = None  # tree="auto": mean predicted tokens/s over runs
    #: tree="auto" over the decode steps of all runs (bench.batching.auto_summary): predicted and
    #: measured tokens/s, and the per-run ratios measured ÷ predicted
    auto_decode: dict[str, Any] | None = None
    auto_trees: dict[str, int] | None = None  # tree="auto": row-steps per chosen tree

    @property
    def config(self) -> tuple[str, str | None, int | None]:
        return (self.method, self.tree, self.k)

    @property
    def label(self) -> str:
        if self.method in _BASE_ORDER:
            return self.method
        tag = f" [{self.choice}]" if self.choice else ""
        tree = self.tree or (f"k={self.k}" if self.k else "")
        if len(tree) > 28:
            tree = tree[:25] + "..."
        return f"{self.method} {tree}{tag}".strip()


def _order(r: BatchRow) -> tuple[Any, ...]:
    base = _BASE_ORDER.index(r.method) if r.method in _BASE_ORDER else len(_BASE_ORDER)
    return (-r.temperature, base, report_order(r.method), r.k or 0, r.tree or "", r.batch_size)


def summarise_batches(batches: list[dict[str, Any]]) -> list[BatchRow]:
    """One :class:`BatchRow` per (temperature, configuration, batch size)."""
    base: dict[tuple[float, int, int, int], float] = {}
    for r in batches:
        if r["method"] == "target-only":
            key = (float(r["temperature"]), int(r["batch_size"]), int(r["group"]), int(r["seed"]))
            base[key] = float(r["tokens_per_second"])
    groups: dict[tuple[float, str, str | None, int | None, int], list[dict[str, Any]]] = (
        defaultdict(list)
    )
    for r in batches:
        key5 = (float(r["temperature"]), r["method"], r.get("tree"), r.get("k"), r["batch_size"])
        groups[key5].append(r)
    rows = []
    for (temp, method, tree, k, b), recs in groups.items():
        ratios = []
        for r in recs:
            den = base.get((temp, b, int(r["group"]), int(r["seed"])))
            if den:
                ratios.append(float(r["tokens_per_second"]) / den)
        wall = sum(r["wall_time"] for r in recs) or 1.0
        steps = sum(r.get("steps") or 0 for r in recs)
        calls = sum(r.get("target_calls") or 0 for r in recs)
        rows.append(
            BatchRow(
                temperature=temp,
                method=method,
                tree=tree,
                k=k,
                choice=recs[0].get("choice"),
                batch_size=int(b),
                n_runs=len(recs),
                tokens_per_second=t_interval([float(r["tokens_per_second"]) for r in recs]),
                ratio=t_interval(ratios) if ratios else None,
                split=(
                    sum(r["target_forward_time"] for r in recs) / wall,
                    sum(r["draft_forward_time"] for r in recs) / wall,
                    sum(r["other_time"] for r in recs) / wall,
                ),
                ms_per_step=1e3 * wall / steps if steps else None,
                block_efficiency=sum(r["num_tokens"] for r in recs) / calls if calls else None,
                time_source=recs[0].get("time_source", "hooks"),
                prediction=recs[0].get("prediction"),
                **_auto_fields(recs),
            )
        )
    rows.sort(key=_order)
    return rows


def _auto_fields(recs: list[dict[str, Any]]) -> dict[str, Any]:
    preds = [
        r["auto_predicted_tokens_per_second"]
        for r in recs
        if r.get("auto_predicted_tokens_per_second")
    ]
    if not preds:
        return {}
    trees: dict[str, int] = defaultdict(int)
    for r in recs:
        for t, n in (r.get("auto_trees") or {}).items():
            trees[t] += n
    out: dict[str, Any] = {
        "auto_predicted": sum(preds) / len(preds),
        "auto_trees": dict(sorted(trees.items(), key=lambda kv: -kv[1])),
    }
    dec = [r["auto_decode"] for r in recs if r.get("auto_decode")]
    if dec:

        def total(k: str) -> float:
            return float(sum(d[k] for d in dec))

        out["auto_decode"] = {
            "predicted": total("predicted_tokens") / total("predicted_seconds"),
            "measured": total("tokens") / total("seconds"),
            "ratios": [
                (d["tokens"] / d["seconds"]) / (d["predicted_tokens"] / d["predicted_seconds"])
                for d in dec
            ],
            "steps": int(total("steps")),
        }
    return out


def _auto_lines(rows: list[BatchRow]) -> list[str]:
    """tree="auto": its predictions next to the measurements."""
    autos = [r for r in rows if r.auto_predicted]
    if not autos:
        return []
    decode = any(r.auto_decode for r in autos)
    lines = [
        'tree="auto" — the cost model\'s prediction next to the measurement, over the **decode '
        "steps** (every engine step after the first, which feeds the prompts — prefill is outside "
        "what the model predicts): predicted = Σ predicted new tokens ÷ Σ predicted seconds of "
        "the steps' decisions, measured = Σ new tokens ÷ Σ seconds of the same steps; ratio "
        "interval: Student-t 95% over runs; end-to-end = the throughput table's tokens/s "
        "(prefill and all); trees: share of row-steps per chosen tree, see docs/auto-tree.md:"
        if decode
        else 'tree="auto" — the cost model\'s prediction next to the measurement (predicted: '
        "mean over engine steps of the predicted tokens/s of the batch for the tree chosen; "
        "trees: share of row-steps per chosen tree, see docs/auto-tree.md):",
        "",
    ]
    if decode:
        lines += [
            "| configuration | B | trees chosen | decode steps | predicted tokens/s | "
            "measured tokens/s | measured ÷ predicted | end-to-end tokens/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
    else:
        lines += [
            "| configuration | B | trees chosen | predicted tokens/s | measured tokens/s | "
            "measured ÷ predicted |",
            "|---|---|---|---|---|---|",
        ]
    for r in autos:
        total = sum((r.auto_trees or {}).values()) or 1
        trees = ", ".join(f"{t} {n / total:.0%}" for t, n in list((r.auto_trees or {}).items())[:3])
        if decode:  # records from before auto_decode existed: its columns stay empty
            d = r.auto_decode
            cells = ["–"] * 4
            if d:
                ratio = _fmt(t_interval(d["ratios"]), 2)
                cells = [str(d["steps"]), f"{d['predicted']:.2f}", f"{d['measured']:.2f}", ratio]
            lines.append(
                f"| {r.label} | {r.batch_size} | {trees} | {' | '.join(cells)} | "
                f"{_fmt(r.tokens_per_second, 2)} |"
            )
            continue
        pred = r.auto_predicted or float("nan")
        lines.append(
            f"| {r.label} | {r.batch_size} | {trees} | {pred:.2f} | "
            f"{r.tokens_per_second.mean:.2f} | {r.tokens_per_second.mean / pred:.2f} |"
        )
    return [*lines, ""]


def _fmt(iv: Interval | None, digits: int) -> str:
    return "–" if iv is None or math.isnan(iv.mean) else iv.format(digits)


def batch_markdown(rows: list[BatchRow], figure: str | None = None) -> str:
    """The batched section of the report: per temperature a throughput table (columns per batch
    size) and the time split table."""
    sizes = sorted({r.batch_size for r in rows})
    lines = [
        "## Batched throughput",
        "",
        f"Batch sizes {sizes}: every configuration generated for B prompts at once (the same "
        "prompts at every batch size, cycling through the set when it is smaller than B; row i "
        "of a pass uses the seed ersd.derive_seed(seed, i), so a prompt's tokens do not depend "
        "on B). **tokens/s** = all new tokens of the batch ÷ wall seconds, Student-t 95% interval "
        "over runs (batches × seeds) where there are two or more; **÷ target-only** = per-run "
        "ratio to batched target-only decoding of the same batch (ersd's engine without a "
        "draft), run side by side in the same process. hf-generate = Hugging Face `generate` of "
        "the target on the left-padded batch with the same sampling settings.",
        "",
    ]
    for temp in sorted({r.temperature for r in rows}, reverse=True):
        trs = [r for r in rows if r.temperature == temp]
        configs: list[tuple[str, str | None, int | None]] = []
        for r in trs:
            if r.config not in configs:
                configs.append(r.config)
        cell = {(r.config, r.batch_size): r for r in trs}
        lines += [f"### Temperature {temp:g}", ""]
        head = "| configuration |" + "".join(
            f" B={b} tokens/s | B={b} ÷ target-only |" for b in sizes
        )
        lines += [head, "|---|" + "---|---|" * len(sizes)]
        for c in configs:
            label = next(r.label for r in trs if r.config == c)
            cells = []
            for b in sizes:
                got = cell.get((c, b))
                cells += [_fmt(got.tokens_per_second, 1), _fmt(got.ratio, 2)] if got else ["–", "–"]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += ["", *_best_fixed(trs, sizes), *_auto_lines(trs)]
        lines += [
            "Time split (shares of the wall time of all runs; forward seconds from the models' "
            "own counters, or the engine's step times where a model keeps none: *source*):",
            "",
            "| configuration | B | forward target | forward draft | other | ms / step | "
            "tokens / call | source |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in trs:
            t, d, o = r.split
            ms = f"{r.ms_per_step:.1f}" if r.ms_per_step is not None else "–"
            be = f"{r.block_efficiency:.2f}" if r.block_efficiency is not None else "–"
            lines.append(
                f"| {r.label} | {r.batch_size} | {t:.1%} | {d:.1%} | {o:.1%} | {ms} | {be} | "
                f"{r.time_source} |"
            )
        lines.append("")
    if figure:
        lines += [f"![batch_throughput]({figure})", ""]
    return "\n".join(lines)


def _best_fixed(rows: list[BatchRow], sizes: list[int]) -> list[str]:
    """A line per method: its fixed tree with the best mean tokens/s at each batch size (``auto``
    and the baselines are left out)."""
    out = []
    methods = [m for m in dict.fromkeys(r.method for r in rows) if m not in _BASE_ORDER]
    for m in methods:
        cells = []
        for b in sizes:
            cands = [r for r in rows if r.method == m and r.batch_size == b and r.tree != "auto"]
            if not cands:
                continue
            best = max(cands, key=lambda r: r.tokens_per_second.mean)
            ratio = f", {best.ratio.mean:.2f}× target-only" if best.ratio else ""
            cells.append(f"B={b}: {best.tree} ({best.tokens_per_second.mean:.1f} tokens/s{ratio})")
        if cells:
            out += [f"Best fixed tree of {m} by mean tokens/s: " + "; ".join(cells) + ".", ""]
    return out


def batch_row_dict(r: BatchRow) -> dict[str, Any]:
    def iv(x: Interval | None) -> dict[str, Any] | None:
        if x is None:
            return None
        fin = math.isfinite
        return {
            "mean": x.mean,
            "low": x.low if fin(x.low) else None,
            "high": x.high if fin(x.high) else None,
            "n": x.n,
        }

    return {
        "temperature": r.temperature,
        "method": r.method,
        "tree": r.tree,
        "k": r.k,
        "choice": r.choice,
        "batch_size": r.batch_size,
        "n_runs": r.n_runs,
        "tokens_per_second": iv(r.tokens_per_second),
        "ratio_to_target_only": iv(r.ratio),
        "time_split": {"target": r.split[0], "draft": r.split[1], "other": r.split[2]},
        "ms_per_step": r.ms_per_step,
        "block_efficiency": r.block_efficiency,
        "time_source": r.time_source,
        "prediction": r.prediction,
        "auto_predicted_tokens_per_second": r.auto_predicted,
        "auto_decode": r.auto_decode,
        "auto_trees": r.auto_trees,
    }
