"""Table of ab-recent.log (or ab-within.log with VARIANT auto-best): per cell the rates and
calls, whether the three texts are identical, VARIANT ÷ auto and auto ÷ chain:4 with t intervals.
python table_recent.py ab-recent.log [VARIANT]"""
import json, math, statistics as st, sys
from collections import defaultdict
from scipy.stats import t as student

V = sys.argv[2] if len(sys.argv) > 2 else "auto-recent"
cell = defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    cell[(r["prompt"], r["temperature"])][r["config"]] = r

def t95(xs):
    m = st.mean(xs)
    h = student.ppf(0.975, len(xs) - 1) * st.stdev(xs) / math.sqrt(len(xs))
    return "%.3f [%.3f, %.3f]" % (m, m - h, m + h)

rec, c4, rc4 = defaultdict(list), defaultdict(list), defaultdict(list)
print("prompt T | auto %s chain:4 (tokens/s, calls) | same text | %s/auto auto/c4" % (V, V))
for (p, t), c in sorted(cell.items()):
    a, r, f = c["auto"], c[V], c["chain:4"]
    same = a["tokens"] == r["tokens"] == f["tokens"]
    print(p, t, "| %.2f/%d %.2f/%d %.2f/%d | %s | %.3f %.3f" % (
        a["rate"], a["target_calls"], r["rate"], r["target_calls"], f["rate"], f["target_calls"],
        same, r["rate"] / a["rate"], a["rate"] / f["rate"]))
    for key in (t, "all"):
        rec[key].append(r["rate"] / a["rate"])
        c4[key].append(a["rate"] / f["rate"])
        rc4[key].append(r["rate"] / f["rate"])
for key in rec:
    print("T=%s n=%d | %s/auto %s | auto/chain:4 %s | %s/chain:4 %s" % (
        key, len(rec[key]), V, t95(rec[key]), t95(c4[key]), V, t95(rc4[key])))
