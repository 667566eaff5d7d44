"""Where ersd's llama.cpp target-only decoding loses time against plain llama-cpp-python (issue 47).

Two measurements, one process, configurations interleaved (rotated each repeat), medians:

1. **ms per one-token decode** at a fixed context (``--cells`` cached tokens): the time inside
   ``llama_decode`` of plain ``Llama.eval`` (no flash attention, f16 cache, repacked weights: its
   defaults) and of ersd sessions with each KV cache / policy in ``--configs``;
2. **per generated token** of a whole target-only generation (T = 1): the time inside
   ``llama_decode`` (the prompt's call included; ``one_token_decode_ms``: the median of the
   later calls), inside the session's ``score``/``commit`` around it (batch building, the
   logits copy, the finite check) and outside the session (ersd's race and bookkeeping;
   llama-cpp-python's sampler and its own loop for ``plain``).

Configs: ``plain``; ``exact-q8_0`` / ``exact-bf16`` (exact policy with that cache);
``fast`` (f16 cache, repacked: ``exact=False``); ``f16-norepack`` (f16 cache, weights not
repacked: what the exact policy would be if an f16 cache were exact).

    OMP_NUM_THREADS=1 python docs/results/llamacpp-overhead-2026-12-06/decode_cost.py \\
        --model qwen2.5-coder-1.5b --threads 1 --cells 300 --repeats 20 --tokens 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from typing import Any

import ersd
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.models import llamacpp_session
from ersd.models.llamacpp import llama_lib, resolve_gguf

CONFIGS = "plain,exact-q8_0,exact-bf16,fast,f16-norepack"


class Clock:
    """Accumulates the seconds spent in ``llama_decode`` and in the session's methods."""

    def __init__(self) -> None:
        self.decode = 0.0
        self.session = 0.0
        self.calls: list[float] = []  # seconds of each llama_decode call

    def install(self, lib: Any) -> None:
        import llama_cpp.llama_cpp as low

        raw = low.llama_decode

        def timed(ctx: Any, batch: Any) -> int:
            t0 = time.perf_counter()
            rc = raw(ctx, batch)
            dt = time.perf_counter() - t0
            self.decode += dt
            self.calls.append(dt)
            return int(rc)

        # llama-cpp-python's Llama calls llama_cpp.llama_cpp.llama_decode; ersd calls the package's
        low.llama_decode = timed
        lib.llama_decode = timed
        cls = llamacpp_session.LlamaCppSession
        for name in ("score", "commit"):
            inner = getattr(cls, name)

            def wrapped(s: Any, *a: Any, _inner: Any = inner) -> Any:
                t0 = time.perf_counter()
                try:
                    return _inner(s, *a)
                finally:
                    self.session += time.perf_counter() - t0

            setattr(cls, name, wrapped)


def load(cfg: str, path: str, threads: int, context: int) -> Any:
    kw: dict[str, Any] = dict(backend="llamacpp", threads=threads, context=context)
    if cfg.startswith("exact-"):
        return ersd.load_model(path, kv_cache=cfg[len("exact-") :], **kw)
    if cfg == "fast":
        return ersd.load_model(path, exact=False, **kw)
    if cfg == "f16-norepack":
        return ersd.load_model(path, exact=False, repack=False, **kw)
    if cfg.startswith("nofa-"):  # no flash attention (plain's path), weights not repacked
        m = ersd.load_model(path, exact=False, repack=False, kv_cache=cfg[len("nofa-") :], **kw)
        m._flash_attn = False
        return m
    raise SystemExit(f"unknown config {cfg!r}; known: {CONFIGS}, nofa-f16")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cells", type=int, default=300, help="cached tokens before the timed decodes")
    ap.add_argument("--repeats", type=int, default=20, help="timed one-token decodes per config")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per generation (0: skip part 2)")
    ap.add_argument("--rounds", type=int, default=2, help="generations per config and prompt")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--configs", default=CONFIGS)
    args = ap.parse_args()
    lib = llama_lib()
    path = str(resolve_gguf(args.model))
    configs = args.configs.split(",")
    context = args.cells + args.repeats + 64
    models: dict[str, Any] = {}
    for cfg in configs:
        if cfg == "plain":
            models[cfg] = lib.Llama(
                path,
                n_ctx=max(context, 1024),
                n_threads=args.threads,
                n_threads_batch=args.threads,
                verbose=False,
            )
        else:
            models[cfg] = load(cfg, path, args.threads, max(context, 1024))
    clock = Clock()
    clock.install(lib)
    any_ersd = next(m for c, m in models.items() if c != "plain")
    text = "def quicksort(xs):\n    if len(xs) < 2:\n        return xs\n    pivot = xs[0]\n"
    filler = any_ersd.tokenizer.encode(text, add_special_tokens=False)
    prompt = (filler * (args.cells // len(filler) + 1))[: args.cells]

    # 1. ms per one-token decode at ~cells cached tokens
    sessions: dict[str, Any] = {}
    for cfg, m in models.items():
        if cfg == "plain":
            m.reset()
            m.eval(prompt)
        else:
            sessions[cfg] = m.start(prompt)
            sessions[cfg].score([], [])
    per: dict[str, list[float]] = defaultdict(list)
    tok = filler[0]
    for r in range(args.repeats):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for cfg in order:
            d0 = clock.decode
            if cfg == "plain":
                models[cfg].eval([tok])
            else:
                sessions[cfg].commit([tok], [])
                sessions[cfg].score([], [])
            per[cfg].append(1000 * (clock.decode - d0))
    base = statistics.median(per[configs[0]])
    part1 = {
        cfg: {
            "median_ms": round(statistics.median(xs), 2),
            "quartiles_ms": [round(q, 2) for q in statistics.quantiles(xs, n=4)[::2]],
            f"vs_{configs[0]}": round(statistics.median(xs) / base, 3),
        }
        for cfg, xs in per.items()
    }
    print(
        json.dumps(
            {"part": "one-token decode", "cells": args.cells, "threads": args.threads, **part1}
        ),
        flush=True,
    )
    sessions.clear()

    # 2. per generated token: llama_decode, session (around it), the rest
    if args.tokens <= 0:
        return
    prompts = load_prompts(["humaneval", "mtbench"], "eval", args.prompts)
    ids_all = [encode_prompt(any_ersd.tokenizer, p, "auto", 256) for p in prompts]
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    k = 0
    for _r in range(args.rounds):
        for i, ids in enumerate(ids_all):
            k += 1
            order = configs[k % len(configs) :] + configs[: k % len(configs)]
            for cfg in order:
                d0, s0, c0 = clock.decode, clock.session, len(clock.calls)
                t0 = time.perf_counter()
                if cfg == "plain":
                    llm = models[cfg]
                    llm.reset()
                    out = llm.create_completion(
                        ids,
                        max_tokens=args.tokens,
                        temperature=1.0,
                        top_k=0,
                        top_p=1.0,
                        min_p=0.0,
                        seed=1000 + i,
                    )
                    n = int(out["usage"]["completion_tokens"])
                else:
                    res = ersd.generate(
                        models[cfg],
                        None,
                        ids,
                        max_new_tokens=args.tokens,
                        temperature=1.0,
                        seed=1000 + i,
                    )
                    n = len(res.tokens)
                total = time.perf_counter() - t0
                dec = clock.decode - d0
                calls = clock.calls[c0:]
                sess = clock.session - s0 - (dec if cfg != "plain" else 0.0)
                rows[cfg].append(
                    {
                        "tokens": n,
                        "total_ms": 1000 * total / n,
                        "decode_ms": 1000 * dec / n,
                        # the calls after the prompt's (one-token decodes)
                        "one_token_decode_ms": 1000 * statistics.median(calls[1:]),
                        "session_ms": 1000 * sess / n,
                        "rest_ms": 1000 * (total - dec - sess) / n,
                    }
                )
    part2 = {}
    for cfg, rs in rows.items():
        part2[cfg] = {
            key: round(statistics.median(r[key] for r in rs), 2)
            for key in ("total_ms", "decode_ms", "one_token_decode_ms", "session_ms", "rest_ms")
        }
        part2[cfg]["runs"] = len(rs)
    print(json.dumps({"part": "per generated token (includes the prompt)", **part2}), flush=True)


if __name__ == "__main__":
    main()
