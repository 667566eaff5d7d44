"""Drafters: who proposes each step's draft tree (:mod:`ersd.drafting.base`).

* :class:`ModelDrafter` — a draft language model, one forward per tree depth.
"""

from __future__ import annotations

from ersd.drafting.base import Drafter, DraftSession, Proposal
from ersd.drafting.model import ModelDrafter, ModelDraftSession

__all__ = ["DraftSession", "Drafter", "ModelDraftSession", "ModelDrafter", "Proposal"]
