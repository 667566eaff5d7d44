"""Per configuration of steps.log: predicted (the curve) against measured (median over steps)
target and draft forward seconds, their ratios, and the run's rate.  python steps_table.py steps.log"""

import collections
import json
import statistics as st
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
print("curves:", rows[0])
by = collections.defaultdict(list)
for r in rows[1:]:
    by[r["config"]].append(r)
for c, rs in by.items():
    d = [x for r in rs for x in r["draft"]]
    t = [x for r in rs for x in r["target"]]
    tot = [x for r in rs for x in r["total"]]
    other = [a - b - e for a, b, e in zip(tot, t, d, strict=True)]
    pt, pd = rs[0]["pred_target"], rs[0]["pred_draft"]
    print(
        f"{c:8s} predicted target {pt:.3f} draft {pd:.3f} | measured target {st.median(t):.3f}"
        f" draft {st.median(d):.3f} other {st.median(other):.3f} step {st.median(tot):.3f}"
        f" | target/predicted {st.median(t) / pt:.3f} draft/predicted"
        f" {st.median(d) / max(pd, 1e-9):.3f} | rate {st.median([r['rate'] for r in rs]):.2f}"
    )
