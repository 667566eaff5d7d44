"""The figures of ``ersd bench report`` (matplotlib, Agg backend, imported only here)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from ersd.bench.aggregate import BASELINE_METHODS, Row, best_per_method
from ersd.bench.batch_report import BatchRow
from ersd.methods.catalog import report_order


def plot_block_efficiency(rows: list[Row], path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r.temperature for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(temps), figsize=(5.2 * len(temps), 4.2), squeeze=False)
    for ax, temp in zip(axes[0], temps, strict=True):
        trs = [
            r
            for r in rows
            if r.temperature == temp
            and r.k
            and r.method not in ("hf-assisted", "hf-prompt-lookup")
            and r.method not in BASELINE_METHODS
        ]
        by_method: dict[str, dict[int, Row]] = defaultdict(dict)
        for r in trs:
            name = r.method + (f" @{r.drafter}" if r.drafter else "")
            cur = by_method[name].get(r.k or 0)
            if cur is None or r.block_efficiency.mean > cur.block_efficiency.mean:
                by_method[name][r.k or 0] = r
        for method, per_k in sorted(
            by_method.items(), key=lambda kv: report_order(kv[0].split(" @")[0])
        ):
            ks = sorted(per_k)
            means = [per_k[k].block_efficiency.mean for k in ks]
            err = [
                [
                    per_k[k].block_efficiency.mean - per_k[k].block_efficiency.low
                    if per_k[k].block_efficiency.n > 1
                    else 0
                    for k in ks
                ],
                [
                    per_k[k].block_efficiency.high - per_k[k].block_efficiency.mean
                    if per_k[k].block_efficiency.n > 1
                    else 0
                    for k in ks
                ],
            ]
            ax.errorbar(ks, means, yerr=err, marker="o", capsize=3, label=f"{method} (best shape)")
        theory = sorted(
            {
                (r.k, r.theory_be)
                for r in trs
                if r.method == "ersd"
                and "optimal-per-call" in (r.choice or "")
                and r.theory_be is not None
            }
        )
        if not theory:
            theory = sorted(
                {
                    (r.k, r.theory_be)
                    for r in trs
                    if r.method == "ersd" and r.tree and r.tree.startswith("chain:") and r.theory_be
                }
            )
        if theory:
            ax.plot(
                [k for k, _ in theory],
                [v for _, v in theory],
                "kx--",
                ms=8,
                label="theory: ERSD optimal tree, i.i.d. ranks",
            )
        bounds = sorted({(r.k, r.bound) for r in trs if r.bound is not None and r.k})
        if bounds:
            ax.plot(
                [k for k, _ in bounds],
                [b for _, b in bounds],
                "k^:",
                label="paper's upper bound (log|Ω|+log(k+1))/H[R]",
            )
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_yticks([1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50])
        ks_all = sorted({r.k for r in trs if r.k})
        if ks_all:
            ax.set_xticks(ks_all)
        ax.set_title(f"T = {temp:g}")
        ax.set_xlabel("draft budget k (tokens)")
        ax.set_ylabel("block efficiency (tokens / target call)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short_tree(r: Row) -> str:
    tree = r.tree or ""
    if tree.startswith("paths:"):
        return r.choice or "tree"
    return tree


def plot_speedup(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r.temperature for r in rows}, reverse=True)
    fig, axes = plt.subplots(len(temps), 1, figsize=(11, 3.6 * len(temps)), squeeze=False)
    for ax, temp in zip(axes[:, 0], temps, strict=True):
        best = best_per_method([r for r in rows if r.temperature == temp])
        bars = [
            (m, k, r)
            for m, per_k in sorted(best.items(), key=lambda kv: report_order(kv[0].split(" @")[0]))
            for k, r in sorted(per_k.items())
        ]
        x = np.arange(len(bars))
        for off, attr, name in (
            (-0.2, "speedup", "vs target-only"),
            (0.2, "speedup_2tok", "vs 2-token target-only"),
        ):
            ivs = [getattr(r, attr) for _, _, r in bars]
            means = [iv.mean if iv else 0 for iv in ivs]
            err = [
                [iv.mean - iv.low if iv and iv.n > 1 else 0 for iv in ivs],
                [iv.high - iv.mean if iv and iv.n > 1 else 0 for iv in ivs],
            ]
            ax.bar(x + off, means, 0.4, yerr=err, capsize=2, label=name)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{m}\nk={k}\n{_short_tree(r)}" for m, k, r in bars], fontsize=7)
        ax.set_ylabel("speedup (tokens/s ratio)")
        ax.set_title(f"T = {temp:g}: best shape per method and budget, 95% t-intervals")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_batch_throughput(rows: list[BatchRow], path: Path) -> None:
    """Total tokens/s against batch size: one line per configuration, one panel per
    temperature, 95% t-intervals as error bars where a cell has two or more runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r.temperature for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(temps), figsize=(5.6 * len(temps), 4.2), squeeze=False)
    for ax, temp in zip(axes[0], temps, strict=True):
        lines: dict[str, list[BatchRow]] = defaultdict(list)
        for r in rows:
            if r.temperature == temp:
                lines[r.label].append(r)
        for label, rs in lines.items():
            rs.sort(key=lambda r: r.batch_size)
            ivs = [r.tokens_per_second for r in rs]
            err = [
                [iv.mean - iv.low if iv.n > 1 else 0 for iv in ivs],
                [iv.high - iv.mean if iv.n > 1 else 0 for iv in ivs],
            ]
            style = "s--" if rs[0].method in ("target-only", "hf-generate") else "o-"
            ax.errorbar(
                [r.batch_size for r in rs],
                [iv.mean for iv in ivs],
                yerr=err,
                fmt=style,
                capsize=3,
                label=label,
            )
        sizes = sorted({r.batch_size for r in rows if r.temperature == temp})
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(b) for b in sizes])
        ax.set_title(f"T = {temp:g}")
        ax.set_xlabel("batch size (prompts generated together)")
        ax.set_ylabel("total tokens/s (all rows)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
