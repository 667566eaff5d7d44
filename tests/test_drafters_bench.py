"""Drafters in the benchmark harness: run.drafters entries, the HF prompt-lookup baseline, a
user's prompt file, per-source statistics in records and report."""

from __future__ import annotations

import json
import tomllib
from importlib import resources
from pathlib import Path

import pytest
from click.testing import CliRunner

from ersd.bench.aggregate import read_records
from ersd.bench.config import BenchConfigError, config_from_dict, load_config
from ersd.bench.drafters import load_prompt_file
from ersd.bench.report import write_report
from ersd.bench.running import run_bench
from ersd.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(name: str, **run: object) -> dict:
    data = tomllib.loads((resources.files("ersd") / "configs" / f"{name}.toml").read_text())
    data["run"].update(run)
    return data


def _quiet(msg: str) -> None:
    pass


def test_tiny_hf_pair_runs_drafters_and_hf_prompt_lookup(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"id": "mine/0", "prompt": "a b c a b c a b"}) + "\n")
    data = _config(
        "smoke-tiny",
        max_new_tokens=8,
        optimal=False,
        cost_aware=False,
        methods=["ersd", "sd"],
        drafters=["lookup", "lookup:policy=both+draft"],
        baselines=["target-only", "hf-prompt-lookup"],
    )
    data["prompts"].update(sets=["grounded"], count=1, file=str(mine))
    cfg = config_from_dict(data, source="smoke-tiny")
    out = run_bench(cfg, tmp_path / "d.jsonl", progress=False, log=_quiet)
    _, results = read_records([out])
    assert {r["prompt_set"] for r in results} == {"grounded", "file"}
    hf = [r for r in results if r["method"] == "hf-prompt-lookup"]
    assert len(hf) == 2 and all(r["num_tokens"] == 8 and r["target_calls"] >= 1 for r in hf)
    alone = {r["prompt_id"]: r["tokens"] for r in results if r["method"] == "target-only"}
    drafted = [r for r in results if r.get("drafter")]
    assert {r["drafter"] for r in drafted} == {"lookup", "lookup:policy=both+draft"}
    for r in drafted:
        assert "drafter_stats" in r
        if r["method"] == "ersd":  # float32: the same text as target-only
            assert r["tokens"] == alone[r["prompt_id"]]
    hybrid = [r for r in drafted if "+" in r["drafter"] and r["method"] == "ersd"]
    assert all("model" in r["drafter_stats"] and r["drafter_mixes"] for r in hybrid)
    text = write_report([out], tmp_path / "rep")["report"].read_text()
    assert "hf-prompt-lookup (k=4)" in text and "@lookup" in text
    assert "Per-source acceptance" in text


@pytest.mark.parametrize(
    ("drafters", "match"),
    [
        (["lookup:n=x"], "must be an integer"),
        (["lookup+qwen2.5-coder-0.5b"], "must be 'draft'"),
        (["suffix:bogus=1"], "unknown option"),
    ],
)
def test_bad_drafter_specs_in_a_config(drafters: list[str], match: str) -> None:
    with pytest.raises(BenchConfigError, match=match):
        config_from_dict(_config("smoke-toy", drafters=drafters), source="x")


def test_prompt_file_formats_and_errors(tmp_path: Path) -> None:
    text = tmp_path / "p.txt"
    text.write_text("first prompt\nline two\n\nsecond prompt\n")
    rows = load_prompt_file(text)
    assert [r["prompt"].strip() for r in rows] == ["first prompt\nline two", "second prompt"]
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(BenchConfigError, match='"prompt" string'):
        load_prompt_file(bad)
    with pytest.raises(BenchConfigError, match="does not exist"):
        load_prompt_file(tmp_path / "none.jsonl")
    data = _config("smoke-toy")
    data["prompts"]["sets"] = []
    with pytest.raises(BenchConfigError, match="prompts.sets is empty"):
        config_from_dict(data, source="x")


def test_cli_prompts_file_runs_only_with_the_file(tmp_path: Path) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_text("abc abc abc\n\nxyz xyz\n")
    cfg = tmp_path / "c.toml"
    data = _config("smoke-toy", drafters=["lookup"], methods=["ersd"], seeds=[0])
    data["prompts"]["sets"] = ["math"]
    data["run"]["temperatures"] = [1.0]
    data["run"]["max_new_tokens"] = 6
    lines = []
    for section, table in data.items():
        if isinstance(table, dict) and section != "quick":
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in table.items() if v != {}]
        elif not isinstance(table, dict):
            lines.insert(0, f"{section} = {json.dumps(table)}")
    cfg.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(
        main,
        ["bench", "run", str(cfg), "--out", str(out), "--no-progress", "--prompts-file", str(mine)],
    )
    assert res.exit_code == 0, res.output
    _, results = read_records([out])
    assert {r["prompt_id"] for r in results if r["prompt_set"] == "file"} == {"mine/0", "mine/1"}
    assert any(r.get("drafter") == "lookup" for r in results)


@pytest.mark.parametrize("name", ["drafters-grounded", "drafters-open", "smoke-drafters"])
def test_drafter_configs_validate(name: str) -> None:
    cfg = load_config(name)
    assert cfg.run.drafters and "hf-prompt-lookup" in cfg.run.baselines
    load_config(name, quick=True) if name != "smoke-drafters" else None
