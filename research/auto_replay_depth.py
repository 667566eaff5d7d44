"""Why ``tree="auto"`` under-drafts where the draft agrees (issue 50's PyTorch cell), replayed.

The live PyTorch cell (docs/results/auto-rules-2026-12-06, run 1 and 2: Qwen2.5-Coder 1.5B
float32 <- 0.5B int8, 96 tokens, one prompt per category) had auto at 0.81-0.98 of ``chain:8``
on grounded, HumanEval and maths.  Its recordings keep per run only the counts of auto's
choices, not per-step traces; the per-step replay therefore runs the library's own
``TreeChooser`` on the recorded T = 0 draft/target agreement of the same prompts
(docs/results/auto-replay-2026-12-05/agree-128.json, 20 prompts with the live run's four among
them) with ``replay_rules.py``'s harness: each step charged a linear cost model, shown to the
chooser as its measured (target, draft) split.  Nothing is timed; every number is
deterministic (the ``~`` scenarios: seeded lognormal step noise, 3 seeds per prompt).

Scenarios: replay_rules.py's (``curve``, ``steps``, ``curve>steps~``, ``dear``, ``steep``) and
``live``: the costs the live run 1's fixed chains showed (plain 0.29 s a token; a chain of k
costs about 0.29 + 0.069 k s: target 0.29 + 0.02 k, draft 0.049 a forward), ``live~`` with
step noise.  Priors: ``live`` (the T = 0 profile the live run stored: roots 0.815, 0.864,
0.778, 0.929), ``stored`` (replay_rules.py's code-heavy profile) and ``generic``.

Variants (``replace(RULES, ...)``): the library before this study (``trusted_after`` = inf:
the smallest tree within ``smaller_tree_within`` of the best is always drafted), the trusted
depths rule at 4 / 8 / 16 observations, and the 3% margin off altogether.

    OMP_NUM_THREADS=1 python -m research.auto_replay_depth > out.md     (~3 min on one core)
    OMP_NUM_THREADS=1 python -m research.auto_replay_depth --live        (the live cell's trace)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ersd.auto import RULES, Rules

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "docs" / "results" / "auto-rules-2026-12-06" / "replay_rules.py"
#: the T = 0 profile run 2 of the live cell stored (per-depth roots; trials not recorded:
#: weighted like the calibration's shrinking depths)
LIVE_PRIOR = ([[0.815], [0.864], [0.778], [0.929]], [96, 80, 60, 40])
LIVE_PROMPTS = ["grounded/edit-rename", "HumanEval/0", "ersd-math/0", "mt_bench/81"]
SETS = ["grounded", "humaneval", "math", "mtbench"]
VARIANTS: dict[str, dict[str, Any]] = {
    "before": {"trusted_after": float("inf")},
    "trusted 4": {"trusted_after": 4},
    "trusted 8": {"trusted_after": 8},
    "trusted 16": {"trusted_after": 16},
    "margin off": {"trusted_after": float("inf"), "smaller_tree_within": 0.0},
}


def harness() -> ModuleType:
    """replay_rules.py (a study file, not a package module), with the live scenarios added."""
    spec = importlib.util.spec_from_file_location("replay_rules", HARNESS)
    assert spec is not None and spec.loader is not None
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    rr.COSTS["live"] = (0.29, 0.02, 0.049)
    rr.SCENARIOS["live"] = ("live", "live", 0.0)
    rr.SCENARIOS["live~"] = ("live", "live", 0.1)
    return rr


def priors(rr: ModuleType) -> dict[str, Any]:
    return {"live": LIVE_PRIOR, "stored": rr.PRIORS["stored"], "generic": None}


def auto_seconds(
    rr: ModuleType, rows: list[list[int]], ctx: list[int], sc: str, prior: Any, rules: Rules, seed
) -> float:
    """auto's seconds over ``rows`` (one row: batch 1), the mean of 3 seeds under step noise."""
    reps = 3 if rr.SCENARIOS[sc][2] else 1
    return float(
        np.mean([rr.run_batch(rows, ctx, sc, prior, rules, seed + 1000 * r) for r in range(reps)])
    )


def trace(rr: ModuleType, agree: list[int], ctx: int, sc: str, prior: Any, rules: Rules):
    """auto's choices (tree, why, root-down estimate) step by step, and its seconds."""
    from ersd.auto import TreeChooser

    log: list[tuple[str, str, list[float]]] = []
    orig = TreeChooser.choose

    def choose(self: TreeChooser, *a: Any, **k: Any) -> Any:
        shape = orig(self, *a, **k)
        assert self.last is not None
        probs = [round(float(p[0]), 3) for p in self.depth_probs()]
        log.append((self.last.tree, self.last.why, probs))
        return shape

    TreeChooser.choose = choose  # type: ignore[method-assign]
    try:
        seconds = rr.run_batch([agree], [ctx], sc, prior, rules, 0)
    finally:
        TreeChooser.choose = orig  # type: ignore[method-assign]
    return log, seconds


def live_cell(rr: ModuleType, data: dict[str, Any], n: int) -> None:
    """The live run's four prompts: auto's choices and predicted rate against chain:8."""
    charged = rr.cost_model("live")
    print(f"## The live cell's prompts, `live` costs and prior, {n} tokens, T = 0\n")
    print("| prompt | variant | steps | choices | auto ÷ chain:8 | auto ÷ best chain |")
    print("|---|---|---|---|---|---|")
    for pid in LIVE_PROMPTS:
        d = data[pid]
        agree = d["agree"][:n]
        fixed = {k: rr.run_fixed(agree, charged, k) for k in range(1, 9)}
        best = min(fixed, key=fixed.__getitem__)
        for v in ("before", "trusted 8"):
            log, t = trace(rr, agree, d["ctx"], "live", LIVE_PRIOR, replace(RULES, **VARIANTS[v]))
            counts = ", ".join(f"{k} {c}" for k, c in Counter(x[0] for x in log).most_common())
            print(
                f"| {pid} | {v} | {len(log)} | {counts} | {fixed[8] / t:.3f} | "
                f"{fixed[best] / t:.3f} (chain:{best}) |"
            )
    print()


def interval(x: list[float]) -> tuple[float, float]:
    a = np.asarray(x, dtype=float)
    t = {2: 12.71, 3: 4.303, 4: 3.182, 5: 2.776}[len(a)]
    return float(a.mean()), float(t * a.std(ddof=1) / np.sqrt(len(a)))


def grid(rr: ModuleType, data: dict[str, Any], lengths: list[int]) -> None:
    """Every cell, every variant: auto ÷ the category's best fixed chain, and each variant's
    change against ``before`` (mean ± 95% t half-width over the cell's prompts / batches)."""
    pri = priors(rr)
    groups = rr.batches(data)
    scenarios = ["live", "live~", "curve", "steps", "curve>steps~", "dear", "steep"]
    cells = [(sc, pr, n) for sc in scenarios for pr in pri for n in lengths]
    times: dict[tuple[str, str, str, int], dict[str, float]] = {}
    for v, kw in VARIANTS.items():
        rules = replace(RULES, **kw)
        for sc, pr, n in cells:
            out = {}
            for i, (pid, d) in enumerate(data.items()):
                out[pid] = auto_seconds(rr, [d["agree"][:n]], [d["ctx"]], sc, pri[pr], rules, i)
            for j, g in enumerate(groups):
                rows = [data[p]["agree"][:n] for p in g]
                ctx = [data[p]["ctx"] for p in g]
                out[f"batch{j}"] = auto_seconds(rr, rows, ctx, sc, pri[pr], rules, 100 + j)
            times[v, sc, pr, n] = out
        print(f"<!-- replayed: {v} -->", file=sys.stderr, flush=True)
    print("## auto ÷ the category's best fixed chain (batch 8: ÷ plain)\n")
    print("| scenario | prior | tokens | variant | " + " | ".join(SETS) + " | batch 8 |")
    print("|---|---|---|---|" + "---|" * (len(SETS) + 1))
    for sc, pr, n in cells:
        charged = rr.cost_model(rr.SCENARIOS[sc][1])
        fixed = {
            p: [rr.run_fixed(d["agree"][:n], charged, k) for k in range(1, 9)]
            for p, d in data.items()
        }
        bc = rr.cost_model(rr.SCENARIOS[sc][1], True)
        bplain = n * rr.step_parts(bc, None, rr.BATCH)[2]
        for v in ("before", "trusted 8"):
            t = times[v, sc, pr, n]
            row = []
            for s in SETS:
                ids = [p for p in data if data[p]["set"] == s]
                row.append(min(np.mean([fixed[p][k] / t[p] for p in ids]) for k in range(8)))
            b = np.mean([bplain / t[f"batch{j}"] for j in range(len(groups))])
            row_txt = " | ".join(f"{x:.3f}" for x in row)
            print(f"| {sc} | {pr} | {n} | {v} | {row_txt} | {b:.3f} |")
    print("\n## Each variant against `before`: change of predicted throughput, %\n")
    print("**bold**: beyond both the 95% half-width over the cell's prompts and 1%.\n")
    for v in VARIANTS:
        if v == "before":
            continue
        print(f"### {v} ({VARIANTS[v]})\n")
        print("| scenario | prior | tokens | " + " | ".join(SETS) + " | batch 8 |")
        print("|---|---|---|" + "---|" * (len(SETS) + 1))
        for sc, pr, n in cells:
            base, new = times["before", sc, pr, n], times[v, sc, pr, n]
            units = [[p for p in data if data[p]["set"] == s] for s in SETS]
            units.append([f"batch{j}" for j in range(len(groups))])
            txt = []
            for ids in units:
                m, h = interval([100 * (base[u] / new[u] - 1) for u in ids])
                cell = f"{m:+.1f} ± {h:.1f}"
                txt.append(f"**{cell}**" if abs(m) > h and abs(m) >= 1.0 else cell)
            print(f"| {sc} | {pr} | {n} | " + " | ".join(txt) + " |")
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--live", action="store_true", help="only the live cell's prompts, traced")
    ap.add_argument("--tokens", type=int, nargs="+", default=[96, 128])
    ap.add_argument(
        "--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="V"
    )
    args = ap.parse_args()
    rr = harness()
    data = json.loads(rr.DATA.read_text())
    print("# Auto's depth where the draft agrees, replayed (research/auto_replay_depth.py)\n")
    live_cell(rr, data, 96)
    if args.live:
        for pid in LIVE_PROMPTS:
            d = data[pid]
            for v in ("before", "trusted 8"):
                rules = replace(RULES, **VARIANTS[v])
                log, _ = trace(rr, d["agree"][:96], d["ctx"], "live", LIVE_PRIOR, rules)
                print(f"### {pid}, {v}\n")
                for i, (tree, why, probs) in enumerate(log):
                    print(f"    {i:2d} {tree:9s} {why:22s} {probs}")
                print()
        return
    for v in [v for v in VARIANTS if v not in args.variants and v != "before"]:
        del VARIANTS[v]
    grid(rr, data, args.tokens)


if __name__ == "__main__":
    main()
