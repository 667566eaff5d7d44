#!/usr/bin/env python
"""ERSD with and without draft sharpness, side by side in one process (issue 16).

ERSD's text does not depend on the drafter, so ERSD chain:K at ``beta = 1`` and at ``beta = B``
produce the *same* tokens for a prompt and seed: their tokens per call and tokens/s differ only by
what the drafter proposes, and the comparison is paired on identical texts (unlike a comparison
with SD, which samples its own). SD chain:K runs alongside for reference. Configurations rotate
from prompt to prompt; ratios are paired per prompt with Student-t 95% intervals.

    python -m research.sharpness_pairs --prompts 10 --tokens 64 --budget 8 --sharpness 1.15 \
        --temperatures 0.7 1.0 --out sharpness-pairs.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

import ersd
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.methods.ersd import ERSD
from ersd.models.hf_load import load
from research.paired import common_args, t_interval


def main() -> None:
    ap = common_args(__doc__ or "")
    ap.add_argument("--sharpness", type=float, default=1.15)
    ap.add_argument("--out", default="sharpness-pairs.json")
    args = ap.parse_args()

    target = load(args.target, dtype=args.dtype)
    draft = load(args.draft, dtype=args.draft_dtype)
    tree = f"chain:{args.budget}"
    configs: dict[str, Any] = {
        "ERSD beta=1": ERSD(),
        f"ERSD beta={args.sharpness:g}": ERSD(draft_sharpness=args.sharpness),
        "SD": "sd",
    }
    prompts = load_prompts([args.set], "eval", args.prompts)
    encoded = [encode_prompt(target.tokenizer, p, "auto", 1024) for p in prompts]
    for meth in configs.values():  # warm-up: kernels, allocator
        ersd.generate(target, draft, encoded[0], max_new_tokens=4, method=meth, tree=tree)
    rows: list[dict[str, Any]] = []
    names = list(configs)
    for i, ids in enumerate(encoded):
        for temp in args.temperatures:
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                t0 = time.perf_counter()
                res = ersd.generate(
                    target,
                    draft,
                    ids,
                    max_new_tokens=args.tokens,
                    method=configs[name],
                    tree=tree,
                    temperature=temp,
                    seed=i,
                )
                wall = time.perf_counter() - t0
                rows.append(
                    {
                        "prompt": i,
                        "temperature": temp,
                        "config": name,
                        "tokens": list(res.tokens),
                        "calls": res.target_calls,
                        "wall": wall,
                        "draft_forwards": sum(s.draft_forwards for s in res.steps),
                    }
                )
            print(f"prompt {i} T={temp} done", flush=True)
    summary: dict[str, Any] = {}
    sharp = names[1]
    for temp in args.temperatures:
        at = {(r["prompt"], r["config"]): r for r in rows if r["temperature"] == temp}
        same = all(
            at[(i, names[0])]["tokens"] == at[(i, sharp)]["tokens"] for i in range(len(encoded))
        )
        out: dict[str, Any] = {"identical_ersd_text": same}
        for name in names:
            tpc = [
                len(at[(i, name)]["tokens"]) / at[(i, name)]["calls"] for i in range(len(encoded))
            ]
            tps = [
                len(at[(i, name)]["tokens"]) / at[(i, name)]["wall"] for i in range(len(encoded))
            ]
            out[name] = {"tokens_per_call": t_interval(tpc), "tokens_per_s": t_interval(tps)}
        for a, b in ((sharp, names[0]), (sharp, "SD"), (names[0], "SD")):
            bpc = [
                (len(at[(i, a)]["tokens"]) / at[(i, a)]["calls"])
                / (len(at[(i, b)]["tokens"]) / at[(i, b)]["calls"])
                for i in range(len(encoded))
            ]
            bps = [
                (len(at[(i, a)]["tokens"]) / at[(i, a)]["wall"])
                / (len(at[(i, b)]["tokens"]) / at[(i, b)]["wall"])
                for i in range(len(encoded))
            ]
            out[f"{a} / {b}"] = {
                "tokens_per_call": t_interval(bpc),
                "tokens_per_s": t_interval(bps),
            }
        summary[str(temp)] = out
        print(f"T={temp}: identical ERSD text {same}")
        for k, v in out.items():
            if isinstance(v, dict):
                m, lo, hi = v["tokens_per_call"]
                n, lo2, hi2 = v["tokens_per_s"]
                print(
                    f"  {k:28s} tokens/call {m:.3f} [{lo:.3f}, {hi:.3f}]  "
                    f"tokens/s {n:.3f} [{lo2:.3f}, {hi2:.3f}]"
                )
    Path(args.out).write_text(
        json.dumps({"args": vars(args), "summary": summary, "runs": rows}, indent=1) + "\n"
    )
    print(f"wrote {args.out}; mean wall per run {np.mean([r['wall'] for r in rows]):.1f}s")


if __name__ == "__main__":
    main()
