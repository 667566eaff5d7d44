"""Per-step cost of auto's decision on a curve where drafting cannot pay (the llama.cpp curve):
with the cannot-pay verdict kept 32 steps (the rule) and re-decided every step (rule off).
Interleaved rounds in one process, median of per-round means."""
import statistics, time
from dataclasses import replace
from ersd.auto import RULES, TreeChooser
from ersd.costs import CostModel
from ersd.methods import get_method
from ersd.tree import AutoTree

STEEP = CostModel(sizes=[1, 2, 4, 8], target=[0.063, 0.110, 0.214, 0.472], draft=[0.030, 0.053, 0.082, 0.155])
m = get_method("ersd")
def run(rules, steps=2000):
    c = TreeChooser(AutoTree(costs=STEEP), None, None, m, m, 1.0, rules=rules, horizon=steps)
    ctx = list(range(60))
    plain = STEEP.target_cost(1)
    t0 = time.perf_counter()
    for _ in range(steps):
        c.choose(ctx)
        c.observe_times(1, 0.0, plain, plain)
        c.observe([], 0, 0)
        ctx.append(1)
    return (time.perf_counter() - t0) / steps
res = {"recheck 32": [], "recheck 1": []}
for r in range(7):
    for name, rules in (("recheck 32", RULES), ("recheck 1", replace(RULES, cannot_pay_recheck=1))):
        res[name].append(run(rules))
for k, v in res.items():
    print(f"{k}: median {statistics.median(v)*1e6:.1f} us/step ({[round(x*1e6,1) for x in v]}); share of a 63 ms llama.cpp step {statistics.median(v)/0.063*100:.3f}%")
