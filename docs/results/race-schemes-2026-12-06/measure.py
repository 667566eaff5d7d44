"""Issue 47: the per-token work outside the forwards under race schemes v1 and v2.

Part A, per vocabulary row: the race work of one new ERSD context (the drafter's chain draft
``ranking(q, 1)``, the target's winner ``winner(p)``, the rank of the emitted token in the
draft's race ``rank(q, y)``; v1 draws the context's Philox row once, cached for the three) and
the two float64 ``logits_to_probs`` (drafter and target; the same code under both schemes), on
real SmolLM2-135M logit rows (V = 49,152) and on the same rows widened to Qwen's V = 151,936
(the extra 102,784 logits drawn from the row's own lower half, at random places).  v1 and v2
alternate, per row, in one process; medians over repeats.

Part B, on the engine: SmolLM2-135M float32 target <- its 8-layer float32 draft, chain:4, T = 1,
B = 1 and B = 8, decode steps after the prefill: "other" = wall - target forwards - draft
forwards, v1 and v2 alternating, medians over repeats.  Every text is checked against
target-only sampling under the same scheme (drafter invariance).

Times are the process's CPU time (``time.process_time``; the forwards' too, by pointing
``ersd.models.hf``'s clock at it): the shared 2-core host ran other sessions' jobs (load 8-12)
and wall time measured their scheduling more than this code.  torch runs one thread, so CPU time
is the work done.  Wall-clock medians are recorded too.

    OMP_NUM_THREADS=1 PYTHONPATH=src python docs/results/race-schemes-2026-12-06/measure.py \
        --json docs/results/race-schemes-2026-12-06/measure.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from typing import Any

import torch

import ersd
import ersd.models.hf
from ersd.batch import BatchEngine
from ersd.probs import SamplingParams, logits_to_probs
from ersd.race import RaceNoise, root_key

TEXTS = [
    "def fibonacci(n):\n    ",
    "The capital of France is",
    "import numpy as np\n",
    "Once upon a time, in a small village,",
    "SELECT name, count(*) FROM",
    "The derivative of x squared is",
    "class Stack:\n    def __init__(self):\n",
    "Dear hiring manager,\n",
]
QWEN_V = 151936


def real_rows(target: Any, prompts: list[list[int]], n: int) -> list[torch.Tensor]:
    """``n`` next-token logit rows of SmolLM2 over the prompts' positions (float32)."""
    rows: list[torch.Tensor] = []
    for ids in prompts:
        with torch.no_grad():
            out = target.hf_module(torch.tensor([ids])).logits[0]  # [len, V]
        rows.extend(out[i].float().clone() for i in range(out.shape[0]))
        if len(rows) >= n:
            break
    return rows[:n]


def widen(row: torch.Tensor, vocab: int, g: torch.Generator) -> torch.Tensor:
    lower = row[row <= row.median()]
    extra = lower[torch.randint(0, lower.numel(), (vocab - row.numel(),), generator=g)]
    out = torch.cat([row, extra])
    return out[torch.randperm(vocab, generator=g)]


def part_a(rows: list[torch.Tensor], repeats: int) -> dict[str, Any]:
    params = SamplingParams(temperature=1.0)
    g = torch.Generator().manual_seed(5)
    drafts = [r + 0.5 * torch.randn(r.shape, generator=g) for r in rows]  # a drafter's logits
    vocab = rows[0].numel()
    res: dict[str, list[float]] = {"v1": [], "v2": [], "probs": [], "v1_wall": [], "v2_wall": []}
    key0 = 0
    for _ in range(repeats):
        for scheme in ("v1", "v2"):
            noise = RaceNoise(vocab, scheme=scheme)
            race = probs_t = wall = 0.0
            for i, (lt, ld) in enumerate(zip(rows, drafts, strict=True)):
                key = root_key(key0 + i, [1, 2])  # a new context: nothing cached
                t0 = time.process_time()
                q = logits_to_probs(ld, params)
                p = logits_to_probs(lt, params)
                t1 = time.process_time()
                w1 = time.perf_counter()
                noise.ranking(key, q, 1)
                y = noise.winner(key, p)
                noise.rank(key, q, y)
                wall += time.perf_counter() - w1
                t2 = time.process_time()
                race += t2 - t1
                probs_t += t1 - t0
            res[scheme].append(race / len(rows) * 1e3)
            res[f"{scheme}_wall"].append(wall / len(rows) * 1e3)
            res["probs"].append(probs_t / len(rows) * 1e3)
        key0 += 1000
    med = {k: statistics.median(v) for k, v in res.items()}
    return {"vocab": vocab, "rows": len(rows), "ms": res, "median_ms": med}


def engine_run(target: Any, draft: Any, prompts: list[list[int]], tokens: int, scheme: str):
    engine = BatchEngine(target, draft)
    for i, p in enumerate(prompts):
        engine.add(p, max_new_tokens=tokens, seed=i, tree="chain:4", race_scheme=scheme)
    texts: dict[int, list[int]] = {}
    for rid, rec, _ in engine.step():  # prefill
        texts.setdefault(rid, []).extend(rec.tokens)
    t_f0, d_f0 = target.forward_seconds, draft.forward_seconds
    t0, w0 = time.process_time(), time.perf_counter()
    steps = 0
    while len(engine):
        steps += 1
        for rid, rec, _ in engine.step():
            texts.setdefault(rid, []).extend(rec.tokens)
    wall = time.process_time() - t0
    clock = time.perf_counter() - w0
    tf, df = target.forward_seconds - t_f0, draft.forward_seconds - d_f0
    engine.close()
    return {
        "wall": wall,
        "clock": clock,
        "steps": steps,
        "target": tf,
        "draft": df,
        "other": wall - tf - df,
        "texts": [texts[k] for k in sorted(texts)],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--engine-repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    # the forwards' clock: CPU time, as the step's (see the module docstring)
    ersd.models.hf.time = types.SimpleNamespace(perf_counter=time.process_time)  # type: ignore[attr-defined]
    target = ersd.load_model("smollm2-135m", dtype="float32")
    draft = ersd.load_model("smollm2-135m", dtype="float32", num_hidden_layers=8)
    prompts = [target.tokenizer.encode(t) for t in TEXTS]
    out: dict[str, Any] = {"args": vars(args)}

    rows = real_rows(target, prompts, args.rows)
    g = torch.Generator().manual_seed(1)
    for name, rs in (("smollm2_49k", rows), ("widened_152k", [widen(r, QWEN_V, g) for r in rows])):
        a = part_a(rs, args.repeats)
        out[name] = a
        m = a["median_ms"]
        print(
            f"A {name}: race per new context (CPU) v1 {m['v1']:.3f} ms, v2 {m['v2']:.3f} ms "
            f"(v2/v1 {m['v2'] / m['v1']:.2f}); two float64 probs {m['probs']:.3f} ms; wall "
            f"v1 {m['v1_wall']:.3f} ms, v2 {m['v2_wall']:.3f} ms",
            flush=True,
        )

    for b in (1, 8):
        ps = prompts[:b]
        runs: dict[str, list[dict[str, Any]]] = {"v1": [], "v2": []}
        for _ in range(args.engine_repeats):
            for scheme in ("v1", "v2"):
                runs[scheme].append(engine_run(target, draft, ps, args.tokens, scheme))
        row: dict[str, Any] = {}
        for scheme, rs in runs.items():
            alone = ersd.generate_batch(
                target,
                None,
                ps,
                seeds=list(range(b)),
                max_new_tokens=args.tokens,
                race_scheme=scheme,
            )
            same = all(r["texts"] == [x.tokens for x in alone] for r in rs)
            shares = [r["other"] / r["wall"] for r in rs]
            per_step = [r["other"] / r["steps"] * 1e3 for r in rs]
            row[scheme] = {
                "other_share": shares,
                "other_ms_per_step": per_step,
                "cpu_s": [r["wall"] for r in rs],
                "wall_s": [r["clock"] for r in rs],
                "steps": [r["steps"] for r in rs],
                "same_text_as_target_only": same,
            }
            print(
                f"B {b} chain:4 {scheme}: median other share {statistics.median(shares):.2%} "
                f"({', '.join(f'{s:.2%}' for s in shares)}), other "
                f"{statistics.median(per_step):.1f} ms/step, wall "
                f"{statistics.median(row[scheme]['cpu_s']):.2f} s CPU "
                f"({statistics.median(row[scheme]['wall_s']):.2f} s wall), "
                f"same text as target-only: {same}",
                flush=True,
            )
        out[f"engine_b{b}"] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
