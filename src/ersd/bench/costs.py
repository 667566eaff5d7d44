"""Forward-cost curves and the cost-aware tree choice: they live in the library
(:mod:`ersd.costs`, used by ``tree="auto"``); this module re-exports them for the benchmark."""

from __future__ import annotations

from ersd.costs import (
    DEFAULT_SIZES,
    CostModel,
    CostModelError,
    TreePrediction,
    candidate_trees,
    choose_trees,
    measure_costs,
    measure_curve,
    predict,
)

__all__ = [
    "DEFAULT_SIZES",
    "CostModel",
    "CostModelError",
    "TreePrediction",
    "candidate_trees",
    "choose_trees",
    "measure_costs",
    "measure_curve",
    "predict",
]
