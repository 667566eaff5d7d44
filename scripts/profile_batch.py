#!/usr/bin/env python
"""Where a batched ERSD step spends its time outside model forwards (issue 13's "other").

Loads the Qwen pair (float32 oneDNN target, int8 draft), generates for B HumanEval prompts with
``generate_batch`` under cProfile and prints the top functions by cumulative and own time, plus
the engine's per-step split.  Run alone:  python scripts/profile_batch.py --batch 8 --tokens 24
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import ersd
from ersd.bench.prompts import encode_prompt, load_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--tree", default="chain:4")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--dump", default=None, help="also save the cProfile stats to this file")
    args = ap.parse_args()
    target = ersd.load_model(args.target, dtype="float32")
    draft = ersd.load_model(args.draft, dtype="int8")
    prompts = load_prompts(["humaneval"], "eval", args.batch)
    ids = [encode_prompt(target.tokenizer, p, "raw", 768) for p in prompts][: args.batch]
    kw = dict(method="ersd", tree=args.tree, temperature=1.0)
    ersd.generate_batch(target, draft, ids, seeds=0, max_new_tokens=4, **kw)  # warm-up
    t_f0, d_f0 = target.forward_seconds, draft.forward_seconds
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    res = ersd.generate_batch(target, draft, ids, seeds=0, max_new_tokens=args.tokens, **kw)
    prof.disable()
    wall = time.perf_counter() - t0
    tf, df = target.forward_seconds - t_f0, draft.forward_seconds - d_f0
    tokens = sum(len(r.tokens) for r in res)
    print(
        f"B={args.batch} {args.tree}: {tokens} tokens in {wall:.1f}s; target forwards {tf:.1f}s "
        f"({tf / wall:.1%}), draft forwards {df:.1f}s ({df / wall:.1%}), other "
        f"{wall - tf - df:.2f}s ({(wall - tf - df) / wall:.1%})"
    )
    if args.dump:
        prof.dump_stats(args.dump)
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(args.top)
    st.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
