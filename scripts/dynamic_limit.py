#!/usr/bin/env python
"""How far can a margin-driven dynamic ERSD tree get above ERSD's chain? (issue 16)

Reads the margin observations of a calibration file (``ersd bench calibrate``: the rank of the
target's race winner in the draft's race, by depth and margin bucket) or of dynamic benchmark
records (``margin_events``), and estimates, per temperature and budget K, the expected tokens per
target call of

* ``chain:K`` -- every context accepts the draft's race winner with the observed rank-1 rate of
  its margin bucket;
* the **margin-oracle tree** -- the best tree of K nodes for a policy that knows the margin bucket
  of *every* context of the step before drafting (more than any real policy knows: the draft's
  race at a context is known only after the forward that reaches it) and the exact rank law of
  each bucket (the observed frequencies, fitted on the very data they are scored on).

Contexts are drawn independently (a bucket from the observed margin mix, then the winner's rank
from that bucket's law), which understates both trees alike (real acceptances come in runs); the
ratio oracle ÷ chain is the most a margin-driven policy can add to ERSD's chain at that budget.
Compare it with the measured ratio SD chain:K ÷ ERSD chain:K.

    python scripts/dynamic_limit.py bench-results/dyn-wide.calibration.json --budgets 4 6 8
    python scripts/dynamic_limit.py bench-results/dyn-wide.jsonl
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from ersd.theory.margin import MarginTable


def tables_from(path: Path) -> dict[float, MarginTable]:
    """Margin tables per temperature from a calibration file or benchmark records."""
    if path.suffix == ".jsonl":
        out: dict[float, MarginTable] = defaultdict(MarginTable.empty)
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            for depth, margin, rank, _children, _pred in rec.get("margin_events") or []:
                m = math.inf if margin is None else float(margin)
                out[float(rec["temperature"])].add(int(depth), m, int(rank))
        return dict(out)
    data = json.loads(path.read_text())
    return {
        float(t): MarginTable.from_dict(p["margin"])
        for t, p in data["profiles"].items()
        if p.get("margin")
    }


def estimate(table: MarginTable, budget: int, trials: int, seed: int) -> dict[str, float]:
    """Mean tokens per call of chain:K and of the margin-oracle tree over ``trials`` simulated
    steps, and the mean and standard error of their paired difference (both trees see the same
    bucket at the same context: common random numbers)."""
    counts = table.counts.sum(axis=0).astype(np.float64)  # pooled over depths: bucket x rank
    n = counts.sum(axis=1)
    mix = n / n.sum()
    law = np.where(n[:, None] > 0, counts / np.maximum(n[:, None], 1), 0.0)[:, :-1]

    def one(trial: int, chain: bool) -> float:
        def accept(ctx: tuple[int, ...], rank: int) -> float:
            # the bucket of a context is a function of (seed, trial, context) only
            b = int(np.random.default_rng([seed, trial, len(ctx), *ctx]).choice(len(mix), p=mix))
            return float(law[b, rank - 1]) if rank <= law.shape[1] else 0.0

        heap = [(-accept((), 1), (), 1, 1.0)]
        value = 0.0
        for _ in range(budget):
            if not heap:
                break
            neg, ctx, rank, reach = heapq.heappop(heap)
            v = -neg
            value += v
            if not chain and rank < law.shape[1]:  # the next sibling at the same context
                heapq.heappush(heap, (-reach * accept(ctx, rank + 1), ctx, rank + 1, reach))
            child = (*ctx, rank)
            heapq.heappush(heap, (-v * accept(child, 1), child, 1, v))
        return 1.0 + value

    chain = np.array([one(t, True) for t in range(trials)])
    oracle = np.array([one(t, False) for t in range(trials)])
    diff = oracle - chain
    return {
        "chain": float(chain.mean()),
        "oracle": float(oracle.mean()),
        "gain": float(diff.mean()),
        "gain_se": float(diff.std(ddof=1) / math.sqrt(trials)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="calibration JSON or benchmark JSONL")
    ap.add_argument("--budgets", type=int, nargs="+", default=[4, 6, 8])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not args.source.is_file():
        raise SystemExit(f"{args.source}: no such file (a calibration JSON or benchmark JSONL)")
    tables = tables_from(args.source)
    if not tables:
        raise SystemExit(f"{args.source}: no margin observations (calibrate with a margin table)")
    print("| T | observations | rank-1 rate | K | chain:K | margin-oracle tree | oracle ÷ chain |")
    print("|---|---|---|---|---|---|---|")
    for t, table in sorted(tables.items()):
        c = table.counts.sum(axis=(0, 1))
        for k in args.budgets:
            e = estimate(table, k, args.trials, args.seed)
            lo, hi = (e["gain"] + s * 1.96 * e["gain_se"] for s in (-1, 1))
            ratio = f"{e['oracle'] / e['chain']:.3f} [{1 + lo / e['chain']:.3f}, "
            ratio += f"{1 + hi / e['chain']:.3f}]"
            head = f"| {t:g} | {int(c.sum())} | {c[0] / c.sum():.3f} | {k} |"
            print(f"{head} {e['chain']:.2f} | {e['oracle']:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
