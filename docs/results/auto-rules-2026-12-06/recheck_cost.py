"""Per-step cost of auto's decision on a curve where drafting cannot pay (the 2-core llama.cpp
curve): with the "cannot pay" verdict kept 32 steps (the rule) and re-decided every step (the
rule off).  Interleaved rounds in one process, median of the per-round means."""

import statistics
import time
from dataclasses import replace

from ersd.auto import RULES, TreeChooser
from ersd.costs import CostModel
from ersd.methods import get_method
from ersd.tree import AutoTree

STEEP = CostModel(
    sizes=[1, 2, 4, 8], target=[0.063, 0.110, 0.214, 0.472], draft=[0.030, 0.053, 0.082, 0.155]
)
METHOD = get_method("ersd")


def per_step(rules, steps: int = 2000) -> float:
    c = TreeChooser(AutoTree(costs=STEEP), None, None, METHOD, METHOD, 1.0, rules=rules)
    c.horizon = steps
    ctx = list(range(60))
    plain = STEEP.target_cost(1)
    t0 = time.perf_counter()
    for _ in range(steps):
        c.choose(ctx)
        c.observe_times(1, 0.0, plain, plain)
        c.observe([], 0, 0)
        ctx.append(1)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    variants = {"kept 32 steps": RULES, "re-decided": replace(RULES, cannot_pay_recheck=1)}
    res: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(7):
        for name, rules in variants.items():
            res[name].append(per_step(rules))
    for name, v in res.items():
        med = statistics.median(v)
        print(
            f"{name}: median {med * 1e6:.1f} us/step (rounds {[round(x * 1e6, 1) for x in v]});"
            f" {med / 0.063 * 100:.3f}% of a 63 ms llama.cpp step"
        )


if __name__ == "__main__":
    main()
