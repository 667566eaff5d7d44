"""A/B of auto's acceptance estimate in one process: one Markov estimate for every depth below
the root (main) against the per-depth Markov estimate it replaced, beside chain:4 and chain:6,
on the bf16 Qwen pair.

Every prompt × temperature × repeat runs the four configurations in rotated order; both autos
share one cost store (curves, the calibrated rank profile, what runs keep).  Run alone:

    ERSD_COST_STORE=$(mktemp -d) OMP_NUM_THREADS=2 python ab.py > ab.log   # 24 cells, ~27 min
"""

import argparse
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

import ersd
from ersd.auto import MAX_RANK, PRIOR_WEIGHT, CurveCache, OnlineProfile, prepare_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.commands.models import _calibration_prompts, _rank_profile
from ersd.tree import AutoTree

markov = OnlineProfile.depth_probs


# the per-depth Markov estimate this replaced (main at 91f9f98), patched in for its runs
def per_depth(self, states: Sequence[bool | None] | None = None) -> list[np.ndarray]:
    """Per-depth rank probabilities; the last entry applies below the deepest observed
    depth.  ``states``: the state of each row decided for (class docstring); the root is
    their mean (expected tokens are linear in the root's vector); None or [None]: the root
    over all its observations.

    Each estimate is shrunk towards a pool of observations *other* than its own: pooling
    its own too would count each observation twice (one early root rejection moved the
    root's estimate almost twice as far as the prior's weight says, and a step that then
    drafts nothing observes nothing more)."""
    w = PRIOR_WEIGHT
    total = sum(self.counts, np.zeros(MAX_RANK))
    n_all = sum(self.trials)
    if not self.trials:
        return [(total + w * self.prior) / (n_all + w)]

    def pool(c: Any, n: float) -> Any:  # every observation but (c, n), and the prior
        return (total - c + w * self.prior) / (n_all - n + w)

    # right after an accepted token: the depths below the root, the roots in state True
    after = sum(self.counts[1:], self.full_counts.copy())
    n_after = sum(self.trials[1:]) + self.full_trials

    def after_pool(c: Any, n: float) -> Any:
        return (after - c + w * pool(c, n)) / (n_after - n + w)

    c0, n0 = self.counts[0], self.trials[0]
    root = (c0 + w * pool(c0, n0)) / (n0 + w)
    rc, rn = self.full_counts, self.full_trials
    full = (rc + w * (c0 - rc + w * pool(c0, n0)) / (n0 - rn + w)) / (rn + w)
    # after a rejection (or a step without drafting): the root over all its observations,
    # not its own state's -- a step that then drafts nothing observes nothing, so an
    # unlucky early estimate in that state would never be corrected (on a chat prompt at
    # T = 0 it made 23 of 67 steps plain, 5% slower than drafting chain:1 throughout)
    roots = [full if s else root for s in (states if states is not None else [None])]
    below = [
        (c + w * after_pool(c, n)) / (n + w)
        for c, n in zip(self.counts[1:], self.trials[1:], strict=True)
    ]
    beyond = (after + w * (total + w * self.prior) / (n_all + w)) / (n_after + w)
    return [sum(roots) / len(roots), *below, beyond]



ap = argparse.ArgumentParser()
ap.add_argument("--repeats", type=int, default=1)
ap.add_argument("--per-set", type=int, default=3)
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
args = ap.parse_args()
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
sets = ("humaneval", "mtbench", "math", "grounded")
prompts = [p for s in sets for p in load_prompts([s], "eval", args.per_set)]
encoded = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
curves = CurveCache()
prepare_costs(target, draft, encoded[0], 1, curves)
calib = _calibration_prompts(target, 1)
for temp in args.temperatures:
    probs, trials = _rank_profile(target, draft, calib, temp, 32)
    curves.store.put_profile(target, draft, "ersd", temp, probs, sum(trials), trials=trials)
configs = [
    ("auto", AutoTree(costs=curves)),
    ("auto-per-depth", AutoTree(costs=curves)),
    ("chain:4", "chain:4"),
    ("chain:6", "chain:6"),
]
for _, tree in configs:
    ersd.generate(target, draft, encoded[0], max_new_tokens=4, tree=tree, temperature=1.0)
k = 0
for i, p in enumerate(prompts):
    for temp in args.temperatures:
        for rep in range(args.repeats):
            shift = k % len(configs)
            k += 1
            for name, tree in configs[shift:] + configs[:shift]:
                OnlineProfile.depth_probs = per_depth if name == "auto-per-depth" else markov
                res = ersd.generate(
                    target,
                    draft,
                    encoded[i],
                    max_new_tokens=args.tokens,
                    tree=tree,
                    temperature=temp,
                    seed=i,
                )
                print(
                    json.dumps(
                        {
                            "prompt": p.id,
                            "set": p.set,
                            "temperature": temp,
                            "repeat": rep,
                            "config": name,
                            "rate": res.tokens_per_second,
                            "target_calls": res.target_calls,
                            "draft_forwards": res.draft_forwards,
                            "auto_choices": res.auto_choices or None,
                        }
                    ),
                    flush=True,
                )
OnlineProfile.depth_probs = markov
