"""One tree grammar: ``binary:K`` and ``optimal:K[@file]`` parse in :func:`ersd.parse_tree` and
work the same from ``ersd.generate``, the CLI and the bench; one profile reader, one rule for the
nearest temperature, one path validator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ersd
from ersd import InvalidTreeSpecError, TreeShape, parse_tree
from ersd.theory import (
    RankProfile,
    expected_block_efficiency,
    load_profiles,
    nearest_temperature,
    optimal_tree,
)
from tests.toy import mixed_draft, table_model

V = 30


def _calibration_file(tmp_path: Path) -> Path:
    """A calibration file with a sharp profile at T=0.5 (a chain is optimal) and a flat one at
    T=1.0 (a bushy tree is optimal)."""
    sharp = RankProfile.from_ranks([1] * 95 + [2] * 5, vocab_size=V, temperature=0.5)
    flat = RankProfile.from_ranks([1] * 40 + [2] * 30 + [3] * 30, vocab_size=V, temperature=1.0)
    path = tmp_path / "calib.json"
    data = {
        "format": "ersd-bench-calibration",
        "version": 1,
        "profiles": {"0.5": sharp.to_dict(), "1.0": flat.to_dict()},
        "costs": None,
        "choices": {},
        "meta": {},
    }
    path.write_text(json.dumps(data))
    return path


def test_binary_spec() -> None:
    assert parse_tree("binary:6").paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1))
    assert parse_tree(" Binary : 3 ") == TreeShape.binary(3)
    assert parse_tree("binary:7").max_children == 2
    with pytest.raises(InvalidTreeSpecError, match="positive integer"):
        parse_tree("binary:0")


def test_optimal_spec_from_profile_argument_and_files(tmp_path: Path) -> None:
    probs = [0.5, 0.3, 0.2]
    shape = parse_tree("optimal:5", profile=probs)
    assert list(shape.paths) == sorted(optimal_tree(probs, 5), key=lambda t: (len(t), t))
    prof = RankProfile.from_ranks([1] * 50 + [2] * 30 + [3] * 20, vocab_size=V)
    assert parse_tree("optimal:5", profile=prof) == shape
    plain = tmp_path / "plain.json"
    prof.save(plain)
    assert parse_tree(f"optimal:5@{plain}") == shape
    calib = _calibration_file(tmp_path)
    chain = parse_tree("optimal:4@" + str(calib), temperature=0.4)
    bushy = parse_tree("optimal:4@" + str(calib), temperature=0.9)
    assert chain == TreeShape.chain(4) and bushy.max_children == 3
    assert parse_tree(f"optimal:4@{calib}") == chain  # no temperature: the lowest
    assert parse_tree("optimal:4", profile=str(calib), temperature=2.0) == bushy
    with pytest.raises(InvalidTreeSpecError, match="ersd bench calibrate"):
        parse_tree(f"optimal:4@{tmp_path / 'missing.json'}")
    with pytest.raises(InvalidTreeSpecError, match="needs a rank profile"):
        parse_tree("optimal:4")


def test_one_reader_and_one_nearest_rule(tmp_path: Path) -> None:
    f = load_profiles(_calibration_file(tmp_path))
    assert sorted(f.profiles) == [0.5, 1.0] and "costs" in f.data and "profiles" not in f.data
    by_t = {0.5: "a", 1.0: "b"}
    assert nearest_temperature(by_t, 0.75) == "a"  # a tie goes to the lower temperature
    assert nearest_temperature(by_t, 0.76) == "b"
    assert nearest_temperature(by_t, None) == "a"
    assert nearest_temperature(by_t, 0.0) == "a"


def test_generate_accepts_binary_and_optimal_specs(tmp_path: Path) -> None:
    target = table_model(V, seed=0)
    draft = mixed_draft(target, table_model(V, seed=1), 0.3)
    calib = _calibration_file(tmp_path)
    for spec in ("binary:4", f"optimal:8@{calib}"):
        shape = parse_tree(spec, temperature=1.0)  # generate picks the profile nearest its T
        res = ersd.generate(target, draft, [1, 2], max_new_tokens=20, tree=spec, seed=4)
        ref = ersd.generate(target, draft, [1, 2], max_new_tokens=20, tree=shape, seed=4)
        assert len(res.tokens) == 20 and res.tokens == ref.tokens
        assert res.target_calls == ref.target_calls < 20
        assert all(s.num_draft_tokens <= shape.num_nodes for s in res.steps)
        if spec.startswith("binary"):
            assert any(s.num_draft_tokens > shape.depth for s in res.steps)  # a tree
        else:  # no temperature given: the file's lowest-temperature (sharp) profile
            assert parse_tree(spec) == TreeShape.chain(8)


def test_theory_shares_the_path_validator() -> None:
    rank = [0.6, 0.3, 0.1]
    # theory allows gaps between siblings and the empty tree; a TreeShape does not
    assert expected_block_efficiency([(1,)], rank) == pytest.approx(1.3)
    assert expected_block_efficiency([], rank) == 1.0
    assert expected_block_efficiency([(np.int64(0),), (0, np.int64(0))], rank) == pytest.approx(
        1 + 0.6 + 0.36
    )
    with pytest.raises(InvalidTreeSpecError, match="elder sibling"):
        TreeShape.from_paths([(1,)])


def test_tree_module_is_light_and_the_cli_does_not_import_bench(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import ersd.tree\n"
        "assert 'torch' not in sys.modules and 'ersd.theory' not in sys.modules\n"
        "from click.testing import CliRunner\n"
        "from ersd.cli import main\n"
        f"res = CliRunner().invoke(main, ['generate', '--tree', 'optimal:4@{tmp_path}/no.json'])\n"
        "assert res.exit_code != 0 and 'ersd bench calibrate' in res.output, res.output\n"
        "bench = sorted(m for m in sys.modules if m.startswith('ersd.bench'))\n"
        "assert not bench, bench\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
