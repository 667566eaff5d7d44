"""A/B runs of auto variants against plain decoding and fixed chains, each auto run from a copy of
one pristine calibrated store (so runs do not feed each other's profile).

    python ab.py PROMPTS OUT.json CONFIGS     # CONFIGS: comma-separated, from
        old       the largest-rate tree, the stored prior's plain depth mean
        new       the smallest tree within 3%, the trial-weighted prior
        z=X       OPTIMISM_Z = X (only on the working tree of ab2.log; never committed)
        plain     target-only decoding;  chain:K   a fixed chain
"""
import json, os, shutil, sys, tempfile, time
import ersd, ersd.auto as A
from ersd.auto import CurveCache, prepare_costs, OnlineProfile
from ersd.cost_store import CostStore
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.commands.models import _calibration_prompts, _rank_profile
from ersd.tree import AutoTree

target = ersd.load_model("qwen2.5-coder-1.5b", dtype="float32")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="int8")
pristine = tempfile.mkdtemp(prefix="ab-store-")
store = CostStore(pristine)
ids = sys.argv[1].split(",")
prompts = {p.id: p for s in ("humaneval", "mtbench", "math", "grounded") for p in load_prompts([s], "eval", 2)}
enc = {i: encode_prompt(target.tokenizer, prompts[i], "auto", 384) for i in ids}
cache = CurveCache(store)
prepare_costs(target, draft, enc[ids[0]], 1, cache)
calib = _calibration_prompts(target, 2)
probs, trials = _rank_profile(target, draft, calib, 1.0, 48)
store.put_profile(target, draft, "ersd", 1.0, probs, sum(trials), trials=trials)
print("profile P(R=1)", [round(r[0], 3) for r in probs], "trials", trials, flush=True)
orig_init = OnlineProfile.__init__
def old_init(self, ranked, prior_probs=None, prior_trials=None):
    orig_init(self, ranked, prior_probs, None)
def variant(name):
    if name.startswith("z="):
        A.OPTIMISM_Z = float(name[2:]); return
    if name == "old":
        A.SMALLER_TREE_WITHIN = 0.0; OnlineProfile.__init__ = old_init
    else:
        A.SMALLER_TREE_WITHIN = 0.03; OnlineProfile.__init__ = orig_init
SEEDS = {"ersd-math/0": 0, "ersd-math/1": 1, "grounded/edit-typehints": 2, "HumanEval/0": 3, "grounded/edit-rename": 4, "mt_bench/85": 5, "mt_bench/81": 6}
configs = sys.argv[3].split(",")
for name in configs:  # warm-up
    ersd.generate(target, draft, enc[ids[0]], max_new_tokens=4, tree=name if name.startswith("chain") else "chain:2", temperature=1.0) if name != "plain" else None
out = []
for k, i in enumerate(ids):
    order = configs[k % len(configs):] + configs[:k % len(configs)]
    for name in order:
        dr = None if name == "plain" else draft
        if name.startswith("chain") or name == "plain":
            tree = "chain:1" if name == "plain" else name
        else:
            variant(name)
            d = tempfile.mkdtemp(prefix="ab-run-"); shutil.copy(os.path.join(pristine, "costs.json"), d)
            tree = AutoTree(costs=CurveCache(CostStore(d)))
        r = ersd.generate(target, dr, enc[i], max_new_tokens=96, tree=tree, temperature=1.0, seed=SEEDS.get(i, k))
        row = dict(prompt=i, config=name, rate=len(r.tokens) / r.wall_time, calls=r.target_calls,
                   draft_forwards=r.draft_forwards, choices=r.auto_choices or None)
        print(json.dumps(row), flush=True); out.append(row)
json.dump(out, open(sys.argv[2], "w"), indent=1)
