"""Batched benchmark runs (``run.batch_sizes``): planning, records, report, HF generate baseline.

The run tests use the toy FunctionModel pair (``smoke-batch``, milliseconds) and the tiny random
Qwen2 pair (real transformers models: forward counters of the HF adapter and Hugging Face
``generate`` on a left-padded batch).
"""

from __future__ import annotations

import json
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import ersd
from ersd.bench.aggregate import read_all
from ersd.bench.baselines import hf_generate
from ersd.bench.batch_report import summarise_batches
from ersd.bench.batching import count_runs
from ersd.bench.config import BenchConfigError, config_from_dict, load_config
from ersd.bench.models import load_pair
from ersd.bench.planning import batch_plan, plan, prompt_groups
from ersd.bench.report import write_report
from ersd.bench.running import run_bench

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _config(name: str = "smoke-batch", **run: Any) -> dict[str, Any]:
    data = tomllib.loads((resources.files("ersd") / "configs" / f"{name}.toml").read_text())
    data["run"].update(run)
    return data


def _quiet(msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def toy_batch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = config_from_dict(_config(), source="smoke-batch")
    out = tmp_path_factory.mktemp("bench") / "batch.jsonl"
    run_bench(cfg, out, progress=False, log=_quiet)
    return out


# --- planning ----------------------------------------------------------------------------------


def test_prompt_groups_cover_every_prompt_at_every_batch_size() -> None:
    assert prompt_groups(8, 1) == [[i] for i in range(8)]
    assert prompt_groups(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert prompt_groups(8, 8) == [list(range(8))]
    assert prompt_groups(3, 2) == [[0, 1], [2, 0]]  # the last batch cycles to the start
    assert prompt_groups(2, 8) == [[0, 1] * 4]  # fewer prompts than rows: cycle
    for n in range(1, 7):
        for b in (1, 2, 3, 8):
            groups = prompt_groups(n, b)
            assert all(len(g) == b for g in groups)
            assert {i for g in groups for i in g} == set(range(n))


def test_planner_expands_batch_sizes() -> None:
    cfg = load_config("smoke-batch")
    assert cfg.run.batch_sizes == [1, 2]
    entries = plan(cfg, 1.0, None)
    labels = [e.label for e in entries]
    assert labels == ["target-only", "ersd chain:4", "ersd multi:2x2", "sd chain:4"]
    pairs = batch_plan(entries, cfg.run.batch_sizes)
    assert [(b, e.label) for b, e in pairs[:2]] == [(1, "target-only"), (1, "ersd chain:4")]
    assert len(pairs) == 2 * len(entries)
    assert {b for b, _ in pairs} == {1, 2}
    # 3 prompts: 3 batches of 1 and 2 batches of 2, per temperature, per seed
    plans = {t: plan(cfg, t, None) for t in cfg.run.temperatures}
    assert count_runs(plans, 3, [1, 2], 2) == 2 * 4 * (3 + 2) * 2
    # "auto" (the tree chosen by the library) is a label the plan keeps
    auto = config_from_dict(_config(trees={"ersd": ["auto", "chain:4"]}), source="t")
    auto_entries = plan(auto, 1.0, None)
    assert [e.tree for e in auto_entries if e.method == "ersd"].count("auto") == 1
    assert next(e for e in auto_entries if e.tree == "auto").shape is None
    # the default stays one prompt per run
    assert load_config("smoke-toy").run.batch_sizes == [1]


@pytest.mark.parametrize(
    ("patch", "fix"),
    [
        ({"batch_sizes": [0, 2]}, "distinct batch sizes >= 1"),
        ({"batch_sizes": [2, 2]}, "distinct batch sizes >= 1"),
        ({"batch_sizes": []}, "distinct batch sizes >= 1"),
        ({"baselines": ["target-only", "target-only-2tok"]}, "remove 'target-only-2tok'"),
        ({"baselines": ["hf-assisted"]}, "target-only, hf-generate"),
        ({"drafters": ["lookup"]}, "do not run batched"),
        ({"trees": {"ersd": ["dynamic:4"]}}, "dynamic tree, which does not run batched"),
    ],
)
def test_batch_config_errors_name_the_fix(patch: dict[str, Any], fix: str) -> None:
    with pytest.raises(BenchConfigError, match=re.escape(fix)):
        config_from_dict(_config(**patch), source="t.toml")


def test_bundled_batch_configs_validate() -> None:
    for name in ("qwen-cpu-batch", "smoke-batch"):
        cfg = load_config(name)
        quick = load_config(name, quick=True)
        assert cfg.run.batch_sizes[0] == 1 and len(cfg.run.batch_sizes) >= 2
        assert quick.name.endswith("+quick")
    cfg = load_config("qwen-cpu-batch")
    assert cfg.run.batch_sizes == [1, 4, 8] and cfg.prompts.count == 8
    assert set(cfg.run.baselines) == {"target-only", "hf-generate"}
    assert [e.label for e in plan(cfg, 1.0, None)] == [
        "target-only",
        "hf-generate",
        "ersd chain:4",
        "ersd multi:2x2",
    ]


# --- toy run -----------------------------------------------------------------------------------


def test_batch_records_hold_the_measured_fields(toy_batch: Path) -> None:
    metas, results, batches = read_all([toy_batch])
    assert results == [] and len(metas) == 1
    assert metas[0]["run"]["batch_sizes"] == [1, 2]
    cfg = load_config("smoke-batch")
    plans = {t: plan(cfg, t, None) for t in cfg.run.temperatures}
    assert len(batches) == count_runs(plans, 3, [1, 2], 2)
    assert [r["order"] for r in batches] == list(range(len(batches)))
    for r in batches:
        b = r["batch_size"]
        assert r["kind"] == "batch" and b in (1, 2)
        assert len(r["tokens"]) == len(r["prompt_ids"]) == len(r["row_seeds"]) == b
        assert r["num_tokens"] == 16 * b == sum(len(t) for t in r["tokens"])
        assert r["tokens_per_second"] == pytest.approx(r["num_tokens"] / r["wall_time"])
        fwd = r["target_forward_time"] + r["draft_forward_time"]
        assert 0 < fwd <= r["wall_time"]
        assert r["other_time"] == pytest.approx(r["wall_time"] - fwd, abs=1e-9)
        assert r["time_source"] == "engine"  # FunctionModels keep no forward_seconds
        assert r["steps"] >= 16 / (1 + 4)  # at most k + 1 tokens per row per call
        if r["method"] == "target-only":
            assert r["draft_forward_time"] == 0 and r["steps"] == 16
        else:
            assert r["draft_forward_time"] > 0 and r["tree"] in ("chain:4", "multi:2x2")


def test_tokens_do_not_depend_on_batch_size_or_method(toy_batch: Path) -> None:
    """Slot i of a pass is prompt i with seed derive_seed(seed, i) at every batch size, and ERSD
    (float32 toy models) reproduces target-only sampling: one token list per (T, seed, prompt)."""
    _, _, batches = read_all([toy_batch])
    seen: dict[tuple[float, int, str], list[int]] = {}
    checked = 0
    for r in batches:
        if r["method"] == "sd" and r["temperature"] > 0:
            continue  # SD keeps the law, not the tokens
        for j, (pid, toks) in enumerate(zip(r["prompt_ids"], r["tokens"], strict=True)):
            slot = r["group"] * r["batch_size"] + j
            if slot >= 3:  # a cycled row: a fresh seed, other tokens
                continue
            assert r["row_seeds"][j] == ersd.derive_seed(r["seed"], slot)
            key = (r["temperature"], r["seed"], pid)
            assert seen.setdefault(key, toks) == toks, (r["method"], r["batch_size"], key)
            checked += 1
    assert checked >= 40
    # and it is what ersd.generate gives for the prompt alone
    pair = load_pair(load_config("smoke-batch").models)
    from ersd.bench.prompts import encode_prompt, load_prompts

    p0 = load_prompts(["humaneval"], "eval", 1)[0]
    ids = encode_prompt(pair.tokenizer, p0, "auto", 512)
    alone = ersd.generate(
        pair.target, None, ids, max_new_tokens=16, temperature=1.0, seed=ersd.derive_seed(1, 0)
    )
    assert seen[(1.0, 1, p0.id)] == alone.tokens


def test_batches_interleave_configurations(toy_batch: Path) -> None:
    _, _, batches = read_all([toy_batch])
    runs: dict[tuple[Any, ...], list[str]] = {}
    for r in batches:
        key = (r["seed"], r["temperature"], r["batch_size"], r["group"])
        runs.setdefault(key, []).append(f"{r['method']} {r['tree']}")
    firsts = [v[0] for v in runs.values()]
    assert all(len(v) == 4 for v in runs.values())
    assert len(set(firsts)) > 1  # the order rotates from batch to batch
    keys = list(runs)  # every configuration of a batch runs before the next batch
    flat = [(r["seed"], r["temperature"], r["batch_size"], r["group"]) for r in batches]
    assert flat == [k for k in keys for _ in range(4)]


def test_report_renders_batch_tables_and_plot(toy_batch: Path, tmp_path: Path) -> None:
    paths = write_report([toy_batch], tmp_path / "rep")
    text = paths["report"].read_text()
    assert "## Batched throughput" in text and "batch sizes [1, 2]" in text
    heads = [x for x in text.splitlines() if x.startswith("| configuration | B=1 tokens/s")]
    assert len(heads) == 2  # one throughput table per temperature
    assert "| B=2 tokens/s | B=2 ÷ target-only |" in heads[0]
    rows = [x for x in text.splitlines() if x.startswith("| ersd chain:4 |") and x.count("|") == 6]
    assert len(rows) == 2  # the throughput tables (the time-split rows have more columns)
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(cells) == 5
    for c in cells[1:]:  # 2 seeds x 3 (B=1) or 2 (B=2) batches: every cell has an interval
        assert re.match(r"^\d+\.\d+ \[-?\d+\.\d+, \d+\.\d+\]$", c), c
    best = re.findall(
        r"^Best fixed tree of ersd by mean tokens/s: B=1: (\S+) .*; B=2: (\S+) ", text, re.M
    )
    assert len(best) == 2 and all(t in ("chain:4", "multi:2x2") for pair in best for t in pair)
    split = [x for x in text.splitlines() if x.startswith("| configuration | B | forward target")]
    assert len(split) == 2
    split_rows = [x for x in text.splitlines() if re.match(r"^\| sd chain:4 \| [12] \|", x)]
    assert len(split_rows) == 4
    data = paths["batch_throughput"].read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    summary = json.loads(paths["batch_summary"].read_text())
    assert len(summary) == 2 * 4 * 2  # temperatures x configurations x batch sizes
    for s in summary:
        if s["method"] == "target-only":
            assert s["ratio_to_target_only"]["mean"] == pytest.approx(1.0)
        split_sum = sum(s["time_split"].values())
        assert split_sum == pytest.approx(1.0, abs=1e-6)
    # the summary's tokens/s is the mean over runs of total tokens / wall
    _, _, batches = read_all([toy_batch])
    rows2 = summarise_batches(batches)
    row = next(r for r in rows2 if r.method == "ersd" and r.batch_size == 2 and r.temperature == 1)
    runs = [
        b["tokens_per_second"]
        for b in batches
        if b["method"] == "ersd"
        and b["tree"] == row.tree
        and b["batch_size"] == 2
        and b["temperature"] == 1.0
    ]
    assert row.n_runs == len(runs) == 4
    assert row.tokens_per_second.mean == pytest.approx(sum(runs) / len(runs))


def test_cli_batch_sizes_option() -> None:
    from ersd.cli import main

    runner = CliRunner()
    res = runner.invoke(main, ["bench", "run", "smoke-toy", "--dry-run", "--batch-sizes", "1,4"])
    # smoke-toy lists target-only-2tok, which does not run batched
    assert res.exit_code != 0 and "remove 'target-only-2tok'" in res.output
    res = runner.invoke(main, ["bench", "run", "smoke-batch", "--dry-run", "--batch-sizes", "1,4"])
    assert res.exit_code == 0, res.output
    assert "batch sizes [1, 4]" in res.output and "ersd multi:2x2" in res.output
    res = runner.invoke(main, ["bench", "run", "smoke-batch", "--dry-run", "--batch-sizes", "x"])
    assert res.exit_code != 0 and "--batch-sizes 1,4,8" in res.output


# --- tiny Qwen2: Hugging Face generate and forward counters ------------------------------------


def test_hf_generate_left_padded_batch_matches_single_prompts() -> None:
    """Greedy float32: every row of a ragged, left-padded batch decodes what the prompt alone
    decodes (padding masked, positions from the attention mask)."""
    pair = load_pair(load_config("smoke-tiny").models)
    prompts = [[5, 17, 33, 9, 71, 2, 40], [88, 3], [120, 6, 6, 45]]
    out = hf_generate(
        pair.target, prompts, max_new_tokens=10, temperature=0.0, seed=0, eos_token_id=None
    )
    assert out["num_tokens"] == 30 and out["steps"] == out["target_forwards"] == 10
    assert out["target_forward_time"] > 0 and out["other_time"] >= 0
    for p, row in zip(prompts, out["tokens"], strict=True):
        alone = hf_generate(
            pair.target, [p], max_new_tokens=10, temperature=0.0, seed=0, eos_token_id=None
        )
        assert row == alone["tokens"][0]
        # and it is the target's greedy decoding (ersd's engine at T = 0)
        ref = ersd.generate(pair.target, None, p, max_new_tokens=10, temperature=0.0, seed=0)
        assert row == ref.tokens
    with pytest.raises(TypeError, match="Hugging Face model"):
        hf_generate(
            load_pair(load_config("smoke-toy").models).target,
            prompts,
            max_new_tokens=2,
            temperature=1.0,
            seed=0,
            eos_token_id=None,
        )


def test_tiny_qwen2_batch_run_with_hf_generate(tmp_path: Path) -> None:
    data = _config(
        baselines=["target-only", "hf-generate"],
        methods=["ersd"],
        temperatures=[1.0],
        seeds=[0],
        max_new_tokens=6,
    )
    data["models"].update(target="tiny-qwen2", draft="tiny-qwen2")
    data["prompts"]["count"] = 2
    out = run_bench(
        config_from_dict(data, source="t"), tmp_path / "t.jsonl", progress=False, log=_quiet
    )
    _, _, batches = read_all([out])
    methods = {r["method"] for r in batches}
    assert methods == {"target-only", "hf-generate", "ersd"}
    assert len(batches) == 4 * (2 + 1)  # 4 configurations x (2 batches of 1 + 1 of 2)
    for r in batches:
        assert r["num_tokens"] == 6 * r["batch_size"]
        assert r["time_source"] in ("forward_seconds", "hooks")
        assert r["target_forward_time"] > 0 and r["target_forwards"] >= 1
        assert r["other_time"] == pytest.approx(
            max(r["wall_time"] - r["target_forward_time"] - r["draft_forward_time"], 0), abs=1e-9
        )
        if r["method"] == "ersd":
            assert r["time_source"] == "forward_seconds"
            assert r["draft_forward_time"] > 0 and r["draft_forwards"] >= 1
        if r["method"] == "hf-generate":
            assert r["steps"] == 6 and r["draft_forward_time"] == 0
    paths = write_report([out], tmp_path / "rep")
    text = paths["report"].read_text()
    assert re.search(r"^\| hf-generate \| \d+\.\d", text, re.M)
    assert paths["batch_throughput"].read_bytes().startswith(PNG_MAGIC)


def test_hf_generate_baseline_in_a_one_prompt_run(tmp_path: Path) -> None:
    """Without batch_sizes, hf-generate is a per-prompt baseline like the others."""
    data = _config(
        "smoke-tiny",
        baselines=["target-only", "hf-generate"],
        methods=["ersd"],
        optimal=False,
        cost_aware=False,
        max_new_tokens=6,
    )
    out = run_bench(
        config_from_dict(data, source="t"), tmp_path / "p.jsonl", progress=False, log=_quiet
    )
    _, results, batches = read_all([out])
    assert batches == []
    hf = [r for r in results if r["method"] == "hf-generate"]
    assert len(hf) == 2  # two prompts
    for r in hf:
        assert r["num_tokens"] == 6 == len(r["tokens"]) and r["target_calls"] == 6
        assert all(isinstance(t, int) for t in r["tokens"])
        assert r["target_time"] > 0 and r["draft_time"] == 0
        assert r["tokens_per_second"] == pytest.approx(6 / r["wall_time"])
    text = write_report([out], tmp_path / "rep")["report"].read_text()
    assert re.search(r"^\| hf-generate \| – \| 1\.00( \[1\.00, 1\.00\])? \| \d", text, re.M)


def test_auto_records_its_choices_and_the_report_puts_predictions_next_to_measurements(
    tmp_path: Path,
) -> None:
    """A tree="auto" entry: its cost curves are measured in the warm-up (not inside a timed run),
    each record carries the trees chosen and the predicted tokens/s, and the report shows the
    prediction next to the measured throughput."""
    data = _config(temperatures=[1.0], seeds=[0], methods=["ersd"])
    data["run"]["trees"] = {"ersd": ["auto"]}
    cfg = config_from_dict(data, source="t")
    out = tmp_path / "auto.jsonl"
    run_bench(cfg, out, progress=False, log=_quiet)
    _, _, batches = read_all([out])
    autos = [r for r in batches if r["tree"] == "auto"]
    assert autos and all(r["batch_size"] in (1, 2) for r in autos)
    for r in autos:
        steps = r["steps"] * r["batch_size"]
        assert 0 < sum(r["auto_trees"].values()) <= steps
        assert r["auto_predicted_tokens_per_second"] > 0
    for r in autos:  # the decode steps: every engine step after the first (the prefill)
        d = r["auto_decode"]
        assert d["steps"] == r["steps"] - 1
        assert r["num_tokens"] - 5 * r["batch_size"] <= d["tokens"] < r["num_tokens"]
        assert 0 < d["seconds"] < r["wall_time"] and d["predicted_seconds"] > 0
    text = write_report([out], tmp_path / "rep")["report"].read_text()
    head = (
        "| configuration | B | trees chosen | decode steps | predicted tokens/s | "
        "measured tokens/s | measured ÷ predicted | end-to-end tokens/s |"
    )
    assert head in text
    after = text[text.index(head) :].split("\n\n")[0].splitlines()
    table = [x for x in after if x.startswith("| ersd auto | ")]
    assert len(table) == 2  # one per batch size
    for x in table:
        b = int(x.split("|")[2])
        recs = [r for r in autos if r["batch_size"] == b]
        ratios = [
            (d["tokens"] / d["seconds"]) / (d["predicted_tokens"] / d["predicted_seconds"])
            for d in (r["auto_decode"] for r in recs)
        ]
        cells = [c.strip() for c in x.strip("|").split("|")]
        assert float(cells[6].split()[0]) == pytest.approx(sum(ratios) / len(ratios), abs=0.01)
    # records written before auto_decode existed, reported beside new ones: empty decode cells
    lines = out.read_text().splitlines()
    old = tmp_path / "old.jsonl"
    with old.open("w") as f:
        for line in lines:
            r = json.loads(line)
            if r.get("tree") == "auto" and r.get("batch_size") == 2:
                r.pop("auto_decode")
            f.write(json.dumps(r) + "\n")
    text = write_report([old], tmp_path / "rep-old")["report"].read_text()
    after = text[text.index(head) :].split("\n\n")[0].splitlines()
    table = [x for x in after if x.startswith("| ersd auto | ")]
    assert [x.count("|") for x in table] == [9, 9]
    assert [x.split("|")[2].strip() for x in table if "| – | – | – | – |" in x] == ["2"]


def test_auto_summary_compares_prediction_and_measurement_over_the_decode_steps() -> None:
    """The first engine step (the prompts' prefill) is left out on both sides; a step's time is
    its slowest row's, its prediction the batch's shared decision; rows that finished early
    leave the later steps."""
    from ersd.bench.batching import auto_summary
    from ersd.results import GenerationResult, StepRecord

    def choice(tree: str, tokens: float, seconds: float) -> dict[str, object]:
        return {
            "tree": tree,
            "predicted": tokens / seconds,
            "predicted_tokens": tokens,
            "predicted_seconds": seconds,
        }

    plans = [  # (tokens emitted per row, total seconds per row, decision)
        ([1, 1], [9.0, 9.5], choice("chain:1", 3.0, 1.0)),  # prefill: left out
        ([2, 1], [1.0, 1.2], choice("chain:1", 3.6, 1.0)),
        ([1, 2], [0.9, 1.1], choice("none", 2.0, 0.8)),
        ([3], [0.7], choice("chain:2", 2.5, 0.5)),  # row 1 has finished
    ]
    rows: list[list[StepRecord]] = [[], []]
    for j, (toks, secs, ch) in enumerate(plans):
        for i, (n, t) in enumerate(zip(toks, secs, strict=True)):
            rows[i].append(StepRecord(j, [7] * n, 1, 0, 1, 1, total_time=t, choice=dict(ch)))
    results = [
        GenerationResult(
            tokens=[7] * sum(len(s.tokens) for s in steps),
            target_calls=len(steps),
            draft_forwards=0,
            steps=steps,
            method="ersd",
            tree="auto",
            finish_reason="length",
            wall_time=1.0,
        )
        for steps in rows
    ]
    out = auto_summary(results)
    assert out["auto_trees"] == {"chain:1": 4, "none": 2, "chain:2": 1}
    d = out["auto_decode"]
    assert d["steps"] == 3
    assert d["tokens"] == 3 + 3 + 3
    assert d["seconds"] == pytest.approx(1.2 + 1.1 + 0.7)
    assert d["predicted_tokens"] == pytest.approx(3.6 + 2.0 + 2.5)
    assert d["predicted_seconds"] == pytest.approx(1.0 + 0.8 + 0.5)
