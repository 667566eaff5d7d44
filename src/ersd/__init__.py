"""ersd — speculative sampling via exponential races (Kobus & Gündüz, ACL Findings 2025).

Public API::

    ersd.FunctionModel(fn, vocab_size)      # weight-free model
    ersd.load_model(name_or_path, ...)      # a TextModel: HF (bundled, folder, hub id) or "toy"
    ersd.LanguageModel, ersd.ModelSession   # the backend protocol (docs/backends.md)
    ersd.TextModel, ersd.Tokenizer          # ... with tokenizer, EOS ids, compatibility check
    ersd.generate(target, draft, prompt, max_new_tokens=..., method="ersd", tree="chain:4", ...)
    ersd.Request(prompt, max_new_tokens=...)  # one request, validated once (BatchEngine.add)
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
    WatermarkError,
)

if TYPE_CHECKING:
    from ersd.batch import BatchEngine, derive_seed, generate_batch, generate_batch_stream
    from ersd.costs import CostModel
    from ersd.drafting import Drafter, DraftSession, ModelDrafter
    from ersd.generation import generate, generate_request, generate_stream, stream_request
    from ersd.methods import METHODS, get_method
    from ersd.models.base import LanguageModel, ModelSession, TextModel, Tokenizer
    from ersd.models.function import FunctionModel
    from ersd.models.loading import load_model
    from ersd.probs import SamplingParams, logits_to_probs
    from ersd.request import Request
    from ersd.results import GenerationResult, StepRecord
    from ersd.tree import AutoTree, TreeShape
    from ersd.tree_spec import parse_tree
    from ersd.watermark import Detection, Watermark, load_watermark

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "BatchEngine": "ersd.batch",
    "derive_seed": "ersd.batch",
    "generate_batch": "ersd.batch",
    "generate_batch_stream": "ersd.batch",
    "GenerationResult": "ersd.results",
    "StepRecord": "ersd.results",
    "Drafter": "ersd.drafting",
    "DraftSession": "ersd.drafting",
    "ModelDrafter": "ersd.drafting",
    "generate": "ersd.generation",
    "generate_stream": "ersd.generation",
    "generate_request": "ersd.generation",
    "stream_request": "ersd.generation",
    "METHODS": "ersd.methods",
    "get_method": "ersd.methods",
    "FunctionModel": "ersd.models.function",
    "LanguageModel": "ersd.models.base",
    "ModelSession": "ersd.models.base",
    "TextModel": "ersd.models.base",
    "Tokenizer": "ersd.models.base",
    "load_model": "ersd.models.loading",
    "SamplingParams": "ersd.probs",
    "Request": "ersd.request",
    "logits_to_probs": "ersd.probs",
    "TreeShape": "ersd.tree",
    "AutoTree": "ersd.tree",
    "CostModel": "ersd.costs",
    "parse_tree": "ersd.tree_spec",
    "Watermark": "ersd.watermark.settings",
    "load_watermark": "ersd.watermark.settings",
    "Detection": "ersd.watermark.detect",
}


#: submodules reachable as attributes without an import (``ersd.transformers.generate``)
_SUBMODULES = ("transformers",)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:  # importing the submodule binds it on the package
        return importlib.import_module(f"ersd.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ersd' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


__all__ = [
    "METHODS",
    "AutoTree",
    "BatchEngine",
    "CostModel",
    "Detection",
    "DraftSession",
    "Drafter",
    "ErsdError",
    "FunctionModel",
    "GenerationInputError",
    "GenerationResult",
    "InvalidLogitsError",
    "InvalidTreeSpecError",
    "LanguageModel",
    "ModelDrafter",
    "ModelLoadError",
    "ModelSession",
    "Request",
    "SamplingParams",
    "SamplingParamsError",
    "StepRecord",
    "TextModel",
    "Tokenizer",
    "TreeShape",
    "UnknownMethodError",
    "UnsupportedTreeError",
    "VocabularyMismatchError",
    "Watermark",
    "WatermarkError",
    "derive_seed",
    "generate",
    "generate_batch",
    "generate_batch_stream",
    "generate_request",
    "generate_stream",
    "get_method",
    "load_model",
    "load_watermark",
    "logits_to_probs",
    "parse_tree",
    "stream_request",
]
