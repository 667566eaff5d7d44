"""A/B on identical texts (float32 target, bf16 draft): main's auto (the smallest tree within
``SMALLER_TREE_WITHIN = 0.03`` of the best prediction) against auto drafting the best prediction
itself (0.0), beside chain:4.  The 3% rule was kept on bf16 A/Bs whose texts differed between
configurations (``docs/results/auto-markov-2026-12-04/ab-within-t0.log``); here they do not.

    ERSD_COST_STORE=$(mktemp -d) OMP_NUM_THREADS=2 python ab_within.py > ab-within.log  # ~15 min
"""

import json

import ersd
import ersd.auto
from ersd.auto import CurveCache, prepare_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.commands.models import _calibration_prompts, _rank_profile
from ersd.tree import AutoTree

within = ersd.auto.SMALLER_TREE_WITHIN
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="float32")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
prompts = load_prompts(["math"], "eval", 6)
encoded = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
temps = [0.0, 1.0]
curves = CurveCache()
prepare_costs(target, draft, encoded[0], 1, curves)
calib = _calibration_prompts(target, 1)
for temp in temps:
    probs, trials = _rank_profile(target, draft, calib, temp, 32)
    curves.store.put_profile(target, draft, "ersd", temp, probs, sum(trials), trials=trials)
configs = [("auto", AutoTree(costs=curves)), ("auto-best", AutoTree(costs=curves)), ("chain:4", "chain:4")]
for _, tree in configs:
    ersd.generate(target, draft, encoded[0], max_new_tokens=4, tree=tree, temperature=1.0)
k = 0
for i, p in enumerate(prompts):
    for temp in temps:
        shift = k % len(configs)
        k += 1
        for name, tree in configs[shift:] + configs[:shift]:
            ersd.auto.SMALLER_TREE_WITHIN = 0.0 if name == "auto-best" else within
            res = ersd.generate(target, draft, encoded[i], max_new_tokens=96, tree=tree,
                                temperature=temp, seed=i)
            print(json.dumps({"prompt": p.id, "set": p.set, "temperature": temp, "config": name,
                              "rate": res.tokens_per_second, "target_calls": res.target_calls,
                              "draft_forwards": res.draft_forwards, "tokens": res.tokens,
                              "auto_choices": res.auto_choices or None}),
                  flush=True)
ersd.auto.SMALLER_TREE_WITHIN = within
