"""A/B of the target's timing ratio per forward size in one process: main (a size's own
measured / predicted ratio, ``SIZE_PRIOR_STEPS``) against one ratio over every size (the
size's own never weighs in), beside chain:4 and chain:6, on the bf16 Qwen pair; the curves
are measured once, in interleaved rounds (``MEASURE_REPEATS``), and shared.

Every prompt × temperature × repeat runs the four configurations in rotated order; both autos
share one cost store (curves, the calibrated rank profile, what runs keep).  Run alone:

    ERSD_COST_STORE=$(mktemp -d) OMP_NUM_THREADS=2 python ab.py > ab.log   # 18 cells, ~25 min
"""

import argparse
import json

import ersd
import ersd.auto
from ersd.auto import CurveCache, prepare_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.commands.models import _calibration_prompts, _rank_profile
from ersd.tree import AutoTree

prior = ersd.auto.SIZE_PRIOR_STEPS


ap = argparse.ArgumentParser()
ap.add_argument("--repeats", type=int, default=1)
ap.add_argument("--per-set", type=int, default=3)
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
args = ap.parse_args()
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
sets = ("math", "grounded", "humaneval")
prompts = [p for s in sets for p in load_prompts([s], "eval", args.per_set)]
encoded = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
curves = CurveCache()
prepare_costs(target, draft, encoded[0], 1, curves)
print(
    json.dumps(
        {
            "curves": {
                r: curves.curve(m, encoded[0], 1) for r, m in (("target", target), ("draft", draft))
            }
        }
    ),
    flush=True,
)
calib = _calibration_prompts(target, 1)
for temp in args.temperatures:
    probs, trials = _rank_profile(target, draft, calib, temp, 32)
    curves.store.put_profile(target, draft, "ersd", temp, probs, sum(trials), trials=trials)
configs = [
    ("auto", AutoTree(costs=curves)),
    ("auto-one-ratio", AutoTree(costs=curves)),
    ("chain:4", "chain:4"),
    ("chain:6", "chain:6"),
]
for _, tree in configs:
    ersd.generate(target, draft, encoded[0], max_new_tokens=4, tree=tree, temperature=1.0)
k = 0
for i, p in enumerate(prompts):
    for temp in args.temperatures:
        for rep in range(args.repeats):
            shift = k % len(configs)
            k += 1
            for name, tree in configs[shift:] + configs[:shift]:
                ersd.auto.SIZE_PRIOR_STEPS = 1e12 if name == "auto-one-ratio" else prior
                res = ersd.generate(
                    target,
                    draft,
                    encoded[i],
                    max_new_tokens=args.tokens,
                    tree=tree,
                    temperature=temp,
                    seed=i,
                )
                print(
                    json.dumps(
                        {
                            "prompt": p.id,
                            "set": p.set,
                            "temperature": temp,
                            "repeat": rep,
                            "config": name,
                            "rate": res.tokens_per_second,
                            "target_calls": res.target_calls,
                            "draft_forwards": res.draft_forwards,
                            "auto_choices": res.auto_choices or None,
                        }
                    ),
                    flush=True,
                )
ersd.auto.SIZE_PRIOR_STEPS = prior
