"""Benchmark: ERSD inside vLLM next to vLLM's own decoding and ersd.generate (docs/vllm.md).

Run it alone on an idle machine, in the vLLM environment (bash scripts/setup-vllm.sh):

    OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=4 .venv-vllm/bin/python research/bench_vllm.py \\
        --pair qwen --batch 1 8 --max-tokens 64 --out bench-results/vllm.json

``--pair smollm`` (SmolLM2-135M drafting for itself) is a quick smoke run.  Every vLLM row is a
fresh engine (float32, eager, in its own engine process) timed at each batch size in turn; the
time is the wall time of one ``generate`` call over ``batch`` prompts after a warm-up call at
that batch size.  Rows:

* vllm-target: vLLM, no drafter, ordinary sampling (T=0 and T=1)
* vllm-ersd-{none,ngram,draft}: ERSD requests (ersd_temperature=T) with each drafter
* vllm-spec-draft: vLLM's own speculative decoding with the draft model (T=0, and T=1)
* ersd-generate-{target,draft}: this package's own loop on the same prompts (``ersd.generate`` at
  batch 1, ``ersd.generate_batch`` above)

plus the cost of the race noise per row (NumPy and torch generators) at the pair's vocabulary.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

PROMPTS = [
    "def quicksort(arr):\n",
    "# Return the n-th Fibonacci number\ndef fib(n):\n",
    "class Stack:\n    def __init__(self):\n",
    "import numpy as np\n\ndef normalize(x):\n",
    "def is_prime(n: int) -> bool:\n",
    "# Parse a CSV file into a list of dicts\ndef read_csv(path):\n",
    "def binary_search(items, target):\n",
    'def merge_sorted(a, b):\n    """Merge two sorted lists."""\n',
]
PAIRS = {"qwen": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"), "smollm": ("smollm2-135m",) * 2}


def spec_metrics(llm) -> dict[str, float]:
    m = {x.name: getattr(x, "value", None) for x in llm.get_metrics()}
    d = m.get("vllm:spec_decode_num_draft_tokens") or 0
    a = m.get("vllm:spec_decode_num_accepted_tokens") or 0
    n = m.get("vllm:spec_decode_num_drafts") or 0
    return {"draft_tokens": d, "accepted": a, "acceptance_rate": a / d if d else 0.0,
            "mean_acceptance_length": 1 + a / n if n else 1.0}  # fmt: skip


def run_vllm(target, draft, spec_kind, params_fn, batches, max_tokens, k):
    """One engine (loaded once) timed at every batch size; one result per batch size."""
    from vllm import LLM

    spec = None
    if spec_kind == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
                "prompt_lookup_min": 2}  # fmt: skip
    elif spec_kind == "draft":
        spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
    t0 = time.perf_counter()
    llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=1024,
              max_num_seqs=max(*batches, 8), speculative_config=spec, seed=0,
              disable_log_stats=False)  # fmt: skip
    load = time.perf_counter() - t0
    out = []
    for batch in batches:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
        warm = [params_fn(99 + i, 8) for i in range(batch)]
        llm.generate(prompts, warm, use_tqdm=False)  # warm-up at this batch size
        before = spec_metrics(llm)
        t0 = time.perf_counter()
        params = [params_fn(i, max_tokens) for i in range(batch)]
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        after = spec_metrics(llm)
        n_tok = sum(len(o.outputs[0].token_ids) for o in outs)
        d = after["draft_tokens"] - before["draft_tokens"]
        a = after["accepted"] - before["accepted"]
        out.append({"batch": batch, "load_s": load, "wall_s": wall, "tokens": n_tok,
                    "tokens_per_s": n_tok / wall, "acceptance_rate": a / d if d else None,
                    "first_tokens": [list(o.outputs[0].token_ids[:8]) for o in outs]})  # fmt: skip
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return out


def run_ersd_generate(target_name, draft_name, batch, max_tokens, temperature, k):
    import ersd

    target = ersd.load_model(target_name, dtype="float32")
    draft = ersd.load_model(draft_name, dtype="float32") if draft_name else None
    tok = target.tokenizer
    prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(batch)]
    ersd.generate_batch(target, draft, prompts, max_new_tokens=8, tree=f"chain:{k}")  # warm-up
    t0 = time.perf_counter()
    if batch == 1:
        results = [ersd.generate(target, draft, prompts[0], max_new_tokens=max_tokens, seed=0,
                                 temperature=temperature, tree=f"chain:{k}")]  # fmt: skip
    else:  # ersd's own batched engine: one target forward per step for all rows
        results = ersd.generate_batch(target, draft, prompts, seeds=list(range(batch)),
                                      max_new_tokens=max_tokens, temperature=temperature,
                                      tree=f"chain:{k}")  # fmt: skip
    n_tok = sum(len(r.tokens) for r in results)
    calls = sum(r.target_calls for r in results)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "tokens": n_tok, "tokens_per_s": n_tok / wall,
            "block_efficiency": n_tok / calls}  # fmt: skip


def noise_cost(vocab: int, rows: int = 8) -> dict[str, float]:
    from ersd.integrations.vllm.philox import race_exponentials_torch
    from ersd.race import RaceNoise, root_key

    keys = [root_key(i, [1, 2, 3]) for i in range(rows)]
    t0 = time.perf_counter()
    noise = RaceNoise(vocab, cache_size=0)
    for k in keys:
        noise.exponentials(k)
    numpy_ms = (time.perf_counter() - t0) / rows * 1e3
    race_exponentials_torch(keys[:1], vocab)  # tables
    t0 = time.perf_counter()
    race_exponentials_torch(keys, vocab)
    torch_ms = (time.perf_counter() - t0) / rows * 1e3
    return {"vocab": vocab, "numpy_ms_per_row": numpy_ms, "torch_cpu_ms_per_row": torch_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=sorted(PAIRS), default="qwen")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4, help="draft tokens per step")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--skip-vllm-t1", action="store_true",
                    help="leave out vLLM's own stochastic speculative decoding")  # fmt: skip
    ap.add_argument("--only", default="", help="run only rows whose name contains this text")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    from vllm import SamplingParams

    from ersd.integrations.vllm import ersd_sampling_params
    from ersd.models.bundled import prepare

    names = PAIRS[a.pair]
    target, draft = (str(prepare(n, progress=True)) for n in names)
    t = a.temperature

    def ersd_p(i, n):
        return ersd_sampling_params(i, t, max_tokens=n, ignore_eos=True)

    def greedy_p(i, n):
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    def random_p(i, n):
        return SamplingParams(temperature=t, seed=i, max_tokens=n, ignore_eos=True)

    rows = [
        ("vllm-target T=0", None, greedy_p),
        (f"vllm-target T={t}", None, random_p),
        (f"vllm-ersd-none T={t}", None, ersd_p),
        (f"vllm-ersd-ngram T={t}", "ngram", ersd_p),
        (f"vllm-ersd-draft T={t}", "draft", ersd_p),
        ("vllm-spec-draft T=0", "draft", greedy_p),
    ]
    if not a.skip_vllm_t1:
        rows.append((f"vllm-spec-draft T={t}", "draft", random_p))
    results: dict = {"pair": names, "k": a.k, "max_tokens": a.max_tokens, "rows": []}
    for name, spec, fn in rows:
        if a.only not in name:
            continue
        for r in run_vllm(target, draft, spec, fn, a.batch, a.max_tokens, a.k):
            results["rows"].append({"name": name, **r})
            print(f"{name:28s} batch={r['batch']}: {r['tokens_per_s']:.2f} tok/s "
                  f"(acceptance {r['acceptance_rate']})", file=sys.stderr, flush=True)  # fmt: skip
    for batch in a.batch:
        for label, d in (("ersd-generate-target", None), ("ersd-generate-draft", draft)):
            if a.only not in label:
                continue
            r = run_ersd_generate(target, d, batch, a.max_tokens, t, a.k)
            results["rows"].append({"name": f"{label} T={t}", "batch": batch, **r})
            print(f"{label:28s} batch={batch}: {r['tokens_per_s']:.2f} tok/s",
                  file=sys.stderr, flush=True)  # fmt: skip
    import ersd

    vocab = ersd.load_model(target).vocab_size
    results["noise"] = noise_cost(vocab)
    print(json.dumps(results["noise"]), file=sys.stderr)
    text = json.dumps(results, indent=1)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    main()
