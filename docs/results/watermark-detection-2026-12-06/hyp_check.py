"""The exact hypoexponential CDF of real windows' weights against Monte Carlo, at the per-salt
level of a 1% test over 256 salts (3.93e-5) and at 1e-3.  Run: python hyp_check.py"""

import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
CACHE = ROOT / "out/watermark-fpr-cache/smollm2-135m-float32-45ef044d"
sys.path.insert(0, str(ROOT))
import research.watermark_detection_field as F  # noqa: E402

from ersd.watermark.weighted import (  # noqa: E402
    DEFAULT_MAX_WEIGHT,
    DEFAULT_WEIGHT_RATIO,
    hypoexp_log_cdf,
    hypoexp_quantile,
    weights_from_probs,
)

wm = F.watermark()
rng = np.random.default_rng(7)
for f, j in [
    ("man-pages-0003", 2),
    ("pypi-docstrings-0010", 5),
    ("man-pages-0100", 0),
    ("pypi-docstrings-0200", 7),
]:
    z = np.load(f"{CACHE}/{f}.npz")
    ids = z["ids"]
    p1 = z["p1"].astype(np.float64)
    text, rows = F.chunk_rows(wm, ids)
    o = j * F.WINDOW
    pos = o + F.first_occurrences(rows[o : o + F.WINDOW])
    w = weights_from_probs(p1[pos], DEFAULT_MAX_WEIGHT)
    wk = w[w >= w.max() / DEFAULT_WEIGHT_RATIO]
    for target in (3.93e-5, 1e-3):
        q = hypoexp_quantile(target, wk)
        cdf = math.exp(hypoexp_log_cdf(q, wk))
        n = 4_000_000
        hits = 0
        for _ in range(10):
            s = rng.exponential(size=(n // 10, wk.size)) @ wk
            hits += int((s <= q).sum())
        print(
            f,
            len(wk),
            f"w max {wk.max():.2f} min {wk.min():.4f}",
            f"target {target:.2e} computed {cdf:.3e} MC {hits / n:.3e} ({hits})",
            flush=True,
        )
