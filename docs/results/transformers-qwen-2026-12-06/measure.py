"""Issue 51's measurement on the bundled Qwen pair: tokens/s of
``model.generate(custom_generate=ersd.transformers.generate)`` against ``ersd.generate`` (same tree,
same modules) and against transformers' assisted generation (same draft, ``num_assistant_tokens``
= the chain's depth, constant schedule), at T = 1 and T = 0, interleaved per prompt with the
order rotating, run alone. Both models are float32 ``AutoModelForCausalLM`` modules loaded from
the prepared bundled folders. Intervals: geometric mean of the per-prompt ratios with a Student-t
95% interval on the log ratios (prompts are the unit; each prompt's rate is over all its rounds).

    python docs/results/transformers-qwen-2026-12-06/measure.py --tokens 128 --rounds 1 > out.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import transformers
from scipy import stats
from transformers import AutoModelForCausalLM, AutoTokenizer

import ersd
from ersd.integrations.transformers import wrap_module
from ersd.models.bundled.cache import prepare

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "def merge_sort(items):\n    ",
    "Explain what a hash map is in two sentences.",
    "import json\n\ndef load_config(path):\n    ",
    "Write a SQL query that returns the ten most recent orders.",
    "What is the difference between a list and a tuple in Python?",
    "class LRUCache:\n    def __init__(self, capacity):\n        ",
    "Write a bash one-liner that counts the lines of every .py file in a folder.",
]


def interval(ratios: list[float]) -> dict[str, float]:
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    m = statistics.fmean(logs)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return {"gmean": math.exp(m), "lo": math.exp(m - half), "hi": math.exp(m + half), "n": n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--systems", nargs="+", default=["custom", "ersd", "assisted"])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.0])
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    tfolder, dfolder = prepare("qwen2.5-coder-1.5b"), prepare("qwen2.5-coder-0.5b")
    model = AutoModelForCausalLM.from_pretrained(tfolder, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(dfolder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(tfolder)
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    tw, dw = wrap_module(model), wrap_module(draft)
    K, N = args.depth, args.tokens
    tree = f"chain:{K}"
    systems = args.systems
    out: dict[str, object] = {"cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": "),
                              "threads": torch.get_num_threads(), "tokens": N, "tree": tree}
    for T in args.temperatures:
        toks = {s: [0] * args.prompts for s in systems}
        secs = {s: [0.0] * args.prompts for s in systems}
        for r in range(args.rounds):
            for i, p in enumerate(PROMPTS[: args.prompts]):
                enc = tok(p, return_tensors="pt")
                ids = enc.input_ids[0].tolist()
                samp = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if T > 0 else dict(do_sample=False)
                rot = (r * len(PROMPTS) + i) % 3
                order = systems[rot:] + systems[:rot]
                seed = r * 100 + i
                for what in order:
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        if what == "custom":
                            o = model.generate(**enc, custom_generate=ersd.transformers.generate, draft_model=draft,
                                               tree=tree, seed=seed, max_new_tokens=N, **samp)
                            n = o.shape[1] - enc.input_ids.shape[1]
                        elif what == "ersd":
                            o = ersd.generate(tw, dw, ids, tree=tree, seed=seed, max_new_tokens=N,
                                              eos_token_id=eos_ids, temperature=T)
                            n = len(o.tokens)
                        else:
                            # transformers reads these from the *assistant's* generation config
                            # (its default drafts 20 tokens); set on the target they do nothing
                            draft.generation_config.num_assistant_tokens = K
                            draft.generation_config.num_assistant_tokens_schedule = "constant"
                            o = model.generate(**enc, assistant_model=draft, max_new_tokens=N, **samp)
                            n = o.shape[1] - enc.input_ids.shape[1]
                    secs[what][i] += time.perf_counter() - t0
                    toks[what][i] += n
                    print(f"T={T} r={r} prompt={i} {what}: {n} tokens, {n / (time.perf_counter() - t0):.2f} tok/s",
                          file=sys.stderr, flush=True)
        rate = {s: [toks[s][i] / secs[s][i] for i in range(args.prompts)] for s in systems}
        cell: dict[str, object] = {
            "tok/s median": {s: statistics.median(v) for s, v in rate.items()},
            "tokens": toks,
        }
        for a, b in (("custom", "ersd"), ("custom", "assisted"), ("ersd", "assisted")):
            if a in rate and b in rate:
                cell[f"{a}/{b}"] = interval([x / y for x, y in zip(rate[a], rate[b])])
        out[f"T={T}"] = cell
        print(json.dumps({f"T={T}": cell}), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
