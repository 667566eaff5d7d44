"""Dynamic ERSD trees in the benchmark: ``dynamic:K[@D]`` and ``dynamic-cost:K[@D]`` entries.

A config lists them next to the static shapes, e.g. ``[run] trees = { ersd = ["dynamic:4",
"dynamic:8", "dynamic-cost:8"] }``.  Each run drafts with a fresh
:class:`ersd.drafting.DynamicDrafter` whose acceptance predictor comes from the calibration's
profile at the run's temperature (its margin table, recorded by ``ersd bench calibrate``) and whose
cost model is the calibration's forward-cost curves.  The drafter learns nothing during a run
(``learn=False``): every configuration sees the same calibrated predictor.

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
from ersd.drafting.dynamic import DynamicDrafter, DynamicSpec, MarginEvent, parse_dynamic
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
    predictor: MarginPredictor
    costs: Any

    def drafter(self, model: Any) -> DynamicDrafter:
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


def setup(spec: str, calibration: Any, temperature: float) -> DynamicSetup | None:
    """The calibrated settings of ``spec`` at ``temperature``; None when the calibration has no
    margin table (or no cost curves for ``dynamic-cost``): the entry is then skipped."""
    s = parse_dynamic(spec)
    assert s is not None
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
) -> tuple[ersd.GenerationResult, dict[str, Any]]:
    """One run with a fresh drafter: (result, extra record fields)."""
    drafter = dyn.drafter(draft_model)
    res = ersd.generate(
        target,
        drafter,
        ids,
        max_new_tokens=max_new_tokens,
        method="ersd",
        tree=TreeShape.chain(drafter.depth_cap),  # the envelope: depth cap, cut near the end
        temperature=temperature,
        seed=seed,
        eos_token_id=eos,
    )
    extra = {
        "expected_tokens": [s.expected_tokens for s in res.steps],
        "policy_time": drafter.policy_seconds,
        "margin_events": [_event(e) for e in drafter.events],
    }
    return res, extra
