"""A/B of the observation below each fully accepted path (``Proposal.beyond``, read by
``tree="auto"``) in one process: main against the same auto that ignores it, beside chain:3 and
chain:4, on the bf16 Qwen pair; curves measured once and shared, a calibrated rank profile per
temperature.

Every prompt × temperature runs the four configurations in rotated order; both autos share one
cost store.  Run alone:

    ERSD_COST_STORE=$(mktemp -d) OMP_NUM_THREADS=2 python ab.py > ab.log   # 12 cells, ~20 min
"""

import argparse
import json

import ersd
from ersd.auto import CurveCache, TreeChooser, prepare_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.commands.models import _calibration_prompts, _rank_profile
from ersd.tree import AutoTree

learns = TreeChooser.learns_beyond
ap = argparse.ArgumentParser()
ap.add_argument("--sets", nargs="+", default=["math"])
ap.add_argument("--per-set", type=int, default=6)
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
args = ap.parse_args()
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
prompts = [p for s in args.sets for p in load_prompts([s], "eval", args.per_set)]
encoded = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
curves = CurveCache()
prepare_costs(target, draft, encoded[0], 1, curves)
calib = _calibration_prompts(target, 1)
for temp in args.temperatures:
    probs, trials = _rank_profile(target, draft, calib, temp, 32)
    curves.store.put_profile(target, draft, "ersd", temp, probs, sum(trials), trials=trials)
configs = [
    ("auto", AutoTree(costs=curves)),
    ("auto-no-beyond", AutoTree(costs=curves)),
    ("chain:3", "chain:3"),
    ("chain:4", "chain:4"),
]
for _, tree in configs:
    ersd.generate(target, draft, encoded[0], max_new_tokens=4, tree=tree, temperature=1.0)
k = 0
for i, p in enumerate(prompts):
    for temp in args.temperatures:
        shift = k % len(configs)
        k += 1
        for name, tree in configs[shift:] + configs[:shift]:
            TreeChooser.learns_beyond = property(lambda self: False) if name == "auto-no-beyond" else learns
            res = ersd.generate(
                target, draft, encoded[i], max_new_tokens=args.tokens, tree=tree,
                temperature=temp, seed=i,
            )
            print(
                json.dumps(
                    {
                        "prompt": p.id,
                        "set": p.set,
                        "temperature": temp,
                        "repeat": 0,
                        "config": name,
                        "rate": res.tokens_per_second,
                        "target_calls": res.target_calls,
                        "draft_forwards": res.draft_forwards,
                        "auto_choices": res.auto_choices or None,
                    }
                ),
                flush=True,
            )
TreeChooser.learns_beyond = learns
