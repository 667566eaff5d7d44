"""``ersd theory`` through click's CliRunner: tables, --json, the figure, rank profiles, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import ersd.theory as T
from ersd.cli import main
from ersd.theory.families import FAMILIES, family_pair


def run(*args: str):
    return CliRunner().invoke(main, ["theory", *args], catch_exceptions=False)


def test_family_table_json_and_figure(tmp_path: Path) -> None:
    fig = tmp_path / "fig.png"
    res = run("--family", "sharp", "--max-k", "4", "--out", str(fig), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout.strip().splitlines()[-1])
    assert data["family"] == "sharp" and data["ks"] == [1, 2, 3, 4]
    assert set(data["curves"]) == set(T.ACCEPTANCE_METHODS)
    p, q = family_pair("sharp")
    rank = T.rank_distribution(p, q)
    ersd_curves = data["curves"]["ersd"]
    assert ersd_curves["chain"][3] == pytest.approx(
        T.expected_block_efficiency(T.chain_paths(4), rank), abs=1e-6
    )
    assert ersd_curves["optimal"][3] == pytest.approx(
        T.expected_block_efficiency(T.optimal_tree(rank, 4), rank), abs=1e-6
    )
    assert data["curves"]["sd"]["batch"][1] is None  # SD cannot draft two children
    assert data["bound"][3] == pytest.approx(T.block_efficiency_bound(rank, 4, 8), abs=1e-6)
    assert data["acceptance"]["specinfer"]["2"] == pytest.approx(
        T.specinfer_acceptance(p, q, 2), abs=1e-9
    )
    assert data["figure"] == str(fig)
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "expected tokens per target call" in res.stderr  # tables go to stderr with --json


def test_plain_table_lists_every_shape() -> None:
    res = run("--max-k", "4", "--methods", "ersd,specinfer")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "family zipf" in out and "H[R] =" in out
    for row in ("ersd      chain", "ersd      optimal", "specinfer multi", "bound", "log k / H[R]"):
        assert row in out, row
    assert "spectr" not in out


def test_profile_mode(tmp_path: Path) -> None:
    prof = T.RankProfile.from_ranks([1] * 60 + [2] * 25 + [3] * 10 + [7] * 5, vocab_size=100)
    path = tmp_path / "profile.json"
    prof.save(path)
    fig = tmp_path / "p.png"
    res = run("--profile", str(path), "--max-k", "8", "--json", "--out", str(fig))
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(data["curves"]) == {"ersd"}
    assert data["num_observations"] == 100 and data["vocab_size"] == 100
    rank = prof.rank_probs()
    assert data["curves"]["ersd"]["optimal"][7] == pytest.approx(
        T.expected_block_efficiency(T.optimal_tree(rank, 8), rank), abs=1e-6
    )
    assert fig.exists()


def test_profile_per_depth(tmp_path: Path) -> None:
    steps = [[1, 1, 2]] * 30 + [[2, 1]] * 20 + [[1, 3, 1]] * 10 + [[4]] * 5
    prof = T.RankProfile.from_step_ranks(steps, vocab_size=50)
    path = tmp_path / "depth.json"
    prof.save(path)
    res = run("--profile", str(path), "--per-depth", "--max-k", "6", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout.strip().splitlines()[-1])
    depth = prof.depth_rank_probs(min_count=20)
    assert len(depth) == 3 and data["per_depth"] is True
    expected = T.expected_block_efficiency_by_depth(T.optimal_tree_by_depth(depth, 6), depth)
    assert data["curves"]["ersd"]["optimal"][5] == pytest.approx(expected, abs=1e-6)
    pooled = run("--profile", str(path), "--max-k", "6", "--json")
    pooled_data = json.loads(pooled.stdout.strip().splitlines()[-1])
    assert pooled_data["curves"]["ersd"]["optimal"][5] != pytest.approx(expected, abs=1e-3)
    res = CliRunner().invoke(main, ["theory", "--per-depth"])
    assert res.exit_code == 2 and "needs --profile" in res.output


def test_errors_are_clean(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["theory", "--family", "zipf", "--profile", "x.json"])
    assert res.exit_code == 2 and "not both" in res.output
    res = CliRunner().invoke(main, ["theory", "--profile", str(tmp_path / "missing.json")])
    assert res.exit_code == 1 and "does not exist" in res.output
    res = CliRunner().invoke(main, ["theory", "--methods", "ersd,medusa"])
    assert res.exit_code == 2 and "medusa" in res.output
    res = CliRunner().invoke(main, ["theory", "--family", "nope"])
    assert res.exit_code == 2


def test_every_family_is_a_valid_pair() -> None:
    for name in FAMILIES:
        for v in (4, 8):
            p, q = family_pair(name, v, seed=1)
            assert p.shape == q.shape == (v,)
            assert np.isclose(p.sum(), 1) and np.isclose(q.sum(), 1)
            assert np.all(p > 0) and np.all(q > 0)
    assert np.array_equal(family_pair("zipf", 8, 0)[1], family_pair("zipf", 8, 0)[1])


def test_cli_choices_match_the_library() -> None:
    from ersd.commands.theory import FAMILY_NAMES, METHOD_NAMES

    assert set(FAMILY_NAMES) == set(FAMILIES)
    assert tuple(METHOD_NAMES) == tuple(T.ACCEPTANCE_METHODS)
