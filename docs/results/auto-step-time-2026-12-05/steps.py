"""Measured against predicted step times of fixed chains on the bf16 Qwen pair at T = 0: for
each drafting step of chain:k (and plain steps), its draft and target forward seconds beside
what auto's cost curve predicts for that tree (the curve auto measures, two timed repeats per
size, before any online correction).  One JSON line per run.  Run alone:

    ERSD_COST_STORE=$(mktemp -d) OMP_NUM_THREADS=2 python steps.py > steps.log   # ~12 min
"""

import argparse
import json

import ersd
from ersd.auto import CurveCache, measured_costs, prepare_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.tree import TreeShape

ap = argparse.ArgumentParser()
ap.add_argument("--per-set", type=int, default=3)
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--sets", default="math,humaneval")
ap.add_argument("--chains", type=int, nargs="+", default=[0, 1, 2, 3, 4, 6])
args = ap.parse_args()
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
prompts = [p for s in args.sets.split(",") for p in load_prompts([s], "eval", args.per_set)]
encoded = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
curves = CurveCache()
prepare_costs(target, draft, encoded[0], 1, curves)
costs = measured_costs(target, draft, encoded[0], 1, curves)
print(json.dumps({"target_curve": costs.target, "draft_curve": costs.draft}), flush=True)
configs = [None if k == 0 else f"chain:{k}" for k in args.chains]
for tree in configs:
    ersd.generate(target, tree and draft, encoded[0], max_new_tokens=4, tree=tree, temperature=0.0)
for i, p in enumerate(prompts):
    shift = i % len(configs)
    for tree in configs[shift:] + configs[:shift]:
        res = ersd.generate(
            target,
            tree and draft,
            encoded[i],
            max_new_tokens=args.tokens,
            tree=tree,
            temperature=0.0,
        )
        if tree is None:
            pt, pd = costs.target_cost(1), 0.0
        else:
            shape = TreeShape.chain(int(tree.split(":")[1]))
            pt = costs.target_cost(shape.num_nodes + 1)
            pd = costs.step_time(shape) - pt
        steps = res.steps[1:-1]  # not the prefill step, not the last (possibly short) one
        print(
            json.dumps(
                {
                    "prompt": p.id,
                    "config": tree or "none",
                    "rate": res.tokens_per_second,
                    "calls": res.target_calls,
                    "wall": res.wall_time,
                    "pred_target": pt,
                    "pred_draft": pd,
                    "draft": [round(s.draft_time, 4) for s in steps],
                    "target": [round(s.target_time, 4) for s in steps],
                    "total": [round(s.total_time, 4) for s in steps],
                    "accepted": [s.num_accepted for s in steps],
                }
            ),
            flush=True,
        )
