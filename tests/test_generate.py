"""The generation loop: statistics, call counts, EOS/length handling and bad input."""

from __future__ import annotations

import itertools

import pytest
import torch

import ersd
from ersd import (
    GenerationInputError,
    InvalidLogitsError,
    SamplingParamsError,
    UnknownMethodError,
    VocabularyMismatchError,
)
from tests.toy import mixed_draft, table_model

V = 30


@pytest.fixture
def pair() -> tuple[ersd.FunctionModel, ersd.FunctionModel]:
    target = table_model(V, seed=0)
    return target, mixed_draft(target, table_model(V, seed=1), 0.3)


def test_target_only_makes_one_call_per_token(pair) -> None:
    target, _ = pair
    res = ersd.generate(target, None, [1, 2], max_new_tokens=12, seed=3)
    assert len(res.tokens) == 12 and res.target_calls == 12 and res.block_efficiency == 1.0
    assert target.forward_calls == 12


@pytest.mark.parametrize("tree", ["chain:4", "multi:2x3", "paths:[[0],[1],[0,0],[0,1],[0,0,0]]"])
def test_call_counts_and_statistics(pair, tree: str) -> None:
    target, draft = pair
    res = ersd.generate(target, draft, [1, 2], max_new_tokens=40, tree=tree, seed=5)
    shape = ersd.parse_tree(tree)
    assert len(res.tokens) == 40
    assert target.forward_calls == res.target_calls  # ONE target forward per step
    assert draft.forward_calls == res.draft_forwards
    for s in res.steps[:-1]:
        assert s.tree_depth <= shape.depth  # trees are cut near max_new_tokens
        assert s.draft_forwards == s.tree_depth  # root + one forward per inner depth
        assert 1 <= len(s.tokens) <= s.tree_depth + 1
        assert s.num_accepted == len(s.tokens) - 1
        assert s.num_draft_tokens <= shape.num_nodes
    assert res.block_efficiency == pytest.approx(40 / res.target_calls)
    assert res.block_efficiency > 1.0  # a correlated draft is accepted sometimes
    hist = res.acceptance_histogram
    assert sum(hist) == res.target_calls
    per_pos = res.accepted_per_pos
    assert all(a >= b for a, b in itertools.pairwise(per_pos))
    assert res.ranks and all(r >= 1 for r in res.ranks)
    stats = res.stats()
    assert stats["num_accepted_tokens"] == res.num_accepted_tokens
    assert res.to_dict()["tokens"] == res.tokens


def test_eos_stops_inside_an_accepted_block(pair) -> None:
    target, draft = pair
    ref = ersd.generate(target, None, [1, 2], max_new_tokens=40, seed=9)
    eos = ref.tokens[7]
    first = ref.tokens.index(eos)
    res = ersd.generate(
        target, draft, [1, 2], max_new_tokens=40, tree="chain:4", seed=9, eos_token_id=eos
    )
    assert res.tokens == ref.tokens[: first + 1]
    assert res.finish_reason == "eos"


def test_length_cut_keeps_a_prefix(pair) -> None:
    target, draft = pair
    ref = ersd.generate(target, None, [4], max_new_tokens=9, seed=1)
    for n in range(1, 9):
        res = ersd.generate(target, draft, [4], max_new_tokens=n, tree="chain:5", seed=1)
        assert res.tokens == ref.tokens[:n]
        assert res.finish_reason == "length"


def test_seed_changes_output(pair) -> None:
    target, draft = pair
    a = ersd.generate(target, draft, [1], max_new_tokens=20, seed=1).tokens
    b = ersd.generate(target, draft, [1], max_new_tokens=20, seed=2).tokens
    assert a != b
    assert a == ersd.generate(target, draft, [1], max_new_tokens=20, seed=1).tokens


def test_greedy_equals_argmax_decoding(pair) -> None:
    target, draft = pair
    seq = [3, 4]
    for _ in range(15):
        seq.append(int(torch.argmax(target.fn([seq])[0])))
    for tree in ["chain:3", "multi:3x2"]:
        res = ersd.generate(target, draft, [3, 4], max_new_tokens=15, temperature=0, tree=tree)
        assert res.tokens == seq[2:]


def test_generate_stream_yields_records(pair) -> None:
    target, draft = pair
    recs = list(ersd.generate_stream(target, draft, [1], max_new_tokens=10, seed=0))
    assert sum(len(r.tokens) for r in recs) == 10
    assert all(r.total_time >= r.draft_time + r.target_time for r in recs)


def test_bad_input_names_the_fix(pair) -> None:
    target, draft = pair
    with pytest.raises(VocabularyMismatchError, match="share one tokenizer"):
        ersd.generate(target, table_model(V + 1, 0), [1], max_new_tokens=3)
    with pytest.raises(GenerationInputError, match="prompt is empty"):
        ersd.generate(target, draft, [], max_new_tokens=3)
    with pytest.raises(GenerationInputError, match="tokenize it first"):
        ersd.generate(target, draft, "hello", max_new_tokens=3)  # type: ignore[arg-type]
    with pytest.raises(GenerationInputError, match="outside"):
        ersd.generate(target, draft, [V], max_new_tokens=3)
    with pytest.raises(GenerationInputError, match="max_new_tokens"):
        ersd.generate(target, draft, [1], max_new_tokens=0)
    with pytest.raises(GenerationInputError, match="eos_token_id"):
        ersd.generate(target, draft, [1], max_new_tokens=3, eos_token_id=-1)
    with pytest.raises(UnknownMethodError, match="known methods: .*ersd"):
        ersd.generate(target, draft, [1], max_new_tokens=3, method="nope")
    with pytest.raises(SamplingParamsError, match="temperature"):
        ersd.generate(target, draft, [1], max_new_tokens=3, temperature=-0.5)
    with pytest.raises(SamplingParamsError, match="top_p"):
        ersd.generate(target, draft, [1], max_new_tokens=3, top_p=0.0)
    with pytest.raises(ersd.InvalidTreeSpecError, match="e.g."):
        ersd.generate(target, draft, [1], max_new_tokens=3, tree="chain:")
    with pytest.raises(GenerationInputError, match="model with .vocab_size"):
        ersd.generate(object(), draft, [1], max_new_tokens=3)  # type: ignore[arg-type]
    # issue 29: an int tree was a raw TypeError
    with pytest.raises(ersd.InvalidTreeSpecError, match="write 'chain:4'"):
        ersd.generate(target, draft, [1], max_new_tokens=3, tree=4)  # type: ignore[arg-type]
    with pytest.raises(ersd.InvalidTreeSpecError, match=r"got None \(NoneType\)"):
        ersd.generate(target, draft, [1], max_new_tokens=3, tree=None)  # type: ignore[arg-type]


def test_numpy_integer_eos_acts_like_the_int(pair) -> None:
    """Issue 29: ``eos_token_id=np.int64(k)`` was a raw TypeError; it must stop where ``k``
    does."""
    import numpy as np

    target, draft = pair
    free = ersd.generate(target, draft, [1], max_new_tokens=12, tree="chain:3", seed=3)
    eos = free.tokens[4]
    cut = free.tokens.index(eos) + 1
    for value in (eos, np.int64(eos), np.int32(eos), torch.tensor(eos)):
        out = ersd.generate(
            target, draft, [1], max_new_tokens=12, tree="chain:3", seed=3, eos_token_id=value
        )
        assert out.tokens == free.tokens[:cut] and out.finish_reason == "eos", value


def test_nan_logits_are_reported() -> None:
    bad = ersd.FunctionModel(lambda seqs: torch.full((len(seqs), 4), float("nan")), 4)
    with pytest.raises(InvalidLogitsError, match="NaN"):
        ersd.generate(bad, None, [1], max_new_tokens=2)
    wrong = ersd.FunctionModel(lambda seqs: torch.zeros(len(seqs), 5), 4)
    with pytest.raises(InvalidLogitsError, match="vocab_size"):
        ersd.generate(wrong, None, [1], max_new_tokens=2)
