"""One table row per rule of ``tree="auto"`` (``docs/auto-tree.md``), on the pure policy
(:func:`ersd.auto.decide`) and the observation state (:mod:`ersd.auto.observe`): inputs that
trigger the rule, the decision expected, and the same inputs with only that rule switched off
(``replace(RULES, ...)``) deciding otherwise -- so each row shows that its rule, and no other,
decides.  Nothing is patched: no clock, no file, no model."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ersd.auto import (
    RULES,
    Candidate,
    OnlineProfile,
    RunState,
    StepTiming,
    TreeChooser,
    decide,
)
from ersd.costs import DEFAULT_SIZES, CostModel
from ersd.methods import get_method
from ersd.tree import AutoTree, TreeShape


def chain(k: int, tokens: float, seconds: float, observed: int = 0) -> Candidate:
    """chain:k predicted to emit ``tokens`` (over the batch) in ``seconds``, its depths'
    estimates resting on at least ``observed`` observations."""
    return Candidate(f"chain:{k}", TreeShape.chain(k), tokens, seconds, observed)


#: drafting's rate 20 against plain's 10 (a clear lead), 0.8x (behind)
LEAD = [chain(2, 2.4, 0.12)]
BEHIND = [chain(1, 1.2, 0.15)]  # ceiling 2 / 0.15 = 13.3 > 10: drafting could pay
HOPELESS = [chain(1, 1.9, 0.25)]  # ceiling 2 / 0.25 = 8 < 10 * 0.95: it cannot
LONG = RunState(run_seconds=100.0)  # a run long enough for any exploration budget

# (rule, candidates, plain, state, expected tree, expected why, the rule off, tree then)
CASES: list[tuple[str, list[Candidate], float, RunState, str, str, dict[str, Any], str]] = [
    ("best", LEAD, 10.0, LONG, "chain:2", "best predicted rate", {}, "chain:2"),
    ("best", BEHIND, 10.0, LONG, "none", "plain decoding predicted faster", {}, "none"),
    (
        "smaller_tree_within",
        [chain(2, 2.0, 0.1), chain(4, 3.0, 0.146)],  # 20 and 20.5 tokens/s
        10.0,
        LONG,
        "chain:2",
        "best predicted rate",
        {"smaller_tree_within": 0.0},
        "chain:4",
    ),
    (
        "trusted_after",  # the same two trees, every depth of both observed 8 times
        [chain(2, 2.0, 0.1, observed=8), chain(4, 3.0, 0.146, observed=8)],
        10.0,
        LONG,
        "chain:4",
        "best predicted rate",
        {"trusted_after": float("inf")},
        "chain:2",
    ),
    (
        "cannot_pay",  # a run of plain steps would explore, were drafting not hopeless
        HOPELESS,
        10.0,
        replace(LONG, plain_run=100),
        "none",
        "cannot pay",
        {"cannot_pay": False},
        "chain:1",
    ),
    (
        "batch_start_margin",  # 8 rows: drafting predicted 5% faster, the draft not started
        [chain(1, 8.4, 0.1)],
        80.0,
        replace(LONG, batch=8),
        "none",
        "batch start",
        {"batch_start_margin": 0.0},
        "chain:1",
    ),
    (
        "prefill_pays_off",  # 20 vs 10 tokens/s, 4 tokens left: 0.2 s saved, a 1 s catch-up
        LEAD,
        10.0,
        replace(LONG, catchup_seconds=1.0, tokens_left=4.0),
        "none",
        "catch-up does not pay",
        {"prefill_pays_off": False},
        "chain:2",
    ),
    (
        "explore_after",  # 16 plain steps in a row: draft the best tree once
        BEHIND,
        10.0,
        replace(LONG, plain_run=16),
        "chain:1",
        "explore",
        {"explore_after": 10**9},
        "none",
    ),
    (
        "explore_budget",  # the same exploration, predicted to lose 0.03 s of a 1 s run
        BEHIND,
        10.0,
        RunState(plain_run=16, run_seconds=1.0),
        "none",
        "plain decoding predicted faster",
        {"explore_budget": 0.05},
        "chain:1",
    ),
]


@pytest.mark.parametrize(
    ("rule", "cands", "plain", "state", "tree", "why", "off", "tree_off"),
    CASES,
    ids=[f"{c[0]}-{c[4]}" for c in CASES],
)
def test_each_rule_decides_its_case(rule, cands, plain, state, tree, why, off, tree_off) -> None:
    d = decide(cands, plain, state)
    assert (d.spec, d.shape is None) == (tree, tree == "none"), d
    assert why in d.why, d
    assert decide(cands, plain, state, replace(RULES, **off)).spec == tree_off


def test_trusted_depths_keep_the_margin_where_the_deep_estimate_is_thin() -> None:
    """The margin still picks the smaller tree while the larger one's deepest depth has fewer
    than ``trusted_after`` observations, and a trusted smaller tree is not given up for a
    larger one within the margin either; a chooser reports the fewest observations behind a
    depth's estimate (0 for a depth never observed)."""
    n = int(RULES.trusted_after)
    thin = [chain(2, 2.0, 0.1, observed=n), chain(4, 3.0, 0.146, observed=n - 1)]
    assert decide(thin, 10.0, LONG).spec == "chain:2"
    faster_small = [chain(2, 2.06, 0.1, observed=n), chain(4, 3.0, 0.146, observed=n)]
    assert decide(faster_small, 10.0, LONG).spec == "chain:2"  # 20.6 > 20.5 tokens/s
    trusted = [chain(2, 2.0, 0.1, observed=n), chain(4, 3.0, 0.146, observed=n)]
    assert decide(trusted, 10.0, LONG).spec == "chain:4"
    batch = replace(LONG, batch=8, ever_drafted=True)  # pooled rows: the margin holds
    assert decide(trusted, 10.0, batch).spec == "chain:2"
    costs = CostModel(sizes=[1, 2, 4, 8], target=[0.1] * 4, draft=[0.01] * 4)
    c = TreeChooser(AutoTree(costs=costs), None, None, get_method("ersd"), None, 0.0)
    for _ in range(3):
        c.observe([], 2, 4)  # 4 drafted, 2 accepted: depths 1-3 observed, depth 4 not
    assert [c.observed(d) for d in (1, 3, 4)] == [3, 3, 0]


def test_trusted_depths_take_a_chooser_on_fully_agreeing_text_to_its_deepest_chain() -> None:
    """Every draft accepted, chain:8 predicted ~2% above chain:7: the 3% margin alone keeps the
    chooser on chain:7 for good (depth 8 is observed only below a full chain:7, once a step);
    with trusted depths it moves to chain:8 once depth 8 has ``trusted_after`` observations."""
    sizes = list(DEFAULT_SIZES)
    costs = CostModel(
        sizes=sizes,
        target=[0.14 + 0.02 * (n - 1) for n in sizes],
        draft=[0.03] * len(sizes),
        overhead=0.0,
        overhead_plain=0.0,
    )

    def depths(rules: Any) -> list[tuple[int, int]]:
        m = get_method("ersd")
        ch = TreeChooser(AutoTree(costs=costs), None, None, m, None, 0.0, rules=rules)
        out = []
        for i in range(20):
            shape = ch.choose(list(range(50 + 9 * i)), 1)
            k = shape.depth if shape is not None else 0
            ch.observe([], k, k)  # all k drafts accepted
            if k:
                ch.observe_beyond(k + 1, 1)  # and the bonus below them agreed too
            out.append((k, ch.observed(8)))
        return out

    on = depths(RULES)
    off = depths(replace(RULES, trusted_after=float("inf")))
    assert [k for k, _ in off[-8:]] == [7] * 8
    first8 = next(i for i, (k, _) in enumerate(on) if k == 8)
    assert on[first8 - 1][1] >= RULES.trusted_after > on[first8 - 2][1]
    assert all(k == 8 for k, _ in on[first8:])


def test_the_batch_start_margin_holds_back_only_a_batch_whose_draft_has_not_started() -> None:
    cands, state = [chain(1, 8.4, 0.1)], replace(LONG, batch=8)
    assert decide(cands, 80.0, state).spec == "none"
    assert decide(cands, 80.0, replace(state, ever_drafted=True)).spec == "chain:1"
    assert decide([chain(1, 1.05, 0.1)], 10.0, replace(state, batch=1)).spec == "chain:1"
    assert decide([chain(1, 8.8, 0.1)], 80.0, state).spec == "chain:1"  # 10% faster


def test_exploration_reports_what_it_loses_and_counts_the_drafts_catch_up() -> None:
    """An exploring step loses its step time, plus the draft's catch-up, less the plain time of
    the same tokens; the budget counts what earlier explorations lost."""
    d = decide(BEHIND, 10.0, replace(LONG, plain_run=16))
    assert d.explore and d.lost == pytest.approx(0.15 - 1.2 / 10.0)
    caught = decide(BEHIND, 10.0, replace(LONG, plain_run=16, catchup_seconds=0.5))
    assert caught.explore and caught.lost == pytest.approx(0.5 + 0.15 - 1.2 / 10.0)
    spent = replace(LONG, plain_run=16, explore_spent=2.0 - 0.02)  # the budget is 2 s
    assert decide(BEHIND, 10.0, spent).spec == "none"
    assert not decide(HOPELESS, 10.0, replace(LONG, plain_run=16)).explore  # cannot pay


def test_the_policy_is_a_function_of_its_arguments() -> None:
    """No hidden state: the same arguments give the same decision, whatever was decided
    before, and the arguments are not changed."""
    state = replace(LONG, plain_run=16)
    first = decide(BEHIND, 10.0, state)
    for cands in (LEAD, HOPELESS):
        decide(cands, 10.0, state)
    assert decide(BEHIND, 10.0, state) == first and state.plain_run == 16


# --- the observation rules ---------------------------------------------------------------------


def test_prior_weight_is_the_pseudo_observations_behind_an_estimate() -> None:
    """One rejected root moves P(accept) from the prior's 0.6 to (0 + W · 0.6) / (1 + W)."""
    for w in (RULES.prior_weight, 1.0):
        p = OnlineProfile(False, rules=replace(RULES, prior_weight=w))
        p.observe_chain(0, 1)
        assert p.depth_probs()[0][0] == pytest.approx(w * 0.6 / (1 + w))


def test_markov_root_estimates_the_root_after_a_full_acceptance_from_that_state() -> None:
    """Roots after a full acceptance always accepted, the others always rejected: the root's
    estimate for a row in state True is far above the estimate over all roots -- and a chooser
    with the rule off decides every row on the latter."""
    p = OnlineProfile(False)
    for _ in range(20):
        p.observe_chain(1, 1, state=True)
        p.observe_chain(0, 1, state=False)
    assert p.depth_probs([True])[0][0] > p.depth_probs([None])[0][0] + 0.3
    m = get_method("ersd")
    costs = CostModel(sizes=[1, 2, 4, 8], target=[0.1] * 4, draft=[0.01] * 4)
    on = TreeChooser(AutoTree(costs=costs), None, None, m, None, 0.0)
    off = TreeChooser(
        AutoTree(costs=costs), None, None, m, None, 0.0, rules=replace(RULES, markov_root=False)
    )
    for c in (on, off):
        c.online = p
        c.observe([], 1, 1)  # this row's last step: one draft, accepted (state True)
    assert on._states(None) == [True] and off._states(None) == [None]


def test_timing_ema_and_size_prior_steps() -> None:
    """The step-time correction is an EMA of weight timing_ema after the first step; a forward
    size's own ratio is shrunk towards the all-sizes ratio by size_prior_steps pseudo-steps."""
    t = StepTiming()
    t.update(2.0, 1.0, 0.5, (3, 1))
    t.update(1.0, 1.0, 0.1, (5, 1))
    assert t.target_ratio == pytest.approx(2.0 + RULES.timing_ema * (1.0 - 2.0))
    own, prior = 2.0, RULES.size_prior_steps
    assert t.target_at((3, 1)) == pytest.approx((own + prior * t.target_ratio) / (1 + prior))
    assert t.target_at((9, 1)) == t.target_ratio  # a size not timed: the all-sizes ratio
    flat = StepTiming(rules=replace(RULES, size_prior_steps=1e9))
    flat.update(2.0, 1.0, 0.5, (3, 1))
    flat.update(1.0, 1.0, 0.1, (5, 1))
    assert flat.target_at((3, 1)) == pytest.approx(flat.target_ratio)


def test_row_factors_a_slow_row_keeps_the_batch_plain() -> None:
    """A batch is done when its slowest row is: one row that accepts nothing makes drafting
    lose over the rest of the run, so auto decodes plain; with the rows' rule off it drafts on
    the pooled acceptance."""
    flat = CostModel(
        sizes=[1, 2, 4, 8],
        target=[0.2] * 4,
        draft=[0.1] * 4,
        batch_sizes=[1, 8],
        target_batch=[[0.2] * 4, [0.2] * 4],
        draft_batch=[[0.1] * 4, [0.1] * 4],
    )
    m = get_method("ersd")
    rows = [(k, 96) for k in range(8)]
    picks = {}
    for name, rules in (("on", RULES), ("off", replace(RULES, row_factors=False))):
        rules = replace(rules, batch_start_margin=0.0)
        c = TreeChooser(
            AutoTree(profile=[[0.9]] * 8, costs=flat), None, None, m, m, 1.0, rules=rules
        )
        first = c.choose([1, 2, 3], 8, rows=rows)
        assert first is not None
        for _ in range(10):
            for k, _ in rows:
                c.observe([1] * first.depth, 0 if k == 0 else first.depth, first.depth, row=k)
        picks[name] = c.choose([1, 2, 3], 8, rows=rows)
    assert picks["on"] is None and picks["off"] is not None


def test_the_rule_table_lists_every_rule() -> None:
    """docs/auto-tree.md's rule table names every constant of Rules (and the rules removed on
    the replay as removed), so the table and the code cannot drift apart."""
    from dataclasses import fields
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "auto-tree.md").read_text()
    table = doc[doc.index("## The rules, one by one") :]
    table = table[: table.index("\n## ", 3)]
    for f in fields(RULES):
        assert f"`{f.name}`" in table, f"{f.name} is missing from docs/auto-tree.md's rule table"
    for gone in ("cannot_pay_recheck", "explore_plain_after", "stale_decay"):
        assert f"`{gone}`" in table and not hasattr(RULES, gone)


def test_the_drafts_catch_up_is_repaid_over_the_tokens_left_not_one_step() -> None:
    """20 vs 10 tokens/s saves 0.05 s a token: a 1 s catch-up pays over 21 tokens, not 19; a
    draft already fed (no catch-up) or a run without a horizon drafts at once."""
    run = replace(LONG, catchup_seconds=1.0)
    assert decide(LEAD, 10.0, replace(run, tokens_left=21.0)).spec == "chain:2"
    assert decide(LEAD, 10.0, replace(run, tokens_left=19.0)).spec == "none"
    assert decide(LEAD, 10.0, replace(run, tokens_left=19.0, catchup_seconds=0.0)).spec == "chain:2"
    assert decide(LEAD, 10.0, run).spec == "chain:2"
