import time, ersd, torch
from ersd.auto import CurveCache, measured_costs
from ersd.bench.prompts import encode_prompt, load_prompts
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
prompts = [p for s in ("humaneval", "mtbench", "math", "grounded") for p in load_prompts([s], "eval", 2)]
enc = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
cc = CurveCache(store=None)
c = measured_costs(target, draft, enc[0], 8, cc)
print("batch sizes", c.batch_sizes)
for b in (1, 8):
    print("b", b, "target", [round(c.target_cost(n, b), 4) for n in (1, 2, 4, 8, 16)], "draft", [round(c.draft_cost(n, b), 4) for n in (1, 2, 4, 8, 16, 64, 118, 173)])
for model, name in ((draft, "draft"), (target, "target")):
    for rep in range(2):
        t0 = time.perf_counter()
        ersd.generate_batch(model, None, enc, max_new_tokens=1, tree="chain:1", temperature=0.0)
        print(name, "prefill 8 rows + 1 step", round(time.perf_counter() - t0, 3))
    t0 = time.perf_counter()
    ersd.generate_batch(model, None, enc[:1], max_new_tokens=1, tree="chain:1", temperature=0.0)
    print(name, "prefill row0", round(time.perf_counter() - t0, 3))
