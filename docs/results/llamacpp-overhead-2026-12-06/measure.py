"""ersd's llama.cpp backend vs plain llama-cpp-python on the same GGUF, one process, interleaved.

Per prompt and round, in rotating order: ``plain`` (llama-cpp-python's ``Llama.create_completion``,
its own sampler, every truncation off, T = 1), ``ersd-none`` (ersd target-only, exact policy),
``ersd-auto`` (ERSD ``tree="auto"`` with a fast-policy draft of the same GGUF) and, for the split,
``ersd-none-fast`` (target-only, fast policy).  A ``:CACHE`` suffix (``ersd-none:bf16``,
``ersd-auto:q8_0``) picks the exact target's KV cache (default: the library's); every
``ersd-auto[:CACHE]`` run's text is checked against ``ersd-none[:CACHE]``'s (same seed), and the
exact target-only texts of two caches are compared too (``none_same_text``: the caches are
different models, so they may differ).  Tokens/s of each run; per prompt the ratio of each ersd
config to ``plain`` in the same round; summary: median of ratios with a bootstrap 95% interval
(2000 resamples of prompts, fixed seed).

    OMP_NUM_THREADS=1 python docs/results/llamacpp-overhead-2026-12-06/measure.py --prompts 8
    OMP_NUM_THREADS=1 python docs/results/llamacpp-overhead-2026-12-06/measure.py \
        --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --threads 2 --tokens 96 \
        --configs plain,ersd-none:q8_0,ersd-none:bf16,ersd-auto:bf16
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

import ersd
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.models.llamacpp import llama_lib, resolve_gguf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--configs", default="plain,ersd-none,ersd-auto,ersd-none-fast")
    ap.add_argument(
        "--draft", default=None, help="ersd-auto's draft GGUF/name (default: the target's own file)"
    )
    ap.add_argument(
        "--context",
        type=int,
        default=1024,
        help="context window of every model (0: the library's default, as `ersd generate` and "
        "`ersd models calibrate` load them: then ersd-config reads their stored curves)",
    )
    args = ap.parse_args()
    path = str(resolve_gguf(args.model))
    lib = llama_lib()
    ctx = args.context or None
    configs = args.configs.split(",")
    caches = sorted({c.split(":")[1] for c in configs if ":" in c})
    exacts = {
        kv: ersd.load_model(
            args.model, backend="llamacpp", threads=args.threads, context=ctx, kv_cache=kv or None
        )
        for kv in ["", *caches]
    }
    exact = exacts[""]
    llm = lib.Llama(
        path,
        n_ctx=exact.max_length,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    # loaded by name, as the CLI loads them: the cost store's keys hold the name
    fast = ersd.load_model(
        args.model, backend="llamacpp", threads=args.threads, context=ctx, exact=False
    )
    dmodel = fast
    if args.draft is not None:
        dmodel = ersd.load_model(
            args.draft,
            backend="llamacpp",
            threads=args.threads,
            context=ctx,
            exact=False,
        )
    # what `ersd generate --backend llamacpp --config auto` would run here (the stored curves of
    # `ersd models calibrate --backend llamacpp`): config "ersd-config"
    from ersd.config_choice import choose_llamacpp

    choice = choose_llamacpp(exact, dmodel if args.draft is not None else None)
    print(f"# config auto: {choice.summary()}", file=sys.stderr, flush=True)
    sets = ["humaneval", "mtbench", "math"]
    per = -(-args.prompts // len(sets))
    prompts = [p for s in sets for p in load_prompts([s], "eval", per)][: args.prompts]
    ids_all = [encode_prompt(exact.tokenizer, p, "auto", 256) for p in prompts]
    n = args.tokens

    draft_forwards: list[int] = []

    def run(cfg: str, ids: list[int], seed: int) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        if cfg == "plain":
            llm.reset()
            out = llm.create_completion(
                ids, max_tokens=n, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed
            )
            k = int(out["usage"]["completion_tokens"])
            return k / (time.perf_counter() - t0), []
        if cfg == "ersd-config":  # --config auto's choice
            cfg = "ersd-none-fast" if choice.candidate.batch_policy == "fast" else "ersd-auto"
        kv = cfg.split(":")[1] if ":" in cfg else ""
        model = fast if cfg.endswith("-fast") else exacts[kv]
        draft = dmodel if "auto" in cfg else None
        res = ersd.generate(
            model,
            draft,
            ids,
            max_new_tokens=n,
            tree="auto" if draft is not None else "chain:1",
            temperature=1.0,
            seed=seed,
        )
        rate = len(res.tokens) / (time.perf_counter() - t0)
        if draft is not None:
            draft_forwards.append(res.draft_forwards)
        return rate, res.tokens

    for cfg in configs:  # warm-up
        run(cfg, ids_all[0][:16], 0)
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for i, ids in enumerate(ids_all):
            order = configs[(i + r) % len(configs) :] + configs[: (i + r) % len(configs)]
            rec: dict[str, Any] = {"prompt": i, "round": r}
            toks = {}
            for cfg in order:
                rec[cfg], toks[cfg] = run(cfg, ids, 1000 + i)
            for cfg in configs:
                ref = cfg.replace("ersd-auto", "ersd-none")
                if cfg.startswith("ersd-auto") and ref in toks:
                    key = "auto_identical" + cfg[len("ersd-auto") :]
                    rec[key] = toks[ref] == toks[cfg]
            nones = [c for c in configs if c.startswith("ersd-none") and not c.endswith("-fast")]
            if len(nones) > 1:
                rec["none_same_text"] = len({tuple(toks[c]) for c in nones}) == 1
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    rng = random.Random(0)
    summary: dict[str, Any] = {"model": args.model, "threads": args.threads, "tokens": n}
    summary["runs"] = len(rows)
    summary["config_auto"] = choice.to_dict()
    summary["auto_draft_forwards"] = sum(draft_forwards)
    for cfg in configs:
        if cfg == "plain":
            continue
        ratios = [row[cfg] / row["plain"] for row in rows]
        boots = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        summary[cfg] = {
            "median_ratio": round(statistics.median(ratios), 3),
            "ci95": [round(boots[50], 3), round(boots[1949], 3)],
            "median_tps": round(statistics.median(row[cfg] for row in rows), 1),
        }
    summary["plain_median_tps"] = round(statistics.median(row["plain"] for row in rows), 1)
    for key in sorted({k for row in rows for k in row if k.startswith("auto_identical")}):
        summary[key] = sum(bool(row.get(key)) for row in rows)
    if any("none_same_text" in row for row in rows):
        summary["none_same_text"] = sum(bool(row.get("none_same_text")) for row in rows)
    print(json.dumps(summary))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
