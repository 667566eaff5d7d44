"""Does each rule of ``tree="auto"`` earn its place?  Replays auto with every rule in place and
with one rule switched off (``replace(RULES, ...)``), on the recorded T = 0 draft/target
agreement of ../auto-replay-2026-12-05/ (20 prompts, 5 per category, 128 tokens), and reports
the predicted throughput change of each removal per cell.  No model runs and nothing is timed:
every step is charged a cost model's seconds (times a seeded noise where the scenario says so),
which the chooser observes as the step's measured (target, draft) split, as in ersd.generate.

Scenarios (what auto believes, what a step really costs):

* ``curve``: the stored packed-float32 curve, exact; ``steps``: the slope its real steps showed,
  exact; ``curve>steps``: auto believes the curve, steps cost the steeper slope (a stale or
  miscalibrated store); ``curve>steps~``: the same with each step's time times a lognormal
  noise of sigma 0.1 (the VM's step-to-step spread, seeded per prompt: paired across variants);
  ``steep``: the 2-core llama.cpp curve, where drafting cannot pay; ``dear``: a flat target
  and a draft forward half as dear as the target's (modelled), where drafting breaks even at
  the generic prior's acceptance and pays on code -- the regime exploration is for.
* batch cells: 8 rows at once (4 batches drawn from the 20 prompts, every category in each),
  a modelled machine whose forward costs grow with the tokens of all rows.

A cell is (scenario, prior, tokens, category) at batch 1 and (scenario, prior, tokens) at batch
8.  Per cell the change is the mean over its prompts (batches) of rate(off) / rate(on) - 1,
with a 95% t-interval over them: the noise of the prompt sample.  A rule is kept if its removal
moves some cell by more than both that interval and 1% (below that no live measurement here
could confirm it).

    bash run.sh   (runs it against the library at commit.txt, before the removals: the Rules
                   fields it switches off are gone after)
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from ersd.auto import RULES, OnlineProfile, TreeChooser
from ersd.costs import DEFAULT_SIZES, CostModel
from ersd.methods import get_method
from ersd.tree import AutoTree, TreeShape

DATA = Path(__file__).resolve().parent.parent / "auto-replay-2026-12-05" / "agree-128.json"
SIZES = list(DEFAULT_SIZES)
#: (target seconds at 1 token, per further token, draft seconds per forward)
COSTS = {
    "curve": (0.23, 0.02, 0.044),
    "steps": (0.22, 0.028, 0.045),
    "steep": (0.063, 0.058, 0.030),  # llama.cpp on 2 cores: 0.063 / 0.110 / 0.214 / 0.472 s
    "dear": (0.22, 0.028, 0.12),  # a draft half a target forward: drafting at P = 0.6 breaks even
}
#: scenario: (believed costs, charged costs, noise sigma)
SCENARIOS = {
    "curve": ("curve", "curve", 0.0),
    "steps": ("steps", "steps", 0.0),
    "curve>steps": ("curve", "steps", 0.0),
    "curve>steps~": ("curve", "steps", 0.1),
    "steep": ("steep", "steep", 0.0),
    "dear": ("dear", "dear", 0.0),
}
#: the stored T = 0 profile this machine held (code-heavy), and the generic prior
PRIORS = {
    "stored": ([[0.925], [0.869], [0.922], [0.892], [0.935], [1.0]], [134, 122, 103, 80, 50, 20]),
    "generic": None,
}
LENGTHS = (96, 128)
BATCH = 8
#: each rule switched off (the rules of what a learning run keeps are not replayed: they act
#: across runs, and a run writes nothing unless asked)
OFF = {
    "smaller_tree_within": {"smaller_tree_within": 0.0},
    "cannot_pay": {"cannot_pay": False},
    "cannot_pay_recheck": {"cannot_pay_recheck": 1},
    "batch_start_margin": {"batch_start_margin": 0.0},
    "prefill_pays_off": {"prefill_pays_off": False},
    "explore_after": {"explore_after": 10**9},
    "explore_plain_after": {"explore_plain_after": 10**9},
    "early_plain": {"early_plain": False},
    "explore_plain_doubt": {"explore_plain_doubt": 1e9},
    "stale_decay": {"stale_decay": 1.0},
    "markov_root": {"markov_root": False},
    "beyond": {"beyond": False},
    "timing_ema": {"timing_ema": 1.0},
    "size_prior_steps": {"size_prior_steps": 1e9},
    "row_factors": {"row_factors": False},
    # the rules removed on this replay's evidence, together (the library after this study)
    "removed together": {
        "cannot_pay_recheck": 1,
        "prefill_pays_off": False,
        "explore_plain_after": 10**9,
        "early_plain": False,
        "stale_decay": 1.0,
    },
}
BATCH_ONLY = {"batch_start_margin", "row_factors"}


def cost_model(name: str, batch: bool = False) -> CostModel:
    """Linear curves; with ``batch``, curves at 1, 2, 4, 8 rows whose cost grows with every
    row's tokens (a row costs what a further tree token costs) plus 2% per row."""
    t0, t1, d = COSTS[name]

    def target(n: int, b: int) -> float:
        return t0 * (1 + 0.02 * (b - 1)) + t1 * (n * b - 1)

    def draft(n: int, b: int) -> float:
        return d * (1 + 0.02 * (b - 1)) + 0.002 * (n * b - 1)

    rows = [1, 2, 4, 8] if batch else []
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


def step_parts(costs: CostModel, shape: TreeShape | None, batch: int) -> tuple[float, float, float]:
    """(target, draft, total) seconds of a step (``shape`` None: no drafting)."""
    if shape is None:
        t = costs.target_cost(1, batch)
        return t, 0.0, t + costs.overhead_plain * batch
    total = costs.step_time(shape, batch)
    t = costs.target_cost(shape.num_nodes + 1, batch)
    return t, total - t - costs.overhead * batch, total


def accepted_from(agree: list[int], pos: int, k: int) -> int:
    acc = 0
    while acc < k and pos + acc < len(agree) and agree[pos + acc]:
        acc += 1
    return acc


def new_chooser(believed: CostModel, prior, horizon: int, rules) -> TreeChooser:
    m = get_method("ersd")  # the rule (None) is not ERSD's: T = 0 chooses among chains
    ch = TreeChooser(AutoTree(costs=believed), None, None, m, None, 0.0, None, horizon, rules)
    ch.online = OnlineProfile(False, *(prior or (None, None)), rules=rules)
    return ch


def run_batch(
    rows: list[list[int]], prompts: list[int], scenario: str, prior, rules, seed: int
) -> float:
    """Seconds until every row of the batch (its agreement bits, after a prompt of
    ``prompts[i]`` tokens) is done."""
    b_name, c_name, sigma = SCENARIOS[scenario]
    batched = len(rows) > 1
    believed, charged = cost_model(b_name, batched), cost_model(c_name, batched)
    rng = np.random.default_rng(seed)
    n = len(rows[0])
    ch = new_chooser(believed, prior, n, rules)
    pos = [0] * len(rows)
    beyond: dict[int, tuple[int, int | None] | None] = {}
    t, first, ctx = 0.0, True, list(range(prompts[0]))
    longest = max(prompts) if batched else None
    while True:
        live = [i for i in range(len(rows)) if pos[i] < n]
        if not live:
            return t
        if batched:
            shape = ch.choose(ctx, len(live), longest, [(i, n - pos[i]) for i in live])
        else:
            shape = ch.choose(ctx, 1)
        k = shape.depth if shape is not None else 0
        for i in live:
            if k and beyond.get(i) is not None:
                ch.observe_beyond(*beyond[i])
            acc = accepted_from(rows[i], pos[i], k)
            ch.observe([], acc, k, row=i if batched else None)
            full = k and acc == k and pos[i] + acc < n
            beyond[i] = (k + 1, 1 if rows[i][pos[i] + acc] else None) if full else None
            pos[i] += acc + 1
            if batched and pos[i] >= n:
                ch.forget_row(i)
        tp, dp, total = step_parts(charged, shape, len(live))
        if sigma:
            f = float(np.exp(rng.normal(0.0, sigma)))
            tp, dp, total = tp * f, dp * f, total * f
        ch.observe_times(len(live), dp, tp, total, prefill=first, step=shape)
        ctx += [0] * (k + 1)
        longest = longest + k + 1 if longest is not None else None
        t, first = t + total, False


def run_fixed(agree: list[int], costs: CostModel, k: int) -> float:
    """Seconds of fixed chain:k over ``agree``."""
    pos, t = 0, 0.0
    while pos < len(agree):
        pos += accepted_from(agree, pos, k) + 1
        t += step_parts(costs, TreeShape.chain(k), 1)[2]
    return t


def batches(data: dict) -> list[list[str]]:
    """4 batches of 8 prompts, each with two of every category (rotating through the 5)."""
    by: dict[str, list[str]] = {}
    for pid, d in data.items():
        by.setdefault(d["set"], []).append(pid)
    return [[ids[(2 * j + r) % len(ids)] for ids in by.values() for r in (0, 1)] for j in range(4)]


def interval(x: list[float]) -> tuple[float, float]:
    """Mean and 95% t half-width."""
    a = np.asarray(x)
    if len(a) < 2:
        return float(a.mean()), 0.0
    t = {2: 12.71, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365}[len(a)]
    return float(a.mean()), float(t * a.std(ddof=1) / math.sqrt(len(a)))


def main() -> None:
    data = json.loads(DATA.read_text())
    sets = sorted({d["set"] for d in data.values()})
    groups = batches(data)
    # times[(variant, scenario, prior, tokens)] = {unit id: seconds}
    times: dict[tuple, dict[str, float]] = {}
    variants = ["all rules", *OFF]
    for v in variants:
        rules = replace(RULES, **OFF.get(v, {}))
        for sc in SCENARIOS:
            for pr in PRIORS:
                for n in LENGTHS:
                    out = {}
                    if v not in BATCH_ONLY:
                        for i, (pid, d) in enumerate(data.items()):
                            agree = [d["agree"][:n]]
                            out[pid] = run_batch(agree, [d["ctx"]], sc, PRIORS[pr], rules, i)
                    for j, g in enumerate(groups):
                        agree = [data[p]["agree"][:n] for p in g]
                        ctx = [data[p]["ctx"] for p in g]
                        out[f"batch{j}"] = run_batch(agree, ctx, sc, PRIORS[pr], rules, 100 + j)
                    times[v, sc, pr, n] = out
        print(f"<!-- replayed: {v} -->", file=sys.stderr, flush=True)
    print('# Each rule of tree="auto" removed, replayed (replay_rules.py)\n')
    print(
        "Change of predicted throughput when the rule is switched off: mean over the cell's "
        "prompts (batch 8: its 4 batches) of rate(off) / rate(all rules) - 1, in %, with the "
        "95% t half-width over them.  **bold**: beyond both the half-width and 1%.\n"
    )
    base_cells = [(sc, pr, n) for sc in SCENARIOS for pr in PRIORS for n in LENGTHS]
    print("## auto with all rules: rate ÷ target-only [÷ the category's best fixed chain]\n")
    print(
        "The best fixed chain: the chain:1-8 with the best mean over the category's prompts, "
        "charged the scenario's costs without noise.\n"
    )
    print("| scenario | prior | tokens | " + " | ".join(sets) + " | batch 8 ÷ plain |")
    print("|---|---|---|" + "---|" * (len(sets) + 1))
    for sc, pr, n in base_cells:
        base = times["all rules", sc, pr, n]
        charged = cost_model(SCENARIOS[sc][1])
        plain_t = n * step_parts(charged, None, 1)[2]
        cells = []
        for s in sets:
            ids = [p for p in data if data[p]["set"] == s]
            ratio = [plain_t / base[p] for p in ids]
            fixed = min(
                np.mean([run_fixed(data[p]["agree"][:n], charged, k) / base[p] for p in ids])
                for k in range(1, 9)
            )
            cells.append(f"{np.mean(ratio):.3f} [{fixed:.3f}]")
        bc = cost_model(SCENARIOS[sc][1], True)
        bplain = []
        for j in range(len(groups)):  # plain decoding: every row one token per step
            bplain.append(
                n * step_parts(bc, None, BATCH)[2] / times["all rules", sc, pr, n][f"batch{j}"]
            )
        print(f"| {sc} | {pr} | {n} | " + " | ".join(cells) + f" | {np.mean(bplain):.3f} |")
    print("\n## Removal of each rule, per cell\n")
    verdict = {}
    for v in OFF:
        rows = []
        beyond = False
        largest = 0.0
        for sc, pr, n in base_cells:
            base, off = times["all rules", sc, pr, n], times[v, sc, pr, n]
            cells = []
            units = (
                [] if v in BATCH_ONLY else [[p for p in data if data[p]["set"] == s] for s in sets]
            )
            units.append([f"batch{j}" for j in range(len(groups))])
            for ids in units:
                m, h = interval([100 * (base[u] / off[u] - 1) for u in ids])
                big = abs(m) > h and abs(m) >= 1.0
                beyond = beyond or big
                largest = m if abs(m) > abs(largest) else largest
                txt = f"{m:+.1f} ± {h:.1f}"
                cells.append(f"**{txt}**" if big else txt)
            rows.append(f"| {sc} | {pr} | {n} | " + " | ".join(cells) + " |")
        verdict[v] = (beyond, largest)
        head = ([] if v in BATCH_ONLY else sets) + ["batch 8"]
        print(f"### {v} off ({OFF[v]})\n")
        print("| scenario | prior | tokens | " + " | ".join(head) + " |")
        print("|---|---|---|" + "---|" * len(head))
        print("\n".join(rows) + "\n")
    print("## Verdict\n")
    print("| rule | some cell beyond the noise | largest mean change (%) |")
    print("|---|---|---|")
    for v, (b, big) in verdict.items():
        if v == "removed together":  # not a rule: the library after the removals, vs before
            print(f"| (the removals together) | {'yes' if b else 'no'} | {big:+.1f} |")
        else:
            print(f"| {v} | {'yes: kept' if b else 'no: goes'} | {big:+.1f} |")


if __name__ == "__main__":
    main()
