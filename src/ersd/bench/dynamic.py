"""Dynamic ERSD trees in the benchmark: ``dynamic:K[@D]`` and ``dynamic-cost:K[@D]`` entries.

A config lists them next to the static shapes, e.g. ``[run] trees = { ersd = ["dynamic:4",
"dynamic:8", "dynamic-cost:8"] }``.  Each run drafts with a fresh
:class:`ersd.drafting.DynamicDrafter` whose acceptance predictor comes from the calibration's
profile at the run's temperature (its margin table, recorded by ``ersd bench calibrate``) and whose
cost model is the calibration's forward-cost curves.  The drafter learns nothing during a run
(``learn=False``): every configuration sees the same calibrated predictor.  Entries listed under
``sd``, ``specinfer`` or ``spectr`` run with that method and a fresh
:class:`ersd.drafting.ConfidenceDrafter` (grown from the draft's confidence, no calibration; their
records carry ``policy_time`` and ``expected_tokens`` of None per step, no ``margin_events``).

Besides the usual fields, a dynamic run's record holds ``expected_tokens`` (the predicted tokens
per call of each step's tree), ``policy_time`` (seconds spent choosing nodes) and
``margin_events``: ``[depth, margin, rank, children, predicted]`` per verified context with a
known draft race (margin ``null`` = infinite), from which :mod:`ersd.bench.margin_report` draws
the predictor's calibration (predicted vs observed acceptance by margin bucket).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ersd
from ersd.drafting import ModelDrafter
from ersd.drafting.confidence import ConfidenceDrafter, baseline_drafter
from ersd.drafting.dynamic import DynamicDrafter, DynamicSpec, MarginEvent, parse_dynamic
from ersd.methods import get_method
from ersd.methods.ersd import with_sharpness
from ersd.theory.margin import MarginPredictor
from ersd.theory.profile import nearest_temperature
from ersd.tree import TreeShape


def is_dynamic(spec: Any) -> bool:
    """True for a ``dynamic[-cost]:K[@D]`` spec string (raises on a malformed one)."""
    return parse_dynamic(spec) is not None


@dataclass(frozen=True)
class DynamicSetup:
    """A dynamic entry's calibrated settings at one temperature; :meth:`drafter` attaches the
    draft model of a run."""

    spec: DynamicSpec
    predictor: MarginPredictor | None
    costs: Any
    method: str = "ersd"

    def drafter(self, model: Any) -> DynamicDrafter | ConfidenceDrafter:
        if self.method != "ersd":  # SD / SpecInfer / SpecTr: grown from the draft's confidence
            return baseline_drafter(self.spec, ModelDrafter(model), get_method(self.method))
        return DynamicDrafter(
            model,
            self.spec.budget,
            max_depth=self.spec.max_depth,
            predictor=self.predictor,
            costs=self.costs,
            cost_aware=self.spec.cost_aware,
            learn=False,
            keep_events=True,
        )


def setup(
    spec: str, calibration: Any, temperature: float, method: str = "ersd"
) -> DynamicSetup | None:
    """The calibrated settings of ``spec`` at ``temperature``; None when the calibration has no
    margin table (or no cost curves for ``dynamic-cost``): the entry is then skipped.  The
    baselines' confidence-grown trees need no calibration (``predictor`` None)."""
    s = parse_dynamic(spec)
    assert s is not None
    if method != "ersd":
        return DynamicSetup(s, None, None, method)
    if calibration is None or not calibration.profiles:
        return None
    prof = nearest_temperature(calibration.profiles, temperature)
    if prof.margin is None or (s.cost_aware and calibration.costs is None):
        return None
    return DynamicSetup(s, MarginPredictor.from_profile(prof), calibration.costs)


def _event(e: MarginEvent) -> list[Any]:
    return [
        e.depth,
        None if math.isinf(e.margin) else round(e.margin, 6),
        e.rank,
        e.children,
        None if e.predicted is None else round(e.predicted, 6),
    ]


def run_dynamic(
    dyn: DynamicSetup,
    target: Any,
    draft_model: Any,
    ids: list[int],
    *,
    temperature: float,
    seed: int,
    max_new_tokens: int,
    eos: list[int] | None,
    draft_sharpness: float = 1.0,
) -> tuple[ersd.GenerationResult, dict[str, Any]]:
    """One run with a fresh drafter: (result, extra record fields)."""
    drafter = dyn.drafter(draft_model)
    res = ersd.generate(
        target,
        drafter,
        ids,
        max_new_tokens=max_new_tokens,
        method=with_sharpness(dyn.method, draft_sharpness),
        tree=TreeShape.chain(drafter.depth_cap),  # the envelope: depth cap, cut near the end
        temperature=temperature,
        seed=seed,
        eos_token_id=eos,
    )
    extra = {
        "expected_tokens": [s.expected_tokens for s in res.steps],
        "policy_time": drafter.policy_seconds,
        "margin_events": (
            [_event(e) for e in drafter.events] if isinstance(drafter, DynamicDrafter) else None
        ),
    }
    return res, extra
