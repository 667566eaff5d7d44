"""Batched generation on the transformers adapter: one target forward per step for all rows
(``HFModel.score_batch``), and each row's tokens equal to its solo ``ersd.generate`` run.

The batched forward pads every row to the batch's longest past and longest call; each row still
attends only to its own cache columns and tree.  Float32 matrix kernels may sum in another order
for a different number of rows, so logits agree to rounding (the contract tests bound that) and
tokens agree except at a race decided within rounding — none occurs in these fixed cases.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ersd
from ersd.batch import BatchEngine
from ersd.models.hf import HFModel
from tests.hf_tiny import tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair() -> tuple[HFModel, HFModel]:
    return tiny_pair()  # type: ignore[no-any-return]


PROMPTS = [[5, 17, 42], [7], [100, 3, 9, 250, 11, 12, 13, 14, 15, 16, 17], [31, 4]]


@pytest.mark.parametrize(
    ("method", "tree", "temperature"),
    [
        ("ersd", "chain:3", 1.0),
        ("ersd", "multi:2x2", 0.7),
        ("sd", "chain:4", 1.0),
        ("specinfer", "multi:2x2", 1.0),
        ("ersd", "chain:3", 0.0),
    ],
)
def test_rows_equal_solo_runs(pair, method: str, tree: str, temperature: float) -> None:
    target, draft = pair
    kw: dict[str, Any] = dict(method=method, tree=tree, temperature=temperature)
    seeds = [3, 4, 5, 6]
    lengths = [12, 5, 9, 16]  # rows finish at different steps
    engine = BatchEngine(target, draft)
    ids = [
        engine.add(p, seed=s, max_new_tokens=n, **kw)
        for p, s, n in zip(PROMPTS, seeds, lengths, strict=True)
    ]
    got: dict[int, list[int]] = {}
    calls_before = target.forward_calls
    steps = 0
    while engine.active and steps < 200:
        for rid, _rec, done in engine.step():
            if done is not None:
                got[rid] = done.tokens
        steps += 1
    assert len(got) == len(PROMPTS)
    # the first step prefills each prompt on its own; every later step is one target forward
    assert target.forward_calls - calls_before <= steps + len(PROMPTS)
    for rid, prompt, seed, n in zip(ids, PROMPTS, seeds, lengths, strict=True):
        solo = ersd.generate(target, draft, prompt, seed=seed, max_new_tokens=n, **kw)
        assert got[rid] == solo.tokens, f"row {rid} differs from its solo run"


def test_one_target_forward_for_all_rows(pair) -> None:
    """After the prefill steps, a step of four rows costs exactly one target forward."""
    target, draft = pair
    engine = BatchEngine(target, draft)
    for i, p in enumerate(PROMPTS):
        engine.add(p, seed=i, max_new_tokens=30, method="ersd", tree="chain:2")
    engine.step()  # prefill (long tails are scored row by row)
    before = target.forward_calls
    engine.step()
    assert target.forward_calls - before == 1


@pytest.mark.realmodel
def test_smollm2_batch_invariance_float32() -> None:
    """Real SmolLM2-135M weights in float32 with a layer-truncated draft: batched rows (one
    forward per step for all of them) give each prompt's solo tokens, ERSD and SD."""
    target = ersd.load_model("smollm2-135m", dtype="float32")
    draft = ersd.load_model("smollm2-135m", dtype="float32", num_hidden_layers=8)
    texts = ["def fibonacci(n):\n    ", "The capital of France is", "import numpy as np\n"]
    prompts = [target.tokenizer.encode(t) for t in texts]
    for method in ("ersd", "sd"):
        kw: dict[str, Any] = dict(method=method, tree="chain:3", temperature=1.0)
        results = ersd.generate_batch(
            target, draft, prompts, seeds=[1, 2, 3], max_new_tokens=24, **kw
        )
        for prompt, seed, res in zip(prompts, [1, 2, 3], results, strict=True):
            solo = ersd.generate(target, draft, prompt, seed=seed, max_new_tokens=24, **kw)
            assert res.tokens == solo.tokens, f"{method}: batched row differs for {prompt[:4]}"


def test_rootless_rows_are_the_full_rows_without_the_root(pair) -> None:
    """``root=False`` (a drafter's levels after its first) returns the new nodes' rows exactly as
    the full result holds them below its root, on the batched path and alone; a result with a
    fed tail keeps its root; ``NodeRows`` refuses the row it does not hold."""
    from ersd.models.batch import NodeRows, score_many

    target, _ = pair
    prompts = [[5, 17, 42, 8], [9, 3, 3, 1, 7, 2]]
    full = [target.start(p) for p in prompts]
    bare = [target.start(p) for p in prompts]
    for group in (full, bare):
        score_many(target, group, [([], [])] * 2)  # prefills: root known
    for calls in ([([4, 6], [-1, 0])] * 2, [([7], [-1]), ([1, 2, 3], [-1, 0, 1])]):
        want = score_many(target, full, calls)
        got = score_many(target, bare, calls, root=False)
        for w, g, (tokens, _) in zip(want, got, calls, strict=True):
            assert isinstance(g, NodeRows) and len(g) == len(w) == 1 + len(tokens)
            for r in range(len(tokens)):
                assert torch.equal(g[1 + r], w[1 + r])
            with pytest.raises(IndexError, match="rows 1"):
                g[0]
        for group in (full, bare):  # commit the first node of each row
            for s, (tokens, _) in zip(group, calls, strict=True):
                s.commit([tokens[0]], [0])
    # alone (HFSession.score), the root known: the nodes only
    want = full[0].score([11, 12], [-1, 0])
    got = score_many(None, [bare[0]], [([11, 12], [-1, 0])], root=False)[0]
    assert isinstance(got, NodeRows) and all(torch.equal(got[i], want[i]) for i in (1, 2))
    # a commit with a token never fed (the bonus): the next call feeds it, so its result
    # carries that fresh root and comes back whole
    for sess in (full[0], bare[0]):
        sess.commit([11, 55], [0])
    want = full[0].score([13], [-1])
    got = score_many(None, [bare[0]], [([13], [-1])], root=False)[0]
    assert isinstance(got, torch.Tensor) and torch.equal(got, want)
