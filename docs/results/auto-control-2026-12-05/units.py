"""Per-run ratios of the llama.cpp control runs: each (prompt, T, repeat) unit ran plain, auto and
plain-b back to back (rotated), so auto ÷ the mean of its unit's two plain runs, and plain-b ÷
plain, are paired within minutes of each other.  Geometric means with Student-t 95% intervals
over the units (log scale); and auto's loop time per token minus the plains' mean."""

import json
import math
import sys
from collections import defaultdict

from ersd.bench.stats import t_interval

for path in sys.argv[1:]:
    units: dict = defaultdict(dict)
    for line in open(path):
        if line.startswith('{"prompt"'):
            r = json.loads(line)
            units[(r["prompt"], r["temperature"], r["repeat"])][r["config"]] = r
    auto, ctrl, loop, below, cbelow = [], [], [], 0, 0
    for u in units.values():
        plains = (u["plain"]["rate"] * u["plain-b"]["rate"]) ** 0.5
        auto.append(math.log(u["auto"]["rate"] / plains))
        ctrl.append(math.log(u["plain-b"]["rate"] / u["plain"]["rate"]))
        per = [1e3 * u[c]["loop_s"] / u[c]["tokens"] for c in ("auto", "plain", "plain-b")]
        loop.append(per[0] - (per[1] + per[2]) / 2)
        below += u["auto"]["rate"] / plains < 0.98
        cbelow += u["plain-b"]["rate"] / u["plain"]["rate"] < 0.98
    a, c, lp = t_interval(auto), t_interval(ctrl), t_interval(loop)
    e = math.exp
    print(
        f"{path}: {len(units)} units; auto ÷ plains {e(a.mean):.3f} [{e(a.low):.3f}, "
        f"{e(a.high):.3f}] ({below} units < 0.98); plain-b ÷ plain {e(c.mean):.3f} "
        f"[{e(c.low):.3f}, {e(c.high):.3f}] ({cbelow} < 0.98); auto's loop +{lp.mean:.3f} [{lp.low:.3f}, "
        f"{lp.high:.3f}] ms/token"
    )
