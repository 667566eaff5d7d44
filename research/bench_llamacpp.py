#!/usr/bin/env python
"""Benchmark of the llama.cpp backend against llama-cpp-python's own decoding (run it alone).

On the bundled Qwen2.5-Coder 1.5B (target) and 0.5B (draft) Q4_K_M GGUF files, interleaved per
prompt so that machine noise hits every configuration alike:

* ``llama``            llama-cpp-python's ``Llama`` generation (its own decoding loop, greedy);
* ``llama-lookup:K``   the same with ``LlamaPromptLookupDecoding(num_pred_tokens=K)``;
* ``ersd-none``        ersd target-only decoding on this backend (exact and fast batch policy);
* ``ersd-chain:K``     ERSD with the 0.5B draft, chain trees;
* ``ersd-auto``        the cost-aware choice: the tree with the highest predicted tokens/s from
  the measured cost curve and a calibrated rank profile (:mod:`ersd.bench.costs`), or no draft
  at all when no tree is predicted to beat target-only decoding (the record says which).

``--draft`` also takes a model-free drafter spec (``lookup``, ``lookup:n=2``, ``suffix``; see
:mod:`ersd.drafting.spec`): then ``ersd-chain:K`` drafts with it and ``ersd-auto`` is
``tree="auto"``, which picks each step's chain (or no drafting) from this backend's measured cost
curve (draft cost 0) and the acceptance seen so far; its record says what it chose.  With
``--sets grounded`` (prompts whose answer copies the input: edits, extraction) that is the
comparison with llama-cpp-python's prompt lookup, at the same threads, greedy.

Also the cost curve: median ms per ``llama_decode`` with 1/2/4/8/16 new tokens (logits for each)
for both models and both batch policies.  Records go to ``--out`` (JSONL); the last stdout line is
a JSON summary.  ``--smoke`` runs a tiny version (SmolLM2, few tokens) to check the script.

    python research/bench_llamacpp.py --out results/llamacpp.jsonl            # ~15 min on 2 cores
    python research/bench_llamacpp.py --draft lookup --sets grounded --prompts 12 --chains '' \
        --out results/llamacpp-lookup.jsonl
    python research/bench_llamacpp.py --smoke [--draft lookup --sets grounded]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import time
from typing import Any

import ersd
from ersd.auto import draft_model_of
from ersd.bench.costs import CostModel, choose_trees, measure_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.bench.stats import t_interval
from ersd.drafting import is_drafter_spec, parse_drafter
from ersd.models.llamacpp import llama_lib, resolve_gguf
from ersd.theory.profile import RankProfile

SIZES = [1, 2, 4, 8, 16]


def cost_curve(target: Any, draft: Any, prompt: list[int], repeats: int) -> CostModel:
    costs = measure_costs(target, draft, prompt, SIZES, repeats)
    plain = ersd.generate(target, None, prompt, max_new_tokens=8, temperature=0.0)
    costs.overhead_plain = statistics.median(s.other_time for s in plain.steps)
    return costs


def auto_choice(
    target: Any, draft: Any, costs: CostModel, prompts: list[list[int]], temp: float, n: int
) -> dict[str, Any]:
    """Calibrate a rank profile with ERSD chain:4, then pick the tree with the best predicted
    tokens/s; ``"none"`` (target-only) when no tree is predicted faster than not drafting."""
    results = [
        ersd.generate(target, draft, p, max_new_tokens=n, tree="chain:4", temperature=temp, seed=i)
        for i, p in enumerate(prompts)
    ]
    overheads = [s.other_time for r in results for s in r.steps]
    costs.overhead = statistics.median(overheads) if overheads else 0.0
    prof = RankProfile.from_results(results, vocab_size=target.vocab_size)
    choice = choose_trees(prof.depth_rank_probs(), costs, budgets=[2, 4, 8], max_nodes=8)
    best = choice["cost_aware"]
    tree = best["spec"] if best["speedup"] > 1.0 else "none"
    return {"tree": tree, "predicted": best, "target_only_rate": choice["target_only_rate"]}


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (``None`` when equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def mean_interval(xs: list[float]) -> list[float]:
    """Mean and Student-t 95% interval (``[mean]`` alone for fewer than 2 values)."""
    iv = t_interval(xs)
    if iv.n < 2:
        return [round(iv.mean, 2)]
    return [round(iv.mean, 2), round(iv.low, 2), round(iv.high, 2)]


def run_llama(llm: Any, prompt: list[int], n: int, temp: float, seed: int) -> tuple[int, float]:
    llm.reset()
    t0 = time.perf_counter()
    if temp > 0:  # llama.cpp's own sampler chain, with every truncation off
        out = llm.create_completion(
            prompt, max_tokens=n, temperature=temp, top_k=0, top_p=1.0, min_p=0.0, seed=seed
        )
    else:
        out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1)
    return int(out["usage"]["completion_tokens"]), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument(
        "--draft",
        default="qwen2.5-coder-0.5b",
        help="draft model, or a model-free drafter spec (lookup, lookup:n=2, suffix)",
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=3, help="prompts per set")
    ap.add_argument(
        "--sets",
        default=None,
        help="prompt sets (humaneval,mtbench,math,grounded; default the first two)",
    )
    ap.add_argument("--tokens", type=int, default=None, help="new tokens per run (default 96)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--chains", default="1,2,3,4", help="chain lengths; '' for none")
    ap.add_argument("--lookup", default="2,4")
    ap.add_argument("--repeats", type=int, default=5, help="timings per cost-curve point")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 = greedy (default); > 0 samples (round r uses seed r, llama.cpp its own sampler)",
    )
    ap.add_argument(
        "--configs",
        default=None,
        help="comma-separated name patterns (fnmatch) of the configs to run, e.g. 'ersd-*-fast'",
    )
    ap.add_argument(
        "--decompose",
        action="store_true",
        help="also measure the cost curve of a fast-policy target that is not repacked "
        "(exact = no repack + Q8_0 cache; this separates the two costs)",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    free = is_drafter_spec(args.draft)  # a model-free (or hybrid) drafter, not a model name
    if args.smoke:
        args.target = "smollm2-135m"
        args.draft = args.draft if free else "smollm2-135m"
        args.prompts, args.rounds, args.repeats = 1, 1, 1
        args.chains, args.lookup = "2", "2"
        args.tokens, args.sets = args.tokens or 8, args.sets or "humaneval"
    args.tokens, args.sets = args.tokens or 96, args.sets or "humaneval,mtbench"
    lib = llama_lib()
    threads = args.threads
    load = dict(backend="llamacpp", threads=threads)
    target = ersd.load_model(args.target, **load)
    target_fast = ersd.load_model(args.target, exact=False, **load)
    if free:
        draft = parse_drafter(
            args.draft,
            load_model=lambda name: ersd.load_model(name, exact=False, **load),
            tokenize=lambda text: target.tokenizer.encode(text, add_special_tokens=False),
        )
        draft_model = draft_model_of(draft)  # None for lookup / suffix alone
    else:
        draft = draft_model = ersd.load_model(args.draft, exact=False, **load)
    if draft_model is not None:
        target.check_compatible(draft_model)
    records: list[dict[str, Any]] = []
    out = open(args.out, "w") if args.out else None  # noqa: SIM115

    def emit(rec: dict[str, Any]) -> None:
        records.append(rec)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        print(json.dumps(rec), file=sys.stderr, flush=True)

    prompts = load_prompts(args.sets.split(","), "eval", args.prompts)
    ids = [encode_prompt(target.tokenizer, p, "auto", 512) for p in prompts]
    calib = load_prompts(args.sets.split(","), "calib", 1)
    calib_ids = [encode_prompt(target.tokenizer, p, "auto", 512) for p in calib]

    curves = {}
    policies = [("exact", target), ("fast", target_fast)]
    if args.decompose:
        nrp = ersd.load_model(args.target, exact=False, repack=False, **load)
        policies.append(("fast-norepack", nrp))
    for policy, tmodel in policies:
        costs = cost_curve(tmodel, draft_model, ids[0], args.repeats)
        curves[policy] = costs
        emit(
            {
                "kind": "cost_curve",
                "policy": policy,
                "sizes": SIZES,
                "target_ms": [round(1e3 * t, 1) for t in costs.target],
                "draft_ms": [round(1e3 * t, 1) for t in costs.draft],
            }
        )
    # a draft model: the tree chosen once, offline. Rank profiles exist only for sampling
    # (T > 0); at T = 1 acceptance is lower than greedy, so the choice errs towards drafting less.
    # A model-free drafter: tree="auto", chosen per step online (its draft cost is 0)
    auto = {
        policy: {"tree": "auto"}
        if free
        else auto_choice(tm, draft, curves[policy], calib_ids, 1.0, args.tokens // 2)
        for policy, tm in (("exact", target), ("fast", target_fast))
    }
    for policy, choice in auto.items():
        emit({"kind": "auto_choice", "policy": policy, "draft": args.draft, **choice})

    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    # llama-cpp-python's own default is cpu_count // 2 threads: give its baseline the same threads
    # as ersd's sessions, or the comparison measures thread counts, not decoding loops
    threads = target.threads
    path_t = str(resolve_gguf(args.target))
    llm = lib.Llama(path_t, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    lookups = {
        k: lib.Llama(
            path_t,
            n_ctx=2048,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k),
        )
        for k in ints(args.lookup)
    }
    configs: list[tuple[str, Any]] = [("llama", llm)]
    configs += [(f"llama-lookup:{k}", m) for k, m in lookups.items()]
    configs += [
        ("ersd-none-exact", (target, None, "none")),
        ("ersd-none-fast", (target_fast, None, "none")),
    ]
    tag = f"{args.draft}-" if free else ""  # e.g. ersd-lookup-auto-exact
    for k in ints(args.chains):
        configs.append((f"ersd-{tag}chain:{k}-exact", (target, draft, f"chain:{k}")))
        configs.append((f"ersd-{tag}chain:{k}-fast", (target_fast, draft, f"chain:{k}")))
    for policy, tm in (("exact", target), ("fast", target_fast)):
        tree = auto[policy]["tree"]
        configs.append((f"ersd-{tag}auto-{policy}", (tm, None if tree == "none" else draft, tree)))

    if args.configs:
        pats = [p.strip() for p in args.configs.split(",") if p.strip()]
        # ersd's target-only decoding always runs: it is the text the others are compared with
        configs = [
            c
            for c in configs
            if c[0].startswith("ersd-none") or any(fnmatch.fnmatchcase(c[0], p) for p in pats)
        ]
        if not configs:
            sys.exit(f"--configs {args.configs!r} matches no config")
    temp = args.temperature
    # the text each policy's target-only decoding gave, per (prompt, round): every exact config
    # must equal it bit for bit; a fast config differs only where a near-tie flips between
    # kernel paths (its records count how often, and from which token)
    reference: dict[tuple[str, int, int], list[int]] = {}
    for name, obj in configs:  # warm-up
        if name.startswith("llama"):
            run_llama(obj, ids[0][:16], 2, temp, 0)
        else:
            # tree="auto" measures its cost curves here, once per model, not in a timed run
            tree = obj[2] if obj[1] is not None else "chain:1"
            ersd.generate(obj[0], obj[1], ids[0][:16], max_new_tokens=2, temperature=0.0, tree=tree)
    for rnd in range(args.rounds):
        for i, prompt in enumerate(ids):
            for name, obj in configs:
                if name.startswith("llama"):
                    n, secs = run_llama(obj, prompt, args.tokens, temp, rnd)
                    rec: dict[str, Any] = {"tokens": n}
                else:
                    tm, dm, tree = obj
                    res = ersd.generate(
                        tm,
                        dm,
                        prompt,
                        max_new_tokens=args.tokens,
                        temperature=temp,
                        seed=rnd,
                        tree=tree if dm is not None else "chain:1",
                    )
                    n, secs = len(res.tokens), res.wall_time
                    rec = {"tokens": n, "block_efficiency": res.block_efficiency}
                    if tree == "auto":  # what it chose and why (e.g. no drafting)
                        rec["auto"] = res.auto_summary
                    policy = "exact" if tm is target else "fast"
                    ref = reference.setdefault((policy, i, rnd), res.tokens)
                    diff = first_difference(ref, res.tokens)
                    rec["policy"] = policy
                    rec["identical_to_target_only"] = diff is None
                    rec["first_difference"] = diff
                emit(
                    {
                        "kind": "run",
                        "config": name,
                        "round": rnd,
                        "prompt": prompts[i].id,
                        "tokens_per_second": n / secs,
                        **rec,
                    }
                )
    summary: dict[str, Any] = {
        "threads": target.threads,
        "tokens": args.tokens,
        "draft": args.draft,
        "sets": args.sets,
    }
    summary["temperature"] = temp
    for name, _ in configs:
        rates = [r["tokens_per_second"] for r in records if r.get("config") == name]
        summary[name] = {
            "median": round(statistics.median(rates), 2),
            "mean_ci": mean_interval(rates),
        }
    summary["auto"] = {p: a["tree"] for p, a in auto.items()}
    runs = [r for r in records if r["kind"] == "run" and "policy" in r]
    # the reference of each (prompt, round) is the policy's target-only decoding (ersd-none-*)
    for policy in ("exact", "fast"):
        cmp = [r for r in runs if r["policy"] == policy and not r["config"].startswith("ersd-none")]
        if not cmp:
            continue
        flips = [r for r in cmp if not r["identical_to_target_only"]]
        summary[f"{policy}_identical"] = f"{len(cmp) - len(flips)}/{len(cmp)}"
        summary[f"{policy}_first_difference"] = sorted(r["first_difference"] for r in flips)
        summary[f"{policy}_tokens_compared"] = sum(r["tokens"] for r in cmp)
    summary["cost_curve_ms"] = {
        p: {
            "target": [round(1e3 * t, 1) for t in c.target],
            "draft": [round(1e3 * t, 1) for t in c.draft],
        }
        for p, c in curves.items()
    }
    if out:
        out.close()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
