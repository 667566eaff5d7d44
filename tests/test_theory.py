"""Unit tests of :mod:`ersd.theory`: formulas, identities, bounds, optimal trees, rank profiles.

The Monte Carlo cross-checks against the samplers live in ``test_theory_mc.py``; the CLI tests in
``test_theory_cli.py``.  The one statistical test here (end-to-end generation) is a z-test /
chi-square test at ``ALPHA = 1e-5`` with fixed seeds.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

import ersd
import ersd.theory as T
from ersd.errors import ErsdError, InvalidTreeSpecError, UnknownMethodError, UnsupportedTreeError
from ersd.theory.acceptance import rrs_wor_rejection_profile
from ersd.theory.families import FAMILIES, family_pair
from ersd.tree import TreeShape

ALPHA = 1e-5
SRC = Path(ersd.__file__).resolve().parent


def random_pairs(n: int, v: int, seed: int, concentration: float = 1.0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield rng.dirichlet(np.full(v, concentration)), rng.dirichlet(np.full(v, concentration))


# --- import hygiene ----------------------------------------------------------------------------


def test_theory_imports_without_torch() -> None:
    """``ersd.theory`` itself needs only numpy/scipy (the parent package is stubbed out here, so
    this checks the theory modules and ``ersd.errors``, not ``ersd/__init__``)."""
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('ersd'); pkg.__path__ = [{str(SRC)!r}]\n"
        "sys.modules['ersd'] = pkg\n"
        "import ersd.theory, ersd.theory.curves, ersd.theory.families, ersd.theory.profile\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# --- input validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "q", "fragment"),
    [
        ([0.5, 0.6, -0.1], [0.3, 0.3, 0.4], "negative"),
        ([0.5, float("nan"), 0.5], [0.3, 0.3, 0.4], "NaN"),
        ([0.5, 0.4, 0.05], [0.3, 0.3, 0.4], "sums to"),
        ([0.5, 0.5], [0.3, 0.3, 0.4], "same vocabulary"),
        ([[0.5, 0.5]], [[0.5, 0.5]], "1-D"),
        ([], [], "empty"),
        (["a", "b"], [0.5, 0.5], "convert"),
    ],
)
def test_bad_distributions_raise_a_clear_error(p, q, fragment: str) -> None:
    with pytest.raises(T.InvalidDistributionError, match=fragment) as info:
        T.acceptance_probability(p, q, 1)
    assert isinstance(info.value, ErsdError)
    with pytest.raises(ErsdError):
        T.rank_distribution(p, q)


def test_bad_method_and_counts() -> None:
    p, q = [0.5, 0.5], [0.25, 0.75]
    with pytest.raises(UnknownMethodError, match="known methods"):
        T.acceptance_probability(p, q, 1, method="medusa")
    with pytest.raises(ErsdError, match="num_drafts"):
        T.acceptance_probability(p, q, 0)
    with pytest.raises(ErsdError, match="num_drafts"):
        T.acceptance_probability(p, q, True)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedTreeError, match="chains only"):
        T.acceptance_probability(p, q, 2, method="sd")
    with pytest.raises(UnsupportedTreeError, match="1 or 2 children"):
        T.acceptance_probability(p, q, 3, method="spechub")
    with pytest.raises(ErsdError, match="sums to"):
        T.block_efficiency_bound([0.7, 0.6], 4, 10)
    with pytest.raises(ErsdError, match="V <= 20"):
        T.iid_optimal_acceptance(np.full(21, 1 / 21), np.full(21, 1 / 21), 2)


def test_lists_and_arrays_give_the_same_answer() -> None:
    p, q = [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]
    for m in T.ACCEPTANCE_METHODS:
        assert T.acceptance_probability(p, q, 1, m) == T.acceptance_probability(
            np.array(p), np.array(q), 1, m
        )


# --- acceptance formulas ------------------------------------------------------------------------


def brute_force_ersd_one_draft(p: np.ndarray, q: np.ndarray) -> float:
    """The method notes' form ``Σ_x 1 / Σ_y max(p_y/p_x, q_y/q_x)`` (all entries positive)."""
    return float(sum(1.0 / np.sum(np.maximum(p / p[x], q / q[x])) for x in range(p.size)))


def test_ersd_one_draft_closed_form() -> None:
    for p, q in random_pairs(8, 7, seed=1):
        exact = T.ersd_match_probability(p, q)
        assert exact == pytest.approx(brute_force_ersd_one_draft(p, q), abs=1e-12)
        # the quadrature path agrees with the closed form
        assert T.rank_distribution(p, q)[0] == pytest.approx(exact, abs=1e-9)


def test_rank_distribution_is_a_distribution() -> None:
    for p, q in random_pairs(5, 6, seed=2, concentration=0.5):
        joint = T.ersd_rank_joint(p, q)
        assert np.allclose(joint.sum(axis=1), p, atol=1e-9)  # marginal of Y is p
        rd = T.rank_distribution(p, q)
        assert rd.shape == (6,)
        assert np.all(rd >= 0)
        assert rd.sum() == pytest.approx(1.0, abs=1e-9)
        cdf = np.cumsum(rd)
        for m in (1, 2, 3, 5):
            assert T.acceptance_probability(p, q, m) == pytest.approx(cdf[m - 1], abs=1e-9)


def test_rank_distribution_with_zeros() -> None:
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.4, 0.0, 0.3, 0.3])  # target token 1 is never drafted
    rd = T.rank_distribution(p, q)
    assert rd.sum() == pytest.approx(1 - 0.3, abs=1e-9)
    assert rd[3] == pytest.approx(0.0, abs=1e-12)  # only 3 tokens have q > 0
    assert T.acceptance_probability(p, q, 4) == pytest.approx(0.7, abs=1e-9)


def test_perfect_draft_is_always_accepted() -> None:
    p = np.array([0.4, 0.3, 0.2, 0.1])
    for m in T.ACCEPTANCE_METHODS:
        assert T.acceptance_probability(p, p, 1, m) == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(T.rank_distribution(p, p), [1, 0, 0, 0], atol=1e-9)
    assert T.block_efficiency_bound(T.rank_distribution(p, p).round(12), 4, 4) == math.inf


def test_single_draft_methods_reduce_to_known_rates() -> None:
    for p, q in random_pairs(10, 6, seed=3):
        one_minus_tv = 1 - T.total_variation(p, q)
        for m in ("sd", "specinfer", "rrs-wor", "spectr", "spechub"):
            assert T.acceptance_probability(p, q, 1, m) == pytest.approx(one_minus_tv, abs=1e-12)
        # GLS with one lane is ERSD's one-draft race
        assert T.gls_acceptance(p, q, 1) == pytest.approx(T.ersd_match_probability(p, q))
        assert T.iid_optimal_acceptance(p, q, 1) == pytest.approx(one_minus_tv, abs=1e-12)


def test_gls_quadrature_reduces_to_ersd_with_one_lane_through_the_general_path() -> None:
    """The general K-lane integral, evaluated at K = 1 by hand, is ERSD's closed form."""
    from scipy import integrate

    from ersd.theory.acceptance import _excess_rates, _gls_lane_match

    p, q = next(random_pairs(1, 5, seed=4))
    c = _excess_rates(p, q).sum(axis=1)
    val = sum(
        integrate.quad(lambda t, y=y: p[y] * np.exp(-t) * np.exp(-t * c[y]), 0, np.inf)[0]
        for y in range(5)
    )
    assert val == pytest.approx(T.ersd_match_probability(p, q), abs=1e-9)
    # a lane conditioned on nothing (t = 0) drafts y with probability q_y
    for y in range(5):
        assert _gls_lane_match(p, q, y, 0.0) == pytest.approx(q[y], abs=1e-12)


def test_specinfer_recursion_matches_enumeration() -> None:
    """RRS with replacement: the product formula equals an explicit enumeration of the drafts."""
    for p, q in random_pairs(5, 4, seed=5):
        for m in (1, 2, 3):
            reject = 0.0
            for draws in itertools.product(range(4), repeat=m):
                prob, cur = 1.0, p.copy()
                for x in draws:
                    acc = min(1.0, cur[x] / q[x])
                    prob *= q[x] * (1 - acc)
                    resid = np.clip(cur - q, 0, None)
                    cur = resid / resid.sum() if resid.sum() > 0 else cur
                reject += prob
            assert T.specinfer_acceptance(p, q, m) == pytest.approx(1 - reject, abs=1e-12)


def test_rrs_wor_recursion_matches_enumeration() -> None:
    """RRS without replacement: the pruned recursion equals enumerating ordered draws."""
    for p, q in random_pairs(5, 5, seed=6):
        for m in (1, 2, 3, 5):
            reject = 0.0
            for draws in itertools.permutations(range(5), m):
                prob, cur, mask = 1.0, p.copy(), np.ones(5)
                for x in draws:
                    qj = q * mask / (q * mask).sum()
                    acc = min(1.0, cur[x] / qj[x])
                    prob *= qj[x] * (1 - acc)
                    resid = np.clip(cur - qj, 0, None)
                    cur = resid / resid.sum() if resid.sum() > 0 else cur
                    mask[x] = 0
                reject += prob
            assert T.rrs_wor_acceptance(p, q, m) == pytest.approx(1 - reject, abs=1e-12)
    prof = rrs_wor_rejection_profile([0.5, 0.5, 0.0], [0.5, 0.25, 0.25], 6)
    assert prof.shape == (7,)  # only 3 tokens can be drafted: flat after that
    assert np.all(np.diff(prof) <= 1e-15)


def test_spectr_rho_is_the_smallest_feasible_ratio() -> None:
    for p, q in random_pairs(10, 6, seed=7):
        for k in (2, 4, 8):
            rho = T.spectr_rho(p, q, k)
            assert 1.0 <= rho <= k

            def g(r: float, k: int = k, p: np.ndarray = p, q: np.ndarray = q) -> float:
                b = float(np.minimum(q, p / r).sum())
                return r * b - 1 + (1 - b) ** k

            assert g(rho) >= -1e-12
            assert rho == 1.0 or g(rho - 1e-6) < 0


def test_spechub_closed_form_and_degenerate_hub() -> None:
    p = np.array([0.2, 0.5, 0.3])
    q = np.array([0.6, 0.3, 0.1])  # hub a = 0, pi = (0, 0.75, 0.25)
    expected = min(0.75, 0.5) + min(0.25, 0.3) + min(0.2, 0.25)
    assert T.spechub_acceptance(p, q, 2) == pytest.approx(expected)
    assert T.spechub_acceptance(p, [1.0, 0.0, 0.0], 2) == pytest.approx(0.2)


def test_more_drafts_never_hurt_and_bounds_hold() -> None:
    for p, q in random_pairs(4, 6, seed=8, concentration=0.7):
        tv = T.total_variation(p, q)
        e1 = T.ersd_match_probability(p, q)
        assert T.ersd_one_draft_lower_bound(p, q) - 1e-12 <= e1 <= 1 - tv + 1e-12
        for method in ("ersd", "specinfer", "rrs-wor", "spectr", "gls"):
            acc = [T.acceptance_probability(p, q, m, method) for m in (1, 2, 3, 4)]
            assert np.all(np.diff(acc) >= -1e-9), (method, acc)
        for m in (1, 2, 4):
            assert T.rank_cdf_lower_bound(p, q, m) <= T.acceptance_probability(p, q, m) + 1e-9
            opt = T.iid_optimal_acceptance(p, q, m)
            for method in ("specinfer", "spectr", "gls"):  # i.i.d. drafts: below the optimum
                assert T.acceptance_probability(p, q, m, method) <= opt + 1e-9, (method, m)


def test_divergences() -> None:
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.25, 0.25, 0.5])
    assert T.total_variation(p, q) == pytest.approx(0.5)
    assert T.kl_divergence(p, q) == pytest.approx(math.log(2))
    assert T.kl_divergence(q, p) == math.inf
    assert T.kl_divergence(p, q, base=2) == pytest.approx(1.0)
    assert T.entropy([0.5, 0.5], base=2) == pytest.approx(1.0)
    assert T.rank_entropy([0.5, 0.25]) == pytest.approx(T.entropy([0.5, 0.25, 0.25]))


# --- trees ---------------------------------------------------------------------------------------


def closed_trees(k: int):
    """Every tree with ``k`` nodes closed under parents and elder siblings (brute force)."""
    seen: set[frozenset] = set()
    frontier = {frozenset()}
    for _ in range(k):
        nxt = set()
        for tree in frontier:
            cands = {(0,)} | {(*t, 0) for t in tree} | {(*t[:-1], t[-1] + 1) for t in tree}
            for c in cands - tree:
                nxt.add(tree | {c})
        frontier = nxt
    for tree in frontier:
        if tree not in seen:
            seen.add(tree)
            yield sorted(tree)


def test_optimal_tree_matches_brute_force() -> None:
    rng = np.random.default_rng(9)
    for _ in range(6):
        rank = np.sort(rng.dirichlet(np.full(4, 0.6)))[::-1]
        for k in (1, 2, 3, 4, 5, 6):
            tree = T.optimal_tree(rank, k)
            assert len(tree) == k
            TreeShape.from_paths(tree)  # a valid shape: closed under parents and elder siblings
            best = max(T.expected_block_efficiency(t, rank) for t in closed_trees(k))
            assert T.expected_block_efficiency(tree, rank) == pytest.approx(best, abs=1e-12)


def test_optimal_tree_handles_short_and_flat_profiles() -> None:
    tree = T.optimal_tree([0.6, 0.4], 5)
    assert len(tree) == 5 and all(j <= 1 for path in tree for j in path)
    TreeShape.from_paths(T.optimal_tree([0.25] * 4, 9))
    assert T.optimal_tree([0.9], 3) == [(0,), (0, 0), (0, 0, 0)]
    assert T.optimal_tree([0.5, 0.5], 0) == []


def test_standard_shapes_and_block_efficiency() -> None:
    rank = np.array([0.6, 0.25, 0.1, 0.05])
    a = rank[0]
    assert T.expected_block_efficiency([], rank) == 1.0
    assert T.expected_block_efficiency(T.chain_paths(5), rank) == pytest.approx(
        sum(a**d for d in range(6))
    )
    assert T.expected_block_efficiency(T.batch_paths(3), rank) == pytest.approx(1 + 0.95)
    assert T.expected_block_efficiency(T.multi_paths(2, 3), rank) == pytest.approx(
        1 + 0.85 * (1 + a + a**2)
    )
    for k in (1, 4, 7):
        assert T.chain_paths(k) == list(ersd.parse_tree(f"chain:{k}").paths)
        assert T.batch_paths(k) == list(ersd.parse_tree(f"batch:{k}").paths)
    assert T.multi_paths(3, 2) == list(ersd.parse_tree("multi:3x2").paths)
    assert T.per_node_block_efficiency([2, 1, 1], [0.6, 0.85]) == pytest.approx(
        1 + 0.85 * (1 + a + a**2)
    )
    with pytest.raises(InvalidTreeSpecError, match="no parent"):
        T.expected_block_efficiency([(0, 0)], rank)
    with pytest.raises(InvalidTreeSpecError, match="twice"):
        T.expected_block_efficiency([(0,), (0,)], rank)
    with pytest.raises(InvalidTreeSpecError, match="integers >= 0"):
        T.expected_block_efficiency([(-1,)], rank)


def test_depth_profiles() -> None:
    deep = [[0.9, 0.1], [0.5, 0.5]]
    tree = T.optimal_tree_by_depth(deep, 3)
    TreeShape.from_paths(tree)
    eff = T.expected_block_efficiency_by_depth(tree, deep)
    best = max(T.expected_block_efficiency_by_depth(t, deep) for t in closed_trees(3))
    assert eff == pytest.approx(best)
    # the last depth's profile is reused deeper down
    assert T.expected_block_efficiency_by_depth(T.chain_paths(3), deep) == pytest.approx(
        1 + 0.9 + 0.45 + 0.225
    )


def test_bound_dominates_the_optimal_tree() -> None:
    rng = np.random.default_rng(10)
    profiles = [np.sort(rng.dirichlet(np.full(8, c)))[::-1] for c in (0.2, 0.5, 1.0, 3.0)]
    profiles += [T.rank_distribution(*family_pair(name)) for name in FAMILIES]
    for rank in profiles:
        rank = np.clip(rank, 0, None)
        v = rank.size
        h = T.rank_entropy(rank)
        for k in (1, 2, 4, 8, 16, 64):
            eff = T.expected_block_efficiency(T.optimal_tree(rank, k), rank)
            bound = T.block_efficiency_bound(rank, k, v)
            assert eff <= bound + 1e-9, (rank, k, eff, bound)
            assert bound == pytest.approx((math.log(v) + math.log(k + 1)) / h)
            assert T.bound_asymptote(rank, k) == pytest.approx(math.log(k) / h)
        # the bound's base does not matter: bits / bits
        assert T.block_efficiency_bound(rank, 8, v) == pytest.approx(
            (math.log2(v) + math.log2(9)) / T.rank_entropy(rank, base=2)
        )


# --- rank profiles -------------------------------------------------------------------------------


def test_rank_profile_from_records_and_json_round_trip(tmp_path: Path) -> None:
    steps = [SimpleNamespace(ranks=[1, 2]), SimpleNamespace(ranks=[1]), SimpleNamespace(ranks=[3])]
    result = SimpleNamespace(steps=steps, ranks=[1, 2, 1, 3])
    prof = T.RankProfile.from_results([result], vocab_size=5, target="toy")
    assert prof.counts.tolist() == [2, 1, 1]
    assert [c.tolist() for c in prof.depth_counts or []] == [[2, 0, 1], [0, 1]]
    np.testing.assert_allclose(prof.rank_probs(), [0.5, 0.25, 0.25])
    depth = prof.depth_rank_probs()
    np.testing.assert_allclose(depth[1], [0.0, 1.0])
    path = tmp_path / "profile.json"
    prof.save(path)
    back = T.RankProfile.load(path)
    assert back.to_dict() == prof.to_dict()
    assert back.meta == {"target": "toy"}
    flat = T.RankProfile.from_ranks([1, 1, 6], vocab_size=5)  # rank 6 = never drafted
    assert flat.rank_probs().sum() == pytest.approx(2 / 3)
    merged = T.merge_profiles([prof, T.RankProfile.from_results(result, vocab_size=5)])
    assert merged.counts.tolist() == [4, 2, 2]


def test_rank_profile_errors(tmp_path: Path) -> None:
    with pytest.raises(T.RankProfileError, match="1-based"):
        T.RankProfile.from_ranks([0, 1])
    with pytest.raises(T.RankProfileError, match="no observations"):
        T.RankProfile.from_ranks([]).rank_probs()
    bad = tmp_path / "bad.json"
    bad.write_text('{"counts": [1]}')
    with pytest.raises(T.RankProfileError, match="format"):
        T.RankProfile.load(bad)
    with pytest.raises(T.RankProfileError, match="does not exist"):
        T.RankProfile.load(tmp_path / "missing.json")
    bad.write_text("{")
    with pytest.raises(T.RankProfileError, match="not valid JSON"):
        T.RankProfile.load(bad)
    # hostile files are one-line errors too, not tracebacks (issue 48)
    bad.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(T.RankProfileError, match="nested too deeply"):
        T.RankProfile.load(bad)
    bad.write_text('{"counts": [' + "7" * 5000 + "]}")
    with pytest.raises(T.RankProfileError, match="unreadable JSON value"):
        T.RankProfile.load(bad)


def test_generation_matches_the_iid_rank_model() -> None:
    """End to end: with the same (p, q) at every context the i.i.d.-rank model is exact, so the
    recorded ranks follow ``rank_distribution`` (chi-square) and tokens per call match
    ``expected_block_efficiency`` of the optimal tree (z-test), both at ``ALPHA``."""
    p, q = family_pair("zipf", vocab_size=6, seed=3)
    tl, dl = torch.log(torch.tensor(p)), torch.log(torch.tensor(q))
    target = ersd.FunctionModel(lambda seqs: tl.expand(len(seqs), -1).clone(), 6)
    draft = ersd.FunctionModel(lambda seqs: dl.expand(len(seqs), -1).clone(), 6)
    rank = T.rank_distribution(p, q)
    tree = T.optimal_tree(rank, 6)
    res = ersd.generate(target, draft, [0], max_new_tokens=1500, tree=tree, seed=11)
    prof = T.RankProfile.from_results(res, vocab_size=6)
    counts = np.bincount(np.asarray(res.ranks) - 1, minlength=6)[:6]
    expected = counts.sum() * rank
    keep = expected >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > ALPHA
    assert prof.num_observations == len(res.ranks)
    per_call = np.array([len(s.tokens) for s in res.steps[:-1]])  # the last call is cut short
    z = (per_call.mean() - T.expected_block_efficiency(tree, rank)) / (
        per_call.std(ddof=1) / math.sqrt(per_call.size)
    )
    assert abs(z) < stats.norm.isf(ALPHA / 2), z
