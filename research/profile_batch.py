#!/usr/bin/env python
"""Where a batched ERSD step spends its time outside model forwards (issue 13's "other").

Loads the Qwen pair (float32 oneDNN target, int8 draft) and generates for B HumanEval prompts
with the batched engine.  By default under cProfile: prints the top functions by cumulative and
own time, plus the split of the decode steps (target forwards / draft forwards / other).  With
``--compare-workers``, no profiler: runs the same batch with the engine's rows worked serially
(1 thread) and side by side (torch's thread count), alternating, ``--repeats`` times each, and
prints each run's split and the median "other" share per setting.  With ``--compare-verify``,
no profiler: the engine as it is ("new": its default verification -- batched on a device,
node by node on the CPU -- and the one-sum finiteness check) against the code before issue 28
("before": node-by-node verification, the entry-wise finiteness check of every scored row; the
same tokens, checked), alternating, for every ``--batch`` and ``--tree``
given (comma-separated), ``--repeats`` pairs each: each run's non-forward share of the decode
steps and tokens/s, then per configuration the medians and the paired ratio.  With
``--compare-logits`` (issue 47 item 4), no profiler: the target's race winners found from its
logits ("new": :data:`ersd.verify_batch.FROM_LOGITS`, no float64 softmax where the sampling is
temperature only) against the float64 probabilities ("before"), under ``--scheme`` (default
v2), alternating, for every ``--batch`` and ``--tree``: per configuration the non-forward share of
the decode steps (mean and 95% t-interval over ``--repeats`` runs), its ms per step, the paired
ratio of the non-forward time and whether every text is the same.  ``--compare-draft`` does the
same for the drafter's race from its logits (:data:`ersd.drafting.model.FROM_LOGITS`: ERSD's
children and rank statistic without the drafter's float64 softmax; the target's winners from its
logits on both sides); ``--compare-all``: both logits paths against neither; ``--compare-cuts``
(issue 47 item 4, the per-step work outside the forwards; both logits paths on both sides): the
block-minimum lower bounds of a new v2 race (:data:`ersd.race_v2.LOWER_BOUNDS`), the NumPy
widening of :func:`ersd.race_v2.logit_block_max` and the engine's member test of a growing draft
session against the code before them (exact minima, the torch cast, ``isinstance`` on the
runtime protocol).  ``--compare-kept`` (the
same, for the block maxima kept from the finiteness check, :data:`ersd.blockmax.ENABLED`, and a
single winner drawn in one pass from the largest logit's bound, :data:`ersd.race_v2.TOP_FIRST`).
``--compare-prune`` (the same, for the fifth pass: :data:`ersd.race_v2.PRUNE_TOKENS`,
:data:`~ersd.race_v2.FEW_IN_PYTHON`, :data:`~ersd.race_v2.ROUGH_RANKS`,
:data:`ersd.drafting.model.PREPARE_RACES`, :data:`ersd.verify_batch.DRAFTED_RANKS`).
``--prompts K`` runs K disjoint batches of the B prompts in every repeat (the issue's "≥ 8
prompts" at B = 1).  ``--cpu-time`` times
everything, the forwards included, by this process's CPU time (a loaded host); ``--target
synthetic:V`` runs a pair of cheap function models over a V-token vocabulary (the work outside
the forwards alone, for development).  Run alone:

    python -m research.profile_batch --batch 8 --tokens 24
    python -m research.profile_batch --batch 8 --tokens 24 --compare-workers --repeats 3
    python -m research.profile_batch --batch 1,8 --tree chain:4,multi:2x3 --compare-verify
    python -m research.profile_batch --batch 1,8 --tree chain:4 --compare-logits --repeats 6
    python -m research.profile_batch --batch 1,8 --tree chain:4 --compare-draft --repeats 6
    python -m research.profile_batch --batch 1,8 --tree chain:4 --compare-cuts --repeats 6
    python -m research.profile_batch --batch 1,8 --tree chain:4 --compare-kept --repeats 6
    python -m research.profile_batch --batch 1,8 --tree chain:4 --compare-prune --repeats 6
    python -m research.profile_batch --batch 1 --compare-prune --prompts 8 --repeats 2
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import types
from typing import Any

import numpy as np
import torch

import ersd
import ersd.batch as batch_module
import ersd.drafting.model as drafting_model
import ersd.models.hf
from ersd import blockmax, race_v2, verify_batch
from ersd.batch import BatchEngine
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.drafting.base import GrowingSession
from ersd.models import checks

_all_finite = checks.all_finite


def _all_finite_entrywise(logits: torch.Tensor) -> bool:
    return bool(torch.isfinite(logits).all())


#: the clock of a run: wall time, or this process's CPU time with --cpu-time (the forwards' too)
CLOCK = time.perf_counter


def run(
    target,
    draft,
    ids,
    tokens: int,
    tree: str,
    workers: int | None,
    batched: bool = True,
    scheme: str = "v1",
) -> dict[str, Any]:
    """One batch through the engine: wall time and its split over the decode steps (every step
    after the first, which feeds the prompts)."""
    engine = BatchEngine(target, draft)
    engine.workers = workers
    if not batched:  # else the engine's default (batched verification)
        engine.batched_verify = False
    # the reference ("before") is the code before issue 28: node-by-node verification
    # and the entry-wise finiteness check of every scored row
    checks.all_finite = _all_finite if batched else _all_finite_entrywise
    for i, p in enumerate(ids):
        engine.add(p, max_new_tokens=tokens, seed=i, tree=tree, temperature=1.0, race_scheme=scheme)
    texts: dict[int, list[int]] = {}
    for rid, rec, _ in engine.step():  # prefill
        texts.setdefault(rid, []).extend(rec.tokens)
    t_f0, d_f0 = target.forward_seconds, draft.forward_seconds
    t0 = CLOCK()
    n = steps = 0
    while len(engine):
        steps += 1
        for rid, rec, _ in engine.step():
            n += len(rec.tokens)
            texts.setdefault(rid, []).extend(rec.tokens)
    wall = CLOCK() - t0
    tf, df = target.forward_seconds - t_f0, draft.forward_seconds - d_f0
    return {
        "wall": wall,
        "steps": steps,
        "tokens": n,
        "target": tf,
        "draft": df,
        "other": wall - tf - df,
        "texts": [texts[k] for k in sorted(texts)],
    }


def compare_verify(target, draft, prompts, args) -> None:
    """The engine as it is against the code before issue 28, paired and alternating."""
    import json

    rows = []
    for b in [int(x) for x in args.batch.split(",")]:
        ids = prompts[:b]
        for tree in args.tree.split(","):
            run(target, draft, ids, 4, tree, None)  # warm-up of this configuration
            runs: dict[str, list[dict[str, Any]]] = {"new": [], "before": []}
            for rep in range(args.repeats):
                order = [True, False] if rep % 2 == 0 else [False, True]
                for batched in order:
                    r = run(target, draft, ids, args.tokens, tree, None, batched)
                    name = "new" if batched else "before"
                    runs[name].append(r)
                    print(
                        f"B={b} {tree} {name:>6}: {r['tokens']} tokens in {r['wall']:.2f}s "
                        f"({r['tokens'] / r['wall']:.2f} tok/s), other {r['other']:.3f}s "
                        f"({r['other'] / r['wall']:.2%}), target {r['target']:.2f}s, draft "
                        f"{r['draft']:.2f}s",
                        flush=True,
                    )
            same = all(r["texts"] == runs["new"][0]["texts"] for v in runs.values() for r in v)
            row = {"batch": b, "tree": tree, "same_tokens": same}
            for name, rs in runs.items():
                row[name] = {
                    "other_share": [r["other"] / r["wall"] for r in rs],
                    "tok_s": [r["tokens"] / r["wall"] for r in rs],
                    "other_s": [r["other"] for r in rs],
                    "wall_s": [r["wall"] for r in rs],
                }
            ratios = [
                (a["tokens"] / a["wall"]) / (c["tokens"] / c["wall"])
                for a, c in zip(runs["new"], runs["before"], strict=True)
            ]
            row["tok_s_ratio"] = ratios
            rows.append(row)
            med = {k: statistics.median(row[k]["other_share"]) for k in runs}
            print(
                f"B={b} {tree}: median other share new {med['new']:.2%}, before "
                f"{med['before']:.2%}; tokens/s ratio median {statistics.median(ratios):.3f} "
                f"(min {min(ratios):.3f}, max {max(ratios):.3f}); same tokens: {same}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of ``xs``."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, m, m
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}
    h = t.get(len(xs), 2.0) * statistics.stdev(xs) / len(xs) ** 0.5
    return m, m - h, m + h


_NEW_BLOCK_MAX = race_v2.logit_block_max
_NEW_GROWS = batch_module.grows


def _old_logit_block_max(logits: torch.Tensor) -> Any:
    """:func:`ersd.race_v2.logit_block_max` before issue 47 item 4's cut (the torch cast)."""
    v = logits.shape[0]
    full = v - v % race_v2.V2_BLOCK
    out = np.empty(-(-v // race_v2.V2_BLOCK))
    if full:
        top = logits[:full].reshape(-1, race_v2.V2_BLOCK).amax(1)
        out[: full // race_v2.V2_BLOCK] = top.to(torch.float64).numpy()
    if full < v:
        out[-1] = float(logits[full:].max())
    return out


def _old_grows(drafter: object) -> bool:
    return isinstance(drafter, GrowingSession)


def _set_cuts(fast: bool) -> None:
    """``--compare-cuts``: issue 47 item 4's cuts on (``fast``) or the code before them."""
    race_v2.LOWER_BOUNDS = fast
    race_v2.logit_block_max = _NEW_BLOCK_MAX if fast else _old_logit_block_max
    batch_module.grows = _NEW_GROWS if fast else _old_grows


def _set_kept(fast: bool) -> None:
    """``--compare-kept``: the block maxima kept from the finiteness check
    (:data:`ersd.blockmax.ENABLED`) and a single winner drawn from the largest logit's bound
    (:data:`ersd.race_v2.TOP_FIRST`) on (``fast``) or the code before them."""
    blockmax.ENABLED = race_v2.TOP_FIRST = fast


def _set_prune(fast: bool) -> None:
    """``--compare-prune``: the fifth pass's cuts (the one draw's tokens pruned by their lower
    bounds and decided in Python floats, races set up before the draft forward, drafted tokens'
    ranks read from the drafted order, other ranks from rough scores) on (``fast``) or off."""
    race_v2.PRUNE_TOKENS = race_v2.FEW_IN_PYTHON = race_v2.ROUGH_RANKS = fast
    drafting_model.PREPARE_RACES = verify_batch.DRAFTED_RANKS = fast


def _set_logit_paths(args, fast: bool) -> None:
    """Switch what the comparison compares: the target's winners from its logits
    (``--compare-logits``) or the drafter's race from its logits (``--compare-draft``; the
    target's winners from its logits on both sides)."""
    if args.compare_prune:
        drafting_model.FROM_LOGITS = verify_batch.FROM_LOGITS = True
        _set_prune(fast)
    elif args.compare_kept:
        drafting_model.FROM_LOGITS = verify_batch.FROM_LOGITS = True
        _set_kept(fast)
    elif args.compare_cuts:
        drafting_model.FROM_LOGITS = verify_batch.FROM_LOGITS = True
        _set_cuts(fast)
    elif args.compare_all:
        drafting_model.FROM_LOGITS = verify_batch.FROM_LOGITS = fast
    elif args.compare_draft:
        drafting_model.FROM_LOGITS = fast
        verify_batch.FROM_LOGITS = True
    else:
        verify_batch.FROM_LOGITS = fast
        drafting_model.FROM_LOGITS = False  # the code the --compare-logits numbers were taken on


def compare_logits(target, draft, prompts, args) -> None:
    """The logits path ("new") against float64 probabilities ("before"), alternating: the
    target's winners (``--compare-logits``) or the drafter's children and rank statistic
    (``--compare-draft``); the non-forward share of the decode steps with intervals (module
    docstring)."""
    import json

    rows = []
    for b in [int(x) for x in args.batch.split(",")]:
        # --prompts K: K batches of b prompts each (disjoint), every one in every repeat
        groups = [prompts[g * b : (g + 1) * b] for g in range(args.prompts)]
        for tree in args.tree.split(","):
            run(target, draft, groups[0], 4, tree, None, scheme=args.scheme)  # warm-up
            runs: dict[str, list[dict[str, Any]]] = {"new": [], "before": []}
            for rep, g in ((rep, g) for rep in range(args.repeats) for g in range(len(groups))):
                for fast in [True, False] if (rep + g) % 2 == 0 else [False, True]:
                    _set_logit_paths(args, fast)
                    try:
                        r = run(
                            target, draft, groups[g], args.tokens, tree, None, scheme=args.scheme
                        )
                        r["group"] = g
                    finally:
                        verify_batch.FROM_LOGITS = drafting_model.FROM_LOGITS = True
                        _set_cuts(True)
                        _set_kept(True)
                        _set_prune(True)
                    name = "new" if fast else "before"
                    runs[name].append(r)
                    print(
                        f"B={b} {tree} {name:>6}: {r['tokens']} tokens, {r['steps']} steps in "
                        f"{r['wall']:.2f}s, other {r['other']:.3f}s ({r['other'] / r['wall']:.2%}, "
                        f"{1e3 * r['other'] / max(r['steps'], 1):.1f} ms/step), target "
                        f"{r['target']:.2f}s, draft {r['draft']:.2f}s",
                        flush=True,
                    )
            first = {r["group"]: r["texts"] for r in reversed(runs["new"])}  # each group's first
            same = all(r["texts"] == first[r["group"]] for v in runs.values() for r in v)
            row: dict[str, Any] = {"batch": b, "tree": tree, "scheme": args.scheme}
            row["prompt_groups"] = len(groups)
            row["compares"] = (
                "prune"
                if args.compare_prune
                else "kept"
                if args.compare_kept
                else "cuts"
                if args.compare_cuts
                else "all"
                if args.compare_all
                else "draft"
                if args.compare_draft
                else "target"
            )
            row["same_tokens"] = same
            for name, rs in runs.items():
                share = [r["other"] / r["wall"] for r in rs]
                ms = [1e3 * r["other"] / max(r["steps"], 1) for r in rs]
                row[name] = {"other_share": share, "other_ms_per_step": ms}
                row[name]["runs"] = [{k: v for k, v in r.items() if k != "texts"} for r in rs]
                m, lo, hi = interval(share)
                print(
                    f"B={b} {tree} {args.scheme} {name:>6}: non-forward share {m:.2%} "
                    f"[{lo:.2%}, {hi:.2%}], {statistics.fmean(ms):.1f} ms/step",
                    flush=True,
                )
            ratio = [
                a["other"] / c["other"]
                for a, c in zip(runs["new"], runs["before"], strict=True)
                if c["other"] > 0
            ]
            row["other_ratio"] = ratio
            m, lo, hi = interval(ratio)
            print(
                f"B={b} {tree}: non-forward time new / before {m:.3f} [{lo:.3f}, {hi:.3f}]; "
                f"same tokens: {same}",
                flush=True,
            )
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def synthetic_pair(vocab: int) -> tuple[Any, Any]:
    """Two cheap function models over ``vocab`` tokens, shaped like a language model's rows (a
    fixed Zipf-like background, a few strong tokens chosen by the last token; the draft a noisy
    copy), each timing its calls in ``forward_seconds`` like the Hugging Face adapter."""
    g = torch.Generator().manual_seed(0)
    zipf = -torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    base = zipf[torch.randperm(vocab, generator=g)]
    noise = torch.randn(vocab, generator=g) * 0.5

    def make(draft: bool) -> Any:
        def fn(seqs: list[list[int]]) -> torch.Tensor:
            t0 = CLOCK()
            out = base.repeat(len(seqs), 1)
            for r, seq in enumerate(seqs):
                h = hash((len(seq), seq[-1])) & 0xFFFFFFFF
                top = torch.tensor([(h * (k + 1) * 2654435761) % vocab for k in range(4)])
                out[r, top] = torch.tensor([9.0, 8.0, 7.0, 6.0])
            if draft:
                out += noise
            model.forward_seconds += CLOCK() - t0
            return out

        model = ersd.FunctionModel(fn, vocab)
        model.forward_seconds = 0.0
        return model

    return make(False), make(True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--batch", default="8", help="batch size (a list with --compare-verify)")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--tree", default="chain:4")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--dump", default=None, help="also save the cProfile stats to this file")
    ap.add_argument("--compare-workers", action="store_true")
    ap.add_argument("--compare-verify", action="store_true")
    ap.add_argument("--compare-logits", action="store_true")
    ap.add_argument("--compare-draft", action="store_true")
    ap.add_argument("--compare-all", action="store_true", help="both logits paths against neither")
    ap.add_argument(
        "--compare-cuts", action="store_true", help="issue 47 item 4's cuts against the code before"
    )
    ap.add_argument(
        "--compare-kept",
        action="store_true",
        help="the block maxima kept from the finiteness check and the one-draw single winner "
        "against the code before them",
    )
    ap.add_argument(
        "--compare-prune",
        action="store_true",
        help="the fifth pass (pruned one draw in Python floats, races set up before the draft "
        "forward, drafted and rough ranks) against the code before it",
    )
    ap.add_argument(
        "--scheme",
        default=None,
        help="the race scheme (default: v2 with --compare-logits, else v1)",
    )
    ap.add_argument("--cpu-time", action="store_true", help="time by this process's CPU time")
    ap.add_argument("--draft-dtype", default="int8")
    ap.add_argument("--draft-layers", type=int, default=None, help="a layer-truncated target")
    ap.add_argument("--json", default=None, help="--compare-verify: save the runs to this file")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--prompts",
        type=int,
        default=1,
        help="--compare-*: run K disjoint batches of B prompts each (every one in every repeat; "
        "the intervals are over all the runs, so they hold the prompts' spread)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="cProfile mode: the engine's row threads (1: the rows' work on the profiled thread)",
    )
    args = ap.parse_args()
    global CLOCK
    args.compare_logits = (
        args.compare_logits
        or args.compare_draft
        or args.compare_all
        or args.compare_cuts
        or args.compare_kept
        or args.compare_prune
    )
    args.scheme = args.scheme or ("v2" if args.compare_logits else "v1")
    if args.cpu_time:
        CLOCK = time.process_time
        ersd.models.hf.time = types.SimpleNamespace(perf_counter=time.process_time)  # type: ignore[attr-defined]
    biggest = max(int(x) for x in args.batch.split(","))
    if args.target.startswith("synthetic:"):
        target, draft = synthetic_pair(int(args.target.split(":")[1]))
        ids = [[1 + 7 * i, 2 + i, 3] for i in range(biggest * max(args.prompts, 1))]
    else:
        target = ersd.load_model(args.target, dtype="float32")
        if args.draft_layers is not None:
            draft = ersd.load_model(
                args.target, dtype="float32", num_hidden_layers=args.draft_layers
            )
        else:
            draft = ersd.load_model(args.draft, dtype=args.draft_dtype)
        want = biggest * max(args.prompts, 1)
        prompts = load_prompts(["humaneval"], "eval", want)
        ids = [encode_prompt(target.tokenizer, p, "raw", 768) for p in prompts][:want]
    if args.compare_logits:
        compare_logits(target, draft, ids, args)
        return
    if args.compare_verify:
        compare_verify(target, draft, ids, args)
        return
    run(target, draft, ids, 4, args.tree, None, scheme=args.scheme)  # warm-up
    if args.compare_workers:
        settings = {"serial": 1, "side by side": torch.get_num_threads()}
        shares: dict[str, list[float]] = {k: [] for k in settings}
        for rep in range(args.repeats):
            order = list(settings) if rep % 2 == 0 else list(settings)[::-1]
            for name in order:
                r = run(
                    target, draft, ids, args.tokens, args.tree, settings[name], scheme=args.scheme
                )
                shares[name].append(r["other"] / r["wall"])
                print(
                    f"{name:>6}: {r['tokens']} tokens in {r['wall']:.1f}s, other "
                    f"{r['other']:.2f}s ({r['other'] / r['wall']:.1%}), target {r['target']:.1f}s, "
                    f"draft {r['draft']:.1f}s",
                    flush=True,
                )
        for name, xs in shares.items():
            print(f"median other share, {name}: {statistics.median(xs):.2%}  ({len(xs)} runs)")
        return
    prof = cProfile.Profile()
    prof.enable()
    r = run(target, draft, ids, args.tokens, args.tree, args.workers, scheme=args.scheme)
    prof.disable()
    print(
        f"B={args.batch} {args.tree}: {r['tokens']} tokens in {r['wall']:.1f}s; target forwards "
        f"{r['target']:.1f}s ({r['target'] / r['wall']:.1%}), draft forwards {r['draft']:.1f}s "
        f"({r['draft'] / r['wall']:.1%}), other {r['other']:.2f}s ({r['other'] / r['wall']:.1%})"
    )
    if args.dump:
        prof.dump_stats(args.dump)
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(args.top)
    st.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
