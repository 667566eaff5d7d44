"""The drafter that grows a ``dynamic:K`` tree for a method: ERSD's race-grown
:class:`~ersd.drafting.dynamic.DynamicDrafter`, or the confidence-grown drafter of SD, SpecInfer
and SpecTr (:mod:`ersd.drafting.confidence`). Its own module so the two drafters need not know
each other."""

from __future__ import annotations

from ersd.drafting.base import Drafter
from ersd.drafting.confidence import ConfidenceDrafter, baseline_drafter
from ersd.drafting.dynamic import DynamicDrafter
from ersd.drafting.model import ModelDrafter
from ersd.errors import GenerationInputError
from ersd.methods import Method
from ersd.methods.ersd import ERSD
from ersd.tree_spec import DynamicSpec


def dynamic_drafter(
    spec: DynamicSpec, drafter: Drafter | None, method: Method
) -> DynamicDrafter | ConfidenceDrafter:
    """The drafter that grows ``spec``'s trees for ``method`` from ``drafter``: for ERSD a
    :class:`DynamicDrafter` (``drafter``'s model, or ``drafter`` itself reconfigured), for SD /
    SpecInfer / SpecTr a confidence-grown one (:mod:`ersd.drafting.confidence`).  Its
    ``depth_cap`` bounds the trees (the loop's envelope shape is a chain of that depth)."""
    if not isinstance(method, ERSD):  # SD / SpecInfer / SpecTr: grown from the draft's confidence
        return baseline_drafter(spec, drafter, method)
    if isinstance(drafter, DynamicDrafter):
        return drafter.configured(spec)
    if isinstance(drafter, ModelDrafter):
        if spec.cost_aware:
            raise GenerationInputError(
                f"tree {spec.spec!r} is cost-aware and needs forward-time curves: pass "
                "draft=ersd.drafting.DynamicDrafter(model, costs=...) (e.g. the CostModel of an "
                "`ersd bench calibrate` file)",
                param="tree",
            )
        return DynamicDrafter(drafter.model, spec.budget, max_depth=spec.max_depth)
    raise GenerationInputError(
        f"tree {spec.spec!r} needs a draft model (or an ersd.drafting.DynamicDrafter), got a "
        f"{type(drafter).__name__}",
        param="tree",
    )


__all__ = ["dynamic_drafter"]
