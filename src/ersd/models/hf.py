"""Hugging Face causal language models behind the backend protocol (:mod:`ersd.models.base`).

:class:`HFModel` wraps a transformers ``PreTrainedModel`` (and :class:`HFTokenizer` its
tokenizer) as an :class:`ersd.TextModel`; its sessions (:mod:`ersd.models.hf_session`) score a
draft tree in one forward on a KV cache with a custom 4-D attention mask, built only on
transformers' public extension points (4-D masks, ``position_ids``, the cache's ``layers``).
If an architecture rejects custom 4-D masks (detected once per model by a tiny probe here),
sessions fall back to scoring every root-to-leaf path of the new nodes as one row of a batch, with
a warning.  Loading from names and folders: :mod:`ersd.models.hf_load`.

transformers is imported lazily: ``import ersd`` does not need it.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ersd.errors import GenerationInputError
from ersd.models.base import check_same_vocabulary
from ersd.models.checks import check_scored_logits
from ersd.models.hf_session import HFSession

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ersd.models.base import TextModel, Tokenizer

TREE_ATTENTION_MODES = ("auto", "mask", "paths")


class HFTokenizer:
    """A transformers tokenizer behind the :class:`ersd.Tokenizer` protocol (``hf_tokenizer`` is
    the wrapped one)."""

    def __init__(self, tokenizer: Any) -> None:
        self.hf_tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.hf_tokenizer.encode(text)]

    def __call__(self, text: Any, **kwargs: Any) -> Any:
        """Tokenize like the wrapped transformers tokenizer: ``tok("text")`` gives a
        ``BatchEncoding`` with ``input_ids`` and ``attention_mask`` (``return_tensors="pt"``,
        ``padding=True``, ... pass through), so ``model.generate(**tok(...))`` works."""
        return self.hf_tokenizer(text, **kwargs)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.hf_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        if not getattr(self.hf_tokenizer, "chat_template", None):
            raise GenerationInputError(
                "this model's tokenizer has no chat template; encode the prompt as plain text"
            )
        from ersd.models.chat import chat_template_ids

        # content is text: a "<|im_start|>system" typed by a user must not become control ids
        return chat_template_ids(
            self.hf_tokenizer, messages, add_generation_prompt=add_generation_prompt
        )

    def get_vocab(self) -> dict[str, int]:
        return dict(self.hf_tokenizer.get_vocab())


# ----------------------------------------------------------------------------------------------
# model wrapper


class HFModel:
    """A transformers causal LM with its tokenizer: an :class:`ersd.TextModel`.

    ``tree_attention``: ``"mask"`` scores a tree in one forward with a 4-D attention mask,
    ``"paths"`` scores each root-to-leaf path as a batch row (for architectures that reject
    custom masks), ``"auto"`` probes the model once on first use and picks ``"mask"`` if it works.
    ``tokenizer`` is a transformers tokenizer (wrapped in :class:`HFTokenizer`), any
    :class:`ersd.Tokenizer`, or ``None`` (the model then generates from token ids only and is not
    an :class:`ersd.TextModel`).

    HF-only capability, for code that needs transformers itself (the benchmark's assisted-
    generation baseline): ``hf_module`` (the ``PreTrainedModel``), ``device``, ``dtype``; check
    ``isinstance(model, HFModel)`` before using them.
    """

    #: score a call whose pending and new nodes form one chain with the plain causal mask
    #: (:meth:`HFSession._is_chain`) instead of an explicit 4-D one; False: always the 4-D tree
    #: mask (the earlier path, kept for the before/after tests and measurements)
    causal_chains: bool = True

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Any = None,
        *,
        tree_attention: str = "auto",
        name: str | None = None,
    ) -> None:
        if tree_attention not in TREE_ATTENTION_MODES:
            raise ValueError(
                f"tree_attention must be one of {TREE_ATTENTION_MODES}, got {tree_attention!r}"
            )
        self.hf_module = model.eval()
        from transformers import PreTrainedTokenizerBase

        if isinstance(tokenizer, PreTrainedTokenizerBase):
            tokenizer = HFTokenizer(tokenizer)
        self._tokenizer: Tokenizer | None = tokenizer
        config = model.config
        self.name: str = name or getattr(config, "_name_or_path", "") or type(model).__name__
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self._text_config = text_config
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        # rows of the output layer (it may be a oneDNN or int8 linear: see ersd.models.cpu)
        rows = getattr(head, "out_features", None)
        if rows is None and isinstance(getattr(head, "weight", None), torch.Tensor):
            rows = head.weight.shape[0]  # type: ignore[union-attr]
        self.vocab_size: int = int(rows) if rows is not None else int(text_config.vocab_size)
        window = getattr(text_config, "max_position_embeddings", None)
        self.max_length: int | None = int(window) if window else None
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.tree_attention = tree_attention
        self._mask_min = torch.finfo(self.dtype).min
        # models mixing full and sliding-window attention layers take a dict of two masks
        layer_types = getattr(text_config, "layer_types", None) or []
        sliding = getattr(text_config, "sliding_window", None)
        self.sliding_window: int | None = (
            int(sliding) if sliding and "sliding_attention" in layer_types else None
        )
        # transformers renamed forward's ``past_key_values`` to ``cache`` (5.2x); use what it takes
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.forward_calls = 0  # scoring forwards (the adapter's own bookkeeping excluded)
        self.forward_seconds = 0.0  # seconds inside those forwards
        self._cache_checked: set[type] = set()  # cache classes seen extended by a forward

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's :class:`ersd.Tokenizer`; a model wrapped without one has no ``tokenizer``
        attribute (it is an :class:`ersd.LanguageModel` but not an :class:`ersd.TextModel`)."""
        if self._tokenizer is None:
            raise AttributeError(
                "this HFModel was wrapped without a tokenizer; pass one to "
                "from_pretrained_model(model, tokenizer) or load it with ersd.load_model"
            )
        return self._tokenizer

    @property
    def linear_backend(self) -> str:
        """``"onednn"``, ``"int8"`` or ``"torch"``: the CPU path of the linear layers
        (:mod:`ersd.models.cpu`)."""
        from ersd.models.cpu import linear_backend

        return linear_backend(self.hf_module)

    def _weights(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return "int8" if self.linear_backend == "int8" else dtype

    def __repr__(self) -> str:
        name = getattr(self.hf_module.config, "_name_or_path", "") or type(self.hf_module).__name__
        extra = ", linear=onednn" if self.linear_backend == "onednn" else ""
        return f"HFModel({name!r}, vocab_size={self.vocab_size}, weights={self._weights()}{extra})"

    @property
    def eos_token_ids(self) -> list[int]:
        """End-of-sequence ids: the generation config's (chat models often list several), else
        the transformers tokenizer's."""
        eos = getattr(getattr(self.hf_module, "generation_config", None), "eos_token_id", None)
        if eos is None and isinstance(self._tokenizer, HFTokenizer):
            eos = getattr(self._tokenizer.hf_tokenizer, "eos_token_id", None)
        if eos is None:
            return []
        return [int(e) for e in eos] if isinstance(eos, list | tuple) else [int(eos)]

    def describe(self) -> dict[str, Any]:
        """JSON-ready metadata: backend, name, architecture, weights dtype, device, linear path."""
        from ersd.models.cpu import linear_layout

        layers = getattr(self._text_config, "num_hidden_layers", None)
        layout = linear_layout(self.hf_module)
        return {
            "backend": "hf",
            "name": self.name,
            "architecture": type(self.hf_module).__name__,
            "dtype": self._weights(),
            "device": str(self.device),
            "linear": self.linear_backend,
            **({"linear_layout": layout} if layout else {}),
            "layers": int(layers) if layers is not None else None,
            "vocab_size": self.vocab_size,
            "max_length": self.max_length,
            "tree_attention": self.tree_attention,
        }

    def start(self, prompt: Sequence[int]) -> HFSession:
        """A fresh session whose committed sequence is ``prompt`` (fed on the first ``score``)."""
        if len(prompt) == 0:
            raise GenerationInputError(
                "prompt is empty; give at least one token (e.g. the tokenizer's BOS token)"
            )
        if self.max_length is not None and len(prompt) >= self.max_length:
            raise GenerationInputError(
                f"prompt has {len(prompt)} tokens but the model's context window is "
                f"{self.max_length} tokens (prompt + new tokens must fit); shorten the prompt"
            )
        return HFSession(self, prompt)

    def score_batch(
        self,
        sessions: Sequence[Any],
        calls: Sequence[tuple[Sequence[int], Sequence[int]]],
        root: bool = True,
    ) -> list[torch.Tensor]:
        """Score several sessions' calls in one forward (see :mod:`ersd.models.hf_batch`)."""
        from ersd.models.hf_batch import score_batch

        return score_batch(self, sessions, calls, root)

    def forward_slots(
        self, rows: list[tuple[int, HFSession, Any]], root: bool = True
    ) -> list[torch.Tensor]:
        """Scores ``(index, session, mask plan)`` rows held in slots of the batched storage in
        one forward (:func:`ersd.models.hf_batch.forward_slots`); a slot-held session scores
        itself alone through it."""
        from ersd.models.hf_batch import forward_slots

        return forward_slots(self, rows, root)

    def check_compatible(self, other: TextModel) -> None:
        """Raise :class:`ersd.VocabularyMismatchError` unless ``other`` tokenizes exactly like
        ``self``: the verifier compares the two models' probabilities token id by token id."""
        check_same_vocabulary(self, other)

    # -- forward passes ------------------------------------------------------------------------

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        mask: torch.Tensor | dict[str, torch.Tensor] | None,
        keep: int,
    ) -> torch.Tensor:
        """Logits of the last ``keep`` rows, ``[batch, keep, V]``; appends to ``cache``."""
        self.forward_calls += 1
        # whether the module extends the cache it is given: a property of its class and the
        # transformers version, so checked on the first forward of each cache class only
        check = type(cache) not in self._cache_checked
        t0 = time.perf_counter()
        before = cache.get_seq_length() if check else 0
        out = self.hf_module(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=keep,
            **{self._cache_kwarg: cache},
        )
        self.forward_seconds += time.perf_counter() - t0
        if not check:
            return out.logits
        if cache.get_seq_length() != before + ids.shape[1]:
            raise RuntimeError(
                f"{type(self.hf_module).__name__} did not extend the KV cache passed as "
                f"{self._cache_kwarg}=; this transformers version is not supported by ersd's "
                "adapter (use transformers >= 5.0)"
            )
        self._cache_checked.add(type(cache))
        return out.logits

    def check_logits(self, logits: torch.Tensor) -> None:
        """Refuse NaN / inf logits of a scoring call, naming this model (the sessions and the
        batched path call it once per call on the rows they return)."""
        check_scored_logits(logits, self.name, dtype=str(self.dtype).removeprefix("torch."))

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """``[q, kv]`` bool (True = may attend) -> ``[1, 1, q, kv]`` additive mask on the device."""
        mask = torch.zeros(1, 1, *allowed.shape, dtype=self.dtype)
        mask.masked_fill_(~allowed, self._mask_min)
        return mask.to(self.device)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    def resolved_tree_attention(self) -> str:
        """``"mask"`` or ``"paths"``; probes the model on the first call in ``"auto"`` mode."""
        if self.tree_attention == "auto":
            ok, why = self._probe_tree_mask()
            self.tree_attention = "mask" if ok else "paths"
            if not ok:
                warnings.warn(
                    f"{type(self.hf_module).__name__} does not honour custom 4-D attention masks "
                    f"({why}); scoring draft trees one root-to-leaf path per batch row instead "
                    "(correct, but slower for wide trees)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return self.tree_attention

    def _probe_tree_mask(self) -> tuple[bool, str]:
        """Score two sibling nodes ``b``, ``c`` under ``a`` with a tree mask on a cache and check
        that ``c``'s row equals a plain forward of ``a c`` (and differs from ``a b c``)."""
        a, b, c = (1 % self.vocab_size, 2 % self.vocab_size, 3 % self.vocab_size)
        dev = self.device
        calls = self.forward_calls  # the probe is not a scoring call
        try:
            with torch.no_grad():
                ref = self.hf_module(input_ids=torch.tensor([[a, c]], device=dev)).logits[0, -1]
                wrong = self.hf_module(input_ids=torch.tensor([[a, b, c]], device=dev)).logits[
                    0, -1
                ]
                cache = self.new_cache()
                self._forward(
                    torch.tensor([[a]], device=dev), torch.tensor([[0]], device=dev), cache, None, 1
                )
                allowed = torch.tensor([[[[True, True, False], [True, False, True]]]], device=dev)
                mask = torch.zeros(allowed.shape, dtype=self.dtype, device=dev)
                mask.masked_fill_(~allowed, self._mask_min)
                got = self._forward(
                    torch.tensor([[b, c]], device=dev),
                    torch.tensor([[1, 1]], device=dev),
                    cache,
                    mask,
                    2,
                )[0, -1]
        except Exception as exc:  # any rejection of the mask means: use the fallback
            return False, f"{type(exc).__name__}: {exc}"
        finally:
            self.forward_calls = calls
        self.check_logits(ref.float())  # a broken model is not a mask problem: say what it is
        err = (got.float() - ref.float()).abs().max().item()
        gap = (wrong.float() - ref.float()).abs().max().item()
        if err <= 0.1 * gap + 1e-6 * (1.0 + ref.float().abs().max().item()):
            return True, ""
        return False, f"masked row differs from the reference by {err:.3g} (gap {gap:.3g})"


def from_pretrained_model(
    model: PreTrainedModel, tokenizer: Any = None, *, tree_attention: str = "auto"
) -> HFModel:
    """Wrap an already loaded transformers causal LM (and its tokenizer) for ``ersd.generate``."""
    return HFModel(model, tokenizer, tree_attention=tree_attention)


__all__ = ["TREE_ATTENTION_MODES", "HFModel", "HFSession", "HFTokenizer", "from_pretrained_model"]
