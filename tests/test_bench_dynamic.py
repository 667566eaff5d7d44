"""Dynamic ERSD trees in the benchmark: config entries, calibration with margin tables, records,
and the report's calibration section (weight-free toy pair, seconds)."""

from __future__ import annotations

import json
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from ersd.bench.calibration import Calibration
from ersd.bench.config import BenchConfigError, config_from_dict
from ersd.bench.report import write_report
from ersd.bench.running import run_bench
from ersd.theory.margin import MarginPredictor
from ersd.theory.profile import load_profiles, nearest_temperature

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TREES = ["dynamic:4", "dynamic:6@3", "dynamic-cost:6"]


def _config(**run: object) -> dict:
    data = tomllib.loads((resources.files("ersd") / "configs" / "smoke-toy.toml").read_text())
    data["run"].update(
        {
            "methods": ["ersd", "sd"],
            "seeds": [0],
            "trees": {"ersd": TREES},
            "optimal": False,
            "cost_aware": False,
            **run,
        }
    )
    data["prompts"]["sets"] = ["humaneval"]
    return data


@pytest.fixture(scope="module")
def dyn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = config_from_dict(_config(), source="smoke-toy+dynamic")
    out = tmp_path_factory.mktemp("bench") / "dyn.jsonl"
    run_bench(cfg, out, progress=False, log=lambda m: None)
    return out


def _records(path: Path) -> tuple[dict, list[dict]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return lines[0], [r for r in lines[1:] if r["kind"] == "result"]


def test_dynamic_entries_run_and_match_target_only(dyn_run: Path) -> None:
    meta, recs = _records(dyn_run)
    plans = meta["plans"]
    for temp in ("0.0", "1.0"):
        assert [e["tree"] for e in plans[temp] if e["tree"] in TREES] == TREES
    alone = {
        (r["prompt_id"], r["temperature"], r["seed"]): r["tokens"]
        for r in recs
        if r["method"] == "target-only"
    }
    dyn = [r for r in recs if r["tree"] in TREES]
    assert len(dyn) == len(TREES) * 2 * 2  # trees x temperatures x prompts
    for r in dyn:
        assert "error" not in r, r.get("error")
        assert r["tokens"] == alone[(r["prompt_id"], r["temperature"], r["seed"])]
        assert len(r["expected_tokens"]) == r["target_calls"]
        assert r["policy_time"] >= 0
        if r["temperature"] > 0:
            # every step drafts, but the last one when no room is left for a draft
            assert all(e is not None and e >= 1 for e in r["expected_tokens"][:-1])
            assert r["margin_events"], "no margin events recorded at T > 0"
            for depth, margin, rank, children, pred in r["margin_events"]:
                assert depth >= 1 and rank >= 1 and children >= 0
                assert margin is None or margin >= 0
                assert pred is None or 0 <= pred <= 1
        else:  # T = 0: the greedy chain, no races
            assert r["margin_events"] == []


def test_calibration_file_carries_the_margin_table(dyn_run: Path) -> None:
    cal_path = dyn_run.with_name(dyn_run.stem + ".calibration.json")
    cal = Calibration.load(cal_path)
    prof = cal.profiles[1.0]
    assert prof.margin is not None and prof.margin.num_observations > 0
    # the one profile reader (optimal:K@file uses it too) returns the same table
    again = nearest_temperature(load_profiles(cal_path).profiles, 1.0)
    pred = MarginPredictor.from_profile(again)
    assert pred.table.num_observations == prof.margin.num_observations


def test_report_has_the_dynamic_section_and_calibration_plot(dyn_run: Path, tmp_path: Path) -> None:
    paths = write_report([dyn_run], tmp_path / "rep")
    text = paths["report"].read_text()
    assert "## Dynamic ERSD trees" in text
    assert "| T | margin | n | predicted | observed [95% CI] |" in text
    for spec in TREES:
        assert f"| 1 | {spec} |" in text
    data = paths["dynamic_calibration"].read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000


@pytest.mark.parametrize(
    ("trees", "fix"),
    [
        ({"gls": ["dynamic:4"]}, "list it under one of them"),
        ({"sd": ["dynamic-cost:4"]}, "ERSD's only"),
        ({"ersd": ["dynamic:0"]}, "dynamic:K"),
    ],
)
def test_config_errors(trees: dict, fix: str) -> None:
    with pytest.raises(BenchConfigError, match=fix):
        config_from_dict(_config(trees=trees), source="bad")


def test_bundled_dynamic_config_validates() -> None:
    from ersd.bench.config import load_config

    cfg = load_config("qwen-cpu-dynamic")
    assert any(s.startswith("dynamic") for s in cfg.run.trees["ersd"])
    load_config("qwen-cpu-dynamic", quick=True)


@pytest.mark.parametrize("method", ["sd", "specinfer", "spectr"])
def test_baseline_dynamic_entries_run_with_their_own_method(method: str) -> None:
    """A `dynamic:K` entry listed under a baseline runs that method on its confidence-grown tree
    (it once ran ERSD's calibrated tree under the baseline's label)."""
    import ersd
    from ersd.bench import dynamic as dynamic_trees
    from tests.toy import mixed_draft, table_model

    target = table_model(30, seed=0)
    draft = mixed_draft(target, table_model(30, seed=1), 0.3)
    dyn = dynamic_trees.setup("dynamic:4@2", None, 1.0, method)
    assert dyn is not None
    for seed in range(3):
        res, extra = dynamic_trees.run_dynamic(
            dyn, target, draft, [1, 2], temperature=1.0, seed=seed, max_new_tokens=16, eos=None
        )
        alone = ersd.generate(
            target,
            draft,
            [1, 2],
            method=method,
            tree="dynamic:4@2",
            seed=seed,
            max_new_tokens=16,
            temperature=1.0,
        )
        assert res.tokens == alone.tokens
        assert res.method == method
        assert extra["margin_events"] is None  # no race margins: not ERSD's policy
        assert all(e is None for e in extra["expected_tokens"])


def test_bench_records_of_baseline_dynamic_entries(tmp_path: Path) -> None:
    cfg = config_from_dict(
        _config(trees={"ersd": ["dynamic:4"], "specinfer": ["dynamic:4@2"]}, temperatures=[1.0]),
        source="smoke-toy+baseline-dynamic",
    )
    out = tmp_path / "dyn.jsonl"
    run_bench(cfg, out, progress=False, log=lambda m: None)
    _, recs = _records(out)
    spec = [r for r in recs if r["tree"] == "dynamic:4@2"]
    assert spec and all(r["method"] == "specinfer" and "error" not in r for r in spec)
    assert all(r["margin_events"] is None for r in spec)
    ours = [r for r in recs if r["method"] == "ersd" and r["tree"] == "dynamic:4"]
    assert ours and all(r["margin_events"] for r in ours)
