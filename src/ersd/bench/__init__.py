"""Benchmarks: configs, prompts, calibration, runs that write JSONL records, reports.

``ersd bench calibrate`` measures rank profiles and forward costs, ``ersd bench run`` writes one
record per (prompt, method, tree, temperature, seed) with every baseline in the same process, and
``ersd bench report`` aggregates records into tables with confidence intervals and figures.  See
docs/benchmarks.md for the metric definitions.
"""

from __future__ import annotations

from ersd.bench.config import BenchConfig, BenchConfigError, bundled_configs, load_config
from ersd.bench.trees import natural_shapes

__all__ = [
    "BenchConfig",
    "BenchConfigError",
    "bundled_configs",
    "load_config",
    "natural_shapes",
]
