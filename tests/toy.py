"""Small weight-free models shared by the tests."""

from __future__ import annotations

import torch

import ersd


def table_model(vocab: int, seed: int, scale: float = 2.0) -> ersd.FunctionModel:
    """Logits from a fixed random table indexed by the last two tokens."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, vocab, vocab, generator=g) * scale

    def fn(seqs: list[list[int]]) -> torch.Tensor:
        return torch.stack([table[s[-2] if len(s) > 1 else 0, s[-1]] for s in seqs])

    return ersd.FunctionModel(fn, vocab)


def mixed_draft(
    target: ersd.FunctionModel, noise_model: ersd.FunctionModel, weight: float
) -> ersd.FunctionModel:
    """A draft whose logits are target logits + weight * other logits (weight 0 = perfect)."""

    def fn(seqs: list[list[int]]) -> torch.Tensor:
        return target.fn(seqs) + weight * noise_model.fn(seqs)

    return ersd.FunctionModel(fn, target.vocab_size)
