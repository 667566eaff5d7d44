"""Render an auto_check JSON as the markdown tables of the results README."""

import json
import statistics
import sys
from collections import defaultdict

d = json.load(open(sys.argv[1]))
rows = d["rows"]
fixed = d["args"]["fixed"]
control = bool(d["args"].get("control"))  # a second plain configuration, plain-b (--control)
by = defaultdict(lambda: defaultdict(list))
for r in rows:
    by[(r["prompt"], r["temperature"])][r["config"]].append(r)
hdr = (
    ["prompt", "T", "plain tok/s", "auto tok/s"]
    + [f"{f} tok/s" for f in fixed]
    + ["auto ÷ plain"]
    + (["plain-b ÷ plain"] if control else [])
    + (["auto ÷ best fixed"] if fixed else [])
    + ["auto draft fwds", "auto's steps", "finding out"]
)
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for (p, t), cfg in by.items():
    if "auto" not in cfg or "plain" not in cfg:
        continue
    med = {c: statistics.median(x["rate"] for x in rs) for c, rs in cfg.items()}
    a = cfg["auto"]
    reps = len(a)
    ch = defaultdict(int)
    for x in a:
        for k, n in (x["auto_choices"] or {}).items():
            ch[k] += n
    steps = ", ".join(
        f"{k} × {n // reps if reps > 1 else n}"
        for k, n in sorted(ch.items(), key=lambda kv: -kv[1])
    )
    share = sum((x["finding_out"] or {}).get("share", 0) for x in a) / reps
    fw = sum(x["draft_forwards"] for x in a) / reps
    cells = [p, f"{t:g}", f"{med['plain']:.2f}", f"{med['auto']:.2f}"] + [
        f"{med[f]:.2f}" for f in fixed
    ]
    cells += [f"{med['auto'] / med['plain']:.3f}"]
    if control:
        cells += [f"{med['plain-b'] / med['plain']:.3f}"]
    if fixed:
        cells += [f"{med['auto'] / max(med[f] for f in fixed):.3f}"]
    cells += [f"{fw:g}", steps, f"{100 * share:.1f}%"]
    print("| " + " | ".join(cells) + " |")
print()
s = d["summary"]
hdr = [
    "cell",
    "n",
    "auto ÷ plain",
    "min",
    "auto ÷ best fixed (cell's best)",
    "auto ÷ per-prompt best",
    "finding out (mean)",
    "cannot pay",
]
if control:
    hdr += ["plain-b ÷ plain", "min", "auto − plain, forwards ms/token", "loop ms/token"]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for k, c in s.items():
    bf = f"{c['best_fixed']} {c['auto/best-fixed']}" if "best_fixed" in c else "-"
    pp = c.get("auto/best-fixed(prompt)", "-")
    line = f"| {k} | {c['n']} | {c['auto/plain']} | {c['auto/plain_min']:.3f} | {bf} | {pp} | {100 * c['finding_out_share_mean']:.1f}% | {c['cannot_pay_prompts']}/{c['n']} |"
    if control:
        line += f" {c['control/plain']} | {c['control/plain_min']:.3f} | {c.get('auto-plain target_ms/token', '-')} | {c.get('auto-plain loop_ms/token', '-')} |"
    print(line)
print()
print("setup:", json.dumps(d.get("setup")))
