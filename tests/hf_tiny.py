"""Tiny random-weight transformers models shared by the HF adapter, loading, CPU-path and backend
contract tests (float32, fixed torch seeds, no downloads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

V = 320


def tiny_config(arch: str, vocab: int = V, layers: int = 2) -> Any:
    common: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,  # peaked logits: greedy comparisons without near-ties
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    return Qwen2Config(**common)


def tiny_model(
    arch: str = "llama", seed: int = 0, attn: str = "sdpa", window: int | None = None, **kw: Any
) -> Any:
    torch.manual_seed(seed)
    config = tiny_config(arch, **kw)
    if window:  # layer 0 full attention, layer 1 sliding window
        config = Qwen2Config(
            **{
                **config.to_dict(),
                "use_sliding_window": True,
                "sliding_window": window,
                "max_window_layers": 1,
                "layer_types": None,
            }
        )
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    return model.eval()


def tiny_pair() -> tuple[Any, Any]:
    """A tiny Llama target and a related draft (the target's first layer only, sharing its
    embedding and head), both as ersd ``HFModel`` s in float32."""
    from ersd.models.hf import from_pretrained_model

    target = from_pretrained_model(tiny_model("llama", 0))
    torch.manual_seed(0)
    draft_model = AutoModelForCausalLM.from_config(tiny_config("llama", layers=1))
    draft_model.load_state_dict(target.hf_module.state_dict(), strict=False)
    return target, from_pretrained_model(draft_model.eval())


def plain_logits(model: Any, seq: list[int]) -> torch.Tensor:
    """Next-token logits after ``seq`` from a plain forward without cache."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).logits[0, -1].float()


def word_tokenizer(n: int) -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(n)}
    tok = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w1")


def save_tiny(folder: Path, arch: str = "llama", seed: int = 0) -> Path:
    """A tiny random model with a word-level tokenizer, saved as a Hugging Face folder."""
    tiny_model(arch, seed).save_pretrained(folder)
    word_tokenizer(V).save_pretrained(folder)
    return folder
