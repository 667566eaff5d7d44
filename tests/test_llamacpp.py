"""The llama.cpp backend (:mod:`ersd.models.llamacpp`) on the bundled SmolLM2-135M GGUF (Q4_1).

1. **Backend contract** (exact batch policy, compared bit for bit): a tree's rows equal the root
   rows of fresh sessions on each node's context; commit-then-score equals a fresh prefill of the
   committed sequence; an empty score returns the root row; bad parents / paths raise.  The
   properties take the model from the ``model`` fixture only, so they move to the shared contract
   suite by replacing that fixture with the suite's factory.
2. **Generation**: ERSD through this backend is drafter invariant (llama.cpp drafts, a random
   draft, a PyTorch draft of another backend); the law of the first token matches the backend's
   own probabilities (chi-square, alpha = 1e-4) for ERSD and SD, and a backend with an
   off-by-one in its context is rejected by the same test.
3. **Bad input**: a GGUF that is not a model, a file that is not a GGUF, options of another
   backend, vocabulary mismatch, too many tree paths, context overflow.

Skipped only if llama-cpp-python is missing *and* ``ERSD_REQUIRE_LLAMACPP`` is unset;
``scripts/test.sh`` (CI) sets it, so there a missing extra fails instead of skipping.
"""

from __future__ import annotations

import importlib.util
import os
import random
import struct
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import ersd
from ersd.errors import GenerationInputError, ModelLoadError, VocabularyMismatchError
from ersd.models.llamacpp import DEFAULT_EXACT_KV_CACHE, EXACT_KV_CACHES

if importlib.util.find_spec("llama_cpp") is None and not os.environ.get("ERSD_REQUIRE_LLAMACPP"):
    pytest.skip(
        "llama-cpp-python is not installed (pip install 'ersd[llamacpp]'); set "
        "ERSD_REQUIRE_LLAMACPP=1 to make this a failure",
        allow_module_level=True,
    )

from tests.exactness_util import ALPHA, gof_test

pytestmark = pytest.mark.realmodel

PROMPT = "def fibonacci(n):\n    "
TREES = ["chain:3", "multi:2x2", "paths:[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]"]


@pytest.fixture(scope="module")
def model() -> Any:
    """The backend under test (exact batch policy). The contract suite's factory goes here."""
    return ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=512)


@pytest.fixture(scope="module", params=EXACT_KV_CACHES)
def exact_model(request: pytest.FixtureRequest) -> Any:
    """The exact policy with each KV cache it accepts (the bit-exact properties hold for all)."""
    return ersd.load_model(
        "smollm2-135m", backend="llamacpp", threads=1, context=512, kv_cache=request.param
    )


@pytest.fixture(scope="module")
def fast_model() -> Any:
    """The same GGUF with the fast batch policy: a near-perfect draft whose logits differ."""
    return ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=512, exact=False)


def _prompt(model: Any) -> list[int]:
    return model.tokenizer.encode(PROMPT)


def _fresh_root(model: Any, seq: Sequence[int]) -> torch.Tensor:
    """Logits after ``seq`` from a fresh session (a plain prefill)."""
    return model.start(list(seq)).score([], [])[0]


def _random_tree(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(-1, i) for i in range(n)]


def _path_to(parents: Sequence[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


# ---------------------------------------------------------------------------------------------
# 1. backend contract (bit-exact under the exact batch policy)


def test_tree_rows_equal_per_path_forwards(exact_model: Any) -> None:
    model = exact_model
    rng = random.Random(3)
    prompt = _prompt(model)
    sess = model.start(prompt)
    root = sess.score([], [])
    for _step in range(3):
        parents = _random_tree(rng, 7)
        tokens = [rng.randrange(model.vocab_size) for _ in parents]
        rows = sess.score(tokens, parents)
        assert rows.shape == (8, model.vocab_size) and rows.dtype == torch.float32
        assert torch.equal(rows[0], root[0])
        base = sess.committed
        for i in range(len(tokens)):
            ctx = base + [tokens[j] for j in _path_to(parents, i)]
            assert torch.equal(rows[1 + i], _fresh_root(model, ctx)), f"node {i}"
        leaf = rng.randrange(len(tokens))
        path = _path_to(parents, leaf)[: rng.randrange(0, 4)]
        sess.commit([tokens[j] for j in path] + [rng.randrange(1000)], path)
        root = sess.score([], [])
        assert torch.equal(root[0], _fresh_root(model, sess.committed))


def test_level_by_level_scoring_equals_one_call(exact_model: Any) -> None:
    """A drafter's calls (one per depth, parents in earlier calls) give the same rows."""
    model = exact_model
    rng = random.Random(5)
    prompt = _prompt(model)
    parents = [-1, -1, 0, 0, 1, 2, 2, 4]
    depth = [1, 1, 2, 2, 2, 3, 3, 3]
    tokens = [rng.randrange(model.vocab_size) for _ in parents]
    whole = model.start(prompt).score(tokens, parents)
    sess = model.start(prompt)
    rows = [sess.score([], [])[0]]
    for d in (1, 2, 3):
        idx = [i for i in range(len(parents)) if depth[i] == d]
        rows += list(sess.score([tokens[i] for i in idx], [parents[i] for i in idx])[1:])
    assert torch.equal(torch.stack(rows), whole)
    path = [1, 4, 7]  # a path ending in a node decoded after rejected ones: parked cells
    accepted = [tokens[i] for i in path]
    sess.commit([*accepted, 42], path)
    assert torch.equal(sess.score([], [])[0], _fresh_root(model, [*prompt, *accepted, 42]))


def test_commit_then_score_equals_fresh_prefill(exact_model: Any) -> None:
    model = exact_model
    rng = random.Random(11)
    sess = model.start(_prompt(model))
    for _step in range(8):
        parents = _random_tree(rng, rng.randrange(0, 6))
        tokens = [rng.randrange(model.vocab_size) for _ in parents]
        sess.score(tokens, parents)
        path = _path_to(parents, rng.randrange(len(parents))) if parents else []
        extra = [rng.randrange(1000) for _ in range(rng.randrange(0, 3))]
        sess.commit([tokens[j] for j in path] + extra, path)
    # the whole path accepted, nothing beyond it: the root row is the last node's row
    rows = sess.score([7, 8], [-1, 0])
    sess.commit([7, 8], [0, 1])
    assert torch.equal(sess.score([], [])[0], rows[2])
    assert torch.equal(sess.score([], [])[0], _fresh_root(model, sess.committed))


def test_empty_score_is_root_row(model: Any) -> None:
    sess = model.start(_prompt(model))
    root = sess.score([], [])
    assert root.shape == (1, model.vocab_size)
    assert torch.equal(sess.score([5], [-1])[0], root[0])
    assert torch.equal(sess.score([], [])[0], root[0])
    assert sess.committed == _prompt(model)


def test_bad_parents_and_paths_raise(model: Any) -> None:
    sess = model.start(_prompt(model))
    with pytest.raises(ValueError, match="parent"):
        sess.score([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="tokens but"):
        sess.score([1, 2], [-1])
    sess.score([1, 2, 3], [-1, -1, 0])
    with pytest.raises(ValueError, match="not a child"):
        sess.commit([2, 3], [1, 2])
    with pytest.raises(ValueError, match="differs"):
        sess.commit([9], [0])
    with pytest.raises(GenerationInputError, match="outside"):
        sess.score([model.vocab_size], [-1])
    sess.commit([1, 3, 4], [0, 2])  # still usable after the errors
    assert torch.equal(sess.score([], [])[0], _fresh_root(model, sess.committed))


@pytest.mark.parametrize("kv_cache", EXACT_KV_CACHES)
def test_batch_policy_two_threads_long_context(kv_cache: str) -> None:
    """Why the exact policy exists: with 2 threads and >= 512 cached cells an f16 cache makes a
    one-token decode (split-KV flash attention) differ from the same row in a tree decode; the
    exact policy's rows agree bit for bit, with each cache it accepts."""
    diffs = {}
    for exact in (True, False):
        kw: dict[str, Any] = {"kv_cache": kv_cache} if exact else {"exact": False}
        m = ersd.load_model("smollm2-135m", backend="llamacpp", threads=2, context=1024, **kw)
        prompt = (_prompt(m) * 80)[:530]
        toks = [11, 12, 13]
        rows = m.start(prompt).score(toks, [-1, 0, 1])
        sess = m.start(prompt + toks[:-1])
        sess.score([], [])
        sess.commit(toks[-1:], [])
        one = sess.score([], [])[0]  # a one-token decode, as in target-only decoding
        diffs[exact] = (rows[-1] - one).abs().max().item()
    assert diffs[True] == 0.0
    assert 0.0 < diffs[False] < 2.0  # same model, other rounding


@pytest.fixture(scope="module")
def kquant_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 requantized to Q4_K_S by llama.cpp (~1 s): its ``ffn_down`` becomes Q4_K, the type
    llama.cpp repacks for AVX2 (the bundled Qwen2.5-Coder GGUFs are mostly Q4_K)."""
    from ersd.models import bundled
    from ersd.models.llamacpp import llama_lib

    lib = llama_lib()
    src = bundled.gguf_path("smollm2-135m", None, ensure=True)
    out = tmp_path_factory.mktemp("gguf") / "smollm2-135m-q4_k_s.gguf"
    params = lib.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = lib.LLAMA_FTYPE_MOSTLY_Q4_K_S
    params.allow_requantize = True
    assert lib.llama_model_quantize(str(src).encode(), str(out).encode(), params) == 0
    return out


@pytest.mark.parametrize("kv_cache", EXACT_KV_CACHES)
def test_rows_do_not_depend_on_the_batch_size_with_repackable_weights(
    kquant_gguf: Path, kv_cache: str
) -> None:
    """Regression (ERSD differed from target-only decoding on Qwen2.5-Coder Q4_K_M): llama.cpp
    multiplies repacked Q4_K weights by a GEMM for batch rows in groups of 4 and a GEMV for the
    other ``n % 4`` rows, which round differently, so a row changed when a tree was decoded with
    it (a prompt of L tokens alone vs L + 3).  The exact policy does not repack; the fast one
    (repacked) shows the effect, so the test can fail."""
    diffs = {}
    for exact in (True, False):
        kw: dict[str, Any] = {"kv_cache": kv_cache} if exact else {"exact": False}
        m = ersd.load_model(kquant_gguf, backend="llamacpp", threads=1, context=256, **kw)
        assert m.repack is not exact and m.describe()["repack"] is not exact
        long = (_prompt(m) * 20)[:60]
        worst = 0.0
        for n in (2, 3, 5, 7, 51):
            tokens = [11, 12, 13]
            rows = m.start(long[:n]).score(tokens, [-1, 0, 1])
            for i in range(4):  # the root row (last prompt token) and each node's row
                alone = _fresh_root(m, long[:n] + tokens[:i])  # its own row in the GEMV rest
                worst = max(worst, (rows[i] - alone).abs().max().item())
        diffs[exact] = worst
    assert diffs[True] == 0.0
    assert 0.0 < diffs[False] < 3.0  # same weights, other rounding


@pytest.mark.parametrize("tree", ["chain:2", "chain:4", "multi:2x2"])
def test_ersd_is_drafter_invariant_with_repackable_weights(kquant_gguf: Path, tree: str) -> None:
    """ERSD through a Q4_K target (exact) with its repacked twin (fast) as a near-perfect draft
    gives target-only decoding's tokens."""
    target = ersd.load_model(kquant_gguf, backend="llamacpp", threads=1, context=256)
    draft = ersd.load_model(kquant_gguf, backend="llamacpp", threads=1, context=256, exact=False)
    prompt = (_prompt(target) * 8)[:51]  # 51 % 4 = 3: the prompt's last row moves to the GEMM
    for seed in range(3):
        kw: dict[str, Any] = dict(max_new_tokens=24, seed=seed, tree=tree)
        res = ersd.generate(target, draft, prompt, **kw)
        assert res.tokens == ersd.generate(target, None, prompt, **kw).tokens, seed


# ---------------------------------------------------------------------------------------------
# 2. generation through the backend


class _RandomDraft:
    """A draft with fixed random logits per last token: mostly rejected, exercises parking."""

    def __init__(self, vocab: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.randn(64, vocab, generator=gen) * 3
        self.model = ersd.FunctionModel(
            lambda seqs: torch.stack([self.table[s[-1] % 64] for s in seqs]), vocab
        )


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("draft", ["fast", "random"])
def test_ersd_is_drafter_invariant(model: Any, fast_model: Any, draft: str, tree: str) -> None:
    prompt = _prompt(model)
    kw: dict[str, Any] = dict(max_new_tokens=24, seed=hash((draft, tree)) % 1000, tree=tree)
    dmodel = fast_model if draft == "fast" else _RandomDraft(model.vocab_size, 1).model
    res = ersd.generate(model, dmodel, prompt, **kw)
    base = ersd.generate(model, None, prompt, **kw)
    assert res.tokens == base.tokens
    if draft == "fast":  # a near-perfect draft: whole paths accepted, the cache moves
        assert res.block_efficiency > 1.8


@pytest.mark.parametrize("tree", ["chain:4", "multi:2x3"])
def test_watermarked_ersd_equals_watermarked_target_only_and_is_detected(
    model: Any, fast_model: Any, tree: str
) -> None:
    """The watermark over llama.cpp (exact policy): every token is the keyed race's winner, so
    ERSD with the fast-policy draft gives watermarked target-only decoding's text, and the
    detector finds it (a story prompt at T = 1: enough entropy for p < 1e-4 at 96 tokens)."""
    wm = ersd.Watermark(key=bytes(range(32)), context_width=4)
    ids = model.tokenizer.encode("Once upon a time, in a city of glass towers,")
    kw: dict[str, Any] = dict(max_new_tokens=96, temperature=1.0, watermark=wm)
    lengths = []
    for seed in (3, 4):
        base = ersd.generate(model, None, ids, seed=seed, **kw)
        lengths.append(len(base.tokens))
        res = ersd.generate(model, fast_model, ids, seed=seed, tree=tree, **kw)
        assert res.tokens == base.tokens
        assert res.num_accepted_tokens > 0
        assert ersd.generate(model, None, ids, seed=seed, max_new_tokens=96).tokens != base.tokens
        if len(base.tokens) >= 64:
            found = ersd.watermark.detect(base.tokens, wm, salt=wm.salt_for(seed))
            assert found.p_value < 1e-4, found
    # at least one of the two samples is long enough to score (EOS may end one early)
    assert max(lengths) >= 64, lengths


def test_mixed_backends_hf_draft(model: Any) -> None:
    """A llama.cpp target with a PyTorch (layer-truncated) draft of the same vocabulary."""
    draft = ersd.load_model("smollm2-135m", num_hidden_layers=8)
    model.check_compatible(draft)
    prompt = _prompt(model)
    assert draft.tokenizer.encode(PROMPT) == prompt
    kw: dict[str, Any] = dict(max_new_tokens=16, seed=4, tree="multi:2x2")
    assert (
        ersd.generate(model, draft, prompt, **kw).tokens
        == ersd.generate(model, None, prompt, **kw).tokens
    )
    # the reverse: a PyTorch float32 target with a llama.cpp draft
    hf_target = ersd.load_model("smollm2-135m")
    model.check_compatible(hf_target)
    kw["tree"] = "chain:3"
    assert (
        ersd.generate(hf_target, model, prompt, **kw).tokens
        == ersd.generate(hf_target, None, prompt, **kw).tokens
    )
    ids = draft.tokenizer.apply_chat_template(  # the Tokenizer protocol: ids
        [{"role": "user", "content": "Hi there"}], add_generation_prompt=True
    )
    assert model.tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}]) == [
        int(t) for t in ids
    ]


class _OffByOne:
    """A broken backend: its sessions forget the last token of the prompt."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.max_length = inner.max_length

    def start(self, prompt: Sequence[int]) -> Any:
        return self.inner.start(list(prompt)[:-1])


N_SAMPLES = 200  # per law; the broken variant (another context) is rejected far below alpha


@pytest.mark.parametrize("method", ["ersd", "sd"])
def test_first_token_law_matches_backend_probabilities(
    model: Any, fast_model: Any, method: str
) -> None:
    params = ersd.SamplingParams(temperature=1.0, top_k=6)
    prompt = _prompt(model)
    probs = ersd.logits_to_probs(_fresh_root(model, prompt), params)
    law = {(t,): float(p) for t, p in enumerate(probs.tolist()) if p > 0}

    def counts(target: Any) -> Counter[tuple[int, ...]]:
        return Counter(
            tuple(
                ersd.generate(
                    target,
                    fast_model,
                    prompt,
                    max_new_tokens=2,
                    method=method,
                    tree="multi:2x1" if method == "ersd" else "chain:1",
                    temperature=1.0,
                    top_k=6,
                    seed=10_000 + s,
                ).tokens[:1]
            )
            for s in range(N_SAMPLES)
        )

    fit = gof_test(counts(model), law)
    assert fit.pvalue > ALPHA, str(fit)
    broken = gof_test(counts(_OffByOne(model)), law)
    assert broken.pvalue < ALPHA, str(broken)


def test_tokenizer_and_metadata(model: Any) -> None:
    tok = model.tokenizer
    ids = tok.encode(PROMPT)
    assert tok.decode(ids) == PROMPT
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    text = tok.decode(chat)
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>" not in tok.decode(chat, skip_special_tokens=True)
    assert tok.encode("<|im_end|>", add_special_tokens=False)[0] in model.eos_token_ids
    info = model.describe()
    assert info["backend"] == "llamacpp" and info["batch_policy"] == "exact"
    assert info["kv_cache"] == model.kv_cache == DEFAULT_EXACT_KV_CACHE
    assert info["layers"] == 30 and info["vocab_size"] == model.vocab_size == 49152
    assert model.max_length == 512


# ---------------------------------------------------------------------------------------------
# 3. bad input


def _write_gguf_without_tensors(path: Path) -> None:
    """A valid GGUF v3 header with one metadata key and no tensors: not a model."""
    key, val = b"general.architecture", b"llama"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    data += struct.pack("<Q", len(key)) + key + struct.pack("<I", 8)  # 8 = string
    data += struct.pack("<Q", len(val)) + val
    path.write_bytes(data)


def test_gguf_that_is_not_a_model(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    _write_gguf_without_tensors(empty)
    with pytest.raises(ModelLoadError, match="not a language model"):
        ersd.load_model(str(empty), backend="llamacpp")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        ersd.load_model(str(junk), backend="llamacpp")
    with pytest.raises(ModelLoadError, match="neither a bundled model"):
        ersd.load_model(str(tmp_path / "missing.gguf"), backend="llamacpp")


def test_bad_options_and_mismatches(model: Any) -> None:
    with pytest.raises(ModelLoadError, match="do not apply to the llama.cpp backend"):
        ersd.load_model("smollm2-135m", backend="llamacpp", dtype="bfloat16")
    with pytest.raises(ModelLoadError, match="unknown backend"):
        ersd.load_model("smollm2-135m", backend="onnx")
    other = ersd.FunctionModel(lambda s: torch.zeros(len(s), 100), 100)
    with pytest.raises(VocabularyMismatchError, match="49152 and 100"):
        model.check_compatible(other)
    with pytest.raises(VocabularyMismatchError):
        ersd.generate(model, other, _prompt(model), max_new_tokens=2)

    class _Shifted:
        vocab_size = model.vocab_size
        tokenizer = type("T", (), {"encode": lambda self, t: [1 + i for i in range(len(t))]})()

    with pytest.raises(VocabularyMismatchError, match="tokenizers disagree"):
        model.check_compatible(_Shifted())


def test_exact_policy_refuses_repacked_weights() -> None:
    with pytest.raises(ModelLoadError, match="repack=True cannot be combined with exact=True"):
        ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=64, repack=True)


def test_kv_cache_choices() -> None:
    """An unknown cache type, or one that puts flash attention on a batch-dependent path under
    the exact policy, is refused naming the fix; the fast policy takes any."""
    with pytest.raises(ModelLoadError, match="kv_cache='q4' is not a KV cache type"):
        ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=64, kv_cache="q4")
    for kv in ("f16", "f32"):
        with pytest.raises(ModelLoadError, match=f"kv_cache='{kv}' cannot be combined with exact"):
            ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=64, kv_cache=kv)
    fast = ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=64, exact=False)
    assert fast.describe()["kv_cache"] == "f16"
    bf16 = ersd.load_model(
        "smollm2-135m", backend="llamacpp", threads=1, context=64, exact=False, kv_cache="bf16"
    )
    assert bf16.start([1, 2, 3]).score([4], [-1]).shape == (2, bf16.vocab_size)


def test_tree_and_context_limits() -> None:
    small = ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=32, max_paths=2)
    sess = small.start([1, 2, 3])
    with pytest.raises(GenerationInputError, match="more than 2 root-to-leaf paths"):
        sess.score([4, 5, 6], [-1, -1, -1])
    rows = sess.score([4, 5], [-1, -1])  # the failed call left no trace
    assert rows.shape[0] == 3
    with pytest.raises(GenerationInputError, match="context window"):
        sess.score(list(range(40)), [-1] + [2 + i for i in range(39)])
    with pytest.raises(GenerationInputError, match="context window"):
        small.start(list(range(40)))
    with pytest.raises(GenerationInputError, match="empty"):
        small.start([])


def test_parked_cells_fill_the_cache_and_it_is_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accepting the last of many siblings parks the others; when they fill the cache it is
    rebuilt from the committed tokens, and rows stay bit-identical to a fresh prefill."""
    from ersd.models import llamacpp

    monkeypatch.setattr(llamacpp, "EXTRA_CELLS", 16)
    m = ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=64)
    rng = random.Random(2)
    sess = m.start([1, 2, 3])
    rebuilt = False
    while len(sess.committed) + 3 < m.max_length and not rebuilt:
        parked = sess._junk
        kids = [rng.randrange(m.vocab_size) for _ in range(12)]
        sess.score(kids, [-1] * 12)
        sess.commit([kids[-1], rng.randrange(1000)], [11])
        rebuilt = sess._junk < parked
    assert rebuilt, "the cache was never rebuilt: raise the number of siblings"
    assert torch.equal(sess.score([], [])[0], _fresh_root(m, sess.committed))
    rows = sess.score([5, 6], [-1, 0])
    assert torch.equal(rows[2], _fresh_root(m, [*sess.committed, 5, 6]))
