"""Table of ab.py's log: per cell the four rates, auto ÷ auto-no-beyond, and per temperature
the mean ratio with a t interval; auto and auto-no-beyond ÷ the best fixed chain (by mean) per
category.  Usage: python table.py ab.log > ab-table.txt"""
import json, math, statistics as st, sys
from collections import defaultdict
from scipy.stats import t as student

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"prompt"')]
cell = defaultdict(dict)
for r in rows:
    cell[(r["prompt"], r["set"], r["temperature"])][r["config"]] = r
FIXED = ("chain:3", "chain:4")

def t95(xs):
    m = st.mean(xs)
    h = student.ppf(0.975, len(xs) - 1) * st.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h

print("prompt T | auto no-beyond chain:3 chain:4 | auto/no-beyond | calls auto/no-beyond")
ratios, best = defaultdict(list), defaultdict(lambda: defaultdict(list))
for k, c in sorted(cell.items()):
    a, n = c["auto"]["rate"], c["auto-no-beyond"]["rate"]
    print(k[0], k[2], "| %.2f %.2f %.2f %.2f | %.3f | %d/%d" % (
        a, n, c["chain:3"]["rate"], c["chain:4"]["rate"], a / n,
        c["auto"]["target_calls"], c["auto-no-beyond"]["target_calls"]))
    ratios[k[2]].append(a / n)
    ratios["all"].append(a / n)
    for cfg in ("auto", "auto-no-beyond", *FIXED):
        best[(k[1], k[2])][cfg].append(c[cfg]["rate"])
for temp, xs in ratios.items():
    print("auto/no-beyond T=%s n=%d mean %.3f [%.3f, %.3f]" % ((temp, len(xs)) + t95(xs)))
print("category T | best fixed | auto÷best [95%] | no-beyond÷best [95%]")
for (s, temp), d in sorted(best.items()):
    b = max(FIXED, key=lambda x: st.mean(d[x]))
    fa = t95([x / y for x, y in zip(d["auto"], d[b])])
    fn = t95([x / y for x, y in zip(d["auto-no-beyond"], d[b])])
    print(s, temp, b, "%.3f [%.3f, %.3f]" % fa, "| %.3f [%.3f, %.3f]" % fn)
