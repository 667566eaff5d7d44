"""What tree="auto" adds to plain decoding when drafting cannot pay (llama.cpp), measured inside
the runs rather than by wall-time ratios: per run, the target forward seconds per token and the
seconds outside the forwards per token (`GenerationResult.other_time`: the loop, sampling,
auto's decision and timing, everything but the model calls), auto and plain alternated per
(prompt, repeat) in one process.  The two configurations issue the same one-token target
forwards, so the difference outside the forwards is auto's own cost, free of the machine noise
that moves whole runs by +-5%.

    ERSD_COST_STORE=... python docs/results/auto-never-lose-2026-12-03/overhead.py --out o.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import ersd
from ersd.auto import CurveCache, prepare_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.bench.stats import t_interval
from ersd.tree import AutoTree

ap = argparse.ArgumentParser()
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--repeats", type=int, default=2)
ap.add_argument("--temperature", type=float, default=1.0)
ap.add_argument("--out", required=True)
args = ap.parse_args()

opts = {"backend": "llamacpp", "threads": 2}
target = ersd.load_model("qwen2.5-coder-1.5b", **opts)
draft = ersd.load_model("qwen2.5-coder-0.5b", **opts)
prompts = [
    p for s in ("humaneval", "mtbench", "math", "grounded") for p in load_prompts([s], "eval", 1)
]
encoded = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
curves = CurveCache()
prepare_costs(target, draft, encoded[0], 1, curves)
configs = [("plain", None, "chain:1"), ("auto", draft, AutoTree(costs=curves))]
for _, d, tree in configs:
    ersd.generate(target, d, encoded[0], max_new_tokens=4, tree=tree)
rows = []
k = 0
for i, (p, ids) in enumerate(zip(prompts, encoded, strict=True)):
    for rep in range(args.repeats):
        order = configs[k % 2 :] + configs[: k % 2]
        k += 1
        for name, d, tree in order:
            res = ersd.generate(
                target,
                d,
                ids,
                max_new_tokens=args.tokens,
                tree=tree,
                temperature=args.temperature,
                seed=i,
            )
            n = len(res.tokens)
            row = {
                "prompt": p.id,
                "repeat": rep,
                "config": name,
                "tokens": n,
                "rate": res.tokens_per_second,
                "target_ms_per_token": 1e3 * res.target_time / n,
                "other_ms_per_token": 1e3 * res.other_time / n,
                "draft_forwards": res.draft_forwards,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
pairs = {}
for r in rows:
    pairs.setdefault((r["prompt"], r["repeat"]), {})[r["config"]] = r
diff = [v["auto"]["other_ms_per_token"] - v["plain"]["other_ms_per_token"] for v in pairs.values()]
tratio = [
    v["auto"]["target_ms_per_token"] / v["plain"]["target_ms_per_token"] for v in pairs.values()
]
summary = {
    "pairs": len(diff),
    "plain_other_ms_per_token_median": statistics.median(
        v["plain"]["other_ms_per_token"] for v in pairs.values()
    ),
    "auto_other_ms_per_token_median": statistics.median(
        v["auto"]["other_ms_per_token"] for v in pairs.values()
    ),
    "auto_minus_plain_other_ms_per_token": t_interval(diff).format(3),
    "plain_target_ms_per_token_median": statistics.median(
        v["plain"]["target_ms_per_token"] for v in pairs.values()
    ),
    "auto_over_plain_target_time": t_interval(tratio).format(3),
    "auto_over_plain_rate": t_interval(
        [v["auto"]["rate"] / v["plain"]["rate"] for v in pairs.values()]
    ).format(3),
}
print(json.dumps(summary, indent=1))
with open(args.out, "w") as f:
    json.dump({"args": vars(args), "rows": rows, "summary": summary}, f, indent=1)
