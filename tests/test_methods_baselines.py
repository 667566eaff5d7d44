"""Per-node exactness of the baseline verification methods (sd, specinfer, rrs-wor, spectr,
spechub, gls).

At one tree node with target ``p`` and draft ``q`` every method must emit a token whose law is
exactly ``p``.  Two kinds of checks:

* **exact enumeration** over every drafted child tuple (with its exact draft probability) and
  every verification branch, using the methods' own hooks (acceptance probability, residual,
  rho, hub ...): the emitted law equals ``p`` and the acceptance rate equals its closed form to
  1e-12;
* **Monte Carlo** through the public rules (``draft`` then ``verify_node`` with real keyed noise,
  one fresh key per sample): a chi-square goodness-of-fit test of the emitted tokens against
  ``p`` and a binomial z-test of the acceptance rate, each at significance level
  ``ALPHA = 1e-4`` with fixed seeds (so a correct method fails a given check with probability
  at most 1e-4; the checks are deterministic given the seeds).

The same tests reject deliberately broken variants (mutants made by overriding one hook).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pytest
import torch
from scipy import stats

from ersd import METHODS
from ersd.errors import ErsdError, UnsupportedTreeError
from ersd.methods import Method, NodeNoise
from ersd.methods.rejection import RecursiveRejection, lane_uniform, sample_categorical
from ersd.methods.rrs_wor import RRSWithoutReplacement
from ersd.methods.sd import SpeculativeSampling
from ersd.methods.spechub import SpecHub
from ersd.methods.specinfer import SpecInfer
from ersd.methods.spectr import SpecTr, spectr_rho
from ersd.race import RaceNoise, root_key
from ersd.tree import parse_tree

ALPHA = 1e-4
Z_CRIT = float(stats.norm.isf(ALPHA / 2))  # two-sided binomial z-test
MC_SAMPLES = 1200
#: cases run by Monte Carlo (all cases are checked by exact enumeration)
MC_CASES = ("generic", "zeros", "q_twohot")
BASELINES = ("sd", "specinfer", "rrs-wor", "spectr", "spechub", "gls")
#: children per node used for each method in the per-node tests
NUM_CHILDREN = {"sd": 1, "specinfer": 3, "rrs-wor": 3, "spectr": 3, "spechub": 2, "gls": 3}


def _t(xs: list[float]) -> torch.Tensor:
    t = torch.tensor(xs, dtype=torch.float64)
    return t / t.sum()


CASES: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
    "generic": (_t([0.4, 0.3, 0.15, 0.1, 0.05]), _t([0.1, 0.2, 0.3, 0.25, 0.15])),
    "zeros": (_t([0.5, 0.0, 0.3, 0.2, 0.0]), _t([0.2, 0.3, 0.0, 0.1, 0.4])),
    "p_eq_q": (_t([0.25, 0.25, 0.2, 0.2, 0.1]), _t([0.25, 0.25, 0.2, 0.2, 0.1])),
    "disjoint": (_t([0.6, 0.4, 0.0, 0.0, 0.0]), _t([0.0, 0.0, 0.5, 0.3, 0.2])),
    "p_onehot": (_t([0.0, 0.0, 1.0, 0.0, 0.0]), _t([0.1, 0.2, 0.3, 0.25, 0.15])),
    "q_twohot": (_t([0.05, 0.1, 0.15, 0.2, 0.25, 0.25]), _t([0.0, 0.9, 0.1, 0.0, 0.0, 0.0])),
    "q_onehot": (_t([0.3, 0.5, 0.2, 0.0]), _t([0.0, 1.0, 0.0, 0.0])),
}


# --- exact enumeration -------------------------------------------------------------------------


def _iid_tuples(q: torch.Tensor, k: int) -> Iterator[tuple[list[int], float]]:
    support = [i for i in range(q.numel()) if q[i] > 0]
    for tup in itertools.product(support, repeat=k):
        yield list(tup), math.prod(float(q[x]) for x in tup)


def _wor_tuples(q: torch.Tensor, k: int) -> Iterator[tuple[list[int], float]]:
    """Sequential sampling without replacement; shorter tuples when q runs out of mass."""

    def rec(
        prefix: list[int], prob: float, rest: torch.Tensor
    ) -> Iterator[tuple[list[int], float]]:
        total = float(rest.sum())
        if len(prefix) == k or total <= 0:
            yield prefix, prob
            return
        for x in range(rest.numel()):
            if rest[x] > 0:
                nxt = rest.clone()
                nxt[x] = 0.0
                yield from rec([*prefix, x], prob * float(rest[x]) / total, nxt)

    yield from rec([], 1.0, q.clone())


def _hub_pairs(q: torch.Tensor, hub: int) -> Iterator[tuple[list[int], float]]:
    for x1 in range(q.numel()):
        if q[x1] <= 0:
            continue
        if x1 != hub:
            yield [x1, hub], float(q[x1])
            continue
        rest_mass = 1.0 - float(q[hub])
        if rest_mass <= 1e-15:
            yield [hub], float(q[hub])
            continue
        for x2 in range(q.numel()):
            if x2 != hub and q[x2] > 0:
                yield [hub, x2], float(q[hub]) * float(q[x2]) / rest_mass


def exact_law(
    method: Method, p: torch.Tensor, q: torch.Tensor, k: int
) -> tuple[torch.Tensor, float]:
    """(law of the emitted token, acceptance probability) at one node, by enumeration.

    Uses the method's hooks; the Monte Carlo tests check that ``draft``/``verify_node`` follow
    them.
    """
    law = torch.zeros_like(p)
    accept = 0.0
    if isinstance(method, RecursiveRejection):
        tuples = (
            _wor_tuples(q, k) if isinstance(method, RRSWithoutReplacement) else _iid_tuples(q, k)
        )
        for children, prob in tuples:
            pj, qj, reach = p, q, prob
            for x in children:
                a = method.acceptance_probability(pj, qj, x)
                law[x] += reach * a
                accept += reach * a
                reach *= 1.0 - a
                pj = method.residual(pj, qj)
                qj = method.next_draft_probs(qj, x)
            law += reach * pj / pj.sum()
    elif isinstance(method, SpecTr):
        rho = method.compute_rho(p, q, k)
        res = method.residual(p, q, rho, k)
        for children, prob in _iid_tuples(q, k):
            reach = prob
            for x in children:
                a = method.acceptance_probability(p, q, x, rho)
                law[x] += reach * a
                accept += reach * a
                reach *= 1.0 - a
            law += reach * res / res.sum()
    elif isinstance(method, SpecHub):
        a_tok = method.hub(q)
        pi = method.pair_probs(q, a_tok)
        pairs = _hub_pairs(q, a_tok) if k == 2 else _iid_tuples(q, 1)
        for children, prob in pairs:
            if len(children) == 1:
                x = children[0]
                acc = method.acceptance_probability(p, q, x)
                res = method.residual(p, q, -1, 0.0)
                law[x] += prob * acc
                accept += prob * acc
                law += prob * (1 - acc) * res / res.sum()
                continue
            b = children[0] if children[1] == a_tok else children[1]
            acc_b = method.acceptance_probability(p, pi, b)
            gamma, reach_hub = method.hub_acceptance(p, pi, a_tok)
            law[b] += prob * acc_b
            law[a_tok] += prob * (1 - acc_b) * gamma
            accept += prob * (acc_b + (1 - acc_b) * gamma)
            res = method.residual(p, pi, a_tok, gamma * reach_hub)
            law += prob * (1 - acc_b) * (1 - gamma) * res / res.sum()
    else:
        raise AssertionError(f"no enumeration for {method.name}")
    return law, accept


ENUMERABLE = ("sd", "specinfer", "rrs-wor", "spectr", "spechub")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", ENUMERABLE)
def test_exact_law_by_enumeration(name: str, case: str) -> None:
    p, q = CASES[case]
    method = METHODS[name]
    for k in sorted({1, NUM_CHILDREN[name]}):
        law, accept = exact_law(method, p, q, k)
        assert torch.allclose(law, p, atol=1e-12, rtol=0), (name, case, k, law, p)
        assert 0.0 <= accept <= 1.0 + 1e-12
        if k == 1:  # every method is standard SD with one child: acceptance sum min(p, q)
            assert accept == pytest.approx(float(torch.minimum(p, q).sum()), abs=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_closed_form_acceptance(case: str) -> None:
    p, q = CASES[case]
    _, acc_sd = exact_law(METHODS["sd"], p, q, 1)
    assert acc_sd == pytest.approx(SpeculativeSampling.acceptance_rate(p, q), abs=1e-12)
    hub = METHODS["spechub"]
    assert isinstance(hub, SpecHub)
    _, acc_hub = exact_law(hub, p, q, 2)
    assert acc_hub == pytest.approx(hub.acceptance_rate(p, q), abs=1e-12)
    # SpecHub is LP-optimal for its draft: min(1, sum_b min(pi, p) + p(a))
    a = hub.hub(q)
    pi = hub.pair_probs(q, a)
    if pi.sum() > 0:
        bound = min(1.0, float(torch.minimum(pi, p).sum()) + float(p[a]))
        assert acc_hub == pytest.approx(bound, abs=1e-12)
    for k in (1, 2, 3):
        _, acc_tr = exact_law(METHODS["spectr"], p, q, k)
        assert acc_tr == pytest.approx(SpecTr.acceptance_rate(p, q, k), abs=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_spectr_rho_is_smallest_feasible(case: str, k: int) -> None:
    p, q = CASES[case]
    rho = spectr_rho(p, q, k)
    assert 1.0 <= rho <= k

    def f(r: float) -> float:
        b = float(torch.minimum(q, p / r).sum())
        return r * b - (1.0 - (1.0 - b) ** k)

    assert f(rho) >= -1e-12
    if rho > 1.0:
        assert f(rho * (1.0 - 1e-9)) < 0.0


# --- Monte Carlo through draft + verify_node ---------------------------------------------------


def run_node(
    method: Method, p: torch.Tensor, q: torch.Tensor, k: int, n: int, seed: int
) -> tuple[torch.Tensor, int]:
    """Emitted-token counts and number of accepted nodes over ``n`` fresh keys."""
    noise = RaceNoise(p.numel(), cache_size=8)
    counts = torch.zeros(p.numel(), dtype=torch.float64)
    accepted = 0
    for i in range(n):
        node = NodeNoise(noise, root_key(seed, [i]))
        children = method.draft(q, k, node)
        assert all(q[c] > 0 for c in children), (method.name, children)
        d = method.verify_node(p, q, children, node)
        assert 0 <= d.token < p.numel()
        if d.child is not None:
            assert children[d.child] == d.token
            accepted += 1
        counts[d.token] += 1
    return counts, accepted


def chi2_pvalue(counts: torch.Tensor, p: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value of ``counts`` against ``p`` (zero-mass tokens: 0)."""
    support = p > 0
    assert float(counts[~support].sum()) == 0.0, "emitted a token with zero target probability"
    obs = counts[support]
    if obs.numel() == 1:
        return 1.0
    n = float(obs.sum())
    exp = p[support] / p[support].sum() * n
    return float(stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


def expected_acceptance(name: str, p: torch.Tensor, q: torch.Tensor, k: int) -> float | None:
    """Closed-form acceptance rate (None for GLS with several lanes: no closed form here)."""
    if name == "gls":
        if k != 1:
            return None
        # one lane = ERSD: sum_x 1 / sum_y max(p_y / p_x, q_y / q_x) over x with p_x, q_x > 0
        both = (p > 0) & (q > 0)
        total = 0.0
        for x in torch.nonzero(both).flatten().tolist():
            total += 1.0 / float(torch.maximum(p / p[x], q / q[x]).sum())
        return total
    return exact_law(METHODS[name], p, q, k)[1]


@pytest.mark.parametrize("case", MC_CASES)
@pytest.mark.parametrize("name", BASELINES)
def test_monte_carlo_law_and_acceptance(name: str, case: str) -> None:
    p, q = CASES[case]
    k = NUM_CHILDREN[name]
    seed = 1000 + BASELINES.index(name) * 10 + MC_CASES.index(case)
    counts, accepted = run_node(METHODS[name], p, q, k, MC_SAMPLES, seed)
    assert chi2_pvalue(counts, p) > ALPHA, (name, case, counts.tolist(), p.tolist())
    rate = expected_acceptance(name, p, q, k)
    if rate is None:
        rate = expected_acceptance(name, p, q, 1)
        assert rate is not None
        # GLS with k lanes accepts at least as often as its lane 0 alone (ERSD), one-sided test
        sd = math.sqrt(max(rate * (1 - rate), 1e-12) / MC_SAMPLES)
        assert accepted / MC_SAMPLES >= rate - Z_CRIT * sd - 1e-12, (name, case, accepted, rate)
        return
    sd = math.sqrt(max(rate * (1 - rate), 1e-12) / MC_SAMPLES)
    assert abs(accepted / MC_SAMPLES - rate) <= Z_CRIT * sd + 1e-12, (name, case, accepted, rate)


@pytest.mark.parametrize("case", MC_CASES)
def test_gls_one_lane_acceptance(case: str) -> None:
    p, q = CASES[case]
    counts, accepted = run_node(METHODS["gls"], p, q, 1, MC_SAMPLES, seed=500)
    assert chi2_pvalue(counts, p) > ALPHA
    rate = expected_acceptance("gls", p, q, 1)
    assert rate is not None
    sd = math.sqrt(max(rate * (1 - rate), 1e-12) / MC_SAMPLES)
    assert abs(accepted / MC_SAMPLES - rate) <= Z_CRIT * sd + 1e-12, (case, accepted, rate)


def test_gls_exact_law_one_lane_is_ersd() -> None:
    """A one-child GLS node is ERSD's node: same child, same decision, same bonus."""
    p, q = CASES["generic"]
    gls, ersd = METHODS["gls"], METHODS["ersd"]
    noise = RaceNoise(p.numel())
    for i in range(200):
        node = NodeNoise(noise, root_key(7, [i]))
        kids = gls.draft(q, 1, node)
        assert kids == ersd.draft(q, 1, node)
        assert gls.verify_node(p, q, kids, node) == ersd.verify_node(p, q, kids, node)
        assert gls.bonus(p, node) == ersd.bonus(p, node)


def test_spechub_draft_law() -> None:
    """SpecHub's pair always holds the hub once; the other token has law q(b) / (1 - q(a))."""
    _, q = CASES["generic"]
    hub = METHODS["spechub"]
    assert isinstance(hub, SpecHub)
    a = hub.hub(q)
    noise = RaceNoise(q.numel())
    counts = torch.zeros_like(q)
    first_is_hub = 0
    for i in range(MC_SAMPLES):
        kids = hub.draft(q, 2, NodeNoise(noise, root_key(11, [i])))
        assert len(kids) == 2 and kids.count(a) == 1
        first_is_hub += kids[0] == a
        counts[kids[1] if kids[0] == a else kids[0]] += 1
    assert chi2_pvalue(counts, hub.pair_probs(q, a)) > ALPHA
    sd = math.sqrt(float(q[a]) * (1 - float(q[a])) / MC_SAMPLES)
    assert abs(first_is_hub / MC_SAMPLES - float(q[a])) <= Z_CRIT * sd


# --- robustness --------------------------------------------------------------------------------


def test_without_replacement_returns_fewer_children() -> None:
    p, q = CASES["q_twohot"]
    node = NodeNoise(RaceNoise(q.numel()), root_key(0, [1]))
    kids = METHODS["rrs-wor"].draft(q, 4, node)
    assert sorted(kids) == [1, 2]
    d = METHODS["rrs-wor"].verify_node(p, q, kids, node)
    assert d.child is None or kids[d.child] == d.token
    onehot = CASES["q_onehot"][1]
    assert METHODS["spechub"].draft(onehot, 2, node) == [1]


@pytest.mark.parametrize("name", BASELINES)
def test_one_hot_target_and_equal_distributions(name: str) -> None:
    method = METHODS[name]
    k = NUM_CHILDREN[name]
    noise = RaceNoise(5)
    p1, q1 = CASES["p_onehot"]
    peq, qeq = CASES["p_eq_q"]
    for i in range(300):
        node = NodeNoise(noise, root_key(3, [i]))
        assert method.verify_node(p1, q1, method.draft(q1, k, node), node).token == 2
        if name in ("sd", "specinfer", "rrs-wor", "spectr"):
            # p == q: the first child is always accepted (rho = 1 for SpecTr)
            kids = method.draft(qeq, k, node)
            assert method.verify_node(peq, qeq, kids, node).child == 0


@pytest.mark.parametrize("name", BASELINES)
def test_children_with_zero_draft_probability(name: str) -> None:
    """Children the draft could not have produced give a valid decision, never NaN."""
    p, q = CASES["zeros"]  # q(2) = 0, p(4) = 0
    method = METHODS[name]
    noise = RaceNoise(5)
    kids = [2] if name == "sd" else ([2, 4] if name == "spechub" else [2, 4, 2])
    for i in range(100):
        node = NodeNoise(noise, root_key(5, [i]))
        d = method.verify_node(p, q, kids, node)
        assert p[d.token] > 0
        assert d.child is None or kids[d.child] == d.token


def test_spechub_rejects_children_without_hub() -> None:
    p, q = CASES["generic"]
    node = NodeNoise(RaceNoise(5), 1)
    with pytest.raises(ErsdError, match="hub"):
        METHODS["spechub"].verify_node(p, q, [0, 1], node)
    with pytest.raises(UnsupportedTreeError, match="at most 2"):
        METHODS["spechub"].draft(q, 3, node)


@pytest.mark.parametrize("name", BASELINES)
def test_determinism(name: str) -> None:
    method = METHODS[name]
    p, q = CASES["generic"]
    k = NUM_CHILDREN[name]
    for i in range(20):
        key = root_key(9, [i])
        a = NodeNoise(RaceNoise(5), key)
        b = NodeNoise(RaceNoise(5), key)
        kids = method.draft(q, k, a)
        assert kids == method.draft(q, k, b)
        assert method.verify_node(p, q, kids, a) == method.verify_node(p, q, kids, b)


def test_check_shape() -> None:
    for spec in ("chain:1", "chain:5"):
        for name in BASELINES:
            METHODS[name].check_shape(parse_tree(spec))
    for spec in ("batch:2", "multi:2x3", "paths:[[0],[1],[0,0],[0,1]]"):
        METHODS["spechub"].check_shape(parse_tree(spec))
        with pytest.raises(UnsupportedTreeError, match="chains only"):
            METHODS["sd"].check_shape(parse_tree(spec))
    for spec in ("batch:3", "multi:4x2", "paths:[[0],[0,0],[0,1],[0,2]]"):
        for name in ("specinfer", "rrs-wor", "spectr", "gls"):
            METHODS[name].check_shape(parse_tree(spec))
        with pytest.raises(UnsupportedTreeError, match="one or two children"):
            METHODS["spechub"].check_shape(parse_tree(spec))
        with pytest.raises(UnsupportedTreeError, match="'sd'"):
            METHODS["sd"].check_shape(parse_tree(spec))


def test_registry_names() -> None:
    assert set(BASELINES) <= set(METHODS)
    for name in BASELINES:
        assert METHODS[name].name == name


def test_sample_categorical_never_returns_zero_weight() -> None:
    w = torch.tensor([0.0, 0.3, 0.0, 0.7, 0.0], dtype=torch.float64)
    for u in (0.0, 0.299999, 0.3, 0.5, 1.0 - 2**-53):
        assert w[sample_categorical(w, u)] > 0
    with pytest.raises(ErsdError, match="all-zero"):
        sample_categorical(torch.zeros(3, dtype=torch.float64), 0.5)


def test_large_vocabulary_valid_and_finite() -> None:
    """Qwen2.5-size vocabulary: every rule returns a valid token with finite quantities.

    (No wall-time assertion: speed is the benchmarks' business, and a timing bound in a unit
    test fails on a busy machine and passes a slow implementation on a fast one.)"""
    v = 151_936
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(v, generator=gen, dtype=torch.float64) * 3, 0)
    q = torch.softmax(torch.randn(v, generator=gen, dtype=torch.float64) * 3, 0)
    noise = RaceNoise(v)
    for name in BASELINES:
        method = METHODS[name]
        k = {"sd": 1, "spechub": 2}.get(name, 4)
        node = NodeNoise(noise, root_key(1, [BASELINES.index(name)]))
        kids = method.draft(q, k, node)
        d = method.verify_node(p, q, kids, node)
        assert 0 <= d.token < v and p[d.token] > 0
        assert all(0 <= c < v for c in kids)
    # SpecTr's rho on the full vocabulary and an all-rejected residual stay finite
    rho = spectr_rho(p, q, 8)
    res = METHODS["spectr"].residual(p, q, rho, 8)  # type: ignore[attr-defined]
    assert torch.isfinite(res).all() and float(res.sum()) == pytest.approx(1.0)


# --- power: mutants made by overriding one hook are rejected -----------------------------------


class _SkipResidual(SpeculativeSampling):
    def residual(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        return target_probs


class _WrongRatio(SpecInfer):
    def acceptance_probability(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int
    ) -> float:
        return min(1.0, float(target_probs[token]) / max(float(draft_probs.max()), 1e-300))


class _ReuseDraftNoise(SpeculativeSampling):
    def verify_uniforms(self, noise: NodeNoise, n: int) -> list[float]:
        return [lane_uniform(noise, j) for j in range(n)]


class _ForgetRemoval(RRSWithoutReplacement):
    def next_draft_probs(self, draft_probs: torch.Tensor, token: int) -> torch.Tensor:
        return draft_probs


class _HubNoCorrection(SpecHub):
    def residual(
        self, target_probs: torch.Tensor, pair_probs: torch.Tensor, hub: int, hub_mass: float
    ) -> torch.Tensor:
        return super().residual(target_probs, pair_probs, hub, 0.0)


@pytest.mark.parametrize(
    "mutant,k",
    [(_SkipResidual(), 1), (_WrongRatio(), 3), (_ForgetRemoval(), 3), (_HubNoCorrection(), 2)],
)
def test_enumeration_rejects_mutants(mutant: Method, k: int) -> None:
    p, q = CASES["generic"]
    law, _ = exact_law(mutant, p, q, k)
    assert float((law - p).abs().max()) > 1e-3


@pytest.mark.parametrize("mutant,k", [(_ReuseDraftNoise(), 1), (_SkipResidual(), 1)])
def test_monte_carlo_rejects_mutants(mutant: Method, k: int) -> None:
    p, q = CASES["generic"]
    counts, _ = run_node(mutant, p, q, k, MC_SAMPLES, seed=2024)
    assert chi2_pvalue(counts, p) < ALPHA
