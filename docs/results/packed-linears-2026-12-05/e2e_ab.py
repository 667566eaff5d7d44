"""End to end: the float32 target with its oneDNN linears packed for 8 rows (the default now)
against the same target in oneDNN's plain layout (before), int8 draft, ERSD at T = 1.  One
process, configurations rotated per prompt; tokens/s per run and the ratios per prompt."""
import json, statistics, sys, torch, ersd
from ersd.models import cpu
from ersd.bench.prompts import encode_prompt, load_prompts

torch.set_num_threads(2)
packed = ersd.load_model("qwen2.5-coder-1.5b", dtype="float32")
plain = ersd.load_model("qwen2.5-coder-1.5b", dtype="float32", linear="torch")
with torch.no_grad():
    for m in list(plain.hf_module.modules()):
        for name, child in list(m.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(m, name, cpu.OneDNNLinear(child, packed=False))
print(packed.describe()["linear_layout"], plain.describe()["linear_layout"], flush=True)
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="int8")
per_set, tokens = int(sys.argv[1]), int(sys.argv[2])
prompts = [p for s in ("humaneval", "mtbench", "math", "grounded") for p in load_prompts([s], "eval", per_set)]
configs = [("plain/packed", packed, None, "chain:1"), ("plain/plain-layout", plain, None, "chain:1")]
for tree in ("chain:4", "chain:6"):
    configs += [(f"{tree}/packed", packed, draft, tree), (f"{tree}/plain-layout", plain, draft, tree)]
for name, t, d, tree in configs:  # warm-up
    ersd.generate(t, d, [1, 2, 3], max_new_tokens=4, tree=tree)
rows = []
for i, p in enumerate(prompts):
    ids = encode_prompt(packed.tokenizer, p, "auto", 384)
    order = configs[i % len(configs):] + configs[: i % len(configs)]
    for name, t, d, tree in order:
        r = ersd.generate(t, d, ids, max_new_tokens=tokens, tree=tree, temperature=1.0, seed=i)
        row = {"prompt": p.id, "config": name, "rate": r.tokens_per_second, "calls": r.target_calls, "text": r.tokens}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "text"}), flush=True)
by = {}
for r in rows:
    by.setdefault(r["prompt"], {})[r["config"]] = r
same = all(len({tuple(c["text"]) for c in cfg.values()}) == 1 for cfg in by.values())
print("every configuration's text identical on every prompt:", same)
for tree in ("chain:4", "chain:6"):
    new = [cfg[f"{tree}/packed"]["rate"] / cfg["plain/packed"]["rate"] for cfg in by.values()]
    old = [cfg[f"{tree}/plain-layout"]["rate"] / cfg["plain/plain-layout"]["rate"] for cfg in by.values()]
    gain = [cfg[f"{tree}/packed"]["rate"] / cfg[f"{tree}/plain-layout"]["rate"] for cfg in by.values()]
    print(f"{tree}: speedup over target-only, packed {statistics.mean(new):.3f} (min {min(new):.3f}), "
          f"plain layout {statistics.mean(old):.3f} (min {min(old):.3f}); packed / plain layout {statistics.mean(gain):.3f}")
pl = [cfg["plain/packed"]["rate"] / cfg["plain/plain-layout"]["rate"] for cfg in by.values()]
print(f"target-only, packed / plain layout: {statistics.mean(pl):.3f}")
