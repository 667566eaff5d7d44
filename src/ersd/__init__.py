"""ersd — speculative sampling via exponential races (Kobus & Gündüz, ACL Findings 2025).

Public API::

    ersd.FunctionModel(fn, vocab_size)      # weight-free model
    ersd.load_model(name_or_path, ...)      # Hugging Face model (bundled offline weights or hub)
    ersd.generate(target, draft, prompt, max_new_tokens=..., method="ersd", tree="chain:4", ...)
    ersd.GenerationResult                   # .tokens, .target_calls, .block_efficiency, ...
    ersd.METHODS                            # registry of verification methods

Names are imported lazily (PEP 562), so ``import ersd.theory`` or ``ersd --help`` never pays for
torch; only the error classes are imported eagerly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ersd.errors import (
    ErsdError,
    GenerationInputError,
    InvalidLogitsError,
    InvalidTreeSpecError,
    ModelLoadError,
    SamplingParamsError,
    UnknownMethodError,
    UnsupportedTreeError,
    VocabularyMismatchError,
)

if TYPE_CHECKING:
    from ersd.generation import GenerationResult, StepRecord, generate, generate_stream
    from ersd.methods import METHODS, get_method
    from ersd.models.function import FunctionModel
    from ersd.probs import SamplingParams, logits_to_probs
    from ersd.tree import TreeShape, parse_tree

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "GenerationResult": "ersd.generation",
    "StepRecord": "ersd.generation",
    "generate": "ersd.generation",
    "generate_stream": "ersd.generation",
    "METHODS": "ersd.methods",
    "get_method": "ersd.methods",
    "FunctionModel": "ersd.models.function",
    "SamplingParams": "ersd.probs",
    "logits_to_probs": "ersd.probs",
    "TreeShape": "ersd.tree",
    "parse_tree": "ersd.tree",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ersd' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def load_model(
    name_or_path: str,
    *,
    backend: str = "auto",
    dtype: str = "float32",
    device: str = "cpu",
    linear: str = "auto",
    **config_overrides: Any,
) -> Any:
    """Load a Hugging Face causal LM (bundled offline name, local folder or hub id).

    Returns an :class:`ersd.models.hf.HFModel` (``.tokenizer``, ``.vocab_size``), accepted by
    :func:`ersd.generate`; ``dtype="int8"`` quantizes a CPU draft, ``linear`` picks the CPU
    linear-layer path (see :func:`ersd.models.hf.load_model`); ``config_overrides`` go to the model
    config (``num_hidden_layers=K`` makes a layer-truncated draft).  transformers is imported only
    here.  ``backend="llamacpp"`` loads a bundled name or ``.gguf`` file with llama.cpp instead
    (:func:`ersd.models.llamacpp.load_model`; options: threads, context, exact, max_paths).
    """
    if backend == "llamacpp":
        from ersd.models.llamacpp import load_model as _load_gguf

        hf_only = [
            name
            for name, given in (
                ("dtype", dtype != "float32"),
                ("device", device != "cpu"),
                ("linear", linear != "auto"),
            )
            if given
        ]
        if hf_only:
            raise ModelLoadError(
                f"option(s) {hf_only} do not apply to the llama.cpp backend (it runs the GGUF's "
                "own quantized weights on the CPU); it takes threads=, context=, exact=, "
                "max_paths=, repack= and cache_dir="
            )
        return _load_gguf(name_or_path, **config_overrides)
    if backend not in ("auto", "hf"):
        raise ModelLoadError(f"unknown backend {backend!r}; use 'auto', 'hf' or 'llamacpp'")
    from ersd.models.hf import load_model as _load

    return _load(name_or_path, dtype=dtype, device=device, linear=linear, **config_overrides)


__all__ = [
    "METHODS",
    "ErsdError",
    "FunctionModel",
    "GenerationInputError",
    "GenerationResult",
    "InvalidLogitsError",
    "InvalidTreeSpecError",
    "ModelLoadError",
    "SamplingParams",
    "SamplingParamsError",
    "StepRecord",
    "TreeShape",
    "UnknownMethodError",
    "UnsupportedTreeError",
    "VocabularyMismatchError",
    "generate",
    "generate_stream",
    "get_method",
    "load_model",
    "logits_to_probs",
    "parse_tree",
]
