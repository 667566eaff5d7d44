"""Drafters: who proposes each step's draft tree (:mod:`ersd.drafting.base`).

* :class:`ModelDrafter` — a draft language model, one forward per tree depth.
* :class:`LookupDrafter` — prompt lookup: what followed the last n tokens earlier in the text.
* :class:`SuffixDrafter` — a suffix trie over the text (and an optional corpus).
* :class:`HybridDrafter` — a model-free drafter and a draft model, mixed per step by cost.

:func:`parse_drafter` builds one from a spec string (``lookup``, ``lookup+qwen2.5-coder-0.5b``).
docs/drafters.md says which to use when and why each method stays exact.
* :class:`DynamicDrafter` — a draft model growing ERSD trees best-first from its own races
  (:mod:`ersd.drafting.dynamic`); :class:`MarginRecorder` records its calibration data.
* :class:`ConfidenceDrafter` — the same `dynamic:K` specs for SD, SpecInfer and SpecTr, grown
  from the draft's confidence (:mod:`ersd.drafting.confidence`).
"""

from __future__ import annotations

from ersd.drafting.base import Drafter, DraftSession, Proposal
from ersd.drafting.confidence import ConfidenceDrafter
from ersd.drafting.dynamic import DynamicDrafter, MarginRecorder
from ersd.drafting.free import DrafterStats, SourceStats
from ersd.drafting.grow import DrafterConfigError
from ersd.drafting.hybrid import HybridDrafter
from ersd.drafting.lookup import LookupDrafter
from ersd.drafting.model import ModelDrafter, ModelDraftSession
from ersd.drafting.spec import is_drafter_spec, parse_drafter
from ersd.drafting.suffix import SuffixDrafter

__all__ = [
    "ConfidenceDrafter",
    "DraftSession",
    "Drafter",
    "DrafterConfigError",
    "DrafterStats",
    "DynamicDrafter",
    "HybridDrafter",
    "LookupDrafter",
    "MarginRecorder",
    "ModelDraftSession",
    "ModelDrafter",
    "Proposal",
    "SourceStats",
    "SuffixDrafter",
    "is_drafter_spec",
    "parse_drafter",
]
