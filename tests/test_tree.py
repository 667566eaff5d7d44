"""Tree shapes, spec parsing and derived tree-attention data."""

from __future__ import annotations

import pytest
import torch

from ersd import InvalidTreeSpecError, TreeShape, parse_tree
from ersd.tree import ancestor_mask, path_to, root_to_leaf_paths, tree_depths


def test_chain_multi_batch() -> None:
    assert parse_tree("chain:3").paths == ((0,), (0, 0), (0, 0, 0))
    m = parse_tree("multi:2x3")
    assert m.num_nodes == 6 and m.depth == 3 and m.child_nodes(-1) == (0, 1)
    assert parse_tree("batch:3").paths == ((0,), (1,), (2,))
    assert parse_tree(" MULTI : 2X1 ") == parse_tree("batch:2")


def test_paths_spec_is_sorted_and_roundtrips() -> None:
    t = parse_tree("paths:[[1],[0,0],[0]]")
    assert t.paths == ((0,), (1,), (0, 0))
    assert t.parents == (-1, -1, 0)
    assert parse_tree(t.spec) == t
    assert parse_tree([[0], [0, 0]]) == TreeShape.chain(2)


@pytest.mark.parametrize(
    "spec, word",
    [
        ("chain:0", "positive integer"),
        ("chain:x", "positive integer"),
        ("multi:2", "MxL"),
        ("tree:3", "unknown tree kind"),
        ("chain3", "no 'kind:' prefix"),
        ("paths:[[0],[0,0", "JSON"),
        ("paths:[]", "at least one node"),
        ("paths:[[0,0]]", "no parent"),
        ("paths:[[1]]", "elder sibling"),
        ("paths:[[0],[0]]", "twice"),
        ("paths:[[-1]]", "integers >= 0"),
        ("paths:[[]]", "empty path"),
        ("paths:{}", "JSON list"),
    ],
)
def test_bad_specs_show_a_valid_example(spec: str, word: str) -> None:
    with pytest.raises(InvalidTreeSpecError, match=word) as info:
        parse_tree(spec)
    assert "e.g." in str(info.value) or "examples" in str(info.value)


def test_truncated() -> None:
    t = parse_tree("multi:2x3")
    assert t.truncated(1) == parse_tree("batch:2")
    assert t.truncated(0) is None


def test_derived_structure() -> None:
    parents = [-1, -1, 0, 0, 2]
    assert tree_depths(parents) == [1, 1, 2, 2, 3]
    mask = ancestor_mask(parents)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [0, 1, 0, 0, 0],
            [1, 0, 1, 0, 0],
            [1, 0, 0, 1, 0],
            [1, 0, 1, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    assert path_to(parents, 4) == [0, 2, 4]
    assert root_to_leaf_paths(parents) == [[1], [0, 3], [0, 2, 4]]
    with pytest.raises(InvalidTreeSpecError, match="topological"):
        tree_depths([1, -1])
