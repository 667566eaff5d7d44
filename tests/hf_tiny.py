"""Tiny random-weight transformers models shared by the HF adapter, loading, CPU-path and backend
contract tests (float32, fixed torch seeds, no downloads)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from ersd.models.hf import HFModel, HFSession
from tests.backend_contract import random_parents as random_tree
from tests.backend_contract import random_path

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


# --- shared by the adapter tests and the device check (scripts/device/gpu_check.py) ----------

ATOL = 1e-4
TREE_SPECS = ["chain:3", "multi:2x2", "paths:[[0],[1],[0,0],[1,0],[0,0,0]]"]

MODELS: dict[str, Callable[[], Any]] = {
    "llama-sdpa": lambda: tiny_model("llama", 0, "sdpa"),
    "llama-eager": lambda: tiny_model("llama", 0, "eager"),
    "qwen2-sdpa": lambda: tiny_model("qwen2", 1, "sdpa"),
    "qwen2-eager": lambda: tiny_model("qwen2", 1, "eager"),
    "qwen2-sliding": lambda: tiny_model("qwen2", 2, "sdpa", window=5),  # mixed layer types
}


class Checker:
    """Drives an HFSession and checks every returned row against a plain forward."""

    def __init__(
        self, model: Any, session: HFSession, plain: Callable[[Any, list[int]], Any] | None = None
    ) -> None:
        self.model = model
        self.plain = plain or plain_logits  # the reference forward (a device check passes its own)
        self.session = session
        self.ptok: list[int] = []
        self.ppar: list[int] = []
        self.worst = 0.0
        self.vocab = V
        self.atol = ATOL

    def seq(self, node: int) -> list[int]:
        out: list[int] = []
        while node >= 0:
            out.append(self.ptok[node])
            node = self.ppar[node]
        return self.session.committed + out[::-1]

    def score(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        first = len(self.ptok)
        rows = self.session.score(tokens, parents)
        self.ptok += tokens
        self.ppar += parents
        assert rows.shape == (1 + len(tokens), self.vocab) and rows.dtype == torch.float32
        seqs = [self.session.committed] + [self.seq(first + i) for i in range(len(tokens))]
        for row, seq in zip(rows, seqs, strict=True):
            err = (row - self.plain(self.model, seq)).abs().max().item()
            self.worst = max(self.worst, err)
            assert err < self.atol, f"row for {seq} off by {err}"
        return rows

    def commit(self, tokens: list[int], path: list[int]) -> None:
        self.session.commit(tokens, path)
        self.ptok, self.ppar = [], []
        assert self.session.cache_length <= len(self.session.committed)


def run_random_session(
    model: Any,
    hm: HFModel,
    seed: int,
    steps: int = 8,
    plain: Callable[[Any, list[int]], Any] | None = None,
) -> Checker:
    """Random drafter- and target-style tree calls and commits, every row checked."""
    rng = random.Random(seed)
    sess = hm.start([rng.randrange(V) for _ in range(rng.randrange(1, 9))])
    chk = Checker(model, sess, plain)
    for _ in range(steps):
        if rng.random() < 0.5:  # drafter style: root first, then level by level
            chk.score([], [])
            for _level in range(rng.randrange(1, 4)):
                level = [p for p in random_tree(rng, len(chk.ptok), rng.randrange(1, 4))]
                chk.score([rng.randrange(V) for _ in level], level)
        else:  # target style: the whole tree in one call
            parents = random_tree(rng, 0, rng.randrange(0, 9))
            chk.score([rng.randrange(V) for _ in parents], parents)
        path = random_path(rng, chk.ppar)
        extra = [rng.randrange(V) for _ in range(rng.choice([0, 1, 1, 2]))]
        chk.commit([chk.ptok[i] for i in path] + extra, path)
    chk.score([], [])
    return chk
