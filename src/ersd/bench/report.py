"""``ersd bench report``: JSONL records → markdown tables with 95% intervals, and PNG figures.

Aggregation unit: one **configuration** = (temperature, method, tree, budget k).  For each
configuration every metric is first averaged over seeds within a prompt, then summarised over
prompts with a Student-t 95% interval (:func:`ersd.bench.stats.t_interval`; prompts are the
independent units).  Speedups are per-(prompt, temperature, seed) ratios of tokens/s against the
two target-only baselines run on the same prompt, temperature and seed in the same process:

* ``speedup`` — against plain target-only decoding (one-token forwards);
* ``speedup vs 2-tok`` — against target-only decoding that pays a two-token forward per token
  (the cheaper CPU kernel; see :mod:`ersd.bench.baselines`), the honest denominator on CPUs.

Theory next to measurement (ERSD): the expected block efficiency of the run's tree under the
i.i.d.-rank model with the calibrated per-depth profile, the gap (measured − predicted), and the
paper's upper bound ``(log|Ω| + log(k+1)) / H[R]``.  For trees chosen by the cost model the
predicted speedup is shown with the measured/predicted ratio.
"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ersd.bench.stats import Interval, t_interval
from ersd.errors import ErsdError
from ersd.theory import RankProfile, block_efficiency_bound, expected_block_efficiency_by_depth

BASELINE_METHODS = ("target-only", "target-only-2tok")


class ReportError(ErsdError):
    """Records could not be read or hold nothing to report."""


def read_records(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(meta records, result records) of one or more JSONL files."""
    metas: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
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
            (metas if rec.get("kind") == "meta" else results).append(rec)
    failed = [r for r in results if "error" in r]
    if failed:
        warnings.warn(
            f"{len(failed)} records are failed runs (field 'error', e.g. {failed[0]['error']!r}); "
            "they are left out of the report",
            RuntimeWarning,
            stacklevel=2,
        )
        results = [r for r in results if "error" not in r]
    if not results:
        raise ReportError("no result records found: the run wrote only metadata (or nothing)")
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

    @property
    def label(self) -> str:
        if self.method in BASELINE_METHODS:
            return self.method
        if self.method == "hf-assisted":
            return f"hf-assisted (k={self.k})"
        tree = self.tree or ""
        if len(tree) > 28:
            tree = tree[:25] + "..."
        tag = f" [{self.choice}]" if self.choice else ""
        return f"{self.method} {tree}{tag}"


def _key(r: dict[str, Any]) -> tuple[float, str, str | None, int | None]:
    return (float(r["temperature"]), r["method"], r.get("tree"), r.get("k"))


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
    groups: dict[tuple[float, str, str | None, int | None], list[dict[str, Any]]] = defaultdict(
        list
    )
    for r in results:
        groups[_key(r)].append(r)
    rows = []
    for key, recs in groups.items():
        temp, method, tree, k = key
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
        )
        prof = profiles.get(temp)  # theory only where a profile was measured at this T
        if method == "ersd" and prof is not None:
            paths = _paths(recs[0], metas)
            if paths is not None:
                row.theory_be = expected_block_efficiency_by_depth(
                    paths, prof.depth_rank_probs(min_count=50)
                )
            if k and vocab:
                row.bound = block_efficiency_bound(prof.rank_probs(), k, vocab)
        rows.append(row)
    rows.sort(key=lambda r: (-r.temperature, _method_order(r.method), r.k or 0, r.tree or ""))
    return rows


def _method_order(m: str) -> int:
    order = [
        "target-only",
        "target-only-2tok",
        "hf-assisted",
        "sd",
        "specinfer",
        "rrs-wor",
        "spectr",
        "spechub",
        "gls",
        "ersd",
    ]
    return order.index(m) if m in order else len(order)


def _nearest(by_temp: dict[float, Any], t: float) -> Any:
    return by_temp[min(by_temp, key=lambda x: (abs(x - t), x))]


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


# ----------------------------------------------------------------------------------------------
# markdown


def _fmt(iv: Interval | None, digits: int = 2) -> str:
    return "–" if iv is None or math.isnan(iv.mean) else iv.format(digits)


def markdown(
    rows: list[Row],
    metas: list[dict[str, Any]],
    figures: Iterable[str] = (),
    comparisons: Sequence[tuple[float, int, Row, Interval]] = (),
    dependence: dict[float, dict[str, float]] | None = None,
) -> str:
    lines = ["# Benchmark report", ""]
    for m in metas[:1]:
        run = m.get("run", {})
        cfg = m.get("config", {})
        prompts = m.get("prompts", [])
        sets = sorted({p["set"] for p in prompts})
        lines += [
            f"- config: `{cfg.get('name')}` ({cfg.get('source', '')})",
            f"- models: {run.get('models')}; dtype {run.get('dtype')}; batch size 1; "
            f"{run.get('sampling')}",
            f"- machine: {run.get('cpu')} ({run.get('cpu_count')} CPUs), torch threads "
            f"{run.get('torch_threads')}; torch {run.get('torch')}, transformers "
            f"{run.get('transformers')}, ersd {run.get('ersd')}; {run.get('date')}",
            f"- prompts: {len(prompts)} evaluation prompts from {', '.join(sets)}; "
            f"{cfg.get('run', {}).get('max_new_tokens')} new tokens each; seeds "
            f"{cfg.get('run', {}).get('seeds')}",
        ]
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


def best_per_method(rows: list[Row], metric: str = "speedup") -> dict[str, dict[int, Row]]:
    """For each speculative method and budget k the configuration with the best mean ``metric``
    (``speedup`` or ``block_efficiency``)."""
    out: dict[str, dict[int, Row]] = {}
    for r in rows:
        value = getattr(r, metric)
        if r.method in BASELINE_METHODS or r.k is None or value is None:
            continue
        cur = out.setdefault(r.method, {}).get(r.k)
        if cur is None or value.mean > getattr(cur, metric).mean:
            out[r.method][r.k] = r
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


# ----------------------------------------------------------------------------------------------
# figures


def _plot_block_efficiency(rows: list[Row], path: Path) -> None:
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
            and r.method != "hf-assisted"
            and r.method not in BASELINE_METHODS
        ]
        by_method: dict[str, dict[int, Row]] = defaultdict(dict)
        for r in trs:
            cur = by_method[r.method].get(r.k or 0)
            if cur is None or r.block_efficiency.mean > cur.block_efficiency.mean:
                by_method[r.method][r.k or 0] = r
        for method, per_k in sorted(by_method.items(), key=lambda kv: _method_order(kv[0])):
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


def _plot_speedup(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r.temperature for r in rows}, reverse=True)
    fig, axes = plt.subplots(len(temps), 1, figsize=(11, 3.6 * len(temps)), squeeze=False)
    for ax, temp in zip(axes[:, 0], temps, strict=True):
        best = best_per_method([r for r in rows if r.temperature == temp])
        bars = [
            (m, k, r)
            for m, per_k in sorted(best.items(), key=lambda kv: _method_order(kv[0]))
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


def write_report(paths: Sequence[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """Read records, write ``report.md``, ``summary.json`` and PNG figures into ``out_dir``."""
    metas, results = read_records(paths)
    rows = summarise(results, metas)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = {"block_efficiency": out / "block_efficiency_vs_k.png", "speedup": out / "speedup.png"}
    _plot_block_efficiency(rows, figs["block_efficiency"])
    _plot_speedup(rows, figs["speedup"])
    md = out / "report.md"
    from ersd.bench.margin_report import write_section  # dynamic trees (empty without them)

    dynamic_md, dynamic_figs = write_section(results, out)
    md.write_text(
        markdown(
            rows,
            metas,
            [str(f) for f in figs.values()],
            ersd_vs_hf(results, rows),
            rank_dependence(results),
        )
        + (("\n" + dynamic_md) if dynamic_md else "")
    )
    figs.update(dynamic_figs)
    summary = out / "summary.json"
    summary.write_text(json.dumps([_row_dict(r) for r in rows], indent=1) + "\n")
    return {"report": md, "summary": summary, **figs}


def _row_dict(r: Row) -> dict[str, Any]:
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
