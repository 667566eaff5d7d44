"""tree="auto": the cost model with batch size, the per-step choice, exactness and invariance."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest
from click.testing import CliRunner

import ersd
from ersd.auto import RULES, CurveCache, OnlineProfile, TreeChooser
from ersd.batch import derive_seed
from ersd.cli import main
from ersd.costs import CostModel, CostModelError, measure_costs, predict
from ersd.methods import get_method
from ersd.theory import RankProfile
from ersd.theory.profile import CALIBRATION_FORMAT
from ersd.tree import AutoTree, TreeShape, parse_auto, parse_tree
from tests.toy import mixed_draft, table_model

V = 30
SIZES = [1, 2, 4, 8]
PROFILE = [[0.8, 0.1, 0.05]]
#: a flat target curve and a cheap draft: speculation pays, big trees win
FLAT = CostModel(sizes=SIZES, target=[0.1] * 4, draft=[0.001] * 4)
#: the curve measured for llama.cpp on 2 cores (issue 15): 1.5B target, 0.5B draft, seconds
STEEP = CostModel(
    sizes=SIZES, target=[0.063, 0.110, 0.214, 0.472], draft=[0.030, 0.053, 0.082, 0.155]
)
#: a flat target curve and a draft forward a third of the target's (the Intel bf16 pair's)
THIRD = CostModel(sizes=SIZES, target=[0.1] * 4, draft=[0.033] * 4)
#: linear in the tokens of one forward (no batch curves: B rows of s tokens = B·s tokens)
LINEAR = CostModel(sizes=SIZES, target=[0.05 + 0.005 * s for s in SIZES], draft=[0.001] * 4)


def chooser(auto: AutoTree, method: str = "ersd") -> TreeChooser:
    m = get_method(method)
    return TreeChooser(auto, None, None, m, m, 1.0)


def nodes(shape: TreeShape | None) -> int:
    return 0 if shape is None else shape.num_nodes


@pytest.fixture
def pair() -> tuple[ersd.FunctionModel, ersd.FunctionModel]:
    target = table_model(V, seed=0)
    return target, mixed_draft(target, table_model(V, seed=1), 0.3)


# --- the cost model ---------------------------------------------------------------------------


def test_batch_cost_model_interpolates_rows_and_stacks_without_batch_curves() -> None:
    # without batch curves: B rows of s tokens cost one forward of B·s tokens
    assert LINEAR.target_cost(3, batch=4) == pytest.approx(LINEAR.target_cost(12))
    costs = CostModel(
        sizes=[1, 4],
        target=[1.0, 2.0],
        draft=[0.1, 0.2],
        batch_sizes=[1, 4],
        target_batch=[[1.0, 2.0], [3.0, 9.0]],
        draft_batch=[[0.1, 0.2], [0.3, 0.6]],
        overhead=0.01,
    )
    # bilinear: size 2 is a third of the way at each batch size, batch 2 a third between them
    at1, at4 = 1.0 + (2.0 - 1.0) / 3, 3.0 + (9.0 - 3.0) / 3
    assert costs.target_cost(2, batch=2) == pytest.approx(at1 + (at4 - at1) / 3)
    shape = TreeShape.chain(3)  # target(4) + draft(1) + 2 levels of one node + overhead per row
    assert costs.step_time(shape, batch=4) == pytest.approx(9.0 + 3 * 0.3 + 4 * 0.01)
    pred = predict(shape, PROFILE, costs, batch=4)
    assert pred.tokens_per_second == pytest.approx(4 * pred.block_efficiency / pred.step_time)
    assert costs.target_only_rate(4) == pytest.approx(4 / 3.0)
    assert CostModel.from_dict(costs.to_dict()) == costs


def test_cost_beyond_the_curve_never_falls() -> None:
    """Measured on the Intel bf16 draft at batch 1: 16 tokens timed faster than 8, and the old
    extension of the last segment put a 118-token prefill at 0.058 s, 60% of one token's."""
    costs = CostModel(sizes=[1, 8, 16], target=[1.0, 1.5, 3.0], draft=[0.0863, 0.0983, 0.0954])
    one = costs.draft_cost(1)
    slope = (0.0954 - 0.0863) / 15  # the whole curve's, the larger here
    assert costs.draft_cost(118) == pytest.approx(0.0954 + slope * 102)
    assert costs.draft_cost(118) > one
    assert costs.target_cost(32) == pytest.approx(3.0 + 16 * (1.5 / 8))  # the last segment's
    flat = CostModel(sizes=[1, 2], target=[2.0, 1.0], draft=[0.0, 0.0])
    assert flat.target_cost(10) == pytest.approx(1.0)  # never below the last point


@pytest.mark.parametrize(
    "bad",
    [
        {"sizes": [1, 2], "target": [0.1], "draft": [0.1, 0.1]},
        {"sizes": [2, 1], "target": [0.1, 0.1], "draft": [0.1, 0.1]},
        {"sizes": [1], "target": [-1.0], "draft": [0.1]},
        {"sizes": [1], "target": [0.1], "draft": [0.1], "batch_sizes": [1, 2]},
        {"sizes": [1], "target": [0.1], "draft": [0.1], "speed": 3},
        {"target": [0.1], "draft": [0.1]},
    ],
)
def test_bad_cost_models_are_refused(bad: dict) -> None:
    with pytest.raises(CostModelError):
        CostModel.from_dict(bad)


def test_measure_costs_batched_and_serial_fallback() -> None:
    model = table_model(V, seed=0)

    class Serial:  # the same model without score_batch: rows are scored one call each
        vocab_size, max_length = V, None

        def start(self, prompt):
            return model.start(prompt)

    costs = measure_costs(model, None, [1, 2, 3], SIZES, repeats=1, batch_sizes=[1, 3])
    assert costs.batch_sizes == [1, 3] and len(costs.target_batch[1]) == 4
    assert costs.draft_batch == [[0.0] * 4, [0.0] * 4]
    before = model.forward_calls
    measure_costs(model, None, [1, 2, 3], [2], repeats=1, batch_sizes=[3])
    batched = model.forward_calls - before
    before = model.forward_calls
    measure_costs(Serial(), None, [1, 2, 3], [2], repeats=1, batch_sizes=[3])
    serial = model.forward_calls - before
    # FunctionModel calls fn once per forward: 1 + 2 (batch 1) + 1 + 2 (batch 3, shared)
    assert batched == 6 and serial == 3 + 3 * 3


def test_a_slow_stretch_of_the_machine_does_not_reshape_a_measured_curve(monkeypatch) -> None:
    """Forwards cost 0.1 s + 0.01 s per token on a fake clock, but three forwards in a row take
    three times as long (another process on a shared machine).  Timed in rounds, the stretch
    touches three sizes once each and the medians drop it: the curve is the true one.  (Timed
    size by size it fell on one size three times out of six, and that size came out 3x.)"""
    import ersd.costs as costs_mod
    import ersd.models.batch as batch_mod

    model = table_model(V, seed=0)
    clock = [0.0]
    calls = [0]
    real = batch_mod.score_many

    def score_many(model_, sessions, calls_):
        calls[0] += 1
        n = len(calls_[0][0]) + 1
        slow = 3.0 if 10 <= calls[0] < 13 else 1.0  # call 1 is the prefill
        clock[0] += slow * (0.1 + 0.01 * n)
        return real(model_, sessions, calls_)

    monkeypatch.setattr(batch_mod, "score_many", score_many)
    monkeypatch.setattr(costs_mod.time, "perf_counter", lambda: clock[0])
    sizes = [1, 2, 4, 8, 16]
    curve = costs_mod.measure_curve(model, [1, 2, 3], sizes, repeats=5)
    assert calls[0] == 1 + 6 * len(sizes)
    assert curve == pytest.approx([0.1 + 0.01 * s for s in sizes])
    with pytest.raises(CostModelError, match="repeats >= 1"):
        costs_mod.measure_curve(model, [1, 2, 3], sizes, repeats=0)


def test_bench_reexports_the_library_cost_model_and_library_never_imports_bench() -> None:
    import ersd.bench.costs as bench_costs
    import ersd.costs as lib_costs

    assert bench_costs.CostModel is lib_costs.CostModel
    assert bench_costs.choose_trees is lib_costs.choose_trees
    code = (
        "import sys, ersd, ersd.generation, ersd.batch, ersd.auto, ersd.drafting.dynamic;"
        "print(any(m.startswith('ersd.bench') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- the choice -------------------------------------------------------------------------------


def test_flat_curve_picks_a_big_tree_and_steep_curve_no_drafting() -> None:
    flat = chooser(AutoTree(profile=PROFILE, costs=FLAT))
    shape = flat.choose([1, 2], batch=1)
    assert nodes(shape) >= 8 and flat.last is not None and flat.last.tree != "none"
    assert flat.last.predicted > flat.last.target_only
    steep = chooser(AutoTree(profile=PROFILE, costs=STEEP))
    assert steep.choose([1, 2], batch=1) is None
    last = steep.last
    assert last is not None and last.tree == "none" and last.best_tree is not None
    assert last.target_only == pytest.approx(1 / 0.063)
    assert last.best_tree_predicted < last.target_only


def test_measured_step_times_correct_the_choice() -> None:
    """The online correction: a drafting step far slower than predicted (the engine's own
    overhead) makes auto stop drafting; plain steps as predicted keep it there; a step during
    which cost curves were measured is not learned from."""
    c = chooser(AutoTree(profile=PROFILE, costs=FLAT))
    shape = c.choose([1], batch=4)
    assert shape is not None
    target, draft = c._forward_parts(FLAT, shape, 4)
    # measured: forwards as predicted, plus 1 s per row outside them
    c.observe_times(4, draft, target, target + draft + 4.0)
    spec = c.timing["spec"]
    assert spec.steps == 1 and spec.overhead == pytest.approx(1.0)
    assert c.choose([1], batch=4) is None  # 1 s per row: drafting no longer pays
    assert c.last is not None and c.last.best_tree_predicted < c.last.target_only
    plain = FLAT.target_cost(1, 4)
    c.observe_times(4, 0.0, plain, plain)  # a plain step exactly as predicted
    assert c.timing["plain"].target_ratio == pytest.approx(1.0)
    assert c.choose([1], batch=4) is None
    # a step whose measured time came with a cost measurement is skipped
    c.curves.measurements += 1
    c.observe_times(4, 0.0, 100 * plain, 100 * plain)
    assert c.timing["plain"].steps == 1
    # a different batch size than the one the choice was made for is not learned either
    c.choose([1], batch=4)
    c.observe_times(2, 0.0, 100 * plain, 100 * plain)
    assert c.timing["plain"].steps == 1


def test_the_target_ratio_per_forward_size_straightens_a_bent_curve() -> None:
    """A stored curve that rises from 4 to 16 tokens (a noisy measurement) where the target
    really costs 0.255 s at every size: one ratio over every size cannot fit chain:1 and
    chain:8 at once, the ratio per forward size fits each size the run has timed -- and the
    choice moves to the longer chain that acceptance 0.94 favours."""
    bent = CostModel(sizes=[1, 2, 4, 8, 16], target=[0.26, 0.26, 0.27, 0.31, 0.34], draft=[0.1] * 5)
    true = 0.255
    m = get_method("ersd")

    def timed(rounds: int) -> TreeChooser:
        c = TreeChooser(AutoTree(profile=[[0.94]], costs=bent), None, None, m, m, 0.0)
        c.choose([1], batch=1)
        for _ in range(rounds):
            for k in range(1, 9):
                c.choose([1], batch=1)
                c.observe_times(1, 0.1 * k, true, true + 0.1 * k, step=TreeShape.chain(k))
        c.choose([1], batch=1)
        return c

    def errors(c: TreeChooser) -> list[float]:
        chains = [TreeShape.chain(k) for k in range(1, 9)]
        return [c._step_time(bent, s, 1) / (true + 0.1 * s.num_nodes) - 1 for s in chains]

    untimed = timed(0)
    assert untimed.last is not None and untimed.last.tree == "chain:3"
    assert max(errors(untimed)) > 0.04  # chain:8's target forward read off the bend
    c = timed(2)
    assert max(abs(e) for e in errors(c)) < 0.02
    assert c.last is not None and c.last.tree == "chain:4"
    spec = c.timing["spec"]
    assert spec.sizes[9, 1][1] == 2 and spec.sizes[9, 1][0] == pytest.approx(
        true / bent.target_cost(9)
    )
    # one ratio over every size (a size's own never weighed in) is off by 2-3% somewhere
    for entry in spec.sizes.values():
        entry[1] = 0
    assert max(abs(e) for e in errors(c)) > 0.05


def test_prefill_steps_are_not_learned_and_auto_explores_after_a_run_of_plain_steps() -> None:
    """Exploration (drafting once although it is predicted not to pay) comes after
    EXPLORE_AFTER plain steps in a row, and only while the time it is predicted to lose keeps
    the run's exploration within EXPLORE_BUDGET of its time so far (a fake clock: the step
    times given to observe_times)."""

    c = chooser(AutoTree(profile=PROFILE, costs=FLAT))
    shape = c.choose([1], batch=1)
    assert shape is not None
    target, draft = c._forward_parts(FLAT, shape, 1)
    # a first step (its target forward includes the prompt) is not learned from
    c.observe_times(1, draft, 50 * target, 60 * target, prefill=True)
    assert c.timing["spec"].steps == 0
    c.observe_times(1, draft, target, target + draft + 0.7)  # 0.7 s outside forwards
    assert c.choose([1], batch=1) is None  # drafting no longer pays (but could, were every
    assert c.last is not None and c.last.can_pay  # drafted token accepted)
    # the run so far (about 6.8 s) leaves no budget for a step predicted to lose ~0.3 s
    decisions = [c.choose([1], batch=1) for _ in range(3 * RULES.explore_after)]
    assert all(d is None for d in decisions) and c.explore_spent == 0.0
    # a longer run (a prefill-like step adds time without being learned from): budget for one
    c.observe_times(1, 0.0, 12.0, 12.0, prefill=True)
    picks = []
    for _ in range(3 * RULES.explore_after):
        d = c.choose([1], batch=1)
        assert c.last is not None
        picks.append((d is not None, c.last.explore, c.last.tree != "none"))
    # one exploring step with the best tree (the plain run was already long enough), then back
    # to the decision the costs favour, and no second one: the budget is spent
    n = 3 * RULES.explore_after - 1
    assert picks == [(True, True, True)] + [(False, False, False)] * n
    assert 0.0 < c.explore_spent <= RULES.explore_budget * c.elapsed


def test_an_untimed_kind_of_step_borrows_the_other_kinds_target_ratio() -> None:
    """While only drafting steps have been timed, the target-only side of the comparison
    borrows their measured/predicted target ratio (one model, one machine: a curve measured in
    other conditions is off for both alike); a timed plain step then speaks for itself."""

    c = chooser(AutoTree(profile=PROFILE, costs=FLAT))
    plain_curve = c._plain_rate(FLAT, 4)
    for _ in range(2):
        shape = c.choose([1], batch=4)
        assert shape is not None
        target, draft = c._forward_parts(FLAT, shape, 4)
        c.observe_times(4, draft, 1.5 * target, 1.5 * target + draft)  # target 1.5x its curve
    assert c.timing["plain"].steps == 0
    want = 4 / (1.5 * FLAT.target_cost(1, 4) + FLAT.overhead_plain * 4)
    assert c._plain_rate(FLAT, 4) == pytest.approx(want) and want < plain_curve
    c._chosen = (FLAT, None, 4)  # a plain step (as a row that did not draft would time it)
    plain = FLAT.target_cost(1, 4)
    c.observe_times(4, 0.0, plain, plain)  # timed: as its curve says
    assert c.timing["plain"].steps == 1 and c._target_ratio("plain") == pytest.approx(1.0)
    assert c._plain_rate(FLAT, 4) == pytest.approx(plain_curve)


def test_a_batch_step_is_costed_by_its_largest_tree_not_by_this_rows_choice() -> None:
    """In a batch the forwards are shared: a row that chose a small tree (or none) must compare
    the step's time with the prediction for the largest tree drafted in it."""
    c = chooser(AutoTree(profile=PROFILE, costs=LINEAR))
    c.choose([1], batch=4)
    big = TreeShape.chain(8)
    target, draft = c._forward_parts(LINEAR, big, 4)
    c.observe_times(4, draft, target, target + draft, step=big)  # as predicted for the big tree
    spec = c.timing["spec"]
    assert spec.steps == 1 and spec.target_ratio == pytest.approx(1.0)
    assert spec.draft_ratio == pytest.approx(1.0)
    c.choose([1], batch=4)
    plain = LINEAR.target_cost(1, 4)
    c.observe_times(4, 0.0, 2 * plain, 2 * plain, step=None)  # no row drafted: a plain step
    assert c.timing["plain"].steps == 1 and c.timing["plain"].target_ratio == pytest.approx(2.0)


def test_step_timing_is_an_exponential_moving_average() -> None:
    from ersd.auto import StepTiming

    t = StepTiming()
    t.update(2.0, 3.0, 0.5)
    assert (t.target_ratio, t.draft_ratio, t.overhead) == (2.0, 3.0, 0.5)  # first step replaces
    t.update(1.0, 1.0, 0.1)
    assert t.target_ratio == pytest.approx(2.0 + RULES.timing_ema * (1.0 - 2.0))
    assert t.overhead == pytest.approx(0.5 + RULES.timing_ema * (0.1 - 0.5))


def test_trees_shrink_as_the_batch_grows_on_a_curve_linear_in_tokens() -> None:
    c = chooser(AutoTree(profile=PROFILE, costs=LINEAR))
    sizes = [nodes(c.choose([1], batch=b)) for b in (1, 2, 4, 8, 16, 64)]
    assert sizes == sorted(sizes, reverse=True), sizes
    assert sizes[0] > sizes[-1]
    # the choice is the smallest candidate within RULES.smaller_tree_within of the best, at every
    # batch size
    for b in (1, 8):
        c.choose([1], batch=b)
        assert c.last is not None
        rates = {
            s.num_nodes: max(
                predict(t, PROFILE, LINEAR, batch=b).tokens_per_second
                for t in c.candidates(PROFILE).values()
                if t.num_nodes == s.num_nodes
            )
            for s in c.candidates(PROFILE).values()
        }
        top = max(rates.values())
        near = [n for n, r in rates.items() if r >= (1 - RULES.smaller_tree_within) * top]
        assert c.last.predicted >= (1 - RULES.smaller_tree_within) * top - 1e-9
        assert nodes(c.choose([1], batch=b)) == min(near)


def test_the_smallest_tree_near_the_best_predicted_rate_is_drafted() -> None:
    """Near its top the predicted rate is flat in the tree's size: of the trees within
    SMALLER_TREE_WITHIN of the best, the smallest is drafted -- and only a tree that beats no
    drafting."""
    c = chooser(AutoTree(profile=PROFILE, costs=LINEAR))
    rates = {
        spec: predict(s, PROFILE, LINEAR).tokens_per_second
        for spec, s in c.candidates(PROFILE).items()
    }
    best = max(rates, key=rates.__getitem__)
    hedged = nodes(c.choose([1, 2]))
    assert c.last is not None and c.last.tree != best  # chain:6 best, chain:4 within 3%
    assert hedged < c.candidates(PROFILE)[best].num_nodes
    assert c.last.predicted >= (1 - RULES.smaller_tree_within) * rates[best]
    off = replace(RULES, smaller_tree_within=0.0)  # off: the best tree itself
    m = get_method("ersd")
    c = TreeChooser(AutoTree(profile=PROFILE, costs=LINEAR), None, None, m, m, 1.0, rules=off)
    c.choose([1, 2])
    assert c.last is not None and c.last.tree == best
    # every tree within 3% of the best but below plain decoding's rate: no drafting, as before
    c = chooser(AutoTree(profile=PROFILE, costs=STEEP))
    assert c.choose([1, 2]) is None and c.last is not None and c.last.tree == "none"


def test_fast_paths_equal_the_theory_library() -> None:
    from ersd.auto import expected_tokens, tunstall_order
    from ersd.theory import expected_block_efficiency_by_depth, optimal_tree_by_depth

    probs = [[0.5, 0.2, 0.1], [0.7, 0.1], [0.3, 0.3, 0.3]]  # per depth, ties included
    order = tunstall_order(probs, 16)
    for k in range(1, 17):
        paths = sorted(order[:k], key=lambda t: (len(t), t))
        assert paths == optimal_tree_by_depth(probs, k)
        shape = TreeShape.from_paths(paths)
        assert expected_tokens(shape, probs) == pytest.approx(
            expected_block_efficiency_by_depth(shape.paths, probs)
        )


def test_online_profile_learns_from_ranks_and_chain_outcomes() -> None:
    ranked = OnlineProfile(ranked=True)
    prior = ranked.depth_probs()[0]
    for _ in range(200):
        ranked.observe_ranks([1, 1, 2])
    probs = ranked.depth_probs()
    assert probs[0][0] > prior[0] and probs[0][0] > 0.95
    assert probs[2][1] > 0.9  # depth 3: rank 2 every time
    chain = OnlineProfile(ranked=False)
    for _ in range(100):
        chain.observe_chain(accepted=1, depth=3)  # depth 1 accepted, depth 2 rejected
    p = chain.depth_probs()
    assert p[0][0] > 0.95 and p[1][0] < 0.1 and p[0][1:].sum() == 0
    assert len(p) == 3  # depth 3 was never reached: the pooled estimate (last entry) applies


def test_a_stored_profile_is_a_prior_weighted_by_the_observations_behind_each_depth() -> None:
    """A deep depth reached in a few easy stretches (all accepted) must not pull the prior up as
    much as the root, observed at every step."""
    stored = [[0.5, 0.2], [1.0, 0.0]]
    weighted = OnlineProfile(ranked=True, prior_probs=stored, prior_trials=[90, 10])
    assert weighted.prior[0] == pytest.approx(0.5 * 0.9 + 1.0 * 0.1)
    assert weighted.prior[1] == pytest.approx(0.2 * 0.9)
    unknown = OnlineProfile(ranked=True, prior_probs=stored)  # no trials stored: equal weights
    assert unknown.prior[0] == pytest.approx(0.75)
    chain = OnlineProfile(ranked=False, prior_probs=stored, prior_trials=[90, 10])
    assert chain.prior[0] == pytest.approx(0.55) and chain.prior[1:].sum() == 0


def test_a_depth_is_shrunk_towards_the_other_depths_not_its_own_observations() -> None:
    """One root rejection moves the root's estimate as far as the prior's weight says (4
    pseudo-observations: 0.85 -> 0.68), not almost twice as far (0.54, pooling it twice)."""
    p = OnlineProfile(ranked=True, prior_probs=[[0.85, 0.08, 0.03]], prior_trials=[200])
    p.observe_ranks([3])
    root, below = p.depth_probs()
    assert root[0] == pytest.approx(4 * 0.85 / 5) and root[2] == pytest.approx((1 + 4 * 0.03) / 5)
    assert below[0] == pytest.approx(4 * 0.85 / 5)  # below the deepest depth: every observation
    p.observe_ranks([1, 1])  # depth 2's estimate leans on the root's observations, not its own
    root, second, _ = p.depth_probs()
    assert second[0] == pytest.approx((1 + 4 * (1 + 4 * 0.85) / 6) / 5)
    assert root[0] == pytest.approx((1 + 4 * (1 + 4 * 0.85) / 5) / 6)


def stretches(after_accept: float, after_reject: float, n: int, seed: int) -> list[bool]:
    """``n`` acceptances as a two-state Markov chain: accepted with ``after_accept`` right after
    an acceptance, with ``after_reject`` right after a rejection (easy and hard stretches)."""
    rng, out, last = random.Random(seed), [], True
    for _ in range(n):
        last = rng.random() < (after_accept if last else after_reject)
        out.append(last)
    return out


def test_acceptance_in_stretches_is_estimated_as_a_markov_chain() -> None:
    """Chain:1 steps in easy and hard stretches (accepted 95% after an acceptance, 20% after a
    rejection; 80% overall): after a full acceptance the root is estimated from that state's
    roots, and the unobserved depths below it as right after an accepted token -- not at the
    roots' mean, which kept the bf16 pair on chain:1 where chain:4 accepted 3.8 tokens per
    call.  After a rejection the root stays the mean (a plain step decided there would observe
    nothing).  Without stretches (the same 80%, independent) both states and the depths below
    estimate the same as before."""
    markov, iid = OnlineProfile(ranked=False), OnlineProfile(ranked=False)
    outcomes = stretches(0.95, 0.2, 400, seed=0)
    mean = sum(outcomes) / len(outcomes)
    last = None
    for accepted in outcomes:
        markov.observe_chain(int(accepted), 1, last)
        last = accepted
    easy, hard, unknown = (
        markov.depth_probs([True]),
        markov.depth_probs([False]),
        markov.depth_probs(),
    )
    assert easy[0][0] > 0.9
    assert hard[0][0] == unknown[0][0] == pytest.approx(mean, abs=0.02)  # every root
    assert len(easy) == 2 and easy[1][0] > 0.9 and unknown[1][0] > 0.9  # below the root
    rng, last = random.Random(1), None
    for _ in range(400):
        accepted = rng.random() < mean
        iid.observe_chain(int(accepted), 1, last)
        last = accepted
    easy, hard = iid.depth_probs([True]), iid.depth_probs([False])
    assert abs(easy[0][0] - hard[0][0]) < 0.1
    assert easy[1][0] == pytest.approx(mean, abs=0.05)
    # a batch's root is the mean over its rows' states (expected tokens are linear in it)
    both = markov.depth_probs([True, False])[0]
    assert both == pytest.approx(
        (markov.depth_probs([True])[0] + markov.depth_probs([False])[0]) / 2
    )


def test_auto_drafts_deeper_in_an_easy_stretch_than_after_a_rejection() -> None:
    """The chooser keeps each row's state from its last step: with a draft a third of the
    target's forward (the bf16 pair's), the same observations make it draft a longer chain
    right after a full acceptance than after a rejection (where it still drafts); independent
    outcomes at the same rate give the same tree in both states."""
    picks = []
    for outcomes in (stretches(0.95, 0.2, 200, seed=1), None):
        c = chooser(AutoTree(costs=THIRD), method="specinfer")
        rng = random.Random(2)
        for i in range(200):
            accepted = outcomes[i] if outcomes is not None else rng.random() < 0.8
            c.observe([], int(accepted), 1)
        c.observe([], 1, 1)
        easy = nodes(c.choose([1, 2]))
        c.observe([], 0, 1)
        hard = nodes(c.choose([1, 2]))
        picks.append((easy, hard))
    (easy, hard), (iid_easy, iid_hard) = picks
    assert easy >= 4 and easy > hard >= 1
    assert iid_easy == iid_hard >= 1
    # in a batch, each row's own state: one row after a rejection drafts a shorter chain
    c = chooser(AutoTree(costs=THIRD), method="specinfer")
    for i, accepted in enumerate(stretches(0.95, 0.2, 200, seed=1)):
        c.observe([], int(accepted), 1, row="a" if i % 2 else "b")
    c.observe([], 1, 1, row="a")
    c.observe([], 1, 1, row="b")
    both_easy = nodes(c.choose([1, 2], batch=2, rows=[("a", 50), ("b", 50)]))
    c.observe([], 0, 1, row="b")
    one_hard = nodes(c.choose([1, 2], batch=2, rows=[("a", 50), ("b", 50)]))
    assert both_easy > one_hard


def test_an_observation_below_a_full_acceptance_counts_at_its_depth() -> None:
    """``observe_beyond``: the bonus token one depth below a fully accepted path, at its depth
    (a rank for ERSD, accepted or not for the other methods at temperature 0); not a step.
    Auto then drafts deeper in an easy stretch of short chains than it does without those
    observations; a method whose acceptance is random at T > 0 learns nothing from them."""
    ranked = OnlineProfile(ranked=True)
    for _ in range(50):
        ranked.observe_ranks([1], True)
        ranked.observe_beyond(2, 3)
    assert ranked.trials == [50, 50] and ranked.steps == 50 and ranked.counts[1][2] == 50
    assert ranked.depth_probs([True])[1][2] > 0.6  # depth 2: rank 3 (0.05 from the prior)
    chain = OnlineProfile(ranked=False)
    chain.observe_beyond(2, 2)
    chain.observe_beyond(3, 1)
    chain.observe_beyond(1, 1)  # the root is never below a path: ignored
    assert chain.trials == [0, 1, 1] and chain.counts[1].sum() == 0 and chain.counts[2][0] == 1

    def after_easy_stretch(beyond: bool) -> int:
        c = chooser(AutoTree(costs=THIRD))
        for _ in range(6):
            c.observe([1], 1, 1)
            if beyond:
                c.observe_beyond(2, 1)
        return nodes(c.choose([1, 2]))

    assert after_easy_stretch(True) > after_easy_stretch(False) >= 1
    random_accepts = TreeChooser(AutoTree(costs=THIRD), None, None, *[get_method("sd")] * 2, 1.0)
    assert not random_accepts.learns_beyond and chooser(AutoTree(costs=THIRD)).learns_beyond


@pytest.mark.parametrize("method, temperature", [("ersd", 1.0), ("specinfer", 0.0)])
def test_the_bonus_below_a_fully_accepted_chain_is_observed_as_drafting_it_would_have(
    pair, monkeypatch, method: str, temperature: float
) -> None:
    """After a step whose chain was accepted to its end, the next step's first draft forward
    gives the draft's row at the bonus token too: auto learns the rank that drafting one depth
    deeper would have observed (ERSD: the bonus token's rank in the draft's race; temperature
    0: whether it is the draft's top token).  Every observation equals that rank re-derived from
    the final text (its race key and a fresh draft forward), and not all are rank 1."""
    from ersd.probs import SamplingParams, logits_to_probs
    from ersd.race import STREAM_RACE, RaceNoise, extend_key_many, race_rank, root_key

    # chains only: a leaf is the chain's end
    monkeypatch.setattr(ersd.auto.chooser, "TREE_SIZES", ())
    monkeypatch.setattr(TreeChooser, "observe_times", lambda self, *a, **k: None)
    seen: list[tuple[int, int | None]] = []
    real = TreeChooser.observe_beyond

    def spy(self: TreeChooser, depth: int, rank: int | None) -> None:
        seen.append((depth, rank))
        real(self, depth, rank)

    monkeypatch.setattr(TreeChooser, "observe_beyond", spy)
    target, draft = pair
    prompt, seed = [4, 5], 3
    res = ersd.generate(
        target,
        draft,
        prompt,
        max_new_tokens=160,
        seed=seed,
        temperature=temperature,
        method=method,
        tree=AutoTree(costs=THIRD),
    )
    text, noise, params = res.tokens, RaceNoise(V), SamplingParams(temperature)
    expected: list[tuple[int, int | None]] = []
    at, bonus = 0, None
    for s in res.steps:
        if bonus is not None and s.num_draft_tokens:  # this step's draft saw the last bonus
            depth, pos = bonus
            logits = draft.logits([prompt + text[:pos]])[0]
            if method == "ersd":
                key = extend_key_many(root_key(seed, prompt), text[:pos])
                q = logits_to_probs(logits, params)
                rank: int | None = race_rank(q, noise.exponentials(key, STREAM_RACE), text[pos])
                rank = rank if rank <= 8 else None
            else:
                rank = 1 if int(logits.argmax()) == text[pos] else None
            expected.append((depth, rank))
        bonus = None
        if s.num_draft_tokens and s.num_accepted == s.tree_depth < len(s.tokens):
            bonus = (s.num_accepted + 1, at + s.num_accepted)
        at += len(s.tokens)
    assert seen == expected
    assert len(seen) >= 5 and any(r != 1 for _, r in seen), seen


def test_non_ersd_methods_choose_among_chains_only() -> None:
    c = chooser(AutoTree(profile=PROFILE, costs=FLAT), method="specinfer")
    assert all(s.is_chain for s in c.candidates(PROFILE).values())


# --- generation ---------------------------------------------------------------------------------


def test_steep_curve_generates_without_drafting_and_says_so(pair) -> None:
    target, draft = pair
    res = ersd.generate(
        target, draft, [1, 2], max_new_tokens=12, seed=4, tree=AutoTree(costs=STEEP)
    )
    assert res.target_calls == len(res.tokens) == 12 and res.num_draft_tokens == 0
    assert res.auto_choices == {"none": 12} and res.tree == "auto"
    assert res.auto_summary is not None and res.auto_summary.startswith("auto chose: none in 12/12")
    assert "target-only vs" in res.auto_summary and "auto chose" in res.summary()
    assert res.stats()["auto_choices"] == {"none": 12}


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_ersd_auto_gives_the_target_only_tokens(pair, temperature: float) -> None:
    target, draft = pair
    kw = dict(max_new_tokens=40, seed=7, temperature=temperature, eos_token_id=3)
    plain = ersd.generate(target, None, [4, 5], **kw)
    fixed = ersd.generate(target, draft, [4, 5], tree="multi:2x3", **kw)
    auto = ersd.generate(target, draft, [4, 5], tree=AutoTree(costs=FLAT), **kw)
    assert auto.tokens == plain.tokens == fixed.tokens
    # it drafts (the online correction may stop it later: toy forwards take microseconds, so
    # the engine's own time outside them decides once a plain step was timed too)
    assert auto.num_draft_tokens > 0 and auto.auto_choices.get("none", 0) < len(auto.steps)
    assert auto.target_calls < plain.target_calls
    # measured costs (the default): the measurement forwards stay out of the sequences
    measured = ersd.generate(target, draft, [4, 5], tree="auto", **kw)
    assert measured.tokens == plain.tokens and len(measured.auto_choices) >= 1
    assert not any("ersd" in name for name in vars(target))  # nothing written on the model
    # a CurveCache shared through AutoTree(costs=...) is measured into once, for every call
    curves = CurveCache()
    shared = AutoTree(costs=curves)
    ersd.generate(target, draft, [4, 5], tree=shared, **kw)
    measured_once = curves.measurements
    again = ersd.generate(target, draft, [4, 5], tree=shared, **kw)
    assert measured_once > 0 and curves.measurements == measured_once
    assert again.tokens == plain.tokens


def test_online_profile_grows_the_trees_for_a_perfect_draft(pair, monkeypatch) -> None:
    # the choice rests on LINEAR and the observed ranks alone: the toys' real forward times
    # (the online timing correction) once made it fail on a busy machine
    monkeypatch.setattr(TreeChooser, "observe_times", lambda self, *a, **k: None)
    target, _ = pair
    perfect = mixed_draft(target, table_model(V, seed=1), 0.0)  # the target itself
    kw = dict(max_new_tokens=120, seed=2, temperature=1.0)
    res = ersd.generate(target, perfect, [1], tree=AutoTree(costs=LINEAR), **kw)
    assert res.tokens == ersd.generate(target, None, [1], **kw).tokens

    def size(choice: dict) -> int:
        return 0 if choice["tree"] == "none" else int(choice["tree"].split(":")[1])

    first, last = res.steps[0].choice, res.steps[-2].choice
    assert first is not None and last is not None and first["batch"] == 1
    # the prior decides the first step; every rank observed is 1, so the trees grow
    assert size(last) > size(first), (first, last)


def test_generate_batch_auto_is_batch_invariant(pair) -> None:
    target, draft = pair
    prompts = [[1, 2], [3], [4, 5, 6, 7], [1, 2], [9, 8, 7]]
    auto = AutoTree(costs=LINEAR)
    batch = ersd.generate_batch(
        target, draft, prompts, seeds=5, max_new_tokens=20, tree=auto, eos_token_id=5
    )
    for i, (prompt, res) in enumerate(zip(prompts, batch, strict=True)):
        solo = ersd.generate(
            target,
            draft,
            prompt,
            seed=derive_seed(5, i),
            max_new_tokens=20,
            tree=auto,
            eos_token_id=5,
        )
        plain = ersd.generate(
            target, None, prompt, seed=derive_seed(5, i), max_new_tokens=20, eos_token_id=5
        )
        assert res.tokens == solo.tokens == plain.tokens, f"prompt {i}"
        assert res.tree == "auto"
    assert batch[0].steps[0].choice["batch"] == len(prompts)
    # the trees follow measured step times (they may differ between runs), the text never does
    again = ersd.generate_batch(
        target, draft, prompts, seeds=5, max_new_tokens=20, tree=auto, eos_token_id=5
    )
    assert [r.tokens for r in again] == [r.tokens for r in batch]


def test_rows_with_the_same_auto_settings_decide_together(pair) -> None:
    """In a batch, rows whose auto settings match share one chooser, so every step drafts one
    tree for all of them (a mixed step pays for the widest tree without each row drafting it);
    rows with other settings (here another temperature) keep their own."""
    target, draft = pair
    auto = AutoTree(costs=LINEAR)
    engine = ersd.BatchEngine(target, draft)
    same = [
        engine.add(p, max_new_tokens=16, seed=i, tree=auto) for i, p in enumerate([[1], [2, 3]])
    ]
    same.append(engine.add([4, 5, 6], max_new_tokens=16, seed=7, tree=auto))
    other = engine.add([1, 2], max_new_tokens=16, seed=1, tree=auto, temperature=0.5)
    rows = engine._rows
    assert len({id(rows[r].settings.chooser) for r in same}) == 1
    assert rows[other].settings.chooser is not rows[same[0]].settings.chooser
    trees: dict[int, list[str]] = {r: [] for r in [*same, other]}
    for _ in range(40):
        if not len(engine):
            break
        for rid, rec, _done in engine.step():
            trees[rid].append(rec.choice["tree"])
    assert not len(engine)
    n = min(len(trees[r]) for r in same)
    assert n >= 3
    for i in range(n):  # the steps all three rows took part in: one tree each time
        assert len({trees[r][i] for r in same}) == 1, [trees[r][i] for r in same]


def test_calibration_file_gives_profile_and_costs(tmp_path, pair) -> None:
    target, draft = pair
    prof = RankProfile.from_ranks([1] * 80 + [2] * 10 + [3] * 10, vocab_size=V)
    path = tmp_path / "calib.json"
    data = {
        "format": CALIBRATION_FORMAT,
        "version": 1,
        "profiles": {"1.0": prof.to_dict()},
        "costs": STEEP.to_dict(),
    }
    path.write_text(json.dumps(data))
    res = ersd.generate(target, draft, [1], max_new_tokens=6, tree=f"auto@{path}")
    assert res.auto_choices == {"none": 6} and res.tree == f"auto@{path}"
    c = chooser(parse_auto(f"auto@{path}"))
    assert c.online is None and c.costs == STEEP


# --- bad input ------------------------------------------------------------------------------------


def test_auto_grammar_and_bad_input(tmp_path, pair) -> None:
    target, draft = pair
    assert parse_auto("auto") == AutoTree() and parse_auto(" AUTO @ x.json ").profile == "x.json"
    assert parse_auto("chain:4") is None
    with pytest.raises(ersd.InvalidTreeSpecError, match="not one fixed shape"):
        parse_tree("auto")
    with pytest.raises(ersd.InvalidTreeSpecError, match="auto@FILE"):
        parse_auto("auto:3")
    with pytest.raises(ersd.InvalidTreeSpecError, match="max_nodes"):
        AutoTree(max_nodes=0)
    missing = tmp_path / "nope.json"
    with pytest.raises(ersd.ErsdError, match="does not exist"):
        ersd.generate(target, draft, [1], max_new_tokens=4, tree=f"auto@{missing}")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ersd.ErsdError, match="not valid JSON"):
        ersd.generate_batch(target, draft, [[1], [2]], max_new_tokens=4, tree=f"auto@{bad}")
    with pytest.raises(ersd.InvalidTreeSpecError, match="rank profile"):
        ersd.generate(target, draft, [1], max_new_tokens=4, tree=AutoTree(profile=[[1.5, 0.2]]))
    with pytest.raises(ersd.InvalidTreeSpecError, match="not one fixed shape"):
        parse_tree(AutoTree())
    with pytest.raises(ersd.ErsdError, match="cost model"):
        ersd.generate(target, draft, [1], max_new_tokens=4, tree=AutoTree(costs={"sizes": [1]}))


def test_cli_tree_auto_on_toy_models() -> None:
    args = ["generate", "--target", "toy", "--draft", "toy-draft", "--tree", "auto"]
    args += ["--max-new-tokens", "16", "--seed", "1", "--compare", "--json", "ab"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["tree"] == "auto" and out["identical_to_target_only"] is True
    assert sum(out["auto_choices"].values()) == out["target_calls"]
    assert out["auto_summary"].startswith("auto chose:")
    res = CliRunner().invoke(main, [*args[:-2], "ab"])  # the human-readable statistics
    assert res.exit_code == 0, res.output
    assert "auto chose:" in res.stdout


# --- exactness: the choice adapts to each row's history, the law stays the target's ----------

#: chain:1 pays over no drafting iff P(accept) > 0.55: the prior (0.6) drafts, one rejection
#: (estimate 0.48) stops drafting, so the trees depend on each row's own past
#: (per row at any batch size: B rows cost B times one row, so the batch does not matter here)
_ROW = [0.1, 0.155, 0.30, 0.6]
ADAPTIVE = CostModel(
    sizes=SIZES,
    target=_ROW,
    draft=[0.0] * 4,
    batch_sizes=[1, 64],
    target_batch=[_ROW, [64 * t for t in _ROW]],
    draft_batch=[[0.0] * 4, [0.0] * 4],
)


def auto_law_test(method, setting: str, draft: str, monkeypatch):
    """The law of ``tree="auto"``'s text over N seeded rows.  The online timing correction is
    switched off (the choice then rests on ADAPTIVE and the observed ranks alone): with it, the
    toy models' real forward times steered the choice, and on a fast CPU the mutant drafted so
    little that half the runs did not reject it."""
    from tests.exactness_util import config_seed, exact_law, gof_test
    from tests.test_exactness import DRAFTS, LENGTH, PROMPT, SETTINGS, TARGET, N

    monkeypatch.setattr(TreeChooser, "observe_times", lambda self, *a, **k: None)

    kw = SETTINGS[setting]
    law = exact_law(TARGET, PROMPT, LENGTH, kw)
    base = config_seed("auto", getattr(method, "name", method), setting, draft)
    results = ersd.generate_batch(
        TARGET.model(),
        DRAFTS[draft].model(),
        [PROMPT] * N,
        seeds=list(range(base, base + N)),
        max_new_tokens=LENGTH,
        method=method,
        tree=AutoTree(costs=ADAPTIVE, max_nodes=4),
        max_batch_size=64,
        **kw,
    )
    histories = {tuple(s.choice["tree"] for s in r.steps) for r in results}
    return gof_test(Counter(tuple(r.tokens) for r in results), law), histories


@pytest.mark.parametrize(
    ("method", "setting", "draft"), [("sd", "T1.0", "mild"), ("ersd", "T0.6", "bad")]
)
def test_auto_keeps_the_target_law(method: str, setting: str, draft: str, monkeypatch) -> None:
    from tests.exactness_util import ALPHA

    res, histories = auto_law_test(method, setting, draft, monkeypatch)
    assert len(histories) >= 2, histories  # the trees really adapt to the rows' histories
    assert res.pvalue >= ALPHA, f"{method} auto {setting} {draft}: {res}"


def test_auto_mutant_is_rejected(monkeypatch) -> None:
    from tests.exactness_util import ALPHA
    from tests.test_exactness import SDNoResidual

    res, _ = auto_law_test(SDNoResidual(), "T1.0", "mild", monkeypatch)
    assert res.pvalue < ALPHA, f"mutant not rejected through tree='auto': {res}"


@pytest.mark.parametrize(
    ("method", "temperature"), [("ersd", 1.0), ("ersd", 0.0), ("specinfer", 1.0)]
)
def test_the_candidates_are_kept_while_the_estimate_is_unchanged(method, temperature) -> None:
    """The candidate trees and their expected tokens are computed again only after an
    observation that changes the rank estimate (not after a plain step's timing): the decisions
    are those of a chooser that recomputes them at every step, through stretches of high and
    low acceptance that flip them, with the depth below full acceptances observed too."""
    # drafting pays only at a high acceptance: the stretches of none accepted turn it off
    costs = CostModel(sizes=SIZES, target=[0.05, 0.055, 0.06, 0.07], draft=[0.03] * 4)
    m = get_method(method)

    def make() -> TreeChooser:
        return TreeChooser(AutoTree(costs=costs), None, None, m, m, temperature, horizon=400)

    kept, fresh = make(), make()
    computed = []
    inner = kept.candidates
    kept.candidates = lambda probs: computed.append(1) or inner(probs)  # type: ignore[method-assign]
    rng = random.Random(7)
    context = list(range(50))
    decisions: list[tuple[str, str, float]] = []
    for i in range(240):
        accept = 0.95 if (i // 60) % 2 == 0 else 0.0
        fresh._shapes = None  # recomputed at every step
        shapes = [c.choose(context) for c in (kept, fresh)]
        assert kept.last is not None and fresh.last is not None
        assert kept.last.to_dict() == fresh.last.to_dict()
        decisions.append((kept.last.tree, str(kept.last.best_tree), kept.last.predicted))
        shape = shapes[0]
        depth = 0 if shape is None else shape.depth
        ranks: list[int] = []
        while len(ranks) < depth:
            ranks.append(1 if rng.random() < accept else rng.randint(2, 4))
            if ranks[-1] != 1:
                break
        accepted = next((j for j, r in enumerate(ranks) if r != 1), len(ranks))
        draft = 0.03 * depth
        step = costs.target_cost(1 if shape is None else shape.num_nodes + 1, 1) + draft
        beyond = None  # the bonus token's rank one depth below a full acceptance, some steps
        if depth and accepted == depth and rng.random() < 0.5:
            beyond = 1 if rng.random() < accept else 3
        for c in (kept, fresh):  # both see the same observations
            if beyond is not None:
                c.observe_beyond(depth + 1, beyond)
            c.observe(ranks if c.ranked else [], accepted, depth)
            c.observe_times(1, draft, step - draft, step, prefill=i == 0)
        context += [0] * (accepted + 1)
    trees = {t for t, _, _ in decisions}
    assert "none" in trees and len(trees) > 1  # the stretches flip the decision
    drafted = sum(t != "none" for t, _, _ in decisions)
    assert len(computed) < len(decisions) - 20  # plain steps reuse the candidates
    assert len(computed) >= drafted  # every drafting step's observation recomputes them
    if kept.learns_beyond:  # an observation below a full acceptance alone changes them too
        before = kept.predicted_shapes()["chain:4"][1]
        for _ in range(5):
            kept.observe_beyond(3, 3)  # depth 3 rejected
        assert kept.predicted_shapes()["chain:4"][1] < before
