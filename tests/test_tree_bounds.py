"""Draft trees are bounded (issue 29, item 2): a documented library default, refused beyond it
with the limit in the message, checked from a spec's numbers before anything is built.

Before: ``tree="dynamic:4@99999"`` grew one process to 23.8 GB until the kernel killed it,
``multi:1000x1000`` reached 3.5 GB and ``chain:K`` took O(K^2) time (5.8 s at K = 5000).  The
library cases run in a subprocess under a 1.5 GB address-space limit, so a regression ends in a
MemoryError there instead of taking the machine down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ersd
from ersd.drafting.dynamic import DynamicDrafter
from ersd.errors import GenerationInputError, InvalidTreeSpecError
from ersd.tree import MAX_TREE_DEPTH, MAX_TREE_NODES, TreeShape, parse_tree

SRC = str(Path(__file__).resolve().parents[1] / "src")

_UNDER_LIMIT = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 * 2**20, 1536 * 2**20))
import ersd
target, draft = ersd.load_model("toy"), ersd.load_model("toy-draft")
out = {}
for tree in sys.argv[1:]:
    try:
        ersd.generate(target, draft, [1, 2, 3], max_new_tokens=4, tree=tree, seed=0)
        out[tree] = ["ok", ""]
    except Exception as exc:
        out[tree] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def test_huge_trees_are_refused_by_generate_under_a_memory_limit() -> None:
    trees = ["dynamic:4@99999", "multi:1000x1000", "chain:1500", "dynamic:99999"]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, *trees],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for tree in trees:
        kind, message = out[tree]
        assert kind == "InvalidTreeSpecError", (tree, kind, message)
        assert repr(tree) in message and "limit" in message, message
    assert "(limit 128)" in out["dynamic:4@99999"][1]  # the depth cap names the depth bound
    assert "1000000 nodes (limit 256)" in out["multi:1000x1000"][1]
    assert time.monotonic() - t0 < 60  # refused, not attempted


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ("chain:1500", "1500 nodes (limit 256) and depth 1500 (limit 128)"),
        ("multi:1000x1000", "1000000 nodes (limit 256)"),
        ("batch:300", "300 nodes (limit 256)"),
        ("binary:1000", "1000 nodes (limit 256)"),
        ("chain:129", "depth 129 (limit 128)"),
        ("chain:" + "9" * 30, "far beyond any tree size"),
    ],
)
def test_spec_beyond_the_default_bound_names_the_limit(spec: str, shown: str) -> None:
    with pytest.raises(InvalidTreeSpecError, match="limit") as info:
        parse_tree(spec)
    assert shown in str(info.value) and repr(spec) in str(info.value)


def test_bounds_are_the_documented_defaults_and_can_be_raised() -> None:
    assert (MAX_TREE_NODES, MAX_TREE_DEPTH) == (256, 128)
    assert parse_tree(f"chain:{MAX_TREE_DEPTH}").num_nodes == MAX_TREE_DEPTH
    assert parse_tree(f"batch:{MAX_TREE_NODES}").num_nodes == MAX_TREE_NODES
    assert parse_tree("chain:300", max_nodes=300, max_depth=300).depth == 300
    with pytest.raises(InvalidTreeSpecError, match=r"9 nodes \(limit 8\)"):
        parse_tree("multi:3x3", max_nodes=8)
    paths = [[0] * d for d in range(1, 131)]
    with pytest.raises(InvalidTreeSpecError, match=r"depth 130 \(limit 128\)"):
        parse_tree(paths)
    with pytest.raises(InvalidTreeSpecError, match=r"depth 130 \(limit 128\)"):
        parse_tree(TreeShape.chain(130, max_depth=None))
    assert parse_tree(paths, max_depth=None).depth == 130


def test_generated_kinds_equal_their_path_lists() -> None:
    """chain / multi / batch are now built directly in topological order: the same shapes as
    validating and sorting their path lists."""
    for m, length in [(1, 1), (1, 7), (3, 1), (2, 3), (4, 5)]:
        paths = [(r,) + (0,) * d for r in range(m) for d in range(length)]
        assert TreeShape.multi(m, length) == TreeShape.from_paths(paths)
    assert parse_tree("chain:5") == TreeShape.from_paths([(0,) * d for d in range(1, 6)])


def test_chain_parse_is_fast_up_to_the_bound() -> None:
    """Before: chain:5000 took 5.8 s (sorting and re-validating K paths of length up to K).
    The bound keeps the path data small; the deepest allowed chain parses in milliseconds."""
    t0 = time.perf_counter()
    for _ in range(20):
        parse_tree(f"chain:{MAX_TREE_DEPTH}")
    assert (time.perf_counter() - t0) / 20 < 0.05


def test_dynamic_drafter_budget_and_depth_are_bounded() -> None:
    model = ersd.load_model("toy-draft")
    with pytest.raises(GenerationInputError, match=r"budget must be an integer in 1\.\.256"):
        DynamicDrafter(model, 99999)
    with pytest.raises(GenerationInputError, match=r"max_depth must be an integer in 1\.\.128"):
        DynamicDrafter(model, 4, max_depth=99999)
    with pytest.raises(GenerationInputError, match="depth cap of at most 128"):
        DynamicDrafter(model, 200)
    assert DynamicDrafter(model, 200, max_depth=16).depth_cap == 16
