"""Weight-free stand-in models, loadable by name with :func:`ersd.load_model` (backend ``toy``).

* ``toy`` / ``toy-draft`` — :class:`ToyModel` (a :class:`ersd.FunctionModel`) over a 64-token
  vocabulary: a fixed bigram table, and the same table plus noise for the draft; a byte
  tokenizer; no torch.nn, milliseconds per run;
* ``tiny-qwen2`` / ``tiny-qwen2-draft`` — a randomly initialised 2-layer Qwen2 (vocabulary 256,
  hidden 64) and its 1-layer truncation: real transformers models behind
  :class:`ersd.models.hf.HFModel`, so the tree-attention path (and the benchmark's HF assisted
  generation) run end to end without weights.

Weights come from a ``torch.Generator`` / a forked RNG with a fixed seed, so they are the same in
every run and never touch the caller's global random state; a target and its draft loaded
separately are the same as a pair built together.

    ersd generate --target toy --draft toy-draft "hello"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ersd.errors import GenerationInputError, ModelLoadError
from ersd.models.base import check_same_vocabulary
from ersd.models.function import FunctionModel

if TYPE_CHECKING:
    from ersd.models.base import TextModel
    from ersd.models.hf import HFModel

TOY_VOCAB = 64
TINY_QWEN2_VOCAB = 256
#: every name this backend loads, with a one-line description
NAMES: dict[str, str] = {
    "toy": "toy FunctionModel target (bigram table, vocab 64)",
    "toy-draft": "toy FunctionModel draft (the bigram table plus noise, vocab 64)",
    "tiny-qwen2": "tiny random Qwen2 (2 layers, vocab 256)",
    "tiny-qwen2-draft": "tiny random Qwen2's 1-layer truncation",
}
# options every loader may pass (``ersd generate`` always does); the toy models ignore them
_GENERIC = ("dtype", "device", "linear", "progress")  # progress: nothing to report


class ByteTokenizer:
    """UTF-8 bytes folded into a ``vocab_size`` vocabulary (an :class:`ersd.Tokenizer`)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b % (self.vocab_size - 1) for b in text.encode("utf-8")] or [0]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return bytes(i % 256 for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        raise GenerationInputError(
            "the toy models' byte tokenizer has no chat template; encode the prompt as plain text"
        )

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(self.vocab_size)}


class ToyModel(FunctionModel):
    """A :class:`ersd.FunctionModel` with a name and a byte tokenizer (an ersd.TextModel)."""

    def __init__(self, name: str, fn: Any, vocab_size: int) -> None:
        super().__init__(fn, vocab_size)
        self.name = name
        self.tokenizer = ByteTokenizer(vocab_size)
        self.eos_token_ids: list[int] = []

    def check_compatible(self, other: TextModel) -> None:
        check_same_vocabulary(self, other)

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "toy",
            "name": self.name,
            "description": NAMES.get(self.name, self.name),
            "dtype": "float32",
            "device": "cpu",
            "linear": None,
            "vocab_size": self.vocab_size,
            "max_length": self.max_length,
        }

    def __repr__(self) -> str:
        return f"ToyModel({self.name!r}, vocab_size={self.vocab_size})"


def toy_model(draft: bool = False) -> ToyModel:
    """``toy`` (``draft=False``) or ``toy-draft``: bigram logits, the draft's perturbed."""
    vocab = TOY_VOCAB
    gen = torch.Generator().manual_seed(1234)
    table = torch.randn(vocab, vocab, generator=gen) * 3.0
    noise = torch.randn(vocab, vocab, generator=gen) * 0.7

    def target_fn(seqs: list[list[int]]) -> torch.Tensor:
        return table[torch.tensor([s[-1] for s in seqs])]

    def draft_fn(seqs: list[list[int]]) -> torch.Tensor:
        last = torch.tensor([s[-1] for s in seqs])
        return table[last] + noise[last]

    if draft:
        return ToyModel("toy-draft", draft_fn, vocab)
    return ToyModel("toy", target_fn, vocab)


def tiny_qwen2(draft: bool = False, dtype: str = "float32", device: str = "cpu") -> HFModel:
    """``tiny-qwen2`` (``draft=False``) or ``tiny-qwen2-draft`` as an HF adapter model."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from ersd.models.hf import HFModel
    from ersd.models.hf_load import parse_dtype

    cfg = Qwen2Config(
        vocab_size=TINY_QWEN2_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        big = Qwen2ForCausalLM(cfg)
        small_cfg = cfg.to_dict()
        small_cfg.update(num_hidden_layers=1, layer_types=small_cfg["layer_types"][:1])
        small = Qwen2ForCausalLM(Qwen2Config(**small_cfg))
    # sharpen the random model so that sampling is not uniform noise
    with torch.no_grad():
        big.model.embed_tokens.weight.mul_(8.0)
    model: Any = big
    if draft:
        small.load_state_dict(big.state_dict(), strict=False)
        model = small
    model.to(dtype=parse_dtype(dtype))
    if device != "cpu":
        model.to(device)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    name = "tiny-qwen2-draft" if draft else "tiny-qwen2"
    return HFModel(model, ByteTokenizer(TINY_QWEN2_VOCAB), name=name)


def claims(name_or_path: str) -> bool:
    return name_or_path in NAMES


def load(name_or_path: str, **options: Any) -> TextModel:
    """Load a stand-in by name; ``dtype`` and ``device`` apply to ``tiny-qwen2*`` only, the
    ``toy`` tables ignore them (and ``linear``)."""
    if name_or_path not in NAMES:
        raise ModelLoadError(
            f"unknown toy model {name_or_path!r}; the toy backend has: {', '.join(NAMES)}"
        )
    unknown = sorted(set(options) - set(_GENERIC))
    if unknown:
        raise ModelLoadError(
            f"the stand-in model {name_or_path!r} takes no options {unknown}; it is fixed "
            "(only dtype and device apply, to tiny-qwen2)"
        )
    draft = name_or_path.endswith("-draft")
    if name_or_path.startswith("toy"):
        return toy_model(draft)
    return tiny_qwen2(
        draft, dtype=options.get("dtype", "float32"), device=options.get("device", "cpu")
    )
