"""``ersd.load_model``: one dispatch table over the backends (``toy`` stand-ins, Hugging Face), the
HF loader's options and errors, and the compatibility check between a target and its draft."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from click.testing import CliRunner

import ersd
from ersd.errors import GenerationInputError, ModelLoadError, VocabularyMismatchError
from ersd.models import loading, memory
from ersd.models.hf import HFModel, from_pretrained_model
from ersd.models.toy import ToyModel
from tests.hf_tiny import V, save_tiny, tiny_model, word_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"))


# --- Hugging Face ------------------------------------------------------------------------------


def test_load_model_from_folder_with_overrides(saved: Path) -> None:
    full = ersd.load_model(str(saved))
    assert isinstance(full, HFModel) and full.vocab_size == V
    assert isinstance(full, ersd.TextModel) and isinstance(full.tokenizer, ersd.Tokenizer)
    assert full.tokenizer.encode("w5 w7") == [5, 7]
    assert full.eos_token_ids == [1]  # the tokenizer's (the config has none)
    draft = ersd.load_model(str(saved), num_hidden_layers=1, dtype="bfloat16")
    assert draft.hf_module.config.num_hidden_layers == 1 and draft.dtype == torch.bfloat16
    about = draft.describe()
    assert about["backend"] == "hf" and about["layers"] == 1 and about["dtype"] == "bfloat16"
    assert about["name"] == str(saved) and json.loads(json.dumps(about)) == about
    full.check_compatible(draft)
    res = ersd.generate(full, draft, [5, 7], max_new_tokens=6, seed=0, tree="chain:2")
    assert res.tokens == ersd.generate(full, None, [5, 7], max_new_tokens=6, seed=0).tokens
    with pytest.raises(GenerationInputError, match="no chat template"):
        full.tokenizer.apply_chat_template([{"role": "user", "content": "w5"}])


def test_load_model_bad_input(saved: Path) -> None:
    with pytest.raises(ModelLoadError, match="unsupported dtype 'float8'.*bfloat16"):
        ersd.load_model(str(saved), dtype="float8")
    with pytest.raises(ModelLoadError, match=r"unknown model 'gpt-17'.*smollm2-135m.*network"):
        ersd.load_model("gpt-17")
    with pytest.raises(ModelLoadError, match="unknown config overrides.*num_hiden_layers"):
        ersd.load_model(str(saved), num_hiden_layers=1)


def test_memory_hint(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "available_memory", lambda: 1000)
    with pytest.warns(ResourceWarning, match="only 0.0 GiB of memory is available.*bfloat16"):
        ersd.load_model(str(saved))


def test_available_memory_is_one_helper() -> None:
    from ersd.models.bundled import store

    assert store.available_memory is memory.available_memory
    have = memory.available_memory()
    assert have is None or have > 100_000_000


def test_check_compatible_rejects_different_vocabularies() -> None:
    a = from_pretrained_model(tiny_model("llama", 0), word_tokenizer(V))
    b = from_pretrained_model(tiny_model("llama", 1), word_tokenizer(V))
    a.check_compatible(b)
    other = word_tokenizer(V)
    other.add_tokens(["zzz"])
    c = from_pretrained_model(tiny_model("llama", 1), other)
    with pytest.raises(VocabularyMismatchError, match="tokenizers differ.*family"):
        a.check_compatible(c)
    d = from_pretrained_model(tiny_model("llama", 1, vocab=V + 8), word_tokenizer(V))
    with pytest.raises(VocabularyMismatchError, match="320 and 328 columns"):
        a.check_compatible(d)


# --- dispatch and the toy backend --------------------------------------------------------------


def test_auto_backend_by_name(saved: Path) -> None:
    assert loading.backend_for("toy") == "toy"
    assert loading.backend_for("tiny-qwen2-draft") == "toy"
    assert loading.backend_for(str(saved)) == "hf"
    assert loading.backend_for("smollm2-135m") == "hf"
    assert isinstance(ersd.load_model("toy"), ToyModel)
    assert isinstance(ersd.load_model(str(saved), backend="hf"), HFModel)
    with pytest.raises(ModelLoadError, match="unknown backend 'onnx'.*toy, llamacpp, hf"):
        ersd.load_model("toy", backend="onnx")
    with pytest.raises(ModelLoadError, match="unknown toy model 'toy-big'.*toy-draft"):
        ersd.load_model("toy-big", backend="toy")
    with pytest.raises(ModelLoadError, match="takes no options.*num_hidden_layers"):
        ersd.load_model("toy", num_hidden_layers=2)


def test_toy_pair_is_a_text_model_pair() -> None:
    target, draft = ersd.load_model("toy", dtype="bfloat16"), ersd.load_model("toy-draft")
    for m in (target, draft):
        assert isinstance(m, ersd.TextModel) and isinstance(m, ersd.LanguageModel)
        assert m.max_length is None and m.eos_token_ids == []
        assert m.describe()["backend"] == "toy"
    target.check_compatible(draft)
    ids = target.tokenizer.encode("def f")
    assert len(ids) == 5 and all(0 <= i < 64 for i in ids)  # bytes folded into 63 ids
    assert target.tokenizer.decode([104, 105]) == "hi"
    # the same tables in every load; the draft differs from the target but ERSD is invariant
    again = ersd.load_model("toy")
    seq = [[1, 2, 3], [5]]
    assert torch.equal(target.fn(seq), again.fn(seq))
    assert not torch.equal(target.fn(seq), draft.fn(seq))
    ids = target.tokenizer.encode("hello")
    spec = ersd.generate(target, draft, ids, max_new_tokens=16, seed=2, tree="multi:2x2")
    assert spec.tokens == ersd.generate(target, None, ids, max_new_tokens=16, seed=2).tokens
    with pytest.raises(VocabularyMismatchError, match="64 and 256 columns"):
        target.check_compatible(ersd.load_model("tiny-qwen2"))


def test_tiny_qwen2_draft_is_the_first_layer_of_the_target() -> None:
    target, draft = ersd.load_model("tiny-qwen2"), ersd.load_model("tiny-qwen2-draft")
    assert isinstance(target, HFModel) and isinstance(draft, HFModel)
    assert target.describe()["layers"] == 2 and draft.describe()["layers"] == 1
    assert target.eos_token_ids == draft.eos_token_ids == []
    t_sd, d_sd = target.hf_module.state_dict(), draft.hf_module.state_dict()
    for key, value in d_sd.items():
        assert torch.equal(value, t_sd[key]), key
    target.check_compatible(draft)


def test_cli_generates_with_the_toy_pair_without_the_bench_models() -> None:
    from ersd.cli import main

    args = ["generate", "--target", "toy", "--draft", "toy-draft", "--tree", "chain:3", "--json"]
    res = CliRunner().invoke(main, [*args, "--max-new-tokens", "12", "--compare", "hello"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(out["tokens"]) == 12 and out["identical_to_target_only"] is True
    assert "target toy (float32)" in res.stderr
    args = ["generate", "--target", "toy", "--draft", "none", "--chat", "hi"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0 and "no chat template" in res.output
    # the stand-ins live in the library, not in the benchmark
    code = (
        "import sys; from click.testing import CliRunner; from ersd.cli import main; "
        "r = CliRunner().invoke(main, ['generate', '--target', 'toy', '--draft', 'toy-draft', "
        "'--max-new-tokens', '4', '--json', 'x']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in sys.modules if m.startswith('ersd.bench.models')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_load_model_is_silent_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundled model's first-use preparation reports on stderr only when ``progress=True``
    (the CLI's choice), never by default."""
    from ersd.models import hf_load

    asked: list[bool] = []

    def prepare(name: str, progress: bool = True) -> str:
        asked.append(progress)
        raise ersd.ModelLoadError("stop here")

    monkeypatch.setattr(hf_load, "_bundled", lambda: ({"fake-model": None}, prepare))
    for kw in ({}, {"progress": True}):
        with pytest.raises(ersd.ModelLoadError, match="stop here"):
            ersd.load_model("fake-model", **kw)
    assert asked == [False, True]
