"""Machine noise in a run: plain decoding at T = 0 against T = 1 on the same prompt (the same
96 target forwards; the text differs, the work does not) beside auto ÷ plain. Where auto drafts
nothing (llama.cpp here) both are ratios of the same work, so their spread is the machine's."""
import json, statistics, sys
from math import exp, log

d = json.load(open(sys.argv[1]))
rate = {(r["prompt"], r["temperature"], r["config"]): r["rate"] for r in d["rows"]}
prompts = sorted({r["prompt"] for r in d["rows"]})
pp = [rate[(p, 1.0, "plain")] / rate[(p, 0.0, "plain")] for p in prompts]
ap = [rate[(p, t, "auto")] / rate[(p, t, "plain")] for p in prompts for t in (0.0, 1.0)]
for name, xs in (("plain T=1 ÷ plain T=0", pp), ("auto ÷ plain", ap)):
    ls = [log(x) for x in xs]
    print(f"{name}: n={len(xs)} range {min(xs):.3f}-{max(xs):.3f}, "
          f"geometric sd {exp(statistics.stdev(ls)):.3f}")
