"""Dynamic ERSD trees (:mod:`ersd.drafting.dynamic`, :mod:`ersd.drafting.policy`,
:mod:`ersd.theory.margin`).

* invariance: ERSD with a dynamic tree emits target-only race sampling token for token (6 drafters
  x 40 seeds x 4 dynamic specs, plain and filtered sampling, online learning on and off);
* exactness: the sequence law through the statistical suite (chi-square at alpha = 1e-4, N = 3000,
  as tests/test_exactness.py), and an inexact ERSD mutant with a dynamic tree must be rejected;
* the policy respects the budget, the depth cap, one draft forward per round, and grows ERSD's
  drafting order (closed under parents and elder siblings); the planner equals the Tunstall tree
  when every race is known; the cost-aware cut stops where predicted tokens/s peaks;
* the predictor's bookkeeping (buckets, tail, shrinkage, online updates), the margin recorder's
  counts against the loop's own rank records, and the calibration-file round trip.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

import ersd
from ersd.drafting import DynamicDrafter, MarginRecorder, ModelDrafter
from ersd.drafting.dynamic import MarginEvent, parse_dynamic
from ersd.drafting.policy import CostState, OpenContext, plan_round
from ersd.errors import ErsdError, InvalidTreeSpecError, UnsupportedTreeError
from ersd.methods import DraftTree
from ersd.methods.ersd import ERSD
from ersd.race import RaceNoise, race_ranking, root_key
from ersd.theory import RankProfile, optimal_tree_by_depth
from ersd.theory.margin import MarginPredictor, MarginTable, calibration_curve, race_margin
from ersd.tree import TreeShape
from tests.exactness_util import ALPHA, TableLM, make_drafts, make_target
from tests.test_exactness import DRAFTS, ERSDCorrectionFromDraft, sequence_law_test

TARGET6 = make_target(6, seed=3)
PROMPT = [1, 2]
SPECS = ["dynamic:6", "dynamic:4@2", "dynamic:8@3", "dynamic-cost:8"]


class LinearCosts:
    """A toy cost model: ``a + b·n`` seconds per forward of ``n`` new tokens."""

    def __init__(self, target: tuple[float, float], draft: tuple[float, float], overhead=0.0):
        self.t, self.d, self.overhead = target, draft, overhead

    def target_cost(self, n: float) -> float:
        return self.t[0] + self.t[1] * n

    def draft_cost(self, n: float) -> float:
        return self.d[0] + self.d[1] * n


def _drafter(model: ersd.FunctionModel, spec: str, learn: bool | None = None) -> DynamicDrafter:
    s = parse_dynamic(spec)
    assert s is not None
    return DynamicDrafter(
        model,
        s.budget,
        max_depth=s.max_depth,
        cost_aware=s.cost_aware,
        costs=LinearCosts((1.0, 0.05), (0.1, 0.01)),
        learn=learn,
    )


# --- invariance ----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize(
    "filters", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 3, "top_p": 0.8}]
)
def test_dynamic_ersd_equals_target_only_race_sampling(spec: str, filters: dict) -> None:
    target = TARGET6.model()
    drafts = {n: d.model() for n, d in make_drafts(TARGET6, seed=7).items()}
    accepted = 0
    for name, draft in drafts.items():
        for learn in (True, False):
            drafter = _drafter(draft, spec, learn=learn)
            for seed in range(20):
                want = ersd.generate(
                    target, None, PROMPT, max_new_tokens=12, seed=seed, **filters
                ).tokens
                res = ersd.generate(
                    target, drafter, PROMPT, max_new_tokens=12, seed=seed, tree=spec, **filters
                )
                assert res.tokens == want, f"seed {seed}, drafter {name}, {spec}, learn={learn}"
                assert res.tree == spec
                accepted += res.num_accepted_tokens
    assert accepted > 0


def test_tree_string_wraps_a_plain_draft_model() -> None:
    target, draft = TARGET6.model(), make_drafts(TARGET6, seed=7)["mild"].model()
    res = ersd.generate(target, draft, PROMPT, max_new_tokens=20, seed=1, tree="dynamic:5@3")
    assert res.tokens == ersd.generate(target, None, PROMPT, max_new_tokens=20, seed=1).tokens
    assert res.tree == "dynamic:5@3"
    assert all(s.expected_tokens is not None and s.expected_tokens >= 1.0 for s in res.steps)
    assert res.expected_block_efficiency is not None
    assert res.stats()["expected_block_efficiency"] == res.expected_block_efficiency


def test_temperature_zero_is_the_greedy_chain() -> None:
    target, draft = TARGET6.model(), make_drafts(TARGET6, seed=7)["mild"].model()
    chain = ersd.generate(target, draft, PROMPT, max_new_tokens=20, temperature=0, tree="chain:4")
    dyn = ersd.generate(target, draft, PROMPT, max_new_tokens=20, temperature=0, tree="dynamic:4")
    assert dyn.tokens == chain.tokens
    assert [s.num_draft_tokens for s in dyn.steps] == [s.num_draft_tokens for s in chain.steps]


@pytest.mark.realmodel
def test_real_model_invariance_smollm2() -> None:
    """SmolLM2-135M in float32 as target; drafts: an 8-layer truncation and an int8 copy."""
    target = ersd.load_model("smollm2-135m")
    drafts = {
        "truncated": ersd.load_model("smollm2-135m", num_hidden_layers=8),
        "int8": ersd.load_model("smollm2-135m", dtype="int8"),
    }
    prompt = target.tokenizer.encode("def fibonacci(n):\n    ")
    accepted = 0
    for seed in range(2):
        want = ersd.generate(target, None, prompt, max_new_tokens=20, seed=seed).tokens
        for name, draft in drafts.items():
            for spec in ("dynamic:6", "dynamic:8@3"):
                res = ersd.generate(target, draft, prompt, max_new_tokens=20, seed=seed, tree=spec)
                assert res.tokens == want, f"seed {seed}, {name}, {spec}"
                accepted += res.num_accepted_tokens
    assert accepted > 0  # the drafts were used (the int8 copy is a near-perfect draft)


# --- exactness (statistical) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "setting", "draft"),
    [
        ("dynamic:4", "T1.0", "mild"),
        ("dynamic:5@2", "T1.0-top_k3-top_p0.9", "bad"),
        ("dynamic:3", "T0.6", "sparse"),
    ],
)
def test_dynamic_sequence_law(spec: str, setting: str, draft: str) -> None:
    res = sequence_law_test("ersd", spec, setting, DRAFTS[draft], tag=("dynamic", spec, setting))
    assert res.pvalue >= ALPHA, f"ersd {spec}, {setting}, {draft}: {res}"


def test_dynamic_inexact_mutant_is_rejected() -> None:
    res = sequence_law_test(
        ERSDCorrectionFromDraft(), "dynamic:2", "T1.0", DRAFTS["bad"], tag=("dynamic-mutant",)
    )
    assert res.pvalue < ALPHA, f"the mutant was not rejected: {res}"


# --- the policy ----------------------------------------------------------------------------------


def _proposals(drafter: DynamicDrafter, target: TableLM, spec_depth: int, steps: int = 30):
    """Propose ``steps`` trees at random contexts, straight from a drafting session."""
    noise = RaceNoise(target.vocab_size)
    params = ersd.SamplingParams(1.0)
    g = torch.Generator().manual_seed(0)
    for i in range(steps):
        ctx = [int(t) for t in torch.randint(0, target.vocab_size, (3,), generator=g)]
        session = drafter.start_drafting(ctx)
        yield (
            ctx,
            session.propose(TreeShape.chain(spec_depth), root_key(i, ctx), ERSD(), params, noise),
            noise,
            params,
        )


@pytest.mark.parametrize(("budget", "cap"), [(1, None), (6, None), (8, 2), (12, 3), (5, 1)])
def test_policy_respects_budget_depth_and_drafting_order(budget: int, cap: int | None) -> None:
    draft = make_drafts(TARGET6, seed=7)["mild"]
    drafter = DynamicDrafter(draft.model(), budget, max_depth=cap)
    depth_cap = cap or budget
    for ctx, prop, noise, params in _proposals(drafter, TARGET6, spec_depth=10):
        tree = prop.tree
        assert 1 <= tree.num_nodes <= budget
        depth = max(tree.depth_of(n) for n in range(tree.num_nodes))
        assert depth <= depth_cap
        assert prop.forwards <= depth  # the root forward + one per fed round (< depth rounds)
        for c in range(tree.num_nodes + 1):
            kids = tree.children[c]
            if not kids:
                continue
            q = tree.draft_probs[c]
            assert q is not None
            # children are the first ranks of ERSD's drafting order at that context
            seq = ctx + [tree.tokens[n] for n in _path(tree, c)]
            want = race_ranking(
                ersd.logits_to_probs(draft.logits(seq), params),
                noise.exponentials(tree.keys[c]),
                len(kids),
            )
            assert [tree.tokens[k] for k in kids] == want
        assert prop.expected_tokens is not None
        assert 1.0 <= prop.expected_tokens <= 1.0 + tree.num_nodes + 1e-9


def _path(tree: DraftTree, ctx: int) -> list[int]:
    out, node = [], tree.node_of(ctx)
    while node >= 0:
        out.append(node)
        node = tree.parents[node]
    return out[::-1]


def test_shape_depth_caps_the_tree_near_the_end() -> None:
    draft = make_drafts(TARGET6, seed=7)["mild"]
    drafter = DynamicDrafter(draft.model(), 8)
    for _, prop, _, _ in _proposals(drafter, TARGET6, spec_depth=2, steps=10):
        assert max(prop.tree.depth_of(n) for n in range(prop.tree.num_nodes)) <= 2


def _all_known_plan(accept: np.ndarray, budget: int, depth: int) -> list[tuple[int, ...]]:
    """Run the planner round by round with every race known in advance (a fixed per-depth
    profile), returning the grown tree as child-index paths."""
    prior = lambda d: accept[min(d, len(accept)) - 1]  # noqa: E731
    paths: dict[int, tuple[int, ...]] = {0: ()}
    reach = {0: 1.0}
    children = {0: 0}
    fresh = [0]
    known: list[int] = []
    nxt = 1
    while True:
        known += fresh
        open_ = [
            OpenContext(c, reach[c], prior(len(paths[c]) + 1), children[c], len(paths[c]) + 1)
            for c in known
        ]
        plan = plan_round(open_, budget - (nxt - 1), depth, prior)
        new = []
        for (c, i), v in zip(plan.add, plan.values, strict=True):
            assert i == children[c]
            children[c] += 1
            paths[nxt], reach[nxt], children[nxt] = (*paths[c], i), v, 0
            new.append(nxt)
            nxt += 1
        fresh = [new[j] for j in plan.feed]
        if not fresh:
            return sorted((p for p in paths.values() if p), key=lambda t: (len(t), t))


@pytest.mark.parametrize("budget", [1, 3, 6, 10])
def test_planner_with_known_races_is_the_tunstall_tree(budget: int) -> None:
    profiles = np.array([[0.55, 0.2, 0.1, 0.05], [0.7, 0.15, 0.05, 0.02], [0.8, 0.1, 0.05, 0.0]])
    got = _all_known_plan(profiles, budget, depth=10)
    want = optimal_tree_by_depth(list(profiles), budget)
    assert got == want


def test_planner_depth_cap_and_perfect_draft() -> None:
    perfect = np.array([[1.0, 0.0, 0.0]])
    assert _all_known_plan(perfect, 5, depth=10) == [(0,) * d for d in range(1, 6)]
    assert _all_known_plan(perfect, 5, depth=2) == [(0,), (0, 0)]


def test_cost_aware_cut_stops_where_predicted_rate_peaks() -> None:
    accept = np.array([0.6, 0.2, 0.1])
    root = [OpenContext(0, 1.0, accept, 0, 1)]
    prior = lambda d: accept  # noqa: E731
    free = CostState(LinearCosts((1.0, 0.0), (0.0, 0.0)), 0, 1.0, 0.0)
    assert plan_round(root, 8, 8, prior, free) == plan_round(root, 8, 8, prior)
    for per_node in (0.3, 1.0, 5.0):
        dear = CostState(LinearCosts((1.0, per_node), (0.0, 0.0)), 0, 1.0, 0.0)
        cut = plan_round(root, 8, 8, prior, dear)
        # brute force: the best prefix of the Tunstall order (all contexts share the profile)
        order = optimal_tree_by_depth([accept], 8)
        order.sort(key=lambda p: -math.prod(accept[j] for j in p))
        rates = [
            (1 + sum(math.prod(accept[j] for j in p) for p in order[:n]))
            / (1.0 + per_node * (n + 1))
            for n in range(len(order) + 1)
        ]
        best = order[: int(np.argmax(rates))]
        assert cut.add == [(0, p[0]) for p in best if len(p) == 1]
        assert bool(cut.feed) == any(len(p) == 2 for p in best)
    assert (
        plan_round(root, 8, 8, prior, CostState(LinearCosts((1.0, 50.0), (0, 0)), 0, 1.0, 0.0)).add
        == []
    )


# --- the predictor and calibration ---------------------------------------------------------------


def test_margin_table_buckets_tail_and_merge() -> None:
    t = MarginTable.empty(max_depth=2, max_rank=3, edges=(0.5, 1.0))
    assert [t.bucket(m) for m in (0.0, 0.49, 0.5, 0.99, 1.0, math.inf, float("nan"))] == [
        0,
        0,
        1,
        1,
        2,
        2,
        0,
    ]
    t.add(1, 0.2, 1)
    t.add(5, 0.7, 9)  # depth beyond max_depth -> last row; rank beyond max_rank -> tail column
    assert t.counts[0, 0, 0] == 1 and t.counts[1, 1, 3] == 1
    both = t.merge(t)
    assert both.num_observations == 4
    with pytest.raises(ErsdError):
        t.merge(MarginTable.empty(max_depth=3, max_rank=3, edges=(0.5, 1.0)))
    with pytest.raises(ErsdError):
        t.add(0, 0.1, 1)
    with pytest.raises(ErsdError):
        MarginTable((1.0, 0.5), np.zeros((1, 3, 2)))
    assert race_margin(1.0, math.e) == pytest.approx(1.0)
    assert race_margin(1.0, math.inf) == math.inf


def test_predictor_shrinks_towards_data_and_learns_online() -> None:
    t = MarginTable.empty(max_depth=2, max_rank=3, edges=(0.5,))
    pred = MarginPredictor(t, strength=10.0)
    prior = pred.predict(1, 0.1)
    np.testing.assert_allclose(prior, pred.prior[:-1])  # no data: the prior
    rng = np.random.default_rng(0)
    for _ in range(20_000):  # close races: rank 2 half of the time; clear ones: always rank 1
        pred.update(1, 0.1, int(rng.choice([1, 2])))
        pred.update(1, 0.9, 1)
    close, clear = pred.predict(1, 0.1), pred.predict(1, 0.9)
    np.testing.assert_allclose(close[:2], [0.5, 0.5], atol=0.02)
    assert clear[0] > 0.99
    # depth 2 has no data: it borrows the bucket estimate pooled over depths
    np.testing.assert_allclose(pred.predict(2, 0.1), close, atol=1e-3)
    assert pred.depth_prior(1)[0] == pytest.approx(0.75, abs=0.02)
    assert t.num_observations == 40_000


def test_recorder_counts_match_the_loops_rank_records() -> None:
    target, draft = TARGET6.model(), make_drafts(TARGET6, seed=7)["mild"].model()
    rec = MarginRecorder(draft)
    ranks: list[list[int]] = []
    for seed in range(30):
        res = ersd.generate(target, rec, PROMPT, max_new_tokens=16, seed=seed, tree="chain:3")
        ranks += [s.ranks for s in res.steps[:-1]]  # the last step is not observed
    prof = RankProfile.from_step_ranks(ranks)
    assert prof.depth_counts is not None
    for d, counts in enumerate(prof.depth_counts):
        got = rec.table.counts[d].sum(axis=0)  # pooled over margin buckets
        top = min(counts.size, rec.table.max_rank)
        np.testing.assert_array_equal(got[:top], counts[:top])


def test_calibration_file_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ersd.theory.profile import CALIBRATION_FORMAT, load_profiles, nearest_temperature

    table = MarginTable.empty(max_depth=3)
    for d, b, r in itertools.product(range(1, 4), (0.01, 0.4, 4.0), range(1, 5)):
        table.add(d, b, r)
    prof = RankProfile.from_ranks([1, 1, 2, 3], vocab_size=6, temperature=1.0)
    prof.margin = table
    path = tmp_path / "profile.json"
    prof.save(path)
    back = RankProfile.load(path)
    assert back.margin is not None
    np.testing.assert_array_equal(back.margin.counts, table.counts)
    assert back.margin.edges == table.edges
    cal = {
        "format": CALIBRATION_FORMAT,
        "version": 1,
        "profiles": {"1.0": prof.to_dict(), "0.7": RankProfile.from_ranks([1]).to_dict()},
    }
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    picked = nearest_temperature(load_profiles(tmp_path / "cal.json").profiles, 1.0)
    pred = MarginPredictor.from_profile(picked)
    np.testing.assert_array_equal(pred.table.counts, table.counts)
    with pytest.raises(ErsdError, match="no margin table"):
        MarginPredictor.from_profile(
            nearest_temperature(load_profiles(tmp_path / "cal.json").profiles, 0.7)
        )
    # a profile without margins still writes the version-1 format unchanged
    assert "margin" not in RankProfile.from_ranks([1]).to_dict()


def test_calibration_curve_and_events() -> None:
    target, draft = TARGET6.model(), make_drafts(TARGET6, seed=7)["mild"].model()
    drafter = DynamicDrafter(draft, 6, keep_events=True)
    for seed in range(10):
        ersd.generate(target, drafter, PROMPT, max_new_tokens=16, seed=seed, tree="dynamic:6")
    assert drafter.events and all(isinstance(e, MarginEvent) for e in drafter.events)
    rows = calibration_curve(
        [
            (e.margin, e.predicted, e.accepted)
            for e in drafter.events
            if e.children and e.predicted is not None
        ]
    )
    assert sum(r["n"] for r in rows) > 0
    for r in rows:
        assert 0 <= r["low"] <= r["observed"] <= r["high"] <= 1
        assert 0 <= r["predicted"] <= 1


def test_calibration_interval_holds_the_rate_at_zero_and_one() -> None:
    """At a rate of 0 or 1 the Wilson bound equals the rate in exact arithmetic; in floating point
    it came out 1e-17 past it for some counts, and the calibration plot's error bars went negative
    (matplotlib refuses them): the report of a real benchmark failed that way."""
    bad = []
    for n in range(1, 300):
        for acc in (0.0, 1.0):
            (row,) = calibration_curve([(0.5, 0.5, acc)] * n)
            if not (row["low"] <= row["observed"] <= row["high"]):
                bad.append((n, acc))
    assert not bad


def test_bad_specs_and_methods_are_clear_errors() -> None:
    target, draft = TARGET6.model(), make_drafts(TARGET6, seed=7)["mild"].model()
    for bad in ("dynamic:0", "dynamic:4@", "dynamic:x", "dynamic-cost"):
        with pytest.raises(InvalidTreeSpecError, match="dynamic"):
            ersd.generate(target, draft, PROMPT, max_new_tokens=4, tree=bad)
    with pytest.raises(UnsupportedTreeError, match="ERSD"):
        ersd.generate(target, draft, PROMPT, max_new_tokens=4, tree="dynamic:4", method="gls")
    with pytest.raises(ErsdError, match="cost"):
        ersd.generate(target, draft, PROMPT, max_new_tokens=4, tree="dynamic-cost:4")
    with pytest.raises(ErsdError, match="budget"):
        DynamicDrafter(draft, 0)
    with pytest.raises(UnsupportedTreeError):
        ersd.generate(
            target,
            DynamicDrafter(draft, 4),
            PROMPT,
            max_new_tokens=4,
            method="specinfer",
            tree="chain:4",
        )
    assert isinstance(ModelDrafter(draft), ersd.drafting.Drafter)


def test_batched_generation_with_a_dynamic_drafter_is_invariant() -> None:
    target, draft = TARGET6.model(), make_drafts(TARGET6, seed=7)["mild"].model()
    prompts = [[1, 2], [3], [4, 5, 0]]
    want = ersd.generate_batch(target, None, prompts, max_new_tokens=12, seeds=[5, 6, 7])
    got = ersd.generate_batch(
        target,
        DynamicDrafter(draft, 6),
        prompts,
        max_new_tokens=12,
        seeds=[5, 6, 7],
        tree="chain:6",  # the envelope: depth cap 6
    )
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert sum(r.num_accepted_tokens for r in got) > 0
