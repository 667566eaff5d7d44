"""Models for the benchmark: the real Hugging Face pair, or weight-free stand-ins for tests.

* any name :func:`ersd.load_model` takes (bundled offline names, folders, hub ids);
* ``toy`` — a :class:`ersd.FunctionModel` pair over a 64-token vocabulary (a fixed bigram table
  and a perturbed copy for the draft) with a byte tokenizer: no torch.nn, milliseconds per run;
* ``tiny-qwen2`` — a randomly initialised 2-layer Qwen2 (vocabulary 256, hidden 64) and its
  1-layer truncation as the draft, real transformers models, so Hugging Face assisted generation
  and the tree-attention path run end to end without weights.

Stand-in weights come from a ``torch.Generator`` / a forked RNG with a fixed seed, so they are the
same in every run and never touch the caller's global random state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ersd.bench.config import ModelsConfig
from ersd.models.function import FunctionModel

STANDINS = ("toy", "tiny-qwen2")


class ByteTokenizer:
    """UTF-8 bytes folded into a ``vocab_size`` vocabulary (for the stand-in models)."""

    chat_template = None

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = vocab_size - 1

    def encode(self, text: str) -> list[int]:
        return [b % (self.vocab_size - 1) for b in text.encode("utf-8")] or [0]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return bytes(i % 256 for i in ids if i < 256).decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(self.vocab_size)}


@dataclass
class ModelPair:
    target: Any
    draft: Any
    tokenizer: Any
    is_hf: bool
    eos_token_ids: list[int]
    description: str


def _toy_pair() -> ModelPair:
    vocab = 64
    gen = torch.Generator().manual_seed(1234)
    table = torch.randn(vocab, vocab, generator=gen) * 3.0
    noise = torch.randn(vocab, vocab, generator=gen) * 0.7

    def target_fn(seqs: list[list[int]]) -> torch.Tensor:
        return table[torch.tensor([s[-1] for s in seqs])]

    def draft_fn(seqs: list[list[int]]) -> torch.Tensor:
        last = torch.tensor([s[-1] for s in seqs])
        return table[last] + noise[last]

    return ModelPair(
        target=FunctionModel(target_fn, vocab),
        draft=FunctionModel(draft_fn, vocab),
        tokenizer=ByteTokenizer(vocab),
        is_hf=False,
        eos_token_ids=[],
        description="toy FunctionModel pair (bigram table, vocab 64)",
    )


def _tiny_qwen2_pair(dtype: str) -> ModelPair:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from ersd.models.hf import HFModel, parse_dtype

    vocab = 256
    cfg = Qwen2Config(
        vocab_size=vocab,
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
    small.load_state_dict(big.state_dict(), strict=False)
    tdtype = parse_dtype(dtype)
    tok = ByteTokenizer(vocab)
    for m in (big, small):
        m.to(dtype=tdtype)  # type: ignore[call-arg]
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    return ModelPair(
        target=HFModel(big, tok),
        draft=HFModel(small, tok),
        tokenizer=tok,
        is_hf=True,
        eos_token_ids=[],
        description="tiny random Qwen2 (2 layers) with its 1-layer truncation as draft",
    )


def load_pair(cfg: ModelsConfig) -> ModelPair:
    """Load target and draft as the config says (``toy`` / ``tiny-qwen2`` stand-ins, or real)."""
    if cfg.target in STANDINS or cfg.draft in STANDINS:
        if cfg.target != cfg.draft:
            from ersd.bench.config import BenchConfigError

            raise BenchConfigError(
                f"stand-in models come in pairs: set both models.target and models.draft to "
                f"{cfg.target if cfg.target in STANDINS else cfg.draft!r}"
            )
        return _toy_pair() if cfg.target == "toy" else _tiny_qwen2_pair(cfg.dtype)
    import ersd

    target = ersd.load_model(cfg.target, dtype=cfg.dtype, device=cfg.device, linear=cfg.linear)
    overrides = {"num_hidden_layers": cfg.draft_layers} if cfg.draft_layers else {}
    draft_dtype = cfg.draft_dtype or cfg.dtype
    draft = ersd.load_model(
        cfg.draft, dtype=draft_dtype, device=cfg.device, linear=cfg.linear, **overrides
    )
    target.same_tokenizer(draft)
    return ModelPair(
        target=target,
        draft=draft,
        tokenizer=target.tokenizer,
        is_hf=True,
        eos_token_ids=list(target.eos_token_ids),
        description=f"{cfg.target} <- {cfg.draft}"
        + (f" (first {cfg.draft_layers} layers)" if cfg.draft_layers else "")
        + f" ({cfg.dtype}"
        + (f", draft {draft_dtype}" if draft_dtype != cfg.dtype else "")
        + f"; linear layers: target {target.linear_backend}, draft {draft.linear_backend})",
    )
