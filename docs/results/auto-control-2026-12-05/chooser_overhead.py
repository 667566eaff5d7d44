"""auto's own work per plain step, on costs where drafting could pay at full acceptance but does
not at the prior's: choose + observe + observe_times, timed per step (no model).

    python chooser_overhead.py 1   # temperature; --prof for a cProfile listing
"""
import sys, time, cProfile, pstats
from ersd.auto import TreeChooser
from ersd.costs import CostModel
from ersd.methods import get_method
from ersd.tree import AutoTree

temp = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
costs = CostModel(sizes=[1, 2, 4, 8, 16], target=[0.06, 0.11, 0.21, 0.42, 0.84],
                  draft=[0.004] * 5, overhead=0.0003, overhead_plain=0.0003)
m = get_method("ersd")
def run(n=2000):
    c = TreeChooser(AutoTree(costs=costs), None, None, m, m, temp, None, horizon=n)
    ctx = list(range(300))
    picks = 0
    t0 = time.perf_counter()
    for i in range(n):
        s = c.choose(ctx)
        picks += s is not None
        c.observe([], 0, 0)
        c.observe_times(1, 0.0, 0.06, 0.0603, prefill=i == 0)
        ctx.append(i)
    return (time.perf_counter() - t0) / n * 1e3, picks, c.last
ms, picks, last = run()
print(f"T={temp}: {ms:.4f} ms/step, drafted {picks}, can_pay {last.can_pay}, tree {last.tree}, best {last.best_tree}")
if "--prof" in sys.argv:
    cProfile.run("run()", "/tmp/prof/out")
    pstats.Stats("/tmp/prof/out").sort_stats("cumtime").print_stats(18)
