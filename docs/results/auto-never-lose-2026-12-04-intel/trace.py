"""Per-step trace of auto on one prompt (bf16 pair): chosen tree vs best, predictions, acceptance."""
import json, os, sys, shutil, tempfile
import ersd, ersd.auto as A
from ersd.auto import CurveCache, prepare_costs
from ersd.cost_store import CostStore
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.tree import AutoTree
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
src = sys.argv[1]  # a calibrated store dir
prompts = {p.id: p for s in ("humaneval", "mtbench", "math", "grounded") for p in load_prompts([s], "eval", 2)}
ids = sys.argv[2].split(","); temp = float(sys.argv[3]); within = [float(x) for x in sys.argv[4].split(",")]
enc = {i: encode_prompt(target.tokenizer, prompts[i], "auto", 384) for i in ids}
ersd.generate(target, draft, enc[ids[0]], max_new_tokens=4, tree="chain:3", temperature=1.0)
seeds = {"HumanEval/0":0,"HumanEval/2":1,"mt_bench/81":2,"mt_bench/85":3,"ersd-math/0":4,"ersd-math/1":5,"grounded/edit-rename":6,"grounded/edit-typehints":7}
for i in ids:
    for w in within + ["chain:4"]:
        if isinstance(w, str):
            tree = w
        else:
            A.SMALLER_TREE_WITHIN = w
            d = tempfile.mkdtemp(); shutil.copytree(src, d, dirs_exist_ok=True)
            tree = AutoTree(costs=CurveCache(CostStore(d)))
        r = ersd.generate(target, draft, enc[i], max_new_tokens=96, tree=tree, temperature=temp, seed=seeds[i])
        print(json.dumps(dict(prompt=i, w=w, rate=round(len(r.tokens)/r.wall_time, 3), calls=r.target_calls, choices=r.auto_choices or None)), flush=True)
        if not isinstance(w, str) and w == within[0]:
            for k, s in enumerate(r.steps[:40]):
                c = s.choice or {}
                print(k, c.get("tree"), "best", c.get("best_tree"), "pred %.2f best %.2f plain %.2f" % (c.get("predicted", 0), c.get("best_tree_predicted") or 0, c.get("target_only", 0)), "acc", s.num_accepted, "of", s.num_draft_tokens, "ranks", s.ranks, "t %.3f" % s.total_time, flush=True)
