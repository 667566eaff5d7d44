"""Drafters: who proposes each step's draft tree (:mod:`ersd.drafting.base`).

* :class:`ModelDrafter` — a draft language model, one forward per tree depth.
* :class:`DynamicDrafter` — a draft model growing ERSD trees best-first from its own races
  (:mod:`ersd.drafting.dynamic`); :class:`MarginRecorder` records its calibration data.
"""

from __future__ import annotations

from ersd.drafting.base import Drafter, DraftSession, Proposal
from ersd.drafting.dynamic import DynamicDrafter, MarginRecorder
from ersd.drafting.model import ModelDrafter, ModelDraftSession

__all__ = [
    "DraftSession",
    "Drafter",
    "DynamicDrafter",
    "MarginRecorder",
    "ModelDraftSession",
    "ModelDrafter",
    "Proposal",
]
