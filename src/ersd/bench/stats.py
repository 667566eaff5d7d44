"""Confidence intervals for benchmark summaries.

The unit of replication is the **prompt**: per-prompt values (averaged over seeds) are treated as
independent draws, and intervals are over prompts.  Two intervals are available:

* :func:`t_interval` — Student-t 95% interval of the mean (the report's default: honest for the
  small prompt counts a CPU benchmark affords);
* :func:`bootstrap_interval` — percentile bootstrap of the mean, resampling prompts with a
  generator passed in (``numpy.random.Generator``), for larger prompt sets.

Speedups are per-prompt ratios (tokens/s of the method ÷ tokens/s of the baseline on the same
prompt, temperature and seed), then summarised like any other per-prompt value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _scipy_stats


@dataclass(frozen=True)
class Interval:
    """A mean with a two-sided confidence interval over ``n`` values."""

    mean: float
    low: float
    high: float
    n: int
    method: str  # "t" or "bootstrap" (or "n=1" when there is a single value)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def format(self, digits: int = 2) -> str:
        if self.n < 2 or not math.isfinite(self.low):
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Student-t interval ``mean ± t_{(1+level)/2, n-1} · s / sqrt(n)`` (s: sample std, ddof 1)."""
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "t")
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1, "n=1")
    sem = float(x.std(ddof=1)) / math.sqrt(n)
    t = float(_scipy_stats.t.ppf((1 + level) / 2, n - 1))
    return Interval(mean, mean - t * sem, mean + t * sem, n, "t")


def interval_record(values: Sequence[float]) -> dict[str, Any]:
    """:func:`t_interval` as a JSON record: ``{"mean", "ci95": [low, high], "n"}``."""
    iv = t_interval(values)
    return {"mean": iv.mean, "ci95": [iv.low, iv.high], "n": iv.n}


def binomial_ci(k: int, n: int) -> list[float]:
    """Clopper-Pearson 95% interval of a rate ``k / n``."""
    if n == 0:
        return [math.nan, math.nan]
    ci = _scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return [float(ci.low), float(ci.high)]


def rate(k: int, n: int) -> dict[str, Any]:
    """A rate ``k / n`` as a JSON record with its Clopper-Pearson 95% interval."""
    return {"k": k, "n": n, "rate": k / n if n else math.nan, "ci95": binomial_ci(k, n)}


def bootstrap_interval(
    values: Sequence[float],
    rng: np.random.Generator,
    level: float = 0.95,
    resamples: int = 10_000,
) -> Interval:
    """Percentile bootstrap interval of the mean (prompts resampled with replacement)."""
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "bootstrap")
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1, "n=1")
    idx = rng.integers(0, n, size=(resamples, n))
    means = x[idx].mean(axis=1)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return Interval(mean, float(low), float(high), n, "bootstrap")
