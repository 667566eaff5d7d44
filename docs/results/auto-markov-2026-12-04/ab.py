"""A/B of auto's acceptance estimate in one process: the Markov estimate (main) against the
independent per-depth estimate it replaced, beside chain:4 and chain:6, on the bf16 Qwen pair.

Every prompt × temperature × repeat runs the four configurations in rotated order; both autos
share one cost store (curves, the calibrated rank profile, what runs keep).  Run alone:

    ERSD_COST_STORE=$(mktemp -d) OMP_NUM_THREADS=2 python ab.py --repeats 1 > ab.log
"""

import argparse
import json

import numpy as np

import ersd
from ersd.auto import PRIOR_WEIGHT, CurveCache, OnlineProfile, prepare_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.commands.models import _calibration_prompts, _rank_profile
from ersd.tree import AutoTree

markov = OnlineProfile.depth_probs


def independent(self, states=None):  # the estimate before the Markov one (main at 6e8a69c)
    w = PRIOR_WEIGHT
    total = sum(self.counts, np.zeros(len(self.prior)))
    n_all = sum(self.trials)
    out = [
        (c + w * (total - c + w * self.prior) / (n_all - n + w)) / (n + w)
        for c, n in zip(self.counts, self.trials, strict=True)
    ]
    return [*out, (total + w * self.prior) / (n_all + w)]


ap = argparse.ArgumentParser()
ap.add_argument("--repeats", type=int, default=1)
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
args = ap.parse_args()
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
prompts = [
    p for s in ("humaneval", "mtbench", "math", "grounded") for p in load_prompts([s], "eval", 2)
]
encoded = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
curves = CurveCache()
prepare_costs(target, draft, encoded[0], 1, curves)
calib = _calibration_prompts(target, 1)
for temp in args.temperatures:
    probs, trials = _rank_profile(target, draft, calib, temp, 32)
    curves.store.put_profile(target, draft, "ersd", temp, probs, sum(trials), trials=trials)
configs = [
    ("auto", AutoTree(costs=curves)),
    ("auto-independent", AutoTree(costs=curves)),
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
                OnlineProfile.depth_probs = independent if name == "auto-independent" else markov
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
OnlineProfile.depth_probs = markov
