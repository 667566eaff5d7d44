"""Batch-8 trace of auto (bf16 pair): every step's decision, predicted vs realised over all rows.
Args: a cost-store directory (its timing entries are dropped), T, runs.  btrace-t0.log ran at an
intermediate state of d5dbc82 (finish rates, no spread prior, before row observations re-decided)."""
import json, sys, time, shutil, tempfile
import ersd
from ersd.auto import CurveCache
from ersd.cost_store import CostStore
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.tree import AutoTree
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
src = sys.argv[1]; temp = float(sys.argv[2]); runs = int(sys.argv[3])
prompts = [p for s in ("humaneval", "mtbench", "math", "grounded") for p in load_prompts([s], "eval", 2)]
enc = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
ersd.generate_batch(target, draft, enc, max_new_tokens=4, tree="chain:1", temperature=1.0)
ersd.generate_batch(target, None, enc, max_new_tokens=4, tree="chain:1", temperature=1.0)
d = tempfile.mkdtemp(); shutil.copytree(src, d, dirs_exist_ok=True)
data = json.load(open(d + "/costs.json")); data["timing"] = {}; json.dump(data, open(d + "/costs.json", "w"))
for run in range(runs):
  for cfg in ["plain", "auto"]:
    tree = AutoTree(costs=CurveCache(CostStore(d))) if cfg == "auto" else "chain:1"
    t0 = time.perf_counter()
    out = ersd.generate_batch(target, draft if cfg == "auto" else None, enc, max_new_tokens=96, tree=tree, temperature=temp, seeds=list(range(8)))
    wall = time.perf_counter() - t0
    print(run, cfg, "rate %.2f" % (sum(len(r.tokens) for r in out) / wall), "wall %.2f" % wall, flush=True)
    if cfg == "auto":
        nsteps = max(len(r.steps) for r in out)
        for k in range(nsteps):
            live = [r.steps[k] for r in out if k < len(r.steps)]
            s = live[0]; c = s.choice or {}
            toks = sum(len(x.tokens) for x in live)
            print(k, len(live), c.get("tree"), "X" if c.get("explore") else "", "best", c.get("best_tree"), "pred %.1f best %.1f plain %.1f | ptok %.1f psec %.3f | tok %d t %.3f real %.1f tgt %.3f dr %.3f" % (c.get("predicted", 0), c.get("best_tree_predicted") or 0, c.get("target_only", 0), c.get("predicted_tokens", 0), c.get("predicted_seconds", 0), toks, s.total_time, toks / s.total_time, s.target_time, s.draft_time), flush=True)
        print(json.dumps(out[0].auto_finding_out))
print(json.dumps(json.load(open(d + "/costs.json"))["timing"], indent=0))
