"""How much of auto's replayed shortfall is the acceptance estimate's learning?  Replays the 20
prompts at 96 tokens, T = 0, batch 1 (research/auto_replay_depth.py's harness, the live run's
stored prior), the library against an oracle estimate that knows each prompt's acceptance
over its 96 tokens from the first step (a prior of that rate weighted 10**6, no root state, no
bonus observations), and against prior weights 1 and 16.  Prints auto ÷ the category's best
fixed chain per cost scenario and category.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python \
        docs/results/auto-rules-2026-12-06/depth_oracle.py > \
        docs/results/auto-rules-2026-12-06/depth_oracle.txt        (about 20 s)
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
from research.auto_replay_depth import LIVE_PRIOR, harness

from ersd.auto import RULES

rr = harness()
data = json.loads(rr.DATA.read_text())
for sc in ["live", "curve"]:
    charged = rr.cost_model(sc)
    for s in ["grounded", "humaneval", "math", "mtbench"]:
        ids = [p for p in data if data[p]["set"] == s]
        res = {}
        for name in ["library", "oracle p", "W=1", "W=16"]:
            r = []
            for i, p in enumerate(ids):
                a = data[p]["agree"][:96]
                if name == "oracle p":
                    pr = ([[float(np.mean(a))]], [10**6])
                    rules = replace(RULES, prior_weight=10**6, beyond=False, markov_root=False)
                elif name.startswith("W="):
                    pr, rules = LIVE_PRIOR, replace(RULES, prior_weight=float(name[2:]))
                else:
                    pr, rules = LIVE_PRIOR, RULES
                r.append(rr.run_batch([a], [data[p]["ctx"]], sc, pr, rules, i))
            res[name] = r
        fixed = [
            [rr.run_fixed(data[p]["agree"][:96], charged, k) for k in range(1, 9)] for p in ids
        ]
        out = []
        for name, r in res.items():
            best = min(np.mean([fixed[j][k] / r[j] for j in range(len(ids))]) for k in range(8))
            out.append(f"{name} {best:.3f}")
        print(sc, s, " | ".join(out))
