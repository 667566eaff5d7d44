"""The Hugging Face adapter: tree scoring on a KV cache equals plain forwards of each path.

Tiny random-weight Llama and Qwen2 models (float32, fixed torch seeds) check the cache, the 4-D
tree masks, the position ids and the commit surgery against a plain no-cache forward of every
root-to-leaf sequence; end to end, ERSD with a draft must give exactly the tokens of target-only
race sampling (drafter invariance), and temperature 0 must give transformers' greedy ``generate``.
Tests marked ``realmodel`` repeat the end-to-end checks on the bundled SmolLM2-135M.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")


import ersd
from ersd.errors import GenerationInputError
from ersd.models.hf import HFModel, HFSession, from_pretrained_model
from tests.backend_contract import random_parents as random_tree
from tests.backend_contract import random_path
from tests.hf_tiny import (
    ATOL,
    MODELS,
    TREE_SPECS,
    Checker,
    V,
    plain_logits,
    run_random_session,
    tiny_model,
    tiny_pair,
    word_tokenizer,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> Any:
    return MODELS[request.param]()


TREES = {
    "chain": [-1, 0, 1, 2, 3],
    "wide": [-1] * 8,
    "deep": [-1, 0, 1, 2, 3, 4, 5, 6, 7, 3, 9, 0],
    "bushy": [-1, -1, 0, 0, 1, 1, 2, 2, 3, 5],
}


@pytest.mark.parametrize("shape", sorted(TREES))
def test_one_forward_tree_rows_equal_path_forwards(model: Any, shape: str) -> None:
    hm = from_pretrained_model(model)
    sess = hm.start([3, 1, 4, 1, 5, 9])
    chk = Checker(model, sess)
    parents = TREES[shape]
    rng = random.Random(len(parents))
    calls = hm.forward_calls
    chk.score([rng.randrange(V) for _ in parents], parents)
    assert hm.forward_calls == calls + 1  # the prompt and the whole tree in ONE forward
    assert sess.cache_length == 6 + len(parents)


@pytest.mark.parametrize("seed", range(4))
def test_multi_step_sessions_with_commits(model: Any, seed: int) -> None:
    hm = from_pretrained_model(model)
    chk = run_random_session(model, hm, seed)
    assert hm.tree_attention == "mask"
    assert chk.session.cache_length == len(chk.session.committed)


def test_commit_of_every_token_keeps_the_root_row(model: Any) -> None:
    """A commit whose path covers all its tokens needs no new forward for the root row."""
    hm = from_pretrained_model(model)
    chk = Checker(model, hm.start([7, 8]))
    chk.score([11, 12, 13], [-1, 0, -1])
    chk.commit([11, 12], [0, 1])
    calls = hm.forward_calls
    chk.score([], [])
    assert hm.forward_calls == calls
    chk.commit([], [])
    chk.score([5], [-1])
    chk.score([], [])  # the root row is cached
    chk.commit([5], [0])
    chk.score([6, 7], [-1, -1])


@pytest.mark.parametrize("attention", ["mask", "paths"])
def test_score_previous_gives_the_row_before_the_root_where_the_call_feeds_it(
    model: Any, attention: str
) -> None:
    """A fully accepted chain's last token and its bonus are both fed by the next call: the row
    before the root then comes with it (the logits after ``committed[:-1]``) and every other
    row is :meth:`score`'s; with one token to feed there is no such row to give."""
    hm = from_pretrained_model(model, tree_attention=attention)
    sess = hm.start([3, 1, 4, 1, 5])
    sess.score([9, 2], [-1, 0])  # a chain of two: 9 fed, 2 drafted below it, not fed yet
    sess.commit([9, 2, 6], [0])  # both accepted, 6 the bonus: 2 and 6 are the unfed tail
    other = hm.start([3, 1, 4, 1, 5, 9, 2, 6])
    rows, previous = sess.score_previous([7], [-1])
    assert previous is not None
    torch.testing.assert_close(
        previous, plain_logits(model, [3, 1, 4, 1, 5, 9, 2]), atol=ATOL, rtol=0
    )
    torch.testing.assert_close(rows, other.score([7], [-1]), atol=ATOL, rtol=0)
    sess.commit([7, 8], [0])
    rows, previous = sess.score_previous([], [])
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 7, 8]
    torch.testing.assert_close(rows[0], plain_logits(model, seq), atol=ATOL, rtol=0)
    if attention == "mask":  # 7 was cached when scored: one unfed token, no row before the root
        assert previous is None
    else:  # paths cache no tree node: 7 is fed again, and its row comes back
        assert previous is not None
        torch.testing.assert_close(previous, plain_logits(model, seq[:-1]), atol=ATOL, rtol=0)


@pytest.mark.parametrize("seed", range(3))
def test_paths_fallback_matches(seed: int) -> None:
    model = MODELS["llama-sdpa"]()
    hm = from_pretrained_model(model, tree_attention="paths")
    run_random_session(model, hm, seed)


def _reject_4d_masks(model: Any, ignore: bool) -> None:
    forward = model.forward

    @functools.wraps(forward)
    def patched(*args: Any, attention_mask: Any = None, **kw: Any) -> Any:
        if attention_mask is not None and attention_mask.dim() == 4:
            if not ignore:
                raise ValueError("custom 4-D masks are not supported")
            attention_mask = None
        return forward(*args, attention_mask=attention_mask, **kw)

    model.forward = patched


@pytest.mark.parametrize("ignore", [False, True], ids=["raises", "ignores"])
def test_architecture_without_custom_masks_falls_back_once(ignore: bool) -> None:
    model = MODELS["qwen2-sdpa"]()
    _reject_4d_masks(model, ignore)
    hm = from_pretrained_model(model)
    with pytest.warns(RuntimeWarning, match="root-to-leaf path per batch row"):
        chk = run_random_session(model, hm, seed=5, steps=4)
    assert hm.tree_attention == "paths"
    assert chk.worst < ATOL
    run_random_session(model, hm, seed=6, steps=3)  # no second warning (warnings are errors)


# ---------------------------------------------------------------------------------------------
# end to end


@pytest.fixture(scope="module")
def pair() -> tuple[HFModel, HFModel]:
    return tiny_pair()  # type: ignore[no-any-return]


@pytest.mark.parametrize("tree", TREE_SPECS)
@pytest.mark.parametrize(
    "sampling", [dict(temperature=1.0), dict(temperature=0.7, top_k=20)], ids=["t1", "t07k20"]
)
def test_ersd_is_drafter_invariant_end_to_end(pair, tree: str, sampling: dict) -> None:
    target, draft = pair
    prompt = [5, 17, 42]
    for seed in (0, 1):
        alone = ersd.generate(target, None, prompt, max_new_tokens=24, seed=seed, **sampling)
        spec = ersd.generate(
            target,
            draft,
            prompt,
            max_new_tokens=24,
            seed=seed,
            method="ersd",
            tree=tree,
            **sampling,
        )
        assert spec.tokens == alone.tokens
        assert spec.target_calls < alone.target_calls  # some drafts were accepted


def test_perfect_draft_accepts_whole_trees(pair) -> None:
    target, _ = pair
    twin = from_pretrained_model(target.hf_module)
    res = ersd.generate(target, twin, [1, 2], max_new_tokens=30, tree="chain:4", seed=3)
    alone = ersd.generate(target, None, [1, 2], max_new_tokens=30, seed=3)
    assert res.tokens == alone.tokens
    assert res.block_efficiency == 5.0


@pytest.mark.parametrize("tree", [None, *TREE_SPECS])
def test_greedy_equals_transformers_generate(pair, tree: str | None) -> None:
    target, draft = pair
    prompt = [9, 8, 7, 6]
    with torch.no_grad():
        ref = target.hf_module.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=20, pad_token_id=0
        )[0, len(prompt) :].tolist()
    res = ersd.generate(
        target,
        draft if tree else None,
        prompt,
        max_new_tokens=20,
        temperature=0,
        tree=tree or "chain:1",
    )
    assert res.tokens == ref


def test_caches_never_outgrow_the_committed_sequence(pair) -> None:
    target, draft = pair
    sessions: list[HFSession] = []
    for m in (target, draft):
        start = m.start

        def recording(prompt: Any, start: Any = start) -> HFSession:
            sessions.append(start(prompt))
            return sessions[-1]

        m.start = recording  # type: ignore[method-assign]
    try:
        stream = ersd.generate_stream(
            target, draft, [1, 2, 3], max_new_tokens=200, tree="multi:2x2", seed=1
        )
        seen = []  # (target cache, target committed, draft cache, draft committed) per step
        for _ in stream:
            tsess, dsess = sessions
            seen.append(
                (tsess.cache_length, len(tsess.committed), dsess.cache_length, len(dsess.committed))
            )
    finally:
        del target.start, draft.start
    assert len(seen) > 40
    for tcache, tlen, dcache, dlen in seen[:-1]:  # the last step commits nothing
        assert tcache <= tlen and dcache <= dlen
        assert tlen - tcache == 1  # only the bonus token is waiting to be fed
    assert seen[-2][1] > 150


def test_prompt_longer_than_context_is_rejected(pair) -> None:
    target, _ = pair
    with pytest.raises(GenerationInputError, match="context window is 512"):
        target.start(list(range(600)))
    sess = target.start(list(range(510)))
    with pytest.raises(GenerationInputError, match="exceeds the model's context window"):
        sess.score([1, 2, 3], [-1, 0, 1])
    # generation stops cleanly at the window, keeping every token, with and without a draft
    long_prompt = [i % V for i in range(505)]
    alone = ersd.generate(target, None, long_prompt, max_new_tokens=20)
    assert len(alone.tokens) == 512 - 505 and alone.finish_reason == "context"
    spec = ersd.generate(target, pair[1], long_prompt, max_new_tokens=20, tree="chain:4")
    assert spec.tokens == alone.tokens and spec.finish_reason == "context"


def test_vocab_size_is_the_logits_width() -> None:
    model = tiny_model("qwen2", 0, vocab=V)
    hm = from_pretrained_model(model, tokenizer=word_tokenizer(V - 20))
    assert hm.vocab_size == V == hm.start([1]).score([], []).shape[1]


def test_a_module_that_does_not_extend_the_cache_is_refused() -> None:
    """The adapter checks that a forward extends the KV cache it is given, on the first forward
    with each cache class (a property of the module's class and the transformers version, so not
    on every forward): a module that fills a cache of its own is refused on its first score with
    the reason named; the same module passing the cache on scores as before."""
    from transformers import DynamicCache

    class OwnCache(torch.nn.Module):
        def __init__(self, inner: Any, keep: bool, name: str) -> None:
            super().__init__()
            self.inner, self.keep, self.config, self.name = inner, keep, inner.config, name

        def forward(self, **kw: Any) -> Any:
            if not self.keep:
                kw[self.name] = DynamicCache()  # the cache the adapter gave is left empty
            return self.inner(**kw)

    for keep in (True, False):
        hm = from_pretrained_model(tiny_model("llama", 0))
        hm.hf_module = OwnCache(hm.hf_module, keep, hm._cache_kwarg)
        session = hm.start([1, 2, 3])
        if keep:
            assert session.score([], []).shape == (1, V)
            assert session.score([5], [-1]).shape == (2, V)  # the later forwards go unchecked
        else:
            with pytest.raises(RuntimeError, match="did not extend the KV cache"):
                session.score([], [])  # the prompt's forward


def test_bfloat16_tree_rows_are_close() -> None:
    model = tiny_model("llama", 0).to(torch.bfloat16)
    hm = from_pretrained_model(model)
    rows = hm.start([1, 2, 3]).score([4, 5, 6], [-1, -1, 1])
    assert rows.dtype == torch.float32
    for i, seq in enumerate([[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 5, 6]]):
        assert (rows[i] - plain_logits(model, seq)).abs().max().item() < 0.1


# ---------------------------------------------------------------------------------------------
# the bundled SmolLM2-135M (float32 target with oneDNN linears; drafts: a layer-truncated copy,
# a bfloat16 copy, an int8 copy)


@pytest.fixture(scope="module")
def smol() -> dict[str, HFModel]:
    return {
        "target": ersd.load_model("smollm2-135m"),
        "truncated": ersd.load_model("smollm2-135m", num_hidden_layers=8),
        "bf16": ersd.load_model("smollm2-135m", dtype="bfloat16"),
        "int8": ersd.load_model("smollm2-135m", dtype="int8"),
    }


SMOL_PROMPT = "def fibonacci(n):\n    "
_alone: dict[int, list[int]] = {}


def _target_only(target: HFModel, prompt: list[int], seed: int) -> list[int]:
    if seed not in _alone:
        _alone[seed] = ersd.generate(target, None, prompt, max_new_tokens=20, seed=seed).tokens
    return _alone[seed]


@pytest.mark.realmodel
@pytest.mark.parametrize(
    ("draft", "seed"), [("truncated", 0), ("truncated", 1), ("bf16", 2), ("int8", 3)], ids=str
)
@pytest.mark.parametrize("tree", TREE_SPECS)
def test_smollm2_ersd_is_drafter_invariant(smol, draft: str, seed: int, tree: str) -> None:
    target = smol["target"]
    prompt = target.tokenizer.encode(SMOL_PROMPT)
    res = ersd.generate(target, smol[draft], prompt, max_new_tokens=20, seed=seed, tree=tree)
    assert res.tokens == _target_only(target, prompt, seed)
    if draft in ("bf16", "int8"):  # near-perfect drafts: whole trees accepted, the cache moves
        assert res.block_efficiency > 2.0


@pytest.mark.realmodel
def test_smollm2_greedy_equals_transformers_generate(smol) -> None:
    target = smol["target"]
    prompt = target.tokenizer.encode(SMOL_PROMPT)
    with torch.no_grad():
        ref = target.hf_module.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=24)[
            0, len(prompt) :
        ].tolist()
    for draft, tree in [(None, "chain:1"), ("bf16", "multi:2x2"), ("truncated", "chain:3")]:
        res = ersd.generate(
            target,
            smol[draft] if draft else None,
            prompt,
            max_new_tokens=24,
            temperature=0,
            tree=tree,
        )
        assert res.tokens == ref, (draft, tree)


@pytest.mark.realmodel
def test_smollm2_tree_rows_equal_path_forwards(smol) -> None:
    target = smol["target"]
    chk = Checker(target.hf_module, target.start(target.tokenizer.encode(SMOL_PROMPT)))
    chk.vocab = target.vocab_size
    chk.atol = 2e-3  # logits of size ~20 in float32
    rng = random.Random(7)
    for _ in range(3):
        parents = random_tree(rng, 0, 6)
        chk.score([rng.randrange(target.vocab_size) for _ in parents], parents)
        path = random_path(rng, chk.ppar)
        chk.commit([chk.ptok[i] for i in path] + [rng.randrange(1000)], path)
    chk.score([], [])
    for _level in range(2):  # drafter style
        chk.score(
            [rng.randrange(1000) for _ in range(3)], [-1, -1, 0] if _level == 0 else [0, 1, 2]
        )
