"""``ersd bench watermark compare``: watermarked ERSD side by side with the engines' schemes.

On the same prompts, models, key and seeds, at each temperature: watermarked ERSD (each tree),
the engines' schemes implemented in our loop (:mod:`ersd.methods.watermark_baselines`) --
(a) target-only watermarking (``sd-wm-target`` on chains, ``specinfer-wm-target`` on multi-draft
trees), (b) dual-key SD (``sd-dual-key``, detected by the two-key detector
:func:`ersd.watermark.detect_dual`), (c) watermarked autoregressive sampling (target only) --
and unwatermarked ERSD and SD.  Per configuration: tokens per target call, tokens/s (each prompt
runs every configuration back to back, the order rotated by prompt; ratios paired by prompt
against unwatermarked ERSD on the same tree), the accepted share (accepted draft tokens / tokens)
and detection (TPR at p <= 1% with Clopper-Pearson intervals, median p-value) of the first
32/64/128 generated tokens; the unwatermarked runs' detection is the false-positive rate.
Watermarked ERSD's text must equal (c)'s (drafter invariance): checked on every prompt.

``--compare-batch N > 1`` generates each configuration's texts in batches (detection and tokens
per call only: its timings are the batch's, not one sequence's).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ersd.bench.stats import interval_record, rate
from ersd.watermark import Watermark, detect, detect_dual
from ersd.watermark.detect import DEFAULT_DUAL_ALPHA

COMPARE_LENGTHS = (32, 64, 128)
#: the dual-key detector's key-B weights reported: vLLM's default and the equal weighting
DUAL_ALPHAS = (DEFAULT_DUAL_ALPHA, 0.5)


@dataclass(frozen=True)
class Config:
    name: str  # row label
    method: str
    tree: str | None  # None: target only
    watermarked: bool
    scheme: str  # what it stands for in the issue: ERSD, (a), (b), (c), plain

    @property
    def key(self) -> str:
        return f"{self.name} {self.tree or 'target-only'}"


def configs(trees: Sequence[str]) -> list[Config]:
    """Every configuration compared: chains get SD-based baselines, other trees SpecInfer's."""
    out: list[Config] = []
    for tree in trees:
        chain = tree.startswith("chain:")
        out.append(Config("ersd-wm", "ersd", tree, True, "watermarked ERSD"))
        out.append(
            Config(
                "sd-wm-target" if chain else "specinfer-wm-target",
                "sd-wm-target" if chain else "specinfer-wm-target",
                tree,
                True,
                "(a) target-only watermark",
            )
        )
        if chain:
            out.append(Config("sd-dual-key", "sd-dual-key", tree, True, "(b) dual-key"))
    out.append(Config("ar-wm", "ersd", None, True, "(c) watermarked autoregressive"))
    for tree in trees:
        out.append(Config("ersd", "ersd", tree, False, "unwatermarked ERSD"))
        if tree.startswith("chain:"):
            out.append(Config("sd", "sd", tree, False, "unwatermarked SD"))
    return out


def p_values(tokens: list[int], wm: Watermark, dual: bool) -> dict[str, Any]:
    """p-values of the first L tokens for every L (dual: under each reported alpha)."""
    out: dict[str, Any] = {}
    for length in COMPARE_LENGTHS:
        toks = tokens[:length]
        if not toks:
            out[str(length)] = 1.0
        elif dual:
            out[str(length)] = {
                str(a): detect_dual(toks, wm, alpha=a, min_tokens=1).p_value for a in DUAL_ALPHAS
            }
        else:
            out[str(length)] = detect(toks, wm, min_tokens=1).p_value
    return out


def _record(
    cfg: Config, pid: str, temp: float, r: Any, wm: Watermark, batched: bool
) -> dict[str, Any]:
    n = len(r.tokens)
    return {
        "config": cfg.key,
        "name": cfg.name,
        "scheme": cfg.scheme,
        "tree": cfg.tree,
        "method": cfg.method,
        "watermarked": cfg.watermarked,
        "id": pid,
        "temperature": temp,
        "tokens": r.tokens,
        "num_tokens": n,
        "target_calls": r.target_calls,
        "block_efficiency": r.block_efficiency,
        "accepted_share": (n - r.target_calls) / n if n else math.nan,
        "tokens_per_second": math.nan if batched else r.tokens_per_second,
        "wall_time": math.nan if batched else r.wall_time,
        "p": p_values(r.tokens, wm, cfg.name == "sd-dual-key"),
    }


def compare_part(
    target: Any,
    draft: Any,
    prompts: list[tuple[str, str, list[int]]],
    wm: Watermark,
    trees: Sequence[str],
    temperatures: Sequence[float],
    max_new_tokens: int,
    log: Callable[[str], None],
    batch_size: int = 1,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every configuration on every prompt (module doc); ``checkpoint`` gets the part so far
    after each prompt (chunk), so a run cut short keeps what it measured."""
    import ersd

    eos = getattr(target, "eos_token_ids", None)
    cfgs = configs(trees)
    runs: list[dict[str, Any]] = []

    def part() -> dict[str, Any]:
        return {
            "key": wm.fingerprint,
            "trees": list(trees),
            "batched": batch_size > 1,
            "dual_alphas": list(DUAL_ALPHAS),
            "runs": runs,
            "summary": compare_summary(runs),
        }

    if batch_size > 1:
        # chunk by chunk, every temperature and configuration per chunk: a run cut short keeps
        # every configuration on the same prompts
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            for temp in temperatures:
                for cfg in cfgs:
                    res = ersd.generate_batch(
                        target,
                        draft if cfg.tree else None,
                        [c[2] for c in chunk],
                        seeds=list(range(i, i + len(chunk))),
                        max_new_tokens=max_new_tokens,
                        method=cfg.method,
                        tree=cfg.tree or "chain:1",
                        temperature=temp,
                        eos_token_id=eos,
                        watermark=wm if cfg.watermarked else None,
                    )
                    for (pid, _, _), r in zip(chunk, res, strict=True):
                        runs.append(_record(cfg, pid, temp, r, wm, True))
                    log(f"[compare] prompts {i + 1}-{i + len(chunk)} T={temp} {cfg.key}")
            log(f"[compare] prompts {i + len(chunk)}/{len(prompts)} done")
            if checkpoint is not None:
                checkpoint(part())
        return part()
    ersd.generate(target, draft, prompts[0][2], max_new_tokens=4, tree=trees[0])  # warm-up
    for j, (pid, _, ids) in enumerate(prompts):
        for temp in temperatures:
            k = j % len(cfgs)
            for cfg in cfgs[k:] + cfgs[:k]:  # rotate the order by prompt
                r = ersd.generate(
                    target,
                    draft if cfg.tree else None,
                    ids,
                    max_new_tokens=max_new_tokens,
                    method=cfg.method,
                    tree=cfg.tree or "chain:1",  # no draft: the tree is not used
                    temperature=temp,
                    seed=j,
                    eos_token_id=eos,
                    watermark=wm if cfg.watermarked else None,
                )
                runs.append(_record(cfg, pid, temp, r, wm, False))
            log(f"[compare] prompt {j + 1}/{len(prompts)} {pid} T={temp}")
            if checkpoint is not None:
                checkpoint(part())
    return part()


def _t_interval(values: Sequence[float]) -> dict[str, Any]:
    vals = [v for v in values if not math.isnan(v)]
    return (
        interval_record(vals) if vals else {"mean": math.nan, "ci95": [math.nan, math.nan], "n": 0}
    )


def _median_interval(values: Sequence[float]) -> dict[str, Any]:
    """Median with a distribution-free 95% interval (binomial order statistics)."""
    from scipy import stats

    v = sorted(values)
    n = len(v)
    if n == 0:
        return {"median": math.nan, "ci95": [math.nan, math.nan], "n": 0}
    lo = int(stats.binom.ppf(0.025, n, 0.5))
    hi = min(n - 1, n - lo)
    lo = max(0, lo - 1)
    return {"median": float(statistics.median(v)), "ci95": [v[lo], v[hi]], "n": n}


def compare_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for temp in sorted({r["temperature"] for r in runs}):
        block: dict[str, Any] = {}
        sel = [r for r in runs if r["temperature"] == temp]
        by = {(r["config"], r["id"]): r for r in sel}
        names = list(dict.fromkeys(r["config"] for r in sel))
        for name in names:
            rows = [r for r in sel if r["config"] == name]
            first = rows[0]
            ref_tree = first["tree"] or next((r["tree"] for r in sel if r["tree"]), None)
            ref = f"ersd {ref_tree}"
            ratios = [
                r["tokens_per_second"] / by[(ref, r["id"])]["tokens_per_second"]
                for r in rows
                if (ref, r["id"]) in by
            ]
            det: dict[str, Any] = {}
            for length in COMPARE_LENGTHS:
                key = str(length)
                if first["name"] == "sd-dual-key":
                    for a in next(iter(rows))["p"][key]:
                        ps = [r["p"][key][a] for r in rows]
                        det[f"{key} alpha={a}"] = {
                            "tpr_1pct": rate(sum(p <= 0.01 for p in ps), len(ps)),
                            "median_p": float(np.median(ps)),
                        }
                else:
                    ps = [r["p"][key] for r in rows]
                    det[key] = {
                        "tpr_1pct": rate(sum(p <= 0.01 for p in ps), len(ps)),
                        "median_p": float(np.median(ps)),
                    }
            block[name] = {
                "scheme": first["scheme"],
                "watermarked": first["watermarked"],
                "texts": len(rows),
                "tokens_per_call": _t_interval([r["block_efficiency"] for r in rows]),
                "accepted_share": _t_interval([r["accepted_share"] for r in rows]),
                "tokens_per_second": _median_interval(
                    [r["tokens_per_second"] for r in rows if not math.isnan(r["tokens_per_second"])]
                ),
                "tokens_per_second_ratio_vs": ref,
                "tokens_per_second_ratio": _t_interval(ratios),
                "detection": det,
            }
        identical = [
            by[(f"ersd-wm {t}", pid)]["tokens"] == by[("ar-wm target-only", pid)]["tokens"]
            for (cfg, pid) in by
            if cfg == "ar-wm target-only"
            for t in {r["tree"] for r in sel if r["tree"]}
            if (f"ersd-wm {t}", pid) in by
        ]
        block["_identity"] = {"identical": sum(identical), "of": len(identical)}
        out[str(temp)] = block
    return out


def _fmt_t(r: dict[str, Any], digits: int = 2) -> str:
    if r.get("n", 0) == 0 or math.isnan(r["mean"]):
        return "-"
    lo, hi = r["ci95"]
    if r.get("n", 0) < 2 or math.isnan(lo):
        return f"{r['mean']:.{digits}f}"
    return f"{r['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _fmt_rate(r: dict[str, Any]) -> str:
    lo, hi = r["ci95"]
    return f"{r['rate']:.2f} [{lo:.2f}, {hi:.2f}]"


def report_lines(part: dict[str, Any]) -> list[str]:
    """The compare section of ``report.md``."""
    lines = [
        "## Comparison with the engines' watermark schemes",
        "",
        f"Key fingerprint {part['key']}; trees {', '.join(part['trees'])}. Tokens/s ratios are "
        "paired by prompt against unwatermarked ERSD on the same tree (target-only: against "
        "the first tree); intervals: Student-t 95% for means, Clopper-Pearson 95% for rates, "
        "binomial order statistics for medians. "
        + (
            "Texts were generated in batches: no timings."
            if part.get("batched")
            else "Each prompt ran every configuration back to back, order rotated by prompt."
        ),
        "",
    ]
    for temp, block in part["summary"].items():
        ident = block.get("_identity", {})
        lines += [
            f"### T = {temp}",
            "",
            "| configuration | scheme | texts | tokens/call | accepted share | tokens/s (median) "
            "| tokens/s ratio | "
            + " | ".join(f"TPR@1% / median p, {n} tok" for n in COMPARE_LENGTHS)
            + " |",
            "|---|---|---|---|---|---|---|" + "---|" * len(COMPARE_LENGTHS),
        ]
        for name, v in block.items():
            if name.startswith("_"):
                continue
            tps = v["tokens_per_second"]
            tps_s = "-" if math.isnan(tps["median"]) else f"{tps['median']:.2f}"
            ratio = _fmt_t(v["tokens_per_second_ratio"], 3)
            det = v["detection"]
            keys = [k for k in det if k.split()[0] in {str(n) for n in COMPARE_LENGTHS}]
            alphas = sorted({k.split("alpha=")[1] for k in keys if "alpha=" in k})
            rows = [(name, None)] if not alphas else [(name, a) for a in alphas]
            for label, a in rows:
                cells = []
                for n in COMPARE_LENGTHS:
                    d = det[f"{n} alpha={a}"] if a is not None else det[str(n)]
                    cells.append(f"{_fmt_rate(d['tpr_1pct'])} / {d['median_p']:.2g}")
                tag = f"{label} (two-key detector, alpha={a})" if a is not None else label
                head = (
                    f"| {tag} | {v['scheme']} | {v['texts']} | {_fmt_t(v['tokens_per_call'])} | "
                    f"{_fmt_t(v['accepted_share'])} | {tps_s} | {ratio} | "
                )
                lines.append(head + " | ".join(cells) + " |")
        lines += [
            "",
            f"Watermarked ERSD's text equals watermarked autoregressive sampling's on "
            f"{ident.get('identical', 0)}/{ident.get('of', 0)} (prompt, tree) pairs. Rows of "
            "unwatermarked configurations: their TPR column is the false-positive rate at 1%.",
            "",
        ]
    return lines
