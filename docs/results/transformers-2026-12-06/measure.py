"""tokens/s of model.generate(custom_generate=ersd.transformers.generate) vs ersd.generate (same
tree, same module) and vs transformers' assisted generation (same draft, num_assistant_tokens =
tree depth), interleaved per prompt, on SmolLM2-135M float32 with a layer-truncated draft."""
import statistics, sys, time, json
import torch
torch.set_num_threads(1)
import transformers, ersd
from transformers import AutoModelForCausalLM, AutoTokenizer
from ersd.integrations.transformers import wrap_module
transformers.logging.set_verbosity_error()
folder = ersd.load_model("smollm2-135m", dtype="float32", linear="torch").hf_module.config._name_or_path
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
draft = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, num_hidden_layers=8)
tok = AutoTokenizer.from_pretrained(folder)
prompts = ["def fibonacci(n):\n    ", "The capital of France is", "import numpy as np\nx = np.", "Once upon a time, there",
           "class Stack:\n    def __init__(self):", "The best way to learn", "for i in range(10):\n", "SELECT name FROM"]
N = int(sys.argv[1]) if len(sys.argv) > 1 else 48
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
K = 4
res = {}
for T in (1.0, 0.0):
    rates = {"custom": [], "ersd": [], "assisted": []}
    for r in range(rounds):
        for i, p in enumerate(prompts):
            enc = tok(p, return_tensors="pt")
            ids = enc.input_ids[0].tolist()
            samp = dict(do_sample=True, temperature=1.0, top_k=0) if T > 0 else dict(do_sample=False)
            ersd_s = dict(temperature=1.0) if T > 0 else dict(temperature=0.0)
            order = ["custom", "ersd", "assisted"] if (r + i) % 2 == 0 else ["assisted", "ersd", "custom"]
            for what in order:
                t0 = time.perf_counter()
                with torch.no_grad():
                    if what == "custom":
                        out = model.generate(**enc, custom_generate=ersd.transformers.generate, draft_model=draft,
                                             tree=f"chain:{K}", seed=r * 100 + i, max_new_tokens=N, **samp)
                        n = out.shape[1] - enc.input_ids.shape[1]
                    elif what == "ersd":
                        out = ersd.generate(wrap_module(model), wrap_module(draft), ids, tree=f"chain:{K}",
                                            seed=r * 100 + i, max_new_tokens=N, eos_token_id=2, **ersd_s)
                        n = len(out.tokens)
                    else:
                        # BUG in this run (found 2026-12-06 on the Qwen run): transformers reads
                        # these from the assistant's generation config, so assisted generation
                        # here drafted its default 20 tokens, not K; see README.md
                        model.generation_config.num_assistant_tokens = K
                        model.generation_config.num_assistant_tokens_schedule = "constant"
                        out = model.generate(**enc, assistant_model=draft, max_new_tokens=N, **samp)
                        n = out.shape[1] - enc.input_ids.shape[1]
                dt = time.perf_counter() - t0
                rates[what].append(n / dt)
    # per-run ratios (paired: same prompt, same round)
    def ratio(a, b):
        rs = sorted(x / y for x, y in zip(rates[a], rates[b]))
        m = len(rs)
        return {"median": statistics.median(rs), "q25": rs[m // 4], "q75": rs[(3 * m) // 4], "n": m}
    res[f"T={T}"] = {"custom/ersd": ratio("custom", "ersd"), "custom/assisted": ratio("custom", "assisted"),
                     "median tok/s": {k: statistics.median(v) for k, v in rates.items()}}
    print(json.dumps(res[f"T={T}"]), flush=True)
print(json.dumps(res, indent=1))
