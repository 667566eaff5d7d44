# A copy of docs/results/auto-stale-depth-2026-12-04/trace.py whose target dtype is
# $TARGET_DTYPE (float32 here, the draft stays bf16); run at main 607ed10:
#   SETS=math PER_SET=6 TARGET_DTYPE=float32 python trace32.py ersd-math/1 0 > trace-math1-t0.log
"""Trace of auto on one prompt (main at 91f9f98, before STALE_DECAY): per step, the row state,
the per-depth estimate, the predicted rate of plain decoding and of chain:1-8, and the choice;
then the same prompt with chain:4.  Usage: python trace.py ersd-math/1 0 > trace-math1-t0.log"""
import json, os, sys, time
import numpy as np
import ersd
from ersd.auto import CurveCache, TreeChooser, prepare_costs, expected_tokens
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.commands.models import _calibration_prompts, _rank_profile
from ersd.tree import AutoTree, TreeShape
pid = sys.argv[1] if len(sys.argv) > 1 else "ersd-math/1"
temp = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
target = ersd.load_model("qwen2.5-coder-1.5b", dtype=os.environ.get("TARGET_DTYPE", "bfloat16"))
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
# the prompt order (hence seeds) of ab.py: SETS=math,grounded,humaneval PER_SET=3 for this folder's
sets = os.environ.get("SETS", "humaneval,mtbench,math,grounded").split(",")
prompts = [p for s in sets for p in load_prompts([s], "eval", int(os.environ.get("PER_SET", "2")))]
P = {p.id: p for p in prompts}
enc = encode_prompt(target.tokenizer, P[pid], "auto", 384)
curves = CurveCache()
prepare_costs(target, draft, enc, 1, curves)
calib = _calibration_prompts(target, 1)
t0 = time.time()
probs, trials = _rank_profile(target, draft, calib, temp, 32)
print("calib s", time.time() - t0, "profile", [np.round(np.asarray(p)[:2], 3).tolist() for p in probs], "trials", trials, flush=True)
curves.store.put_profile(target, draft, "ersd", temp, probs, sum(trials), trials=trials)
oc = TreeChooser.choose
def choose(self, context, batch=1, longest=None, rows=None):
    r = oc(self, context, batch, longest, rows)
    pr = self.depth_probs(None)
    costs = self.costs_at(context, batch)
    cands = {k: (expected_tokens(s, pr), self._step_time(costs, s, batch)) for k, s in self.candidates(pr).items() if k.startswith("chain")}
    print("state", self._after.get(self._last_row), "p", [round(float(x[0]), 3) for x in pr[:4]], "beyond", round(float(pr[-1][0]), 3),
          "plain %.2f" % self._plain_rate(costs, batch), " ".join("%s:%.2f" % (k[6:], a / b) for k, (a, b) in cands.items()),
          "->", self.last.tree, "tr %.2f dr %.2f" % (self._target_ratio("spec"), self.timing["spec"].draft_ratio), flush=True)
    return r
TreeChooser.choose = choose
for cfg in ["auto", "chain:4"]:
    tree = AutoTree(costs=curves) if cfg == "auto" else cfg
    t0 = time.perf_counter()
    out = ersd.generate(target, draft, enc, max_new_tokens=96, tree=tree, temperature=temp, seed=prompts.index(P[pid]))
    w = time.perf_counter() - t0
    acc = [(s.num_accepted, s.tree_depth) for s in out.steps]
    print(cfg, "rate %.2f calls %d" % (len(out.tokens) / w, len(out.steps)), "accepted", acc, flush=True)
    print("draft_time", [round(s.draft_time, 3) for s in out.steps][:10], "target_time", [round(s.target_time, 3) for s in out.steps][:10])
