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
