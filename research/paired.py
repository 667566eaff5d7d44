"""ERSD trees against SD's chain on the *same* target texts (issue 16): a paired estimate.

A tested estimator (``tests/test_paired_trees.py``), run as ``python -m research.paired``.

At T > 0 every method samples its own text, so a benchmark compares block efficiencies measured on
different texts, and on a few dozen prompts its intervals are wider (±10-25%) than the gaps that
matter here (1-5%). Every method is lossless, so each one's block efficiency is an expectation over
the *target's* texts; this script estimates all of them on one set of target texts:

1. For each prompt, sample a text ``x`` from the target (ERSD, whose output is target-only race
   sampling) and score ``prompt + x`` once with each model: ``p_j`` and ``q_j`` at every position.
2. **SD chain:K, exactly**: given the text, SD accepts the drafted token at position ``j`` (given
   that ``x_j`` is emitted there) with probability ``min(1, q_j(x_j) / p_j(x_j))``, independently
   across positions; a dynamic program over the text gives the expected number of target calls.
3. **ERSD, by simulation with the real drafter**: the race noise at every context of the text is
   drawn *conditioned on the target's winner being* ``x_j`` (``w ~ Exp(1)``, ``E_x = w p_x``,
   ``E_i = w p_i + Exp(1)``: the exact conditional law of a race), every other context's noise is
   the library's keyed noise; the real draft session (chain or dynamic tree, any draft sharpness)
   drafts each step and the step accepts the drafted path along ``x``. Calls are counted as the
   engine would make them. ERSD configurations share the same noise (common random numbers).

Dynamic trees need a margin table: it is recorded the same way on the calibration split (chain:K
drafts, :class:`ersd.drafting.MarginRecorder`), one per temperature and sharpness, as ``ersd bench
calibrate`` would. Per prompt, ``tokens / calls`` of each configuration and its ratio to SD's;
Student-t 95% intervals over prompts. Predicted tokens/s ratios use forward-time curves
(``--costs``: a calibration file) with the simulated tree sizes and draft forwards.

    python -m research.paired --prompts 10 --calib-prompts 8 --tokens 64 \
        --temperatures 0.7 1.0 --budget 8 --sharpness 1.0 1.3 --repeats 2 --out paired.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import ersd
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.costs import CostModel
from ersd.drafting import DynamicDrafter, MarginRecorder, ModelDrafter
from ersd.methods import DraftTree
from ersd.methods.ersd import ERSD
from ersd.models.hf_load import load
from ersd.probs import SamplingParams, logits_to_probs
from ersd.race import STREAM_RACE, RaceNoise, extend_key, race_winner, root_key
from ersd.theory.margin import MarginPredictor
from ersd.tree import TreeShape


class PathNoise(RaceNoise):
    """Keyed race noise, except at the contexts of one text: there, noise under which the
    target's race winner is the text's next token."""

    def __init__(self, vocab_size: int, path: dict[int, torch.Tensor]) -> None:
        super().__init__(vocab_size, cache_size=512)
        self.path = path

    def exponentials(self, key: int, stream: int = STREAM_RACE) -> torch.Tensor:
        if stream == STREAM_RACE and key in self.path:
            return self.path[key]
        return super().exponentials(key, stream)


def conditioned_race(p: torch.Tensor, winner: int, rng: np.random.Generator) -> torch.Tensor:
    """``E ~ Exp(1)^V`` conditioned on ``argmin E_i / p_i = winner``."""
    w = rng.standard_exponential()
    e = torch.from_numpy(rng.standard_exponential(p.numel())) + w * p
    e[winner] = w * p[winner]
    return e


def text_probs(model: Any, ids: list[int], text: list[int], params: SamplingParams) -> torch.Tensor:
    """The model's probabilities at every position of ``text`` after ``ids`` (one forward)."""
    with torch.no_grad():
        logits = model.hf_module(torch.tensor([ids + text])).logits[0]
    rows = logits[len(ids) - 1 : len(ids) - 1 + len(text)]
    return logits_to_probs(rows, params)


def text_probs_stepwise(
    model: Any, ids: list[int], text: list[int], params: SamplingParams
) -> torch.Tensor:
    """The same, one token per forward through a session, as the engine feeds a chain's draft.
    For an int8 draft this matters: dynamic quantization scales activations per call, so one
    forward over the whole text gives a coarser (and worse) ``q`` than the engine's."""
    session = model.start(list(ids))
    rows = []
    for x in text:
        rows.append(session.score([], [])[0])
        session.commit([int(x)], [])
    return logits_to_probs(torch.stack(rows), params)


def chain_acceptance(
    p: torch.Tensor,
    q: torch.Tensor,
    x: int,
    betas: Sequence[float],
    draws: int,
    rng: np.random.Generator,
    top: int = 4096,
) -> tuple[dict[float, float], dict[float, float]]:
    """At one position whose emitted token is ``x``: (ERSD's chance that the draft's race over
    ``q**beta`` proposes ``x``, by Monte Carlo over ``draws`` races conditioned on the target's
    winner being ``x``; SD's chance ``min(1, q_beta(x) / p(x))`` of accepting a draft from
    ``q_beta`` = ``q**beta`` normalised), for each ``beta``.

    The races are drawn exactly over the ``top`` tokens of ``p`` and of ``q`` (and ``x``); the
    rest ``R`` enters the draft's race as one runner whose score is the minimum over ``R`` of
    ``E_i / q_i**beta`` with ``E_i ~ Exp(1)``: ``Exp(1) / sum_R q_i**beta``.  That drops the
    ``w * p_i`` part of the conditioned noise on ``R`` (``p_R`` is tiny), which can only make the
    rest win more often: the estimate errs, if at all, against ERSD."""
    keep = torch.unique(torch.cat([p.topk(top).indices, q.topk(top).indices, torch.tensor([x])]))
    rest = torch.ones(p.numel(), dtype=torch.bool)
    rest[keep] = False
    ps = p[keep].numpy()
    with np.errstate(divide="ignore"):
        log_q_all = np.log(q.numpy())
    log_q = log_q_all[keep.numpy()]
    log_q_rest = log_q_all[rest.numpy()]
    xi = int((keep == x).nonzero()[0, 0])
    w = rng.standard_exponential((draws, 1))
    e = w * ps + rng.standard_exponential((draws, ps.size))
    e[:, xi] = w[:, 0] * ps[xi]
    log_e = np.log(e)
    log_e_rest = np.log(rng.standard_exponential(draws))
    ersd_acc, sd_acc = {}, {}
    finite = np.isfinite(log_q_all)
    for beta in betas:  # zero-mass draft tokens: log q = -inf, score +inf, never proposed
        scores = log_e - beta * log_q
        rest_w = np.logaddexp.reduce(beta * log_q_rest) if log_q_rest.size else -np.inf
        best = scores.min(axis=1)
        won = (np.argmin(scores, axis=1) == xi) & (best <= log_e_rest - rest_w)
        ersd_acc[beta] = float(won.mean())
        lz = np.logaddexp.reduce(beta * log_q_all[finite])
        sd_acc[beta] = float(min(1.0, math.exp(beta * log_q_all[x] - lz) / float(p[x])))
    return ersd_acc, sd_acc


def sd_calls(accept: np.ndarray, budget: int) -> float:
    """Expected target calls of SD chain:``budget`` over a text whose position-``j`` acceptance
    (given the emitted token) is ``accept[j]``, independently (dynamic program from the end)."""
    n = len(accept)
    calls = np.zeros(n + 2)
    for t in range(n - 1, -1, -1):
        cap = min(budget, n - t)
        reach, total = 1.0, 0.0
        for m in range(cap + 1):  # m tokens accepted, then the next one emitted
            stop = 1.0 - accept[t + m] if m < cap else 1.0
            total += reach * stop * calls[min(t + m + 1, n + 1)]
            reach *= accept[t + m] if m < cap else 0.0
        calls[t] = 1.0 + total
    return float(calls[0])


def simulate(
    drafter: Any,
    ids: list[int],
    text: list[int],
    path: dict[int, torch.Tensor],
    keys: list[int],
    rule: ERSD,
    shape: TreeShape,
    params: SamplingParams,
    vocab: int,
) -> dict[str, float]:
    """One ERSD run over ``text`` with the real draft session: target calls, drafted nodes and
    draft forwards."""
    session = drafter.start_drafting(ids)
    noise = PathNoise(vocab, path)
    t, calls, nodes, forwards = 0, 0, 0, 0
    while t < len(text):
        prop = session.propose(shape, keys[t], rule, params, noise)
        tree = prop.tree
        ctx, j, accepted = DraftTree.ROOT, t, []
        while j < len(text):
            kid = next((c for c in tree.children[ctx] if tree.tokens[c] == text[j]), None)
            if kid is None:
                break
            accepted.append(kid)
            ctx, j = DraftTree.context_of(kid), j + 1
        calls += 1
        nodes += tree.num_nodes
        forwards += prop.forwards
        session.observe(text[t : j + 1], accepted)
        t = j + 1
    return {"calls": calls, "nodes": nodes, "forwards": forwards}


def t_interval(xs: Sequence[float]) -> tuple[float, float, float]:
    from scipy import stats

    a = np.asarray(xs, float)
    m = float(a.mean())
    if len(a) < 2:
        return m, math.nan, math.nan
    h = float(stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))
    return m, m - h, m + h


def common_args(doc: str) -> argparse.ArgumentParser:
    """The options this script shares with ``sharpness_pairs.py``: models, prompts, budget."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--draft-dtype", default="int8")
    ap.add_argument("--set", default="humaneval")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    ap.add_argument("--budget", type=int, default=8)
    return ap


def main() -> None:
    ap = common_args(__doc__ or "")
    ap.add_argument("--calib-prompts", type=int, default=8)
    ap.add_argument("--sharpness", type=float, nargs="+", default=[1.0, 1.3])
    ap.add_argument("--repeats", type=int, default=2, help="simulated runs per eval text (0: none)")
    ap.add_argument(
        "--chain-mc",
        type=int,
        default=0,
        help="also estimate every chain in --dp-budgets by a dynamic program over per-position "
        "acceptances (ERSD: this many conditioned races per position; SD exact)",
    )
    ap.add_argument("--dp-budgets", type=int, nargs="+", default=[4, 6, 8])
    ap.add_argument("--costs", default="docs/results/dyn-wide-2026-12-02/dyn-wide.calibration.json")
    ap.add_argument("--out", default="paired-trees.json")
    args = ap.parse_args()

    target = load(args.target, dtype=args.dtype)
    draft = load(args.draft, dtype=args.draft_dtype)
    vocab = int(target.vocab_size)
    costs = CostModel.from_dict(json.loads(Path(args.costs).read_text())["costs"])
    k = args.budget
    chain = TreeShape.chain(k)
    out: dict[str, Any] = {"args": vars(args), "temperatures": {}}
    t_start = time.time()

    def texts(split: str, count: int, temp: float) -> list[tuple[list[int], list[int]]]:
        rows = []
        for i, pr in enumerate(load_prompts([args.set], split, count)):
            ids = encode_prompt(target.tokenizer, pr, "auto", 1024)
            seed = (7_000 if split == "calib" else 9_000) + i
            res = ersd.generate(
                target,
                draft,
                ids,
                max_new_tokens=args.tokens,
                tree="chain:6",
                temperature=temp,
                seed=seed,
            )
            rows.append((ids, list(res.tokens)))
        return rows

    def path_noise(
        ids: list[int], text: list[int], params: SamplingParams, seed: int
    ) -> tuple[dict[int, torch.Tensor], list[int], torch.Tensor]:
        p = text_probs(target, ids, text, params)
        keys = [root_key(seed, ids)]
        for x in text:
            keys.append(extend_key(keys[-1], x))
        rng = np.random.default_rng(seed)
        path = {keys[j]: conditioned_race(p[j], text[j], rng) for j in range(len(text))}
        assert all(race_winner(p[j], path[keys[j]]) == text[j] for j in range(len(text)))
        return path, keys, p

    for temp in args.temperatures:
        params = SamplingParams(temperature=temp)
        # margin tables on the calibration split, one per sharpness (chain:K drafts)
        tables = {}
        calib = texts("calib", args.calib_prompts, temp) if args.repeats > 0 else []
        for beta in args.sharpness if calib else []:
            rec = MarginRecorder(draft)
            for i, (ids, text) in enumerate(calib):
                path, keys, _ = path_noise(ids, text, params, 1_000 + i)
                simulate(rec, ids, text, path, keys, ERSD(beta), chain, params, vocab)
            tables[beta] = rec.table
        print(f"[T={temp}] margin tables recorded ({time.time() - t_start:.0f}s)", flush=True)
        configs: list[tuple[str, Any, TreeShape, Any]] = []
        for beta in args.sharpness:
            configs.append((f"ERSD chain:{k} beta={beta:g}", ModelDrafter(draft), chain, beta))
            if beta in tables:
                dyn = DynamicDrafter(draft, k, predictor=MarginPredictor(tables[beta]))
                configs.append((f"ERSD dynamic:{k} beta={beta:g}", dyn, chain, beta))
        per: dict[str, list[dict[str, float]]] = defaultdict(list)
        for i, (ids, text) in enumerate(texts("eval", args.prompts, temp)):
            q = text_probs_stepwise(draft, ids, text, params)
            p_full = text_probs(target, ids, text, params)
            idx = torch.tensor(text)[:, None]
            p_x = p_full.gather(1, idx)[:, 0]
            q_x = q[:, : p_full.shape[1]].gather(1, idx)[:, 0]
            exact = torch.clamp(q_x / p_x, max=1.0).numpy()  # SD's acceptance given x
            sd_expected = sd_calls(exact, k)
            if args.chain_mc > 0:
                rng = np.random.default_rng(70_000 + i)
                acc_e: dict[float, list[float]] = defaultdict(list)
                acc_s: dict[float, list[float]] = defaultdict(list)
                for j, x in enumerate(text):
                    qj = q[j, : p_full.shape[1]]
                    a_e, a_s = chain_acceptance(
                        p_full[j], qj, x, args.sharpness, args.chain_mc, rng
                    )
                    for beta in args.sharpness:
                        acc_e[beta].append(a_e[beta])
                        acc_s[beta].append(a_s[beta])
                for kk in args.dp_budgets:
                    base = sd_calls(exact, kk)
                    for beta in args.sharpness:
                        for kind, acc in (("ERSD", acc_e[beta]), ("SD", acc_s[beta])):
                            calls = sd_calls(np.array(acc), kk)
                            per[f"{kind} chain:{kk} beta={beta:g} (DP)"].append(
                                {
                                    "prompt": i,
                                    "calls": calls,
                                    "nodes": calls * kk,
                                    "forwards": calls * kk,
                                    "tokens": len(text),
                                    "sd_calls": base,
                                    "sd_budget": kk,
                                    "per_token": float(np.mean(acc)),
                                }
                            )
            for r in range(args.repeats):
                path, keys, _ = path_noise(ids, text, params, 50_000 + 100 * i + r)
                for name, drafter, shape, beta in configs:
                    sim = simulate(drafter, ids, text, path, keys, ERSD(beta), shape, params, vocab)
                    per[name].append(
                        {"prompt": i, **sim, "tokens": len(text), "sd_calls": sd_expected}
                    )
            per[f"SD chain:{k}"].append(
                {
                    "prompt": i,
                    "calls": sd_expected,
                    "nodes": sd_expected * k,
                    "forwards": sd_expected * k,
                    "tokens": len(text),
                    "sd_calls": sd_expected,
                }
            )
            print(f"[T={temp}] prompt {i} done ({time.time() - t_start:.0f}s)", flush=True)
        summary: dict[str, dict[str, Any]] = {}
        for name, rows in per.items():
            by_prompt: dict[int, list[dict[str, float]]] = defaultdict(list)
            for row in rows:
                by_prompt[int(row["prompt"])].append(row)
            be, ratio, rate_ratio = [], [], []
            sd_k = int(rows[0].get("sd_budget", k))
            sd_call_time = costs.target_cost(sd_k + 1) + sd_k * costs.draft_cost(1)
            for rs in by_prompt.values():
                calls = float(np.mean([x["calls"] for x in rs]))
                tokens = rs[0]["tokens"]
                b = tokens / calls
                b_sd = tokens / rs[0]["sd_calls"]
                nodes = float(np.mean([x["nodes"] / x["calls"] for x in rs]))
                fw = float(np.mean([x["forwards"] / x["calls"] for x in rs]))
                call_time = costs.target_cost(nodes + 1) + fw * costs.draft_cost(1)
                be.append(b)
                ratio.append(b / b_sd)
                rate_ratio.append((b / call_time) / (b_sd / sd_call_time))
            summary[name] = {
                "tokens_per_call": t_interval(be),
                "ratio_to_sd": t_interval(ratio),
                "predicted_rate_ratio_to_sd": t_interval(rate_ratio),
                "pooled_tokens_per_call": sum(r["tokens"] for r in rows)
                / sum(r["calls"] for r in rows),
            }
            m, lo, hi = summary[name]["ratio_to_sd"]
            print(
                f"[T={temp}] {name:28s} {np.mean(be):.3f} tokens/call, ÷ SD {m:.4f} "
                f"[{lo:.4f}, {hi:.4f}]",
                flush=True,
            )
        out["temperatures"][str(temp)] = {"summary": summary, "runs": per}
        Path(args.out).write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"wrote {args.out} ({time.time() - t_start:.0f}s)")


if __name__ == "__main__":
    main()
