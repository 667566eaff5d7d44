"""``python -m research.auto_check``'s issue-50 pieces: ``auto`` of another checkout run in a
worker subprocess (``--old-auto``, ``--auto-worker``), new ÷ old per cell, and the issue's
criteria per cell (``checks``)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def row(prompt: str, s: str, config: str, rate: float, forwards: int = 0) -> dict:
    return {
        "prompt": prompt,
        "set": s,
        "temperature": 0.0,
        "config": config,
        "rate": rate,
        "tokens": 10,
        "draft_forwards": forwards,
        "finding_out": {"share": 0.0, "can_pay": True} if config.startswith("auto") else None,
    }


def test_new_against_old_per_cell_and_the_issue_criteria() -> None:
    from research.auto_check import summarise

    rows = []
    for p, (auto, old, c4) in {"a": (10.0, 8.0, 9.0), "b": (9.0, 9.0, 10.0)}.items():
        rows += [
            row(p, "code", "plain", 5.0),
            row(p, "code", "auto", auto, 3),
            row(p, "code", "auto-old", old, 4),
            row(p, "code", "auto-new", auto * 1.1, 3),
            row(p, "code", "chain:4", c4, 3),
        ]
    cell = summarise(rows, ["chain:4"], "hf")["code T=0"]
    assert cell["auto/auto-old"].startswith("1.125")  # (10/8 + 9/9) / 2
    assert cell["auto-new/auto-old"].startswith("1.238")  # 1.1 * 1.125 = 1.2375
    assert cell["auto-old/plain"].startswith("1.700") and cell["auto-old_draft_forwards"] == 8
    assert cell["auto-old/best-fixed"].startswith("0.894")  # (8/9 + 9/10) / 2
    assert cell["checks"] == {
        "auto/best-fixed mean >= 0.95": True,  # (10/9 + 9/10) / 2 = 1.006
        "auto/auto-old not below 1 beyond noise": True,
        "auto-new/auto-old not below 1 beyond noise": True,
    }
    # the category criterion is per category: the pooled cell does not carry it
    assert "auto/best-fixed mean >= 0.95" not in summarise(rows, ["chain:4"])["all T=0"]["checks"]
    # a new auto clearly below the old fails its check; below 0.95 of the best fixed fails too
    slow = []
    for p, auto in {"a": 5.0, "b": 5.2, "c": 4.8}.items():  # auto ÷ old 0.5, 0.52, 0.48
        slow += [
            row(p, "code", "plain", 5.0),
            row(p, "code", "auto", auto),
            row(p, "code", "auto-old", 10.0),
            row(p, "code", "chain:4", 10.0),
        ]
    bad = summarise(slow, ["chain:4"], "hf")["code T=0"]["checks"]
    assert bad["auto/auto-old not below 1 beyond noise"] is False
    assert bad["auto/best-fixed mean >= 0.95"] is False


def test_llamacpp_criteria_auto_at_plain_with_zero_draft_forwards() -> None:
    from research.auto_check import summarise

    rows = [
        row("a", "code", "plain", 10.0),
        row("a", "code", "auto", 9.9),
        row("b", "code", "plain", 10.0),
        row("b", "code", "auto", 10.0),
    ]
    ok = summarise(rows, [], "llamacpp")["code T=0"]["checks"]
    assert ok == {"auto/plain mean >= 0.98": True, "auto draft forwards == 0": True}
    drafted = [dict(r, draft_forwards=2) if r["config"] == "auto" else r for r in rows]
    assert summarise(drafted, [], "llamacpp")["code T=0"]["checks"]["auto draft forwards == 0"] is (
        False
    )
    slow = [dict(r, rate=9.0) if r["config"] == "auto" else r for r in rows]
    assert summarise(slow, [], "llamacpp")["code T=0"]["checks"]["auto/plain mean >= 0.98"] is (
        False
    )
    # one prompt has no interval: the old-vs-new check says so (None), it does not pass
    one = [row("a", "code", "plain", 10.0), row("a", "code", "auto", 9.9)]
    one.append(row("a", "code", "auto-old", 9.0))
    assert summarise(one, [])["code T=0"]["checks"] == {
        "auto/auto-old not below 1 beyond noise": None
    }


def test_config_list_puts_the_workers_in_the_rotation() -> None:
    from research.auto_check import config_list

    args = argparse.Namespace(control=False, fixed=["chain:4"], old_auto="HEAD", auto_worker=True)
    names = [c[0] for c in config_list(args, "d", "auto", {"auto-old": 1, "auto-new": 2})]
    assert names == ["plain", "auto", "auto-old", "auto-new", "chain:4"]


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout"
)
def test_old_auto_ref_is_extracted_and_a_bad_ref_is_one_line(tmp_path) -> None:
    from research.auto_check import checkout_src

    src = checkout_src("HEAD", tmp_path / "old")
    assert (src / "ersd" / "auto" / "policy.py").exists()
    with pytest.raises(SystemExit, match="--old-auto 'no-such-ref': git archive failed"):
        checkout_src("no-such-ref", tmp_path / "bad")


def test_worker_runs_auto_in_a_subprocess_interleaved_with_the_others(tmp_path) -> None:
    """The whole harness, tiny: the current auto in a worker (auto-new) beside the in-process
    one, on the weight-free tiny-qwen2 pair; the worker imports ersd from the src it was given
    and its rows are complete."""
    out = tmp_path / "run.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ERSD_COST_STORE": str(tmp_path / "store")}
    cmd = [sys.executable, "-m", "research.auto_check", "--target", "tiny-qwen2"]
    cmd += ["--draft", "tiny-qwen2-draft", "--sets", "humaneval", "--per-set", "1"]
    cmd += ["--tokens", "6", "--temperatures", "0", "--fixed", "chain:2", "--auto-worker"]
    cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    worker = result["setup"]["auto-new_setup"]
    assert Path(worker["ersd"]).resolve().is_relative_to(ROOT / "src")
    assert worker["measured"] == 0  # it read the curves this process measured: the same ones
    by = {r["config"]: r for r in result["rows"]}
    assert set(by) == {"plain", "auto", "auto-new", "chain:2"}
    assert by["auto-new"]["tokens"] == by["auto"]["tokens"] == 6
    assert by["auto-new"]["rate"] > 0 and by["auto-new"]["auto_choices"]
    assert "checks" in result["summary"]["humaneval T=0"]
    for r in by.values():  # the per-step trace: one row per target call, every token counted
        trace = r["trace"]
        assert len(trace) == r["target_calls"] and sum(t[3] for t in trace) == r["tokens"]
    auto_steps = [t[0] for t in by["auto"]["trace"]]
    assert {c: auto_steps.count(c) for c in set(auto_steps)} == by["auto"]["auto_choices"]
