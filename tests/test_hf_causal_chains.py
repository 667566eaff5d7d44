"""The causal-chain shortcut of the Hugging Face sessions (issue 51).

A score call whose pending and new nodes form one chain (every call of a ``chain:K`` target and
every level of a chain drafter) is fed with the plain causal mask, built (or, for one query row,
skipped) by transformers as in its own decoding loop, instead of an explicit 4-D tree mask.
Checked here: exactly those calls take it; their rows equal plain forwards of each sequence and
the 4-D mask path's rows on every tiny architecture (sliding windows included); applied to a tree
(a deliberately broken ``_is_chain``) the same row check fails; and on the bundled SmolLM2 the
tokens of ``ersd.generate`` are the same with and without it at T = 0 and T = 1.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

import ersd
from ersd.models.hf import HFModel, HFSession, from_pretrained_model
from tests.hf_tiny import ATOL, MODELS, Checker, V, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _plan(sess: HFSession, tokens: list[int], parents: list[int]) -> Any:
    return sess.plan_mask(tokens, parents, sess.depths_of(parents))


def test_exactly_chain_calls_take_the_causal_mask() -> None:
    hm = from_pretrained_model(tiny_model("llama", 0))
    sess = hm.start([3, 1, 4, 1, 5])
    # target style: the uncached prompt and a chain in one call
    assert _plan(sess, [7, 8, 9], [-1, 0, 1]).allowed is None
    assert _plan(sess, [7, 8], [-1, -1]).allowed is not None  # siblings
    assert _plan(sess, [7, 8, 9], [-1, 0, 0]).allowed is not None  # a fork below the root
    # drafter style: the root, then one level per call below the pending chain
    sess.score([], [])
    sess.score([7], [-1])
    assert _plan(sess, [8], [0]).allowed is None
    assert _plan(sess, [8], [-1]).allowed is not None  # a sibling of the pending node
    sess.score([8], [0])
    assert _plan(sess, [9], [1]).allowed is None
    assert _plan(sess, [9], [0]).allowed is not None  # below the first node, not the last
    HFModel.causal_chains = False
    try:
        assert _plan(sess, [9], [1]).allowed is not None  # the earlier path: always a mask
    finally:
        HFModel.causal_chains = True


def _chain_calls(chk: Checker, rng: random.Random) -> list[torch.Tensor]:
    """Random target- and drafter-style chain calls and commits, every row checked against a
    plain forward; returns the rows."""
    rows: list[torch.Tensor] = []
    for step in range(6):
        if step % 2:  # drafter style: root, then a chain level by level
            rows.append(chk.score([], []))
            for _ in range(rng.randrange(1, 4)):
                rows.append(chk.score([rng.randrange(V)], [len(chk.ptok) - 1]))
        else:  # target style: the tail and the whole chain in one call
            n = rng.randrange(1, 6)
            rows.append(chk.score([rng.randrange(V) for _ in range(n)], list(range(-1, n - 1))))
        k = rng.randrange(0, len(chk.ptok) + 1)
        extra = [rng.randrange(V) for _ in range(rng.choice([0, 1, 1, 2]))]
        chk.commit([chk.ptok[i] for i in range(k)] + extra, list(range(k)))
    return rows


@pytest.mark.parametrize("name", sorted(MODELS))
def test_chain_rows_equal_plain_forwards_and_the_mask_path(name: str) -> None:
    model = MODELS[name]()
    rows: dict[bool, list[torch.Tensor]] = {}
    for shortcut in (True, False):
        HFModel.causal_chains = shortcut
        try:
            chk = Checker(model, from_pretrained_model(model).start([2, 7, 1, 8, 2, 8]))
            rows[shortcut] = _chain_calls(chk, random.Random(11))
        finally:
            HFModel.causal_chains = True
    assert len(rows[True]) == len(rows[False])
    for a, b in zip(rows[True], rows[False], strict=True):
        assert (a - b).abs().max().item() < ATOL


def test_a_shortcut_applied_to_trees_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: every call treated as a chain.  Siblings then see each other, and the row
    check above rejects it (the real ``_is_chain`` passes the same check)."""
    model = tiny_model("llama", 0)
    parents = [-1, -1, 0, 0, 1, 1]
    tokens = [random.Random(5).randrange(V) for _ in parents]
    Checker(model, from_pretrained_model(model).start([4, 4, 2])).score(tokens, parents)
    monkeypatch.setattr(HFSession, "_is_chain", staticmethod(lambda parents: True))
    with pytest.raises(AssertionError, match="off by"):
        Checker(model, from_pretrained_model(model).start([4, 4, 2])).score(tokens, parents)


# ---------------------------------------------------------------------------------------------
# the bundled SmolLM2-135M: the same tokens with and without the shortcut


@pytest.fixture(scope="module")
def smol() -> tuple[HFModel, HFModel]:
    return ersd.load_model("smollm2-135m"), ersd.load_model("smollm2-135m", num_hidden_layers=8)


@pytest.mark.realmodel
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_smollm2_tokens_are_the_same_with_and_without_the_shortcut(
    smol: tuple[HFModel, HFModel], temperature: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, draft = smol
    prompt = target.tokenizer.encode("def fibonacci(n):\n    ")
    masks = {"n": 0}
    additive = HFModel._additive

    def counted(self: HFModel, allowed: torch.Tensor) -> torch.Tensor:
        masks["n"] += 1
        return additive(self, allowed)

    monkeypatch.setattr(HFModel, "_additive", counted)
    for seed in (0, 1, 2):
        out: dict[bool, list[int]] = {}
        for shortcut in (True, False):
            monkeypatch.setattr(HFModel, "causal_chains", shortcut)
            masks["n"] = 0
            res = ersd.generate(
                target,
                draft,
                prompt,
                max_new_tokens=24,
                tree="chain:4",
                seed=seed,
                temperature=temperature,
            )
            out[shortcut] = res.tokens
            # the cut: no 4-D mask is built for a chain tree; one per forward before
            assert (masks["n"] == 0) if shortcut else (masks["n"] > res.target_calls)
        assert out[True] == out[False], seed
