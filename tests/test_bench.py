"""Benchmark harness: run + report end to end on weight-free models, configs, tree specs, CIs.

Everything here runs on the ``toy`` FunctionModel pair (milliseconds per run) except one test on
a tiny random Qwen2 pair, which exercises Hugging Face assisted generation and tree attention.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import ersd
from ersd.bench.aggregate import read_records, summarise
from ersd.bench.baselines import target_only_two_token
from ersd.bench.calibration import Calibration
from ersd.bench.config import BenchConfigError, config_from_dict, load_config
from ersd.bench.costs import CostModel, candidate_trees, choose_trees, predict
from ersd.bench.models import load_pair
from ersd.bench.planning import plan
from ersd.bench.prompts import load_prompts
from ersd.bench.report import write_report
from ersd.bench.running import run_bench
from ersd.bench.stats import bootstrap_interval, t_interval
from ersd.bench.trees import natural_shapes
from ersd.errors import InvalidTreeSpecError
from ersd.theory import RankProfile, expected_block_efficiency, optimal_tree
from ersd.tree import TreeShape
from ersd.tree_spec import parse_tree


def _toy_config(**run: object) -> dict:
    data = tomllib.loads((resources.files("ersd") / "configs" / "smoke-toy.toml").read_text())
    data["run"].update(run)
    return data


def _quiet(msg: str) -> None:
    pass


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = config_from_dict(_toy_config(), source="smoke-toy")
    out = tmp_path_factory.mktemp("bench") / "toy.jsonl"
    run_bench(cfg, out, progress=False, log=_quiet)
    return out


# --- run ---------------------------------------------------------------------------------------


def test_run_writes_one_consistent_record_per_run(toy_run: Path) -> None:
    metas, results = read_records([toy_run])
    assert len(metas) == 1
    meta = metas[0]
    for key in ("ersd", "torch", "transformers", "dtype", "torch_threads", "cpu", "date"):
        assert key in meta["run"]
    plans = meta["plans"]
    n_prompts, n_seeds = 4, 2  # 2 sets x count 2; seeds [0, 1]
    assert len(results) == sum(len(v) for v in plans.values()) * n_prompts * n_seeds
    methods = {r["method"] for r in results}
    assert {"target-only", "target-only-2tok", "ersd", "sd", "specinfer", "spechub"} <= methods
    for r in results:
        assert r["num_tokens"] == 24 == len(r["tokens"])
        assert r["block_efficiency"] == pytest.approx(r["num_tokens"] / r["target_calls"])
        assert sum(r["tokens_per_call"]) == r["num_tokens"]
        assert len(r["accepted_per_call"]) == r["target_calls"]
        assert sum(r["acceptance_histogram"]) == r["target_calls"]
        split = r["draft_time"] + r["target_time"] + r["other_time"]
        assert split == pytest.approx(r["wall_time"], rel=1e-6, abs=1e-6)
        assert r["tokens_per_second"] == pytest.approx(r["num_tokens"] / r["wall_time"])
        if r["method"] == "ersd":
            assert len(r["ranks"]) == r["target_calls"]
            if r["temperature"] > 0:  # a rank per verified context that had children
                for rk, acc in zip(r["ranks"], r["accepted_per_call"], strict=True):
                    assert acc <= len(rk) <= acc + 1 and all(x >= 1 for x in rk)
        elif r["method"] not in ("target-only", "target-only-2tok"):
            assert len(r["acceptance_events"]) == r["target_calls"]
        if r["tree"]:
            assert r["depth"] >= 1 and r["num_nodes"] >= 1


def test_baselines_and_ersd_match_target_only_tokens(toy_run: Path) -> None:
    """Same process, same prompts, same seeds: ERSD and the 2-token baseline reproduce
    target-only race sampling token for token (float32 FunctionModels)."""
    _, results = read_records([toy_run])
    ref = {
        (r["prompt_id"], r["temperature"], r["seed"]): r["tokens"]
        for r in results
        if r["method"] == "target-only"
    }
    checked = 0
    for r in results:
        if r["method"] in ("ersd", "target-only-2tok"):
            assert r["tokens"] == ref[(r["prompt_id"], r["temperature"], r["seed"])]
            checked += 1
    assert checked > 20


def test_methods_interleave_per_prompt(toy_run: Path) -> None:
    _, results = read_records([toy_run])
    orders = [r["order"] for r in results]
    assert orders == list(range(len(results)))
    first_prompt = results[0]["prompt_id"]
    # all configurations of the first prompt run before the second prompt starts
    n_first = sum(1 for r in results if r["prompt_id"] == first_prompt)
    assert {r["prompt_id"] for r in results[:n_first]} == {first_prompt}
    # the order of configurations rotates from prompt to prompt
    second = next(r for r in results if r["prompt_id"] != first_prompt)["prompt_id"]
    m1 = [(r["method"], r["tree"]) for r in results if r["prompt_id"] == first_prompt][:3]
    m2 = [(r["method"], r["tree"]) for r in results if r["prompt_id"] == second][:3]
    assert m1 != m2


def test_calibration_is_saved_and_feeds_optimal_and_cost_aware_trees(toy_run: Path) -> None:
    cal_path = toy_run.with_name("toy.calibration.json")
    cal = Calibration.load(cal_path)
    assert 1.0 in cal.profiles and cal.profiles[1.0].num_observations > 0
    assert cal.costs is not None and len(cal.costs.target) == len(cal.costs.sizes)
    choice = cal.choices[1.0]
    assert choice["cost_aware"]["tokens_per_second"] == max(
        c["tokens_per_second"] for c in choice["top_candidates"]
    )
    _, results = read_records([toy_run])
    choices = {c for r in results if r["method"] == "ersd" for c in (r["choice"] or "").split("+")}
    assert {"optimal-per-call", "cost-aware"} <= choices
    preds = [r["prediction"] for r in results if "cost-aware" in (r["choice"] or "")]
    assert preds and all(p["block_efficiency"] >= 1 for p in preds)
    # the optimal tree spec with the saved file gives the same tree as the in-run plan
    shape = parse_tree(f"optimal:4@{cal_path}", temperature=1.0)
    entries = plan(config_from_dict(_toy_config(), source="t"), 1.0, cal)
    opt = [e for e in entries if "optimal:4" in [e.tree, *e.aliases]]
    assert opt and opt[0].shape is not None and opt[0].shape.paths == shape.paths


# --- report ------------------------------------------------------------------------------------


def test_report_table_parses_and_figures_are_pngs(toy_run: Path, tmp_path: Path) -> None:
    paths = write_report([toy_run], tmp_path / "rep")
    text = paths["report"].read_text()
    assert "Student-t 95%" in text and "vs 2-tok" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    header = [r for r in rows if r.startswith("| configuration | k | block efficiency")]
    assert len(header) == 2  # one table per temperature
    ncols = header[0].count("|")
    table_rows = [r for r in rows if r.count("|") == ncols and not r.startswith("| configuration")]
    timing = [r for r in rows if r.startswith("| configuration | draft | target | other")]
    assert len(timing) == 2
    assert len(table_rows) >= 2 * 10
    for row in table_rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert re.match(r"^\d+\.\d\d( \[-?\d+\.\d\d, \d+\.\d\d\])?$", cells[2]), cells
    for key in ("block_efficiency", "speedup"):
        data = paths[key].read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    summary = json.loads(paths["summary"].read_text())
    target_only = [s for s in summary if s["method"] == "target-only"]
    assert all(s["speedup"]["mean"] == pytest.approx(1.0) for s in target_only)
    ersd_rows = [s for s in summary if s["method"] == "ersd" and s["temperature"] == 1.0]
    assert all(s["theory_block_efficiency"] is not None for s in ersd_rows)
    assert all(
        s["identical_to_target_only"][0] == s["identical_to_target_only"][1] for s in ersd_rows
    )


def test_summary_speedup_is_mean_of_per_prompt_ratios(toy_run: Path) -> None:
    metas, results = read_records([toy_run])
    rows = summarise(results, metas)
    row = next(r for r in rows if r.method == "sd" and r.temperature == 1.0)
    base = {
        (r["prompt_id"], r["seed"]): r["tokens_per_second"]
        for r in results
        if r["method"] == "target-only" and r["temperature"] == 1.0
    }
    per_prompt: dict[str, list[float]] = {}
    for r in results:
        if r["method"] == "sd" and r["temperature"] == 1.0:
            per_prompt.setdefault(r["prompt_id"], []).append(
                r["tokens_per_second"] / base[(r["prompt_id"], r["seed"])]
            )
    expected = np.mean([np.mean(v) for v in per_prompt.values()])
    assert row.speedup is not None and row.speedup.mean == pytest.approx(expected)
    assert row.speedup.n == 4


def test_cli_run_and_report(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(
        'name = "cli"\n[models]\ntarget = "toy"\ndraft = "toy"\ndtype = "float32"\n'
        '[prompts]\nsets = ["humaneval"]\ncount = 2\n'
        '[run]\nmax_new_tokens = 8\nmethods = ["ersd"]\nbudgets = [2]\noptimal = false\n'
        'cost_aware = false\nbaselines = ["target-only"]\n'
    )
    out = tmp_path / "r.jsonl"
    runner = CliRunner()
    res = runner.invoke(
        _main(), ["bench", "run", str(cfg_file), "--out", str(out), "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    # meta + 2 prompts x (target-only, ersd chain:2, ersd multi:2x1)
    assert len(out.read_text().splitlines()) == 1 + 2 * 3
    res = runner.invoke(_main(), ["bench", "report", str(out), "--out-dir", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "| configuration |" in res.output
    res = runner.invoke(_main(), ["bench", "run", "no-such-config"])
    assert res.exit_code != 0 and "bundled configs" in res.output
    res = runner.invoke(_main(), ["bench", "run", "qwen-full", "--dry-run", "--temperatures", "x"])
    assert res.exit_code != 0 and "--temperatures 0,0.7,1" in res.output


def _main() -> Any:
    from ersd.cli import main

    return main


# --- configs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["smoke-toy", "smoke-tiny", "smoke-smollm", "qwen-quick", "qwen-full"]
)
def test_bundled_configs_validate(name: str) -> None:
    cfg = load_config(name)
    assert cfg.run.max_new_tokens >= 1
    if name.startswith("qwen"):
        quick = load_config(name, quick=True)
        assert quick.name.endswith("+quick")


@pytest.mark.parametrize(
    ("patch", "fix"),
    [
        ({"run": {"methds": ["ersd"]}}, "known keys: max_new_tokens"),
        ({"run": {"methods": ["ersdd"]}}, "known methods:"),
        ({"run": {"budgets": [0]}}, "draft budgets must be >= 1"),
        ({"run": {"baselines": ["vllm"]}}, "known: target-only"),
        ({"run": {"temperatures": "1.0"}}, "must be a list in square brackets"),
        ({"prompts": {"sets": ["gsm8k"]}}, "known sets: humaneval, mtbench, math"),
        ({"prompts": {"template": "jinja"}}, "'auto'"),
        ({"calibrate": {"temperatures": [0.0]}}, "must be > 0"),
        ({"models": {"dtype": "int8"}}, "use 'bfloat16'"),
        ({"models": {"draft_dtype": "int4"}}, "'' (same as dtype)"),
        ({"models": {"linear": "mkl"}}, "'onednn'"),
        ({"run": {"trees": {"ersd": ["chain:x"]}}}, "positive integer"),
        ({"extra": {}}, "unknown top-level key 'extra'"),
        ({"run": {"draft_sharpness": 0}}, "run.draft_sharpness must be a number > 0"),
        ({"run": {"draft_sharpness": "1.3"}}, "run.draft_sharpness must be a number"),
    ],
)
def test_config_errors_name_the_fix(patch: dict, fix: str) -> None:
    data = _toy_config()
    for section, values in patch.items():
        data.setdefault(section, {}).update(values)
    with pytest.raises(BenchConfigError, match=re.escape(fix)):
        config_from_dict(data, source="t.toml")


def test_quick_without_quick_table_and_hf_baseline_on_toy(tmp_path: Path) -> None:
    data = _toy_config()
    data.pop("quick")
    with pytest.raises(BenchConfigError, match=r"no \[quick\] table"):
        config_from_dict(data, quick=True, source="t.toml")
    cfg = config_from_dict(_toy_config(baselines=["hf-assisted"]), source="t.toml")
    with pytest.raises(BenchConfigError, match="remove 'hf-assisted'"):
        run_bench(cfg, tmp_path / "x.jsonl", progress=False, log=_quiet)
    with pytest.raises(BenchConfigError, match="neither a file nor a bundled config"):
        load_config("does-not-exist")


def test_prompt_splits_are_disjoint() -> None:
    for s in ("humaneval", "mtbench", "math"):
        ev = {p.id for p in load_prompts([s], "eval", 1000)}
        ca = {p.id for p in load_prompts([s], "calib", 1000)}
        assert ev and ca and not ev & ca
    assert len(load_prompts(["humaneval"], "eval", 1000)) == 40


# --- tree specs --------------------------------------------------------------------------------


def test_optimal_tree_spec_uses_the_profile() -> None:
    probs = [0.6, 0.25, 0.1, 0.05]
    shape = parse_tree("optimal:6", profile=probs)
    assert list(shape.paths) == sorted(optimal_tree(probs, 6), key=lambda t: (len(t), t))
    # per-depth profiles: a sharper second depth favours going deep
    deep = parse_tree("optimal:3", profile=[[0.5, 0.5], [1.0]])
    assert deep.paths == ((0,), (1,), (0, 0))
    with pytest.raises(InvalidTreeSpecError, match="needs a rank profile"):
        parse_tree("optimal:4")
    with pytest.raises(InvalidTreeSpecError, match="e.g. 'optimal:8'"):
        parse_tree("optimal:four", profile=probs)
    assert parse_tree("chain:3") == TreeShape.chain(3)


def test_optimal_tree_spec_from_file(tmp_path: Path) -> None:
    prof = RankProfile.from_step_ranks([[1, 1, 2], [1, 3], [2], [1, 1, 1, 1]] * 20, vocab_size=8)
    path = tmp_path / "p.json"
    prof.save(path)
    shape = parse_tree(f"optimal:5@{path}")
    assert shape.num_nodes == 5
    with pytest.raises(InvalidTreeSpecError, match="ersd bench calibrate"):
        parse_tree(f"optimal:5@{tmp_path / 'missing.json'}")


def test_binary_and_natural_shapes() -> None:
    assert TreeShape.binary(6).paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1))
    assert parse_tree("binary:3").max_children == 2
    assert natural_shapes("sd", 8) == ["chain:8"]
    assert natural_shapes("ersd", 8) == ["chain:8", "multi:2x4", "multi:4x2"]
    hub = natural_shapes("spechub", 8)
    assert hub == ["multi:2x4", "binary:8"]
    assert all(parse_tree(s).max_children <= 2 for s in hub)
    assert natural_shapes("specinfer", 4) == ["chain:4", "multi:2x2", "multi:4x1"]


# --- cost model and intervals ------------------------------------------------------------------


def test_cost_model_step_time_and_choice() -> None:
    costs = CostModel(
        sizes=[1, 2, 4, 8],
        target=[0.2, 0.2, 0.22, 0.25],
        draft=[0.08, 0.08, 0.09, 0.1],
        overhead=0.01,
        overhead_plain=0.002,
    )
    # chain:4: target(5) + draft(1) + 3 level forwards of width 1 + overhead
    expected = costs.target_cost(5) + 4 * 0.08 + 0.01
    assert costs.step_time(TreeShape.chain(4)) == pytest.approx(expected)
    assert costs.target_cost(5) == pytest.approx(0.2275)
    # multi:2x2: levels feed 1 (root) then 2 nodes of depth 1
    assert costs.step_time(TreeShape.multi(2, 2)) == pytest.approx(
        costs.target_cost(5) + 0.08 + 0.08 + 0.01
    )
    probs = [[0.9, 0.06, 0.03]]
    pred = predict(TreeShape.chain(4), probs, costs)
    assert pred.block_efficiency == pytest.approx(
        expected_block_efficiency([(0,) * d for d in range(1, 5)], probs[0])
    )
    assert pred.speedup == pytest.approx(pred.tokens_per_second * (0.2 + 0.002))
    choice = choose_trees(probs, costs, [4, 8], max_nodes=10)
    best = choice["cost_aware"]["tokens_per_second"]
    for spec, shape in candidate_trees(probs, 10).items():
        assert predict(shape, probs, costs, spec).tokens_per_second <= best + 1e-12
    assert set(choice["optimal_per_call"]) == {"4", "8"}


def test_t_interval_known_case() -> None:
    iv = t_interval([1, 2, 3, 4, 5])
    # mean 3, s = sqrt(2.5), t_{0.975, 4} = 2.776445
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
    assert iv.mean == 3 and iv.low == pytest.approx(3 - half, abs=1e-5)
    assert iv.high == pytest.approx(3 + half, abs=1e-5)
    assert iv.format() == "3.00 [1.04, 4.96]"
    one = t_interval([2.5])
    assert one.n == 1 and math.isnan(one.low) and one.format() == "2.50"


def test_bootstrap_interval() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(10.0, 2.0, size=40)
    iv = bootstrap_interval(x, np.random.default_rng(1))
    tv = t_interval(x)
    assert iv.low < x.mean() < iv.high
    # for a normal sample the percentile bootstrap is close to the t-interval (within 25%)
    assert iv.half_width == pytest.approx(tv.half_width, rel=0.25)
    const = bootstrap_interval([2.0, 2.0, 2.0], np.random.default_rng(1))
    assert const.low == const.high == 2.0


# --- baselines ---------------------------------------------------------------------------------


def test_two_token_baseline_matches_target_only() -> None:
    pair = load_pair(load_config("smoke-toy").models)
    ids = pair.tokenizer.encode("def f(x):")
    for temp in (0.0, 0.7, 1.0):
        ref = ersd.generate(pair.target, None, ids, max_new_tokens=20, temperature=temp, seed=3)
        two = target_only_two_token(pair.target, ids, max_new_tokens=20, temperature=temp, seed=3)
        assert two.tokens == ref.tokens
        assert two.target_calls == 20
    # each forward feeds two tokens: the pending one and a throw-away node (+ prompt on prefill)
    calls_before = pair.target.forward_calls
    target_only_two_token(pair.target, ids, max_new_tokens=5, temperature=1.0, seed=0)
    assert pair.target.forward_calls - calls_before == 5


def test_tiny_hf_pair_with_assisted_generation(tmp_path: Path) -> None:
    """Real transformers models (random 2-layer Qwen2): HF assisted generation and ERSD run
    through the harness and the report."""
    data = tomllib.loads((resources.files("ersd") / "configs" / "smoke-tiny.toml").read_text())
    data["run"].update(max_new_tokens=8, optimal=False, cost_aware=False, methods=["ersd"])
    cfg = config_from_dict(data, source="smoke-tiny")
    out = run_bench(cfg, tmp_path / "tiny.jsonl", progress=False, log=_quiet)
    _, results = read_records([out])
    hf = [r for r in results if r["method"] == "hf-assisted"]
    assert len(hf) == 2
    for r in hf:
        assert r["num_tokens"] == 8 and r["target_calls"] >= 2
        assert r["block_efficiency"] == pytest.approx(8 / r["target_calls"])
        assert r["draft_forwards"] >= 1 and r["target_time"] > 0
    paths = write_report([out], tmp_path / "rep")
    text = paths["report"].read_text()
    assert "hf-assisted (k=4)" in text
    assert re.search(r"÷ Hugging Face assisted generation .*k=4: \d+\.\d\d", text)


def test_rank_dependence_counts_consecutive_contexts() -> None:
    from ersd.bench.aggregate import rank_dependence

    rec = {
        "method": "ersd",
        "temperature": 1.0,
        # call 1: R=1, R=1, then rejection R=3; call 2 continues at the next context: R=1, R=2;
        # call 3 starts after a rejection again: R=1 (full accept, bonus); call 4: no pair.
        "ranks": [[1, 1, 3], [1, 2], [1], [2]],
    }
    dep = rank_dependence([rec, {**rec, "temperature": 0.0}, {**rec, "method": "sd"}])
    assert set(dep) == {1.0}
    d = dep[1.0]
    assert d["P(R=1)"] == pytest.approx(4 / 7)
    # pairs after R=1: (1,1) (1,3) (1,2) -> 1 of 3; after R>1: (3,1) (2,1) -> 2 of 2
    assert d["P(R=1 | prev=1)"] == pytest.approx(1 / 3)
    assert d["P(R=1 | prev>1)"] == pytest.approx(1.0)
    assert d["pairs"] == 5


def test_failed_run_is_recorded_and_left_out_of_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ersd.bench.running as runner_mod

    real = runner_mod.run_entry

    def flaky(e, pair, ids, temp, seed, max_new_tokens, eos, **kw):  # type: ignore[no-untyped-def]
        if e.method == "sd" and max_new_tokens > 2:  # the warm-up (2 tokens) passes
            raise RuntimeError("out of memory (simulated)")
        return real(e, pair, ids, temp, seed, max_new_tokens, eos, **kw)

    monkeypatch.setattr(runner_mod, "run_entry", flaky)
    data = _toy_config(
        temperatures=[1.0], seeds=[0], methods=["sd", "ersd"], optimal=False, cost_aware=False
    )
    out = run_bench(
        config_from_dict(data, source="t"), tmp_path / "f.jsonl", progress=False, log=_quiet
    )
    lines = [json.loads(x) for x in out.read_text().splitlines()[1:]]
    failed = [r for r in lines if "error" in r]
    assert len(failed) == 4 and all(r["method"] == "sd" for r in failed)
    with pytest.warns(RuntimeWarning, match="4 records are failed runs"):
        paths = write_report([out], tmp_path / "rep")
    assert "| sd chain:4" not in paths["report"].read_text()
