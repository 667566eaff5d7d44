"""Dynamic ERSD trees vs ERSD chains vs SD chains on a weight-free toy pair (V = 40 table models,
draft = target logits + N(0, 1) noise): tokens per target call and the predicted value, with the
margin table calibrated on held-out seeds.  About a minute on 2 cores.

Usage: PYTHONPATH=src:. python scripts/dynamic_toy_compare.py
"""

import torch
from tests.exactness_util import TableLM, random_table

import ersd
from ersd.drafting import DynamicDrafter, MarginRecorder
from ersd.theory.margin import MarginPredictor

V = 40
T = TableLM(random_table(V, 1, scale=2.0))
g = torch.Generator().manual_seed(5)
D = TableLM(T.table + 1.0 * torch.randn(T.table.shape, generator=g, dtype=torch.float64))
t, d = T.model(), D.model()
for temp in (1.0, 0.7):
    rec = MarginRecorder(d)
    for s in range(40):
        ersd.generate(
            t, rec, [1, 2], max_new_tokens=64, tree="chain:8", temperature=temp, seed=1000 + s
        )
    pred = MarginPredictor(rec.table)
    for K in (4, 6, 8):
        out = {}
        for name, kw in {
            "ersd chain": dict(draft=d, tree=f"chain:{K}"),
            "ersd dyn": dict(
                draft=DynamicDrafter(d, K, predictor=pred, learn=False), tree=f"dynamic:{K}"
            ),
            "ersd dyn-online": dict(draft=d, tree=f"dynamic:{K}"),
            "sd chain": dict(draft=d, tree=f"chain:{K}", method="sd"),
        }.items():
            tok = calls = 0
            exp = []
            for s in range(30):
                r = ersd.generate(
                    t,
                    kw["draft"],
                    [3, 4],
                    max_new_tokens=64,
                    tree=kw["tree"],
                    method=kw.get("method", "ersd"),
                    temperature=temp,
                    seed=s,
                )
                tok += len(r.tokens)
                calls += r.target_calls
                if r.expected_block_efficiency:
                    exp.append(r.expected_block_efficiency)
            out[name] = f"{tok / calls:.2f}" + (f" (pred {sum(exp) / len(exp):.2f})" if exp else "")
        print(f"T={temp} K={K}", out)
