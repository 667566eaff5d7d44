"""ersd — speculative sampling via exponential races (Kobus & Gündüz, ACL Findings 2025).

Public API::

    ersd.FunctionModel(fn, vocab_size)      # weight-free model
    ersd.load_model(name_or_path, ...)      # Hugging Face model (bundled offline weights or hub)
    ersd.generate(target, draft, prompt, max_new_tokens=..., method="ersd", tree="chain:4", ...)
    ersd.GenerationResult                   # .tokens, .target_calls, .block_efficiency, ...
    ersd.METHODS                            # registry of verification methods
"""

from __future__ import annotations

from typing import Any

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
from ersd.generate import GenerationResult, StepRecord, generate, generate_stream
from ersd.methods import METHODS, get_method
from ersd.models.function import FunctionModel
from ersd.probs import SamplingParams, logits_to_probs
from ersd.tree import TreeShape, parse_tree

__version__ = "0.1.0"


def load_model(
    name_or_path: str, *, dtype: str = "float32", device: str = "cpu", **config_overrides: Any
) -> Any:
    """Load a Hugging Face causal LM (bundled offline name, local folder or hub id).

    Imported lazily so that ``import ersd`` needs no transformers.
    """
    from ersd.models.hf import load_model as _load

    return _load(name_or_path, dtype=dtype, device=device, **config_overrides)


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
