"""Which llama.cpp configurations keep every token's logits independent of how calls are batched.

For each candidate (KV cache type, flash attention on/off; weights never repacked, tiled K-quant
GEMM off, rejected cells parked as in the exact policy), the largest ``|Δ|`` of the logits in
three checks, each against a fresh prefill of the same context (0 = bit-identical):

* ``tree``: random draft trees (siblings, commits after rejections, so parked cells and holes)
  scored in one call vs each node's context prefilled alone;
* ``long1``: with ``--long`` cached cells (>= 512: llama.cpp's split-KV threshold) a one-token
  decode vs the same row in a 3-token chain;
* ``prompt+tree``: a 100-token prompt decoded together with a 3-token chain (one call of >= 64
  tokens, ERSD's first target call) vs token by token.

    OMP_NUM_THREADS=1 python docs/results/llamacpp-overhead-2026-12-06/exactness_candidates.py \\
        --model smollm2-135m --threads 2
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import ersd
from ersd.models.llamacpp import resolve_gguf

CANDIDATES = "fa-q8_0,fa-bf16,fa-f16,nofa-f16,nofa-bf16"


def load(cand: str, path: str, threads: int, context: int) -> Any:
    attn, kv = cand.split("-")
    exact_ok = attn == "fa" and kv in ("q8_0", "bf16")
    m = ersd.load_model(
        path,
        backend="llamacpp",
        threads=threads,
        context=context,
        kv_cache="q8_0" if not exact_ok else kv,
    )
    # a study: the exact policy's parking and weights, another cache / attention path
    m.kv_cache = kv
    m._flash_attn = attn == "fa"
    return m


def root(m: Any, seq: list[int]) -> Any:
    s = m.start(seq)
    try:
        return s.score([], [])[0]
    finally:
        s.close()


def path_to(parents: list[int], node: int) -> list[int]:
    p = [node]
    while parents[p[-1]] >= 0:
        p.append(parents[p[-1]])
    return p[::-1]


def check_tree(m: Any, prompt: list[int], seed: int) -> float:
    rng = random.Random(seed)
    sess = m.start(prompt)
    sess.score([], [])
    worst = 0.0
    for _ in range(4):
        parents = [rng.randrange(-1, i) for i in range(7)]
        tokens = [rng.randrange(m.vocab_size) for _ in parents]
        rows = sess.score(tokens, parents)
        base = sess.committed
        for i in range(len(tokens)):
            ctx = base + [tokens[j] for j in path_to(parents, i)]
            worst = max(worst, (rows[1 + i] - root(m, ctx)).abs().max().item())
        leaf = rng.randrange(len(tokens))
        path = path_to(parents, leaf)[: rng.randrange(0, 4)]
        sess.commit([tokens[j] for j in path] + [rng.randrange(1000)], path)
        worst = max(worst, (sess.score([], [])[0] - root(m, sess.committed)).abs().max().item())
    sess.close()
    return worst


def check_long(m: Any, prompt: list[int], long: int) -> float:
    text = (prompt * (long // len(prompt) + 1))[:long]
    toks = [11, 12, 13]
    rows = m.start(text).score(toks, [-1, 0, 1])
    sess = m.start(text + toks[:-1])
    sess.score([], [])
    sess.commit(toks[-1:], [])
    return (rows[-1] - sess.score([], [])[0]).abs().max().item()


def check_prompt_tree(m: Any, prompt: list[int]) -> float:
    text = (prompt * (100 // len(prompt) + 1))[:100]
    toks = [11, 12, 13]
    rows = m.start(text).score(toks, [-1, 0, 1])
    sess = m.start(text[:1])
    for t in text[1:] + toks:  # token by token: every call decodes one token
        sess.score([], [])
        sess.commit([t], [])
    return (rows[-1] - sess.score([], [])[0]).abs().max().item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--long", type=int, default=530)
    ap.add_argument("--candidates", default=CANDIDATES)
    args = ap.parse_args()
    path = str(resolve_gguf(args.model))
    for cand in args.candidates.split(","):
        m = load(cand, path, args.threads, 1024)
        prompt = m.tokenizer.encode("def fibonacci(n):\n    ")
        rec = {
            "model": args.model,
            "threads": args.threads,
            "candidate": cand,
            "tree": check_tree(m, prompt, 3),
            "long1": check_long(m, prompt, args.long),
            "prompt+tree": check_prompt_tree(m, prompt),
        }
        rec["exact"] = rec["tree"] == rec["long1"] == rec["prompt+tree"] == 0.0
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
