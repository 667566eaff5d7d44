"""Dynamic trees for the baselines (SD, SpecInfer, SpecTr), grown from the draft's confidence
(``ersd.drafting.confidence``, issue 16 item 3).

* exactness: the sequence law through the statistical suite (chi-square at alpha = 1e-4,
  N = 3000, as tests/test_exactness.py) with ``tree="dynamic:K[@D]"``; two broken policies must be
  rejected by the same test: one that deduplicates the draws (children no longer i.i.d.) and one
  that stops drawing once the draft's favourite token is drawn (exact for SpecInfer, whose
  verification is sequential, but not for SpecTr, whose ``rho`` needs ``K`` fixed before drawing);
* the tree: budget, depth cap, children = the method's own lanes in order, duplicates not
  expanded, SD a chain, real branching at temperature 1;
* temperature 0: the greedy chain.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

import ersd
from ersd.drafting import ConfidenceDrafter
from ersd.drafting.confidence import ConfidenceDraftSession, _Context, draw_values
from ersd.errors import UnsupportedTreeError
from ersd.methods import DraftTree, Method, NodeNoise, get_method
from ersd.race import RaceNoise, root_key
from ersd.tree import TreeShape
from tests.exactness_util import ALPHA, TableLM, make_drafts, make_target
from tests.test_exactness import DRAFTS, sequence_law_test

TARGET6 = make_target(6, seed=3)
PROMPT = [1, 2]
BASELINES = ["sd", "specinfer", "spectr"]


# --- exactness (statistical) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "spec", "setting", "draft"),
    [
        ("specinfer", "dynamic:4", "T1.0", "mild"),
        ("specinfer", "dynamic:5@2", "T1.0-top_k3-top_p0.9", "bad"),
        ("spectr", "dynamic:4", "T1.5", "bad"),
        ("spectr", "dynamic:3@1", "T0.6", "sparse"),
        ("sd", "dynamic:3", "T1.0", "adversarial"),
    ],
)
def test_dynamic_baseline_sequence_law(method: str, spec: str, setting: str, draft: str) -> None:
    res = sequence_law_test(
        method, spec, setting, DRAFTS[draft], tag=("dynamic-baseline", method, spec, setting)
    )
    assert res.pvalue >= ALPHA, f"{method} {spec}, {setting}, {draft}: {res}"


class _DedupSession(ConfidenceDraftSession):
    """Broken: skips a draw that repeats a token already drafted at the context."""

    def draw(self, rule: Method, ctx: _Context, count: int, noise: NodeNoise) -> list[int]:
        pool = rule.draft(ctx.q, 8 * ctx.q.numel(), noise)
        seen = set(ctx.drawn)
        out: list[int] = []
        for t in pool:
            if t not in seen and len(out) < count:
                seen.add(t)
                out.append(t)
        return out


class _StopAtFavouriteSession(ConfidenceDraftSession):
    """Stops drawing at a context once the draft's favourite token was drawn there: a stopping
    rule (exact for sequential SpecInfer), but it makes SpecTr's K depend on its drafts."""

    def draw(self, rule: Method, ctx: _Context, count: int, noise: NodeNoise) -> list[int]:
        top = int(torch.argmax(ctx.q))
        if top in ctx.drawn:
            return []
        out: list[int] = []
        for t in super().draw(rule, ctx, count, noise):
            out.append(t)
            if t == top:
                break
        return out


def _policy(session: type[ConfidenceDraftSession]) -> type[ConfidenceDrafter]:
    class Policy(ConfidenceDrafter):
        def start_drafting(self, prompt: Sequence[int]) -> ConfidenceDraftSession:
            return session(self.model.start(list(prompt)), self)

    return Policy


class _AsTable:
    """Stands in for a TableLM in ``sequence_law_test``: ``.model()`` gives the drafter."""

    def __init__(self, table: TableLM, policy: type[ConfidenceDrafter]) -> None:
        self.table, self.policy = table, policy

    def model(self) -> ConfidenceDrafter:
        return self.policy(self.table.model(), 1)


def _law(
    method: str, spec: str, session: type[ConfidenceDraftSession], draft: str, setting: str
) -> float:
    res = sequence_law_test(
        method,
        spec,
        setting,
        _AsTable(DRAFTS[draft], _policy(session)),  # type: ignore[arg-type]
        tag=("dynamic-baseline-mutant", method, spec, session.__name__),
    )
    return res.pvalue


@pytest.mark.parametrize("method", ["specinfer", "spectr"])
def test_deduplicating_policy_is_rejected(method: str) -> None:
    p = _law(method, "dynamic:3@1", _DedupSession, "bad", "T1.0")
    assert p < ALPHA, f"{method}: the deduplicating policy was not rejected (p={p:.3g})"


def test_draw_dependent_count_breaks_spectr_only() -> None:
    p_tr = _law("spectr", "dynamic:3@1", _StopAtFavouriteSession, "adversarial", "T1.5")
    assert p_tr < ALPHA, f"SpecTr with a draw-dependent K was not rejected (p={p_tr:.3g})"
    p_inf = _law("specinfer", "dynamic:3@1", _StopAtFavouriteSession, "adversarial", "T1.5")
    assert p_inf >= ALPHA, f"SpecInfer with a stopping rule was rejected (p={p_inf:.3g})"


# --- the tree ------------------------------------------------------------------------------------


def _proposals(method: str, budget: int, cap: int | None, temperature: float = 1.0, steps=25):
    draft = make_drafts(TARGET6, seed=7)["bad"]
    drafter = ConfidenceDrafter(draft.model(), budget, max_depth=cap)
    rule = get_method(method)
    noise = RaceNoise(TARGET6.vocab_size)
    params = ersd.SamplingParams(temperature)
    g = torch.Generator().manual_seed(0)
    for i in range(steps):
        ctx = [int(t) for t in torch.randint(0, TARGET6.vocab_size, (3,), generator=g)]
        prop = drafter.start_drafting(ctx).propose(
            TreeShape.chain(10), root_key(i, ctx), rule, params, noise
        )
        yield ctx, prop, draft, rule, noise, params


def _path_tokens(tree: DraftTree, ctx: int) -> list[int]:
    out, node = [], tree.node_of(ctx)
    while node >= 0:
        out.append(tree.tokens[node])
        node = tree.parents[node]
    return out[::-1]


@pytest.mark.parametrize("method", BASELINES)
@pytest.mark.parametrize(("budget", "cap"), [(1, None), (6, None), (8, 2), (5, 1)])
def test_tree_respects_budget_depth_and_draws_iid_lanes(method: str, budget: int, cap) -> None:
    depth_cap = cap or budget
    branched = 0
    for ctx, prop, draft, rule, noise, params in _proposals(method, budget, cap):
        tree = prop.tree
        assert 1 <= tree.num_nodes <= budget
        depth = max(tree.depth_of(n) for n in range(tree.num_nodes))
        assert depth <= depth_cap
        # one forward per fed level; SpecInfer may feed a level that then loses to late siblings
        assert prop.forwards <= depth + (method == "specinfer")
        assert prop.expected_tokens is None
        if method == "sd":  # one lane per context: a chain of the whole budget (q has no zeros)
            assert tree.num_nodes == min(budget, depth_cap) == depth
        for c in range(tree.num_nodes + 1):
            kids = tree.children[c]
            if not kids:
                continue
            q = tree.draft_probs[c]
            assert q is not None
            want_q = ersd.logits_to_probs(draft.logits(ctx + _path_tokens(tree, c)), params)
            assert torch.equal(q, want_q)
            # the children are lanes 0, 1, ... of the method's own i.i.d. drafting, in order
            toks = [tree.tokens[k] for k in kids]
            assert toks == rule.draft(q, len(kids), NodeNoise(noise, tree.keys[c]))
            for j, k in enumerate(kids):  # a repeated token is verified but never expanded
                if toks[j] in toks[:j]:
                    assert not tree.children[DraftTree.context_of(k)]
            branched += len(kids) > 1
    if method != "sd" and depth_cap < budget:
        assert branched > 0  # past the depth cap the budget goes to siblings


def test_draw_values_are_the_chance_that_the_next_draws_are_new() -> None:
    q = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    v = draw_values(q, [], 3)
    assert v[0] == pytest.approx(1.0)
    assert v[2] == pytest.approx(0.5 * 0.25 + 0.3 * 0.49 + 0.2 * 0.64)
    assert draw_values(q, [0, 0], 1)[0] == pytest.approx(0.5)
    assert draw_values(q, [0, 1, 2], 2).tolist() == [0.0, 0.0]
    g = torch.Generator().manual_seed(1)  # Monte Carlo: P(x_2 != x_1) given nothing
    x = torch.multinomial(q.float(), 200_000 * 2, replacement=True, generator=g).view(-1, 2)
    mc = float((x[:, 1] != x[:, 0]).double().mean())
    assert mc == pytest.approx(v[1], abs=0.005)
    big = 1.0 / torch.arange(1, 1001, dtype=torch.float64)  # the tail below the head of 256
    big /= big.sum()
    full = big.clone()
    full[[3, 999]] = 0.0
    want = [float((full * (1 - big) ** j).sum()) for j in range(3)]
    assert draw_values(big, [3, 999], 3) == pytest.approx(want, abs=2e-3)


@pytest.mark.parametrize("method", BASELINES)
def test_temperature_zero_is_the_greedy_chain(method: str) -> None:
    target, draft = TARGET6.model(), make_drafts(TARGET6, seed=7)["mild"].model()
    chain, dyn = (
        ersd.generate(
            target, draft, PROMPT, max_new_tokens=20, temperature=0, method=method, tree=t
        )
        for t in ("chain:3", "dynamic:5@3")
    )
    assert dyn.tokens == chain.tokens
    assert [s.num_draft_tokens for s in dyn.steps] == [s.num_draft_tokens for s in chain.steps]
    assert dyn.tree == "dynamic:5@3"


def test_specs_and_errors() -> None:
    target, draft = TARGET6.model(), make_drafts(TARGET6, seed=7)["mild"].model()
    res = ersd.generate(target, draft, PROMPT, max_new_tokens=8, method="spectr", tree="dynamic:4")
    assert res.tree == "dynamic:4" and len(res.tokens) == 8
    for method in ("gls", "rrs-wor", "spechub"):
        with pytest.raises(UnsupportedTreeError, match="SpecInfer"):
            ersd.generate(target, draft, PROMPT, max_new_tokens=4, method=method, tree="dynamic:4")
    with pytest.raises(UnsupportedTreeError, match="cost-aware"):
        ersd.generate(
            target, draft, PROMPT, max_new_tokens=4, method="specinfer", tree="dynamic-cost:4"
        )


@pytest.mark.parametrize("method", BASELINES)
def test_batched_generation_matches_one_at_a_time(method: str) -> None:
    target, draft = TARGET6.model(), make_drafts(TARGET6, seed=7)["mild"].model()
    prompts, seeds = [[1, 2], [3], [4, 5, 0]], [5, 6, 7]
    got = ersd.generate_batch(
        target,
        ConfidenceDrafter(draft, 6),
        prompts,
        max_new_tokens=12,
        seeds=seeds,
        tree="chain:6",  # the envelope: depth cap 6
        method=method,
    )
    one = [
        ersd.generate(target, draft, p, max_new_tokens=12, seed=s, tree="dynamic:6", method=method)
        for p, s in zip(prompts, seeds, strict=True)
    ]
    assert [r.tokens for r in got] == [r.tokens for r in one]
    assert sum(r.num_accepted_tokens for r in got) > 0
