"""Where auto's drafts were rejected vs where the drafter's own race (re-derived on the final
text with one draft forward) says they must be: a drafter-state bug would show as a rejection
at a position the drafter's race wins."""
import os, sys, time
import numpy as np
import ersd
from ersd.auto import CurveCache, prepare_costs
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.commands.models import _calibration_prompts, _rank_profile
from ersd.tree import AutoTree
from ersd.watermark.audit import audit
pid = sys.argv[1]; temp = float(sys.argv[2]); dtype = sys.argv[3] if len(sys.argv) > 3 else "float32"
target = ersd.load_model("qwen2.5-coder-1.5b", dtype=dtype)
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype=dtype)
sets = os.environ.get("SETS", "math").split(",")
prompts = [p for s in sets for p in load_prompts([s], "eval", int(os.environ.get("PER_SET", "6")))]
P = {p.id: p for p in prompts}
enc = encode_prompt(target.tokenizer, P[pid], "auto", 384)
seed = prompts.index(P[pid])
curves = CurveCache()
prepare_costs(target, draft, enc, 1, curves)
if os.environ.get("CALIB", "1") == "1":
    calib = _calibration_prompts(target, 1)
    probs, trials = _rank_profile(target, draft, calib, temp, 32)
    curves.store.put_profile(target, draft, "ersd", temp, probs, sum(trials), trials=trials)
texts = {}
for cfg in os.environ.get("CFGS", "auto,chain:4,chain:1").split(","):
    tree = AutoTree(costs=curves) if cfg == "auto" else cfg
    out = ersd.generate(target, draft, enc, max_new_tokens=96, tree=tree, temperature=temp, seed=seed)
    texts[cfg] = (out.tokens, out.steps)
ref = texts["chain:4"][0]
for cfg, (toks, _) in texts.items():
    same = next((i for i, (a, b) in enumerate(zip(toks, ref)) if a != b), None)
    print(cfg, "len", len(toks), "first difference from chain:4 at", same)
for cfg, (toks, steps) in texts.items():
    rep = audit(draft, enc, toks, seed=seed, temperature=temp)
    easy = [p.winner == p.token for p in rep.positions]
    print(cfg, "oracle: drafter race wins at", sum(easy), "of", len(easy), "positions")
    p = 0; bad = []; n = 0
    prev_full = None
    for s in steps:
        d = s.tree_depth if s.num_draft_tokens else 0
        acc = s.num_accepted
        for k in range(min(acc + 1, d)):
            n += 1
            obs = k < acc
            if p + k < len(easy) and obs != easy[p + k] and s.num_draft_tokens == d:  # chains only
                bad.append((p + k, "depth", k + 1, "observed", obs, "oracle", easy[p + k], "state", prev_full))
        prev_full = d > 0 and acc == d
        p += len(s.tokens)
    print(cfg, "chain observations", n, "disagreeing with the oracle", len(bad))
    for b in bad[:20]:
        print("   ", b)
