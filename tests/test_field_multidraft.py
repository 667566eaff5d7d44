"""Issue 53: the field's multi-draft protocol — the i.i.d. optimum, the preset, the resumable
runner and the exact (variance-reduced) one-step column."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from ersd.errors import ErsdError
from ersd.theory.acceptance import acceptance_probability, iid_optimal_acceptance
from ersd.theory.distributions import total_variation
from ersd.theory.optimal_transport import iid_optimum, iid_optimum_lp, iid_optimum_set

# --- the i.i.d. optimum -----------------------------------------------------------------------


def _pairs(v: int, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        alpha = 0.3 if i % 2 else 1.0  # peaked and flat pairs
        p, q = rng.dirichlet([alpha] * v), rng.dirichlet([alpha] * v)
        if i % 5 == 0:  # a zero in each: tokens only one side can produce
            p[0], q[-1] = 0.0, 0.0
            p, q = p / p.sum(), q / q.sum()
        out.append((p, q))
    return out


@pytest.mark.parametrize("v,k", [(3, 1), (3, 2), (3, 3), (4, 2), (4, 3), (5, 2)])
def test_closed_form_equals_the_transport_lp(v, k):
    for p, q in _pairs(v, 12, seed=10 * v + k):
        lp = iid_optimum_lp(p, q, k)
        assert iid_optimum(p, q, k) == pytest.approx(lp, abs=1e-9)
        # and the 2^V subset enumeration of ersd.theory.acceptance
        assert iid_optimal_acceptance(p, q, k) == pytest.approx(lp, abs=1e-9)


def test_the_minimising_set_is_a_ratio_prefix_and_scores_the_value():
    for p, q in _pairs(6, 20, seed=3):
        for k in (1, 2, 4, 8):
            s = iid_optimum_set(p, q, k)
            brute = min(
                p[list(sub)].sum() + 1 - q[list(sub)].sum() ** k
                for r in range(7)
                for sub in itertools.combinations(range(6), r)
            )
            assert p[s].sum() + 1 - q[s].sum() ** k == pytest.approx(brute, abs=1e-12)


def test_a_wrong_order_of_prefixes_is_caught_by_the_lp():
    # the deliberately broken variant: prefixes by p descending instead of p/q ascending
    def broken(p, q, k):
        order = np.argsort(-p)
        ps = np.concatenate([[0], np.cumsum(p[order])])
        qs = np.concatenate([[0], np.cumsum(q[order])])
        return float(np.min(ps + 1 - qs**k))

    misses = sum(
        abs(broken(p, q, 2) - iid_optimum_lp(p, q, 2)) > 1e-6 for p, q in _pairs(4, 12, seed=7)
    )
    assert misses >= 3


def test_one_draft_is_one_minus_tv_and_more_drafts_never_hurt():
    for p, q in _pairs(50, 10, seed=5):
        assert iid_optimum(p, q, 1) == pytest.approx(1 - total_variation(p, q), abs=1e-12)
        vals = [iid_optimum(p, q, k) for k in (1, 2, 4, 6, 8)]
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(vals))


def test_iid_methods_stay_below_the_optimum_at_support_50():
    for p, q in _pairs(50, 4, seed=9):
        for k in (2, 4):
            opt = iid_optimum(p, q, k)
            for method in ("specinfer", "spectr", "gls"):
                assert acceptance_probability(p, q, k, method) <= opt + 1e-7, method


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(ErsdError, match="num_drafts"):
        iid_optimum([0.5, 0.5], [0.5, 0.5], 0)
    with pytest.raises(ErsdError, match="same vocabulary"):
        iid_optimum([0.5, 0.5], [1.0], 2)
    with pytest.raises(ErsdError, match="closed form"):
        iid_optimum_lp(np.full(50, 0.02), np.full(50, 0.02), 4)


# --- the preset -------------------------------------------------------------------------------

from ersd.bench.config import BenchConfigError  # noqa: E402
from ersd.bench.field import (  # noqa: E402
    ERSD_TREE,
    FIELD_METHODS,
    category_prompts,
    cells,
    exact_column,
    preset,
    read_records,
    run_field,
    summarise,
    write_report,
)


def test_the_liu_scale_is_the_papers_protocol():
    p = preset("liu")
    assert (p.target, p.draft) == ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-0.5B-Instruct")
    assert (p.top_k, p.top_p, p.temperature) == (50, 1.0, 1.0)
    assert (p.max_new_tokens, p.draft_length, p.drafts) == (128, 4, (1, 2, 4, 6, 8))
    assert p.prompts_per_category * len(p.categories) == 1000
    sources = [c.source for c in p.categories]
    assert sources[0].startswith("datasets:abisee/cnn_dailymail:3.0.0:test:article")
    assert "eli5" in sources[1]
    assert set(p.methods) == {"ersd", "gls", "spectr", "spechub", "rrs-wor", "specinfer", "sd"}
    assert p.device == "cuda" and not p.stop_at_eos


def test_the_cpu_scale_keeps_the_sampling_and_has_two_categories():
    cpu, liu = preset("cpu"), preset("liu")
    for f in ("top_k", "top_p", "temperature", "max_new_tokens", "draft_length", "drafts"):
        assert getattr(cpu, f) == getattr(liu, f), f
    names = [c.name for c in cpu.categories]
    assert names == ["summarization", "code"]
    summ = category_prompts(cpu.categories[0], "eval", 100)
    assert summ and all(pr.set == "grounded" for pr in summ)
    assert category_prompts(cpu.categories[1], "eval", 3)[0].set == "humaneval"


def test_the_datasets_source_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(BenchConfigError, match="pip install datasets"):
        category_prompts(preset("liu").categories[0], "eval", 1)


def test_cells_follow_the_protocol():
    p = preset("cpu")
    trees = {b * 4: f"paths:{b}" for b in p.drafts}
    plan = cells(p, trees)
    by = {(c.method, c.drafts): c for c in plan}
    assert [c.drafts for c in plan if c.method == "sd"] == [1]
    assert by[("spechub", 2)].tree == "multi:2x4" and by[("spechub", 8)].tree == "binary:32"
    for b in p.drafts:
        shape = "chain:4" if b == 1 else f"multi:{b}x4"
        for m in ("ersd", "gls", "spectr", "rrs-wor", "specinfer"):
            assert by[(m, b)].tree == shape and by[(m, b)].nodes == 4 * b
        assert by[(ERSD_TREE, b)].tree == trees[4 * b]
    assert {c.method for c in plan} == set(FIELD_METHODS) | {ERSD_TREE}


def test_bad_overrides_are_one_line_errors():
    with pytest.raises(BenchConfigError, match="unknown method 'medusa'"):
        preset("toy").replace(methods=("medusa",))
    with pytest.raises(BenchConfigError, match="known: liu, cpu"):
        preset("h100")
    with pytest.raises(BenchConfigError, match="draft counts >= 1"):
        preset("toy").replace(drafts=(0, 2))


# --- resumable runner -------------------------------------------------------------------------


def _quiet(_msg: str) -> None:
    pass


def _tiny():
    return preset("toy").replace(
        prompts_per_category=1, max_new_tokens=12, drafts=(1, 2), exact_contexts=3
    )


class _Stop(Exception):
    pass


def _key(r):
    return (r["prompt"], r["cell"])


def test_a_stopped_run_resumes_with_no_record_lost_or_repeated(tmp_path):
    p = _tiny()
    full = tmp_path / "full.jsonl"
    run_field(p, full, log=_quiet)
    want = {_key(r): r for r in read_records(full) if r["kind"] in ("cell", "exact")}
    assert len(want) == 2 * (len(cells(p, {4: "x", 8: "x"})) + 1)

    part = tmp_path / "part.jsonl"
    seen = []

    def stop(rec):
        seen.append(rec)
        if len(seen) == 7:
            raise _Stop

    with pytest.raises(_Stop):
        run_field(p, part, log=_quiet, on_record=stop)
    with part.open("a") as fh:  # killed in the middle of a write
        fh.write('{"kind": "cell", "prompt": "torn')
    assert len(read_records(part)) == 7 + 1  # the meta line and 7 records
    run_field(p, part, log=_quiet)
    got = [r for r in read_records(part) if r["kind"] in ("cell", "exact")]
    keys = [_key(r) for r in got]
    assert len(keys) == len(set(keys)), "a record was written twice"
    assert set(keys) == set(want), "a record is missing"
    for r in got:  # same seeds: the resumed records are the uninterrupted run's
        w = want[_key(r)]
        assert r.get("tokens") == w.get("tokens") and r.get("acceptance") == w.get("acceptance")
    assert sum(r["kind"] == "meta" for r in read_records(part)) == 1


def test_resume_refuses_another_configuration_and_extends_with_more_prompts(tmp_path):
    p = _tiny()
    path = tmp_path / "r.jsonl"
    run_field(p, path, log=_quiet)
    with pytest.raises(BenchConfigError, match="differs in: max_new_tokens"):
        run_field(p.replace(max_new_tokens=13), path, log=_quiet)
    run_field(p.replace(prompts_per_category=2), path, log=_quiet)
    recs = [r for r in read_records(path) if r["kind"] == "cell"]
    assert len({r["prompt"] for r in recs}) == 4
    assert len({_key(r) for r in recs}) == len(recs)


def test_summary_pairs_by_prompt_and_writes_the_report(tmp_path):
    p = _tiny().replace(prompts_per_category=2)
    path = tmp_path / "r.jsonl"
    run_field(p, path, log=_quiet)
    recs = read_records(path)
    s = summarise(recs)
    assert s["prompts"] and len(s["prompts"]) == 4
    for m in ("gls", "ersd", ERSD_TREE):
        cell = s["block_efficiency"][m]["2"]
        vals = [r["block_efficiency"] for r in recs if r.get("method") == m and r["drafts"] == 2]
        assert cell["n"] == 4 and cell["mean"] == pytest.approx(np.mean(vals))
    sd = [r for r in recs if r.get("method") == "sd"]
    inner = np.mean([1 + np.mean(r["accepted_per_call"][:-1]) for r in sd])
    assert s["block_efficiency_without_last_call"]["sd"]["1"]["mean"] == pytest.approx(inner)
    # a prompt missing one cell is left out of every cell, so the columns stay paired
    drop = next(r for r in recs if r.get("method") == "gls" and r["drafts"] == 2)
    s2 = summarise([r for r in recs if r is not drop])
    assert drop["prompt"] in s2["partial_prompts_left_out"]
    # ... also when the missing cell is the last of the plan (no record of it anywhere)
    last = [r for r in recs if not (r.get("method") == "gls" and r["drafts"] == 2)]
    assert len(summarise(last)["prompts"]) == 0
    assert all(c["n"] == 3 for row in s2["block_efficiency"].values() for c in row.values())
    # the per-node prediction of chain:4 from SD's exact acceptance a: 1 + a + a² + a³ + a⁴
    ex = [r for r in recs if r["kind"] == "exact"]
    a = [float(np.mean(r["acceptance"]["sd"]["1"])) for r in ex]
    want = np.mean([sum(x**d for d in range(5)) for x in a])
    assert s["predicted"]["sd"]["1"]["mean"] == pytest.approx(want)
    out = write_report(path, tmp_path / "rep")
    assert (out / "block_efficiency_vs_drafts.png").stat().st_size > 1000
    tables = (out / "tables.md").read_text()
    assert "| ERSD, best tree |" in tables and "i.i.d. optimum" in tables


# --- the exact column: unbiased against plain Monte Carlo --------------------------------------


def test_the_exact_column_is_the_mean_of_the_acceptance_indicator():
    """The exact one-step acceptance of a context is E[first-step acceptance | context]: checked
    against plain Monte Carlo over seeds (batch:K trees, one node), alpha = 1e-4 per check
    (|z| < 3.9), 1500 seeds; the broken variant (K-1 drafts' value) is rejected."""
    import ersd
    from ersd.bench.field import _contexts_probs
    from ersd.bench.models import load_pair

    p = _tiny().replace(top_k=12)
    pair = load_pair(p.models())
    ids = [3, 17, 5]
    prow, qrow = _contexts_probs(pair, p, ids, [0])
    exact = exact_column(prow, qrow, (1, 2, 3))
    n = 1500
    rejected_broken = 0
    for method, k in [("ersd", 1), ("ersd", 2), ("specinfer", 2), ("spectr", 3), ("spechub", 2)]:
        hits = 0
        for seed in range(n):
            res = ersd.generate(
                pair.target,
                pair.draft,
                ids,
                max_new_tokens=2,
                method=method,
                tree=f"batch:{k}",
                top_k=12,
                seed=seed,
            )
            hits += res.steps[0].num_accepted >= 1
        mc = hits / n
        a = float(exact[method][str(k)][0])
        se = math.sqrt(max(a * (1 - a), 1e-4) / n)
        assert abs(mc - a) / se < 3.9, (method, k, mc, a)
        wrong = float(exact[method][str(k - 1)][0]) if k > 1 else None
        if wrong is not None and abs(mc - wrong) / se >= 3.9:
            rejected_broken += 1
    assert rejected_broken >= 3


def test_the_command_runs_resumes_and_reports(tmp_path):
    from click.testing import CliRunner

    from ersd.cli import main

    out, rep = tmp_path / "r.jsonl", tmp_path / "rep"
    args = ["bench", "field-multidraft", "--scale", "toy", "--prompts", "1", "--drafts", "1,2"]
    args += ["--max-new-tokens", "8", "--exact-contexts", "2", "--out", str(out)]
    res = CliRunner().invoke(main, [*args, "--report", str(rep)])
    assert res.exit_code == 0, res.output
    assert (rep / "tables.md").is_file()
    n = len(read_records(out))
    again = CliRunner().invoke(main, args)  # everything is there: nothing runs twice
    assert again.exit_code == 0 and len(read_records(out)) == n
    bad = CliRunner().invoke(main, [*args, "--max-new-tokens", "9"])
    assert bad.exit_code != 0 and "differs in: max_new_tokens" in bad.output
    dry = CliRunner().invoke(main, ["bench", "field-multidraft", "--scale", "liu", "--dry-run"])
    assert dry.exit_code == 0 and "multi:8x4" in dry.output and "cnn_dailymail" in dry.output
