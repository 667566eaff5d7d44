"""Batch-8 trace of auto (bf16 pair): each step's decision for row 0 (rows share one chooser)."""
import json, sys, time, shutil, tempfile
import ersd
from ersd.auto import CurveCache
from ersd.cost_store import CostStore
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.tree import AutoTree
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
src = sys.argv[1]; temp = float(sys.argv[2])
prompts = [p for s in ("humaneval", "mtbench", "math", "grounded") for p in load_prompts([s], "eval", 2)]
enc = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
print("prompt lengths", [len(e) for e in enc])
ersd.generate_batch(target, draft, enc, max_new_tokens=4, tree="chain:1", temperature=1.0)
ersd.generate_batch(target, None, enc, max_new_tokens=4, tree="chain:1", temperature=1.0)
for cfg in ["plain", "auto"]:
    d = tempfile.mkdtemp(); shutil.copytree(src, d, dirs_exist_ok=True)
    tree = AutoTree(costs=CurveCache(CostStore(d))) if cfg == "auto" else "chain:1"
    t0 = time.perf_counter()
    out = ersd.generate_batch(target, draft if cfg == "auto" else None, enc, max_new_tokens=96, tree=tree, temperature=temp, seeds=list(range(8)))
    wall = time.perf_counter() - t0
    print(cfg, "rate %.2f" % (sum(len(r.tokens) for r in out) / wall), "wall %.2f" % wall, flush=True)
    if cfg == "auto":
        r = out[0]
        for k, s in enumerate(r.steps[:30]):
            c = s.choice or {}
            print(k, c.get("tree"), "explore" if c.get("explore") else "", "best", c.get("best_tree"), "pred %.2f best %.2f plain %.2f" % (c.get("predicted", 0), c.get("best_tree_predicted") or 0, c.get("target_only", 0)), "acc", s.num_accepted, "of", s.num_draft_tokens, "t %.3f tgt %.3f dr %.3f" % (s.total_time, s.target_time, s.draft_time), flush=True)
        print(json.dumps(r.auto_finding_out))
