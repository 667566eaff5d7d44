"""The backend protocol: everything ersd knows about a language model (see ``docs/backends.md``).

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

Logits are float tensors of shape ``[1 + n, vocab_size]``; they may live on any device.  Bad
``parents`` / ``path`` raise ``ValueError`` (:func:`check_tree_args`, :func:`check_commit_args`).
A session with a KV cache may expose ``cache_length`` (entries held); it must never exceed
``len(committed)`` plus the pending nodes.

:class:`LanguageModel` is what the generation loop needs (``vocab_size``, ``max_length``,
``start``); :class:`TextModel` adds what the CLI and the benchmark need (a :class:`Tokenizer`, EOS
ids, a compatibility check, JSON metadata).  All four are ``runtime_checkable``: code checks them
with ``isinstance``.  Backends: :mod:`ersd.models.hf` (transformers), :mod:`ersd.models.function`
(a Python function), :mod:`ersd.models.toy` (weight-free stand-ins); loading:
:mod:`ersd.models.loading`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ersd.errors import VocabularyMismatchError

if TYPE_CHECKING:
    import torch


@runtime_checkable
class ModelSession(Protocol):
    """One sequence: the committed tokens and a pending tree (see the module docstring)."""

    @property
    def committed(self) -> list[int]: ...

    def score(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor: ...

    def commit(self, tokens: Sequence[int], path: Sequence[int]) -> None: ...


@runtime_checkable
class LanguageModel(Protocol):
    """What :func:`ersd.generate` needs: ``vocab_size`` (the logits' width), ``max_length`` (the
    context window in tokens, ``None`` = unbounded) and ``start(prompt) -> ModelSession``.
    Attributes or read-only properties both satisfy the protocol."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_length(self) -> int | None: ...

    def start(self, prompt: Sequence[int]) -> ModelSession: ...


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids.  ``apply_chat_template`` returns the ids of a chat prompt (ending with
    the assistant's turn when ``add_generation_prompt``) and raises an :class:`ersd.ErsdError`
    when the model has no chat template.  Optional: ``get_vocab() -> dict[str, int]`` makes
    :func:`check_same_vocabulary` exact."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]: ...


@runtime_checkable
class TextModel(LanguageModel, Protocol):
    """A :class:`LanguageModel` that comes with its tokenizer: what ``ersd generate`` and the
    benchmark load.  ``check_compatible(other)`` raises :class:`ersd.VocabularyMismatchError`
    unless ``other`` can be this model's draft (same token ids); ``describe()`` is JSON-ready
    metadata (``backend``, ``name``, ``dtype``, ``device``, ``linear``, ``layers``, ... whatever
    applies)."""

    @property
    def name(self) -> str: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def eos_token_ids(self) -> list[int]: ...

    def check_compatible(self, other: TextModel) -> None: ...

    def describe(self) -> dict[str, Any]: ...


# ----------------------------------------------------------------------------------------------
# helpers for implementations


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


_FAMILY_HINT = (
    "pick a draft from the target's model family, e.g. a smaller Qwen2.5 for a Qwen2.5 target"
)


def check_same_vocabulary(target: TextModel, draft: TextModel) -> None:
    """The usual ``check_compatible``: equal logits width, and tokenizers that map ids alike.

    With ``get_vocab()`` on both tokenizers the vocabularies are compared exactly; otherwise the
    decoded text of up to 4096 ids spread over the vocabulary is compared.  A model without a
    tokenizer (an HF model wrapped without one) is compared by its vocabulary size only.
    """
    if target.vocab_size != draft.vocab_size:
        raise VocabularyMismatchError(
            f"the models' logits have {target.vocab_size} and {draft.vocab_size} columns; draft "
            f"and target must share one tokenizer and vocabulary ({_FAMILY_HINT})"
        )
    mine, theirs = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if mine is None or theirs is None:
        return
    if hasattr(mine, "get_vocab") and hasattr(theirs, "get_vocab"):
        a, b = mine.get_vocab(), theirs.get_vocab()
        if a != b:
            differ = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])[:3]
            raise VocabularyMismatchError(
                f"the draft and target tokenizers differ ({len(a)} vs {len(b)} tokens; e.g. "
                f"{differ}); draft and target must share one tokenizer ({_FAMILY_HINT})"
            )
        return
    step = max(1, target.vocab_size // 4096)
    for i in range(0, target.vocab_size, step):
        x, y = mine.decode([i]), theirs.decode([i])
        if x != y:
            raise VocabularyMismatchError(
                f"the draft and target tokenizers differ: token {i} is {x!r} vs {y!r}; draft and "
                f"target must share one tokenizer ({_FAMILY_HINT})"
            )
