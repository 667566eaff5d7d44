"""The benchmark's model pair: target and draft loaded with :func:`ersd.load_model`.

``models.target`` / ``models.draft`` take any name ``ersd.load_model`` takes (bundled offline
names, folders, hub ids) or a weight-free stand-in (:mod:`ersd.models.toy`): ``toy`` or
``tiny-qwen2`` for both fields loads that stand-in as target and its ``-draft`` as draft.
Everything the bench needs from a model is the :class:`ersd.TextModel` protocol; the HF assisted
baseline alone needs the transformers modules (:class:`ersd.models.hf.HFModel`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ersd
from ersd.auto import CurveCache, sharing
from ersd.bench.config import ModelsConfig
from ersd.models.base import TextModel, Tokenizer
from ersd.tree import parse_auto

STANDINS = ("toy", "tiny-qwen2")


@dataclass
class ModelPair:
    target: TextModel
    draft: TextModel
    description: str
    #: ``tree="auto"``'s measured cost curves, shared by every run of the pair (measured in the
    #: warm-up, so no timed run pays for them)
    curves: CurveCache = field(default_factory=CurveCache)

    def tree(self, spec: Any) -> Any:
        """``spec`` as run on this pair: an ``auto`` spec shares the pair's cost curves."""
        auto = parse_auto(spec)
        return sharing(auto, self.curves) if auto is not None else spec

    @property
    def tokenizer(self) -> Tokenizer:
        return self.target.tokenizer

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.target.eos_token_ids)

    @property
    def is_hf(self) -> bool:
        """Both models are transformers models (the HF assisted-generation baseline can run)."""
        from ersd.models.hf import HFModel

        return isinstance(self.target, HFModel) and isinstance(self.draft, HFModel)


def load_pair(cfg: ModelsConfig) -> ModelPair:
    """Load target and draft as the config says (``toy`` / ``tiny-qwen2`` stand-ins, or real)."""
    if cfg.target in STANDINS or cfg.draft in STANDINS:
        if cfg.target != cfg.draft:
            from ersd.bench.config import BenchConfigError

            raise BenchConfigError(
                f"stand-in models come in pairs: set both models.target and models.draft to "
                f"{cfg.target if cfg.target in STANDINS else cfg.draft!r}"
            )
        target = ersd.load_model(cfg.target, dtype=cfg.dtype)
        draft = ersd.load_model(f"{cfg.target}-draft", dtype=cfg.dtype)
        description = {
            "toy": "toy FunctionModel pair (bigram table, vocab 64)",
            "tiny-qwen2": "tiny random Qwen2 (2 layers) with its 1-layer truncation as draft",
        }[cfg.target]
        return ModelPair(target=target, draft=draft, description=description)
    target = ersd.load_model(cfg.target, dtype=cfg.dtype, device=cfg.device, linear=cfg.linear)
    overrides: dict[str, Any] = {"num_hidden_layers": cfg.draft_layers} if cfg.draft_layers else {}
    draft_dtype = cfg.draft_dtype or cfg.dtype
    draft = ersd.load_model(
        cfg.draft, dtype=draft_dtype, device=cfg.device, linear=cfg.linear, **overrides
    )
    target.check_compatible(draft)
    linear = (target.describe().get("linear"), draft.describe().get("linear"))
    return ModelPair(
        target=target,
        draft=draft,
        description=f"{cfg.target} <- {cfg.draft}"
        + (f" (first {cfg.draft_layers} layers)" if cfg.draft_layers else "")
        + f" ({cfg.dtype}"
        + (f", draft {draft_dtype}" if draft_dtype != cfg.dtype else "")
        + f"; linear layers: target {linear[0]}, draft {linear[1]})",
    )
