"""Smoke comparison of dynamic ERSD trees on SmolLM2-135M (float32 target, 8-layer draft).

Calibrates the margin table on held-out prompts (MarginRecorder, chain:8), then runs ERSD chain:K,
ERSD dynamic:K and SD chain:K on other prompts and prints tokens per target call, predicted tokens
per call and the policy's share of time.  Small and slow-machine friendly: ~2-4 minutes on 2 cores.
Usage: python scripts/dynamic_smoke.py [K] [TOKENS] [SEEDS]
"""

from __future__ import annotations

import sys
import time

import ersd
from ersd.drafting import DynamicDrafter, MarginRecorder
from ersd.theory.margin import MarginPredictor, calibration_curve

K = int(sys.argv[1]) if len(sys.argv) > 1 else 6
TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 48
SEEDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
CALIB = [
    "def quicksort(xs):\n    ",
    "import numpy as np\n\ndef softmax(x):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
]
EVAL = ["def fibonacci(n):\n    ", "def is_prime(n: int) -> bool:\n    "]

target = ersd.load_model("smollm2-135m")
draft = ersd.load_model("smollm2-135m", num_hidden_layers=8)
enc = target.tokenizer.encode
for temp in (1.0, 0.7):
    rec = MarginRecorder(draft)
    for i, p in enumerate(CALIB):
        ersd.generate(
            target, rec, enc(p), max_new_tokens=96, tree="chain:8", temperature=temp, seed=100 + i
        )
    pred = MarginPredictor(rec.table)
    print(f"T={temp}: calibrated on {rec.table.num_observations} contexts")
    rows: dict[str, list[float]] = {}
    events = []
    for p in EVAL:
        ids = enc(p)
        for seed in range(SEEDS):
            alone = ersd.generate(
                target, None, ids, max_new_tokens=TOKENS, seed=seed, temperature=temp
            ).tokens
            runs = {
                f"ersd chain:{K}": dict(draft=draft, tree=f"chain:{K}"),
                f"ersd dynamic:{K}": dict(
                    draft=DynamicDrafter(draft, K, predictor=pred, learn=False, keep_events=True),
                    tree=f"chain:{K}",
                ),
                f"sd chain:{K}": dict(draft=draft, tree=f"chain:{K}", method="sd"),
            }
            for name, kw in runs.items():
                t0 = time.perf_counter()
                res = ersd.generate(
                    target,
                    kw["draft"],
                    ids,
                    max_new_tokens=TOKENS,
                    seed=seed,
                    temperature=temp,
                    tree=kw["tree"],
                    method=kw.get("method", "ersd"),
                )
                wall = time.perf_counter() - t0
                if not name.startswith("sd"):
                    assert res.tokens == alone, name
                r = rows.setdefault(name, [0, 0, 0.0, 0.0, 0.0, 0])
                r[0] += len(res.tokens)
                r[1] += res.target_calls
                r[2] += wall
                if isinstance(kw["draft"], DynamicDrafter):
                    d = kw["draft"]
                    r[3] += d.policy_seconds
                    r[4] += sum(s.expected_tokens or 0 for s in res.steps)
                    r[5] += sum(s.expected_tokens is not None for s in res.steps)
                    events += d.events
    for name, (tok, calls, wall, pol, exp, n) in rows.items():
        extra = f", predicted {exp / n:.2f}, policy {100 * pol / wall:.2f}% of time" if n else ""
        print(f"  {name:18s} {tok / calls:.2f} tokens/call, {tok / wall:.1f} tok/s{extra}")
    for row in calibration_curve(
        [
            (e.margin, e.predicted, e.accepted)
            for e in events
            if e.children and e.predicted is not None
        ]
    ):
        print(
            f"    margin {row['bucket']:>12s} n={row['n']:4d} predicted {row['predicted']:.2f} "
            f"observed {row['observed']:.2f} [{row['low']:.2f}, {row['high']:.2f}]"
        )
