"""Does ``batch_start_margin`` earn its place?  The rules replay (``replay_rules.py``) could not
decide it: its batch-8 cells either drafted at a large predicted gain (the margin never acted) or
believed drafting did not pay at all, and it never charged the draft's catch-up -- the prefill
of every row that the margin exists to avoid paying for a small gain.  This replay puts batches
of 8 rows exactly into the margin's band and charges that prefill.

* **Traces**: the recorded T = 0 draft/target agreement of ../auto-replay-2026-12-05/
  (``agree-128.json``, 20 prompts, 5 per category, each with its prompt length).  ERSD is batch
  invariant, so a row's agreement bits are the same in any batch; ``BATCHES`` batches of 8
  rows, two prompts of each category drawn (seeded) per batch, 96 tokens per row.
* **The machine** (modelled, as ``replay_rules.py``'s batch cells): a target forward of ``n``
  tokens in each of ``b`` rows costs ``0.23 (1 + 0.02 (b - 1)) + s (n b - 1)`` seconds, the
  draft's ``0.044 (1 + 0.02 (b - 1)) + 0.002 (n b - 1)``; overheads 0.015 s (drafting) and
  0.02 s (plain) per row.  The target's slope ``s`` per token sets drafting's true gain at
  batch 8, from clearly paying (``s`` = 0.03) to clearly losing (0.13).
* **What auto believes**: the same curves with the slope ``s (1 - e)``: ``e`` = 0 exact,
  0.15 / 0.3 optimistic (a multi-token forward dearer than the curve says: the live cases, a
  drafting step 1.17x its prediction on the Intel bf16 pair at batch 8, chain:6's target
  forward 11% over), -0.15 pessimistic.  Plain steps correct the target's scale, not its slope.
* **Step noise**: each step's seconds times lognormal(sigma) (0 or 0.1, the VM's step-to-step
  spread), seeded per batch, the same draws for every variant (paired).
* **The draft's catch-up is charged**: a step that drafts after plain steps first feeds the
  draft every token it has not seen (the whole longest context on the first drafting step,
  ``TreeChooser._catchup``), at the charged draft curve -- what the chooser itself predicts as
  ``RunState.catchup_seconds`` and what fixed trees pay on their first step too.
* Priors: the stored code-heavy T = 0 profile and the generic prior (``replay_rules.PRIORS``).

Per cell (slope, belief error, noise, prior): the mean over the batches of rate(variant) ÷
rate(all rules) - 1, with a 95% t-interval over them; and, for reading the regime, the best
fixed chain's and auto's rate ÷ plain decoding's (charged, with the catch-up), and auto's
predicted gain at its first step (best candidate ÷ plain, before any step was timed).

    cd docs/results/auto-rules-2026-12-06
    OMP_NUM_THREADS=1 ../../../.venv/bin/python replay_batch_start.py > replay_batch_start.md
    (``--quick``: 2 batches, 2 slopes, one prior: a smoke test of the script)
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_rules import (
    DATA,
    PRIORS,
    accepted_from,
    interval,
    new_chooser,
    step_parts,
)

from ersd.auto import RULES
from ersd.costs import DEFAULT_SIZES, CostModel
from ersd.tree import TreeShape

SIZES = list(DEFAULT_SIZES)
TOKENS = 96
BATCH = 8
BATCHES = 8
SLOPES = (0.03, 0.05, 0.07, 0.09, 0.11, 0.13)
ERRORS = (-0.15, 0.0, 0.15, 0.3)
SIGMAS = (0.0, 0.1)
#: the variants against all rules (margin 0.10)
VARIANTS = {
    "margin off": {"batch_start_margin": 0.0},
    "margin 0.05": {"batch_start_margin": 0.05},
    "margin 0.20": {"batch_start_margin": 0.20},
}
# The candidate successor, start only if the predicted saving over the rest of the run repays
# the draft's catch-up (``Rules.batch_start_payback``; variants "payback" = that with no margin
# and "payback + margin 0.05"), was replayed at commit 1e9dd50 (replay_batch_start.md has its
# columns) and removed with its switch after: to run it again, check that commit's src out
# (``git archive 1e9dd50 src``, as run.sh does) and add the two variants back.


def batch_model(slope: float) -> CostModel:
    """The modelled machine with the target's slope ``slope`` per token (module docstring)."""

    def target(n: int, b: int) -> float:
        return 0.23 * (1 + 0.02 * (b - 1)) + slope * (n * b - 1)

    def draft(n: int, b: int) -> float:
        return 0.044 * (1 + 0.02 * (b - 1)) + 0.002 * (n * b - 1)

    rows = [1, 2, 4, 8]
    return CostModel(
        sizes=SIZES,
        target=[target(n, 1) for n in SIZES],
        draft=[draft(n, 1) for n in SIZES],
        overhead=0.015,
        overhead_plain=0.02,
        batch_sizes=rows,
        target_batch=[[target(n, b) for n in SIZES] for b in rows],
        draft_batch=[[draft(n, b) for n in SIZES] for b in rows],
    )


def run_auto(
    rows: list[list[int]],
    prompts: list[int],
    believed: CostModel,
    charged: CostModel,
    sigma: float,
    prior,
    rules,
    seed: int,
) -> tuple[float, float, int]:
    """(seconds until every row is done, auto's predicted gain at its first step, drafting
    steps) -- ``replay_rules.run_batch`` with the draft's catch-up charged."""
    rng = np.random.default_rng(seed)
    n = len(rows[0])
    ch = new_chooser(believed, prior, n, rules)
    pos = [0] * len(rows)
    beyond: dict[int, tuple[int, int | None] | None] = {}
    t, first, ctx = 0.0, True, list(range(prompts[0]))
    longest = max(prompts)
    predicted_gain, drafting = math.nan, 0
    while True:
        live = [i for i in range(len(rows)) if pos[i] < n]
        if not live:
            return t, predicted_gain, drafting
        shape = ch.choose(ctx, len(live), longest, [(i, n - pos[i]) for i in live])
        if first:
            last = ch.last
            predicted_gain = (last.best_tree_predicted or 0.0) / last.target_only
        catchup = ch._catchup if shape is not None else 0
        k = shape.depth if shape is not None else 0
        drafting += bool(k)
        for i in live:
            if k and beyond.get(i) is not None:
                ch.observe_beyond(*beyond[i])
            acc = accepted_from(rows[i], pos[i], k)
            ch.observe([], acc, k, row=i)
            full = k and acc == k and pos[i] + acc < n
            beyond[i] = (k + 1, 1 if rows[i][pos[i] + acc] else None) if full else None
            pos[i] += acc + 1
            if pos[i] >= n:
                ch.forget_row(i)
        tp, dp, total = step_parts(charged, shape, len(live))
        if catchup > 1:  # the draft is fed what it has not seen (its prefill, the first time)
            extra = charged.draft_cost(catchup, len(live))
            dp, total = dp + extra, total + extra
        f = float(np.exp(rng.normal(0.0, sigma))) if sigma else 1.0
        ch.observe_times(len(live), dp * f, tp * f, total * f, prefill=first, step=shape)
        ctx += [0] * (k + 1)
        longest += k + 1
        t, first = t + total * f, False


def run_fixed(rows: list[list[int]], prompts: list[int], costs: CostModel, k: int) -> float:
    """Seconds of fixed chain:k (k = 0: plain decoding) over a batch, no noise; a chain pays
    the draft's prefill of the longest context on its first step."""
    n = len(rows[0])
    pos, t = [0] * len(rows), 0.0
    shape = TreeShape.chain(k) if k else None
    if k:
        t += costs.draft_cost(max(prompts), len(rows))
    while True:
        live = [i for i in range(len(rows)) if pos[i] < n]
        if not live:
            return t
        for i in live:
            pos[i] += accepted_from(rows[i], pos[i], k) + 1
        t += step_parts(costs, shape, len(live))[2]


def draw_batches(data: dict, count: int, seed: int = 0) -> list[list[str]]:
    """``count`` batches of 8 prompts, two of each category, drawn without replacement within
    a batch."""
    rng = np.random.default_rng(seed)
    by: dict[str, list[str]] = {}
    for pid, d in data.items():
        by.setdefault(d["set"], []).append(pid)
    return [
        [p for ids in by.values() for p in rng.choice(ids, size=2, replace=False)]
        for _ in range(count)
    ]


def main() -> None:
    import json

    quick = "--quick" in sys.argv
    data = json.loads(DATA.read_text())
    groups = draw_batches(data, 2 if quick else BATCHES)
    slopes = SLOPES[1:3] if quick else SLOPES
    priors = ["stored"] if quick else list(PRIORS)
    cells = [(s, e, sg, pr) for s in slopes for e in ERRORS for sg in SIGMAS for pr in priors]
    rows_of = [[data[p]["agree"][:TOKENS] for p in g] for g in groups]
    ctx_of = [[data[p]["ctx"] for p in g] for g in groups]
    print("# Does the batch start margin earn its place? (replay_batch_start.py)\n")
    print(
        f"{len(groups)} batches of {BATCH} rows (two prompts per category), {TOKENS} tokens, "
        "T = 0; the draft's catch-up charged.  Change of predicted throughput against all "
        "rules (margin 0.10): mean over the batches ± 95% t half-width, in %; **bold**: beyond "
        "both the half-width and 1%.\n"
    )
    # the regime: best fixed chain and auto (all rules) against plain decoding
    regime: dict[float, tuple[float, str]] = {}
    for s in slopes:
        costs = batch_model(s)
        plain = [run_fixed(r, c, costs, 0) for r, c in zip(rows_of, ctx_of, strict=True)]
        best = max(
            (
                float(
                    np.mean(
                        [
                            p / run_fixed(r, c, costs, k)
                            for r, c, p in zip(rows_of, ctx_of, plain, strict=True)
                        ]
                    )
                ),
                f"chain:{k}",
            )
            for k in range(1, 9)
        )
        regime[s] = best
    head = "| slope s | belief error e | noise σ | prior | best fixed ÷ plain | auto ÷ plain "
    head += "| auto's first predicted gain | drafting steps (mean) | "
    head += " | ".join(VARIANTS) + " |"
    print(head)
    print("|---" * (8 + len(VARIANTS)) + "|")
    verdict: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for s, e, sg, pr in cells:
        charged, believed = batch_model(s), batch_model(s * (1 - e))
        base, gains, steps = [], [], []
        for j, (r, c) in enumerate(zip(rows_of, ctx_of, strict=True)):
            t, g, d = run_auto(r, c, believed, charged, sg, PRIORS[pr], RULES, 100 + j)
            base.append(t)
            gains.append(g)
            steps.append(d)
        plain = [run_fixed(r, c, charged, 0) for r, c in zip(rows_of, ctx_of, strict=True)]
        auto_plain = float(np.mean([p / t for p, t in zip(plain, base, strict=True)]))
        out = []
        for v, off in VARIANTS.items():
            rules = replace(RULES, **off)
            ratios = []
            for j, (r, c) in enumerate(zip(rows_of, ctx_of, strict=True)):
                t = run_auto(r, c, believed, charged, sg, PRIORS[pr], rules, 100 + j)[0]
                ratios.append(100 * (base[j] / t - 1))
            m, h = interval(ratios)
            verdict[v].append((m, h))
            txt = f"{m:+.1f} ± {h:.1f}"
            out.append(f"**{txt}**" if abs(m) > h and abs(m) >= 1.0 else txt)
        best_gain, best_name = regime[s]
        print(
            f"| {s:g} | {e:+g} | {sg:g} | {pr} | {best_gain:.3f} ({best_name}) | {auto_plain:.3f} "
            f"| {np.mean(gains):.3f} | {np.mean(steps):.1f} | " + " | ".join(out) + " |",
            flush=True,
        )
    print("\n## Summary per variant\n")
    print("| variant | cells | beyond the noise: gains | losses | largest gain | largest loss |")
    print("|---|---|---|---|---|---|")
    for v, res in verdict.items():
        big = [(m, h) for m, h in res if abs(m) > h and abs(m) >= 1.0]
        ups = [m for m, _ in big if m > 0]
        downs = [m for m, _ in big if m < 0]
        print(
            f"| {v} | {len(res)} | {len(ups)} | {len(downs)} | "
            f"{max(m for m, _ in res):+.1f} | {min(m for m, _ in res):+.1f} |"
        )


if __name__ == "__main__":
    main()
