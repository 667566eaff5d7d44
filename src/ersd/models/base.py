"""The model protocol: the only thing the generation loop knows about a language model.

A model hands out one **session** per sequence being generated.  A session holds the committed
token sequence (prompt + accepted tokens) and a *pending tree* of speculative tokens hanging below
its end.  Three operations, nothing else:

* ``score(tokens, parents)`` appends nodes to the pending tree and returns next-token logits in one
  forward pass: row 0 for the root (the context = committed sequence), row ``1 + i`` for the
  ``i``-th new node.  ``parents[i]`` indexes the pending tree (all nodes added since the last
  commit, in order; earlier calls' nodes first) or is ``-1`` for a child of the root.  Calling it
  with no tokens just returns the root row.
* ``commit(tokens, path)`` appends ``tokens`` to the committed sequence.  ``path[j]`` is the
  pending node that holds ``tokens[j]`` (its cache entry is kept); tokens past ``len(path)`` were
  never scored and are fed on the next call.  The pending tree is then emptied.
* ``committed`` — the committed sequence (prompt included).

Logits are float tensors of shape ``[1 + n, vocab_size]``; they may live on any device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ModelSession(Protocol):
    @property
    def committed(self) -> list[int]: ...

    def score(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor: ...

    def commit(self, tokens: Sequence[int], path: Sequence[int]) -> None: ...


@runtime_checkable
class LanguageModel(Protocol):
    """Anything with a ``vocab_size`` and a ``start(prompt) -> ModelSession``."""

    vocab_size: int

    def start(self, prompt: Sequence[int]) -> ModelSession: ...


def check_tree_args(tokens: Sequence[int], parents: Sequence[int], num_pending: int) -> None:
    """Validate a ``score`` call's arguments against a pending tree of ``num_pending`` nodes."""
    if len(tokens) != len(parents):
        raise ValueError(f"score(): {len(tokens)} tokens but {len(parents)} parents")
    for i, par in enumerate(parents):
        if not -1 <= par < num_pending + i:
            raise ValueError(
                f"score(): node {num_pending + i} has parent {par}; parents must be -1 (root) "
                f"or an earlier pending node"
            )


def check_commit_args(
    tokens: Sequence[int],
    path: Sequence[int],
    pending_tokens: Sequence[int],
    pending_parents: Sequence[int],
) -> None:
    """Validate that ``path`` is a root-down chain of pending nodes holding ``tokens``' prefix."""
    if len(path) > len(tokens):
        raise ValueError(f"commit(): path of {len(path)} nodes but only {len(tokens)} tokens")
    prev = -1
    for j, node in enumerate(path):
        if not 0 <= node < len(pending_tokens):
            raise ValueError(f"commit(): path node {node} is not a pending node")
        if pending_parents[node] != prev:
            raise ValueError(f"commit(): path node {node} is not a child of {prev}")
        if pending_tokens[node] != tokens[j]:
            raise ValueError(
                f"commit(): token {tokens[j]} at position {j} differs from pending node "
                f"{node}'s token {pending_tokens[node]}"
            )
        prev = node
