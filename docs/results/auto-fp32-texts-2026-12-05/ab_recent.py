"""A/B on identical texts (float32 target, bf16 draft): main's auto against auto with a recency
decay of 0.95 on every depth's observations (stop 41's ``recent-decay.patch``, applied here by
wrapping ``OnlineProfile._age``), beside chain:4.  Stop 41 judged that decay on bf16 traces whose
texts differed between configurations; here they do not.

    ERSD_COST_STORE=$(mktemp -d) OMP_NUM_THREADS=2 python ab_recent.py > ab-recent.log  # ~15 min
"""

import json

import ersd
from ersd.auto import CurveCache, OnlineProfile, prepare_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.commands.models import _calibration_prompts, _rank_profile
from ersd.tree import AutoTree

RECENT_DECAY = 0.95
age = OnlineProfile._age


def recent_age(self, depth):
    for d in range(len(self.live_trials)):
        self.live_counts[d] *= RECENT_DECAY
        self.live_trials[d] *= RECENT_DECAY
    self.full_counts = self.full_counts * RECENT_DECAY
    self.full_trials = self.full_trials * RECENT_DECAY
    age(self, depth)


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
configs = [("auto", AutoTree(costs=curves)), ("auto-recent", AutoTree(costs=curves)), ("chain:4", "chain:4")]
for _, tree in configs:
    ersd.generate(target, draft, encoded[0], max_new_tokens=4, tree=tree, temperature=1.0)
k = 0
for i, p in enumerate(prompts):
    for temp in temps:
        shift = k % len(configs)
        k += 1
        for name, tree in configs[shift:] + configs[:shift]:
            OnlineProfile._age = recent_age if name == "auto-recent" else age
            res = ersd.generate(target, draft, encoded[i], max_new_tokens=96, tree=tree,
                                temperature=temp, seed=i)
            print(json.dumps({"prompt": p.id, "set": p.set, "temperature": temp, "config": name,
                              "rate": res.tokens_per_second, "target_calls": res.target_calls,
                              "tokens": res.tokens, "auto_choices": res.auto_choices or None}),
                  flush=True)
OnlineProfile._age = age
