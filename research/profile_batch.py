#!/usr/bin/env python
"""Where a batched ERSD step spends its time outside model forwards (issue 13's "other").

Loads the Qwen pair (float32 oneDNN target, int8 draft) and generates for B HumanEval prompts
with the batched engine.  By default under cProfile: prints the top functions by cumulative and
own time, plus the split of the decode steps (target forwards / draft forwards / other).  With
``--compare-workers``, no profiler: runs the same batch with the engine's rows worked serially
(1 thread) and side by side (torch's thread count), alternating, ``--repeats`` times each, and
prints each run's split and the median "other" share per setting.  With ``--compare-verify``,
no profiler: the engine as it is ("new": its default verification -- batched on a device,
node by node on the CPU -- and the one-sum finiteness check) against the code before issue 28
("before": node-by-node verification, the entry-wise finiteness check of every scored row; the
same tokens, checked), alternating, for every ``--batch`` and ``--tree``
given (comma-separated), ``--repeats`` pairs each: each run's non-forward share of the decode
steps and tokens/s, then per configuration the medians and the paired ratio.  Run alone:

    python -m research.profile_batch --batch 8 --tokens 24
    python -m research.profile_batch --batch 8 --tokens 24 --compare-workers --repeats 3
    python -m research.profile_batch --batch 1,8 --tree chain:4,multi:2x3 --compare-verify
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Any

import torch

import ersd
from ersd.batch import BatchEngine
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.models import checks

_all_finite = checks.all_finite


def _all_finite_entrywise(logits: torch.Tensor) -> bool:
    return bool(torch.isfinite(logits).all())


def run(
    target, draft, ids, tokens: int, tree: str, workers: int | None, batched: bool = True
) -> dict[str, Any]:
    """One batch through the engine: wall time and its split over the decode steps (every step
    after the first, which feeds the prompts)."""
    engine = BatchEngine(target, draft)
    engine.workers = workers
    engine.batched_verify = None if batched else False  # None: the engine's default
    # the reference ("before") is the code before issue 28: node-by-node verification
    # and the entry-wise finiteness check of every scored row
    checks.all_finite = _all_finite if batched else _all_finite_entrywise
    for i, p in enumerate(ids):
        engine.add(p, max_new_tokens=tokens, seed=i, tree=tree, temperature=1.0)
    texts: dict[int, list[int]] = {}
    for rid, rec, _ in engine.step():  # prefill
        texts.setdefault(rid, []).extend(rec.tokens)
    t_f0, d_f0 = target.forward_seconds, draft.forward_seconds
    t0 = time.perf_counter()
    n = 0
    while len(engine):
        for rid, rec, _ in engine.step():
            n += len(rec.tokens)
            texts.setdefault(rid, []).extend(rec.tokens)
    wall = time.perf_counter() - t0
    tf, df = target.forward_seconds - t_f0, draft.forward_seconds - d_f0
    return {
        "wall": wall,
        "tokens": n,
        "target": tf,
        "draft": df,
        "other": wall - tf - df,
        "texts": [texts[k] for k in sorted(texts)],
    }


def compare_verify(target, draft, prompts, args) -> None:
    """The engine as it is against the code before issue 28, paired and alternating."""
    import json

    rows = []
    for b in [int(x) for x in args.batch.split(",")]:
        ids = prompts[:b]
        for tree in args.tree.split(","):
            run(target, draft, ids, 4, tree, None)  # warm-up of this configuration
            runs: dict[str, list[dict[str, Any]]] = {"new": [], "before": []}
            for rep in range(args.repeats):
                order = [True, False] if rep % 2 == 0 else [False, True]
                for batched in order:
                    r = run(target, draft, ids, args.tokens, tree, None, batched)
                    name = "new" if batched else "before"
                    runs[name].append(r)
                    print(
                        f"B={b} {tree} {name:>6}: {r['tokens']} tokens in {r['wall']:.2f}s "
                        f"({r['tokens'] / r['wall']:.2f} tok/s), other {r['other']:.3f}s "
                        f"({r['other'] / r['wall']:.2%}), target {r['target']:.2f}s, draft "
                        f"{r['draft']:.2f}s",
                        flush=True,
                    )
            same = all(r["texts"] == runs["new"][0]["texts"] for v in runs.values() for r in v)
            row = {"batch": b, "tree": tree, "same_tokens": same}
            for name, rs in runs.items():
                row[name] = {
                    "other_share": [r["other"] / r["wall"] for r in rs],
                    "tok_s": [r["tokens"] / r["wall"] for r in rs],
                    "other_s": [r["other"] for r in rs],
                    "wall_s": [r["wall"] for r in rs],
                }
            ratios = [
                (a["tokens"] / a["wall"]) / (c["tokens"] / c["wall"])
                for a, c in zip(runs["new"], runs["before"], strict=True)
            ]
            row["tok_s_ratio"] = ratios
            rows.append(row)
            med = {k: statistics.median(row[k]["other_share"]) for k in runs}
            print(
                f"B={b} {tree}: median other share new {med['new']:.2%}, before "
                f"{med['before']:.2%}; tokens/s ratio median {statistics.median(ratios):.3f} "
                f"(min {min(ratios):.3f}, max {max(ratios):.3f}); same tokens: {same}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--batch", default="8", help="batch size (a list with --compare-verify)")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--tree", default="chain:4")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--dump", default=None, help="also save the cProfile stats to this file")
    ap.add_argument("--compare-workers", action="store_true")
    ap.add_argument("--compare-verify", action="store_true")
    ap.add_argument("--json", default=None, help="--compare-verify: save the runs to this file")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="cProfile mode: the engine's row threads (1: the rows' work on the profiled thread)",
    )
    args = ap.parse_args()
    target = ersd.load_model(args.target, dtype="float32")
    draft = ersd.load_model(args.draft, dtype="int8")
    biggest = max(int(x) for x in args.batch.split(","))
    prompts = load_prompts(["humaneval"], "eval", biggest)
    ids = [encode_prompt(target.tokenizer, p, "raw", 768) for p in prompts][:biggest]
    if args.compare_verify:
        compare_verify(target, draft, ids, args)
        return
    run(target, draft, ids, 4, args.tree, None)  # warm-up
    if args.compare_workers:
        settings = {"serial": 1, "side by side": torch.get_num_threads()}
        shares: dict[str, list[float]] = {k: [] for k in settings}
        for rep in range(args.repeats):
            order = list(settings) if rep % 2 == 0 else list(settings)[::-1]
            for name in order:
                r = run(target, draft, ids, args.tokens, args.tree, settings[name])
                shares[name].append(r["other"] / r["wall"])
                print(
                    f"{name:>6}: {r['tokens']} tokens in {r['wall']:.1f}s, other "
                    f"{r['other']:.2f}s ({r['other'] / r['wall']:.1%}), target {r['target']:.1f}s, "
                    f"draft {r['draft']:.1f}s",
                    flush=True,
                )
        for name, xs in shares.items():
            print(f"median other share, {name}: {statistics.median(xs):.2%}  ({len(xs)} runs)")
        return
    prof = cProfile.Profile()
    prof.enable()
    r = run(target, draft, ids, args.tokens, args.tree, args.workers)
    prof.disable()
    print(
        f"B={args.batch} {args.tree}: {r['tokens']} tokens in {r['wall']:.1f}s; target forwards "
        f"{r['target']:.1f}s ({r['target'] / r['wall']:.1%}), draft forwards {r['draft']:.1f}s "
        f"({r['draft'] / r['wall']:.1%}), other {r['other']:.2f}s ({r['other'] / r['wall']:.1%})"
    )
    if args.dump:
        prof.dump_stats(args.dump)
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(args.top)
    st.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
