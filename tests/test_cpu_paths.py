"""CPU linear-layer paths (ersd.models.cpu): oneDNN-prepacked float32 targets, int8 drafts.

A prepacked model must compute the same function as the stock one (float rounding aside), keep
the adapter's tree scoring and ERSD's drafter invariance intact, and be what ``load_model`` gives
by default on CPU; an int8 draft must stay a usable draft (close to the float model) and never
change what ERSD samples.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM

import ersd
from ersd.errors import ModelLoadError
from ersd.models import cpu
from ersd.models.hf import HFModel, from_pretrained_model
from tests.hf_tiny import V, save_tiny, tiny_config, tiny_model

needs_onednn = pytest.mark.skipif(
    not cpu.onednn_available(), reason="this torch build has no oneDNN linear on this CPU"
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _logits(model: Any, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).logits[0].float()


SEQ = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]


@needs_onednn
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: q/k/v projections carry biases
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("packed", [True, False])  # packed for a row count, or plain layout
def test_prepacked_model_computes_the_same_function(
    arch: str, tied: bool, packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if packed and not cpu.packed_linear_available():
        pytest.skip("this torch build cannot pack a linear weight for a row count")
    monkeypatch.setattr(cpu, "_PACKED_OK", packed)  # what prepack_linears then picks
    torch.manual_seed(0)
    config = tiny_config(arch)
    config.tie_word_embeddings = tied
    model = AutoModelForCausalLM.from_config(config).eval()
    if tied:
        model.tie_weights()
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    ref = _logits(model, SEQ)
    n_linear = sum(1 for m in model.modules() if type(m) is torch.nn.Linear)
    assert cpu.prepack_linears(model) == n_linear > 0
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert {m.packed for m in model.modules() if isinstance(m, cpu.OneDNNLinear)} == {packed}
    new = _logits(model, SEQ)
    assert new.shape == ref.shape
    torch.testing.assert_close(new, ref, atol=1e-4, rtol=1e-5)
    # the input embedding still works on its own after the lm_head was replaced
    assert model.get_input_embeddings().weight.shape == (V, 48)


@needs_onednn
def test_prepacked_tree_scoring_equals_plain_forwards() -> None:
    model = tiny_model("qwen2", 1)
    cpu.prepack_linears(model)
    hm = from_pretrained_model(model)
    prompt = SEQ[:5]
    session = hm.start(prompt)
    # a root + a 2-branch tree: [a], [a, b], [a, c]
    rows = session.score([7, 8, 9], [-1, 0, 0])
    torch.testing.assert_close(rows[0].float(), _logits(model, prompt)[-1], atol=1e-4, rtol=0)
    torch.testing.assert_close(rows[1].float(), _logits(model, [*prompt, 7])[-1], atol=1e-4, rtol=0)
    torch.testing.assert_close(
        rows[3].float(), _logits(model, [*prompt, 7, 9])[-1], atol=1e-4, rtol=0
    )


@needs_onednn
def test_linears_are_packed_for_a_tree_where_the_build_can() -> None:
    """The default layout is the one packed for :data:`~ersd.models.cpu.PACK_ROWS` rows (the
    probe checks it against the plain product), and a packed layer gives the plain layer's
    outputs for any number of rows, one row and a long prompt's included."""
    assert cpu.packed_linear_available()  # torch 2.13 CPU wheels ship the kernel
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 40)
    layer = cpu.OneDNNLinear(lin)
    assert layer.packed and "packed for 8 rows" in repr(layer)
    for rows in (1, 2, 8, 9, 64):
        x = torch.randn(1, rows, 48)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), lin(x), atol=1e-5, rtol=1e-5)


def test_prepack_leaves_non_float32_models_alone() -> None:
    model = tiny_model("llama", 0).to(torch.bfloat16)
    assert cpu.prepack_linears(model) == 0
    assert any(type(m) is torch.nn.Linear for m in model.modules())


def test_int8_draft_is_close_to_its_float_model() -> None:
    model = tiny_model("llama", 0)
    ref = _logits(model, SEQ)
    q = copy.deepcopy(model)
    assert cpu.quantize_int8(q) > 0
    new = _logits(q, SEQ)
    assert new.shape == ref.shape
    assert not torch.equal(new, ref)  # it is a different model ...
    # ... but a close one: the same next token at most positions, correlated logits
    agree = (new.argmax(-1) == ref.argmax(-1)).float().mean().item()
    corr = torch.corrcoef(torch.stack([new.flatten(), ref.flatten()]))[0, 1].item()
    assert agree >= 0.8 and corr > 0.98, (agree, corr)


@needs_onednn
@pytest.mark.parametrize("tree", ["chain:3", "multi:2x2"])
def test_ersd_with_prepacked_target_and_int8_draft_is_drafter_invariant(tree: str) -> None:
    target_model = tiny_model("llama", 0)
    draft_model = copy.deepcopy(target_model)
    cpu.prepack_linears(target_model)
    cpu.quantize_int8(draft_model)
    target = from_pretrained_model(target_model)
    # int8 activations share one scale per forward, so tree rows are not bit-independent: say
    # "mask" (the architecture honours it) instead of letting the probe decide (see load_model)
    draft = from_pretrained_model(draft_model, tree_attention="mask")
    assert draft.vocab_size == target.vocab_size == V
    for seed in (0, 1):
        alone = ersd.generate(target, None, SEQ[:3], max_new_tokens=24, seed=seed)
        spec = ersd.generate(target, draft, SEQ[:3], max_new_tokens=24, seed=seed, tree=tree)
        assert spec.tokens == alone.tokens
        assert spec.block_efficiency > 1.5  # the int8 copy is a good draft


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", 1)


def test_load_model_picks_the_linear_path(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auto = ersd.load_model(str(saved))
    assert auto.linear_backend == ("onednn" if cpu.onednn_available() else "torch")
    stock = ersd.load_model(str(saved), linear="torch")
    assert stock.linear_backend == "torch"
    # the layout is part of the description, hence of the cost store's key: a curve measured
    # with the weights in one layout is never read for another
    if auto.linear_backend == "onednn":
        packed = cpu.packed_linear_available()
        assert auto.describe()["linear_layout"] == ("packed:8" if packed else "plain")
    assert "linear_layout" not in stock.describe()
    assert any(type(m) is torch.nn.Linear for m in stock.hf_module.modules())
    draft = ersd.load_model(str(saved), dtype="int8")
    assert draft.linear_backend == "int8" and "weights=int8" in repr(draft)
    assert isinstance(draft, HFModel) and draft.vocab_size == V
    auto.check_compatible(draft)
    torch.testing.assert_close(
        _logits(auto.hf_module, SEQ), _logits(stock.hf_module, SEQ), atol=1e-4, rtol=1e-5
    )
    # where oneDNN is missing, "auto" quietly keeps nn.Linear and "onednn" says what to do
    monkeypatch.setattr(cpu, "_ONEDNN_OK", False)
    assert ersd.load_model(str(saved)).linear_backend == "torch"
    with pytest.raises(ModelLoadError, match="linear='onednn' needs.*linear='torch'"):
        ersd.load_model(str(saved), linear="onednn")


def test_load_model_rejects_bad_cpu_options(saved: Path) -> None:
    with pytest.raises(ValueError, match="linear must be one of.*'onednn'"):
        ersd.load_model(str(saved), linear="mkl")
    with pytest.raises(ModelLoadError, match="int8.*CPU only.*'bfloat16'"):
        ersd.load_model(str(saved), dtype="int8", device="cuda")
    with pytest.raises(ModelLoadError, match="linear='onednn' needs a float32 model"):
        ersd.load_model(str(saved), dtype="bfloat16", linear="onednn")
