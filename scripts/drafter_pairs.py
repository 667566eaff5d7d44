"""Per-prompt paired comparisons of a drafters benchmark (issue 11's claims).

    python scripts/drafter_pairs.py RESULTS.jsonl [MORE.jsonl ...]

For each temperature: a table per configuration (tokens/s, ÷ target-only of the same prompt,
tokens per target call, draft forwards per call, the lookup drafter's own seconds as a share of
wall time), then paired ratios of the configurations compared in docs/drafters.md (hybrid and
lookup against Hugging Face prompt lookup, hybrid against model-only drafting) — Student-t 95%
intervals over prompts — and how many prompts gave the same text in both (ERSD's text is the
target-only text whatever the drafter, so ERSD-vs-ERSD pairs time the same tokens).
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any

from ersd.bench.stats import t_interval

#: (numerator, denominator) pairs reported when both ran
PAIRS = [
    ("ersd {k} @lookup+draft", "hf-prompt-lookup"),
    ("ersd {k} @lookup:policy=guided+draft", "hf-prompt-lookup"),
    ("ersd {k} @lookup", "hf-prompt-lookup"),
    ("ersd {k} @lookup+draft", "ersd {k} @model"),
    ("ersd {k} @lookup:policy=guided+draft", "ersd {k} @model"),
]


def label(r: dict[str, Any]) -> str:
    if r["method"] in ("target-only", "hf-prompt-lookup"):
        return str(r["method"])
    return f"{r['method']} {r['tree']} @{r.get('drafter') or 'model'}"


def main(paths: list[str]) -> None:
    recs = []
    for path in paths:
        with open(path) as f:
            recs += [json.loads(line) for line in f if line.strip()]
    by: dict[tuple[float, str], dict[str, Any]] = collections.defaultdict(dict)
    for r in recs:
        if r.get("kind") == "result" and "error" not in r:
            by[(r["temperature"], r["prompt_id"])][label(r)] = r
    for temp in sorted({t for t, _ in by}):
        groups = [d for (t, _), d in by.items() if t == temp and "target-only" in d]
        names = sorted({n for d in groups for n in d})
        print(f"\n### T = {temp:g} ({len(groups)} prompts)\n")
        print(
            "| configuration | tokens/s | ÷ target-only | tokens/call | draft forwards / call "
            "| lookup time (share of wall) |"
        )
        print("|---|---|---|---|---|---|")
        for n in names:
            rows = [d for d in groups if n in d]
            tps = t_interval([d[n]["tokens_per_second"] for d in rows])
            sp = t_interval(
                [d[n]["tokens_per_second"] / d["target-only"]["tokens_per_second"] for d in rows]
            )
            calls = sum(d[n]["target_calls"] for d in rows)
            be = sum(d[n]["num_tokens"] for d in rows) / calls
            df = sum(d[n].get("draft_forwards") or 0 for d in rows) / calls
            stats = [d[n].get("drafter_stats") or {} for d in rows]
            free = sum(s.get("lookup", {}).get("seconds", 0.0) for s in stats)
            wall = sum(d[n]["wall_time"] for d in rows)
            share = f"{100 * free / wall:.2f}%" if any("lookup" in s for s in stats) else "–"
            print(f"| {n} | {tps.format(2)} | {sp.format(2)} | {be:.2f} | {df:.2f} | {share} |")
        trees = sorted({d[n]["tree"] for d in groups for n in d if n.startswith("ersd")})
        for k in trees:
            for a, b in PAIRS:
                a, b = a.format(k=k), b.format(k=k)
                rows = [d for d in groups if a in d and b in d]
                if not rows:
                    continue
                iv = t_interval(
                    [d[a]["tokens_per_second"] / d[b]["tokens_per_second"] for d in rows]
                )
                same = sum(d[a]["tokens"] == d[b]["tokens"] for d in rows)
                print(f"- {a} ÷ {b}: {iv.format(3)} ({len(rows)} prompts; same text in {same})")
        ersd = [n for n in names if n.startswith("ersd")]
        same = sum(
            all(d[n]["tokens"] == d["target-only"]["tokens"] for n in ersd if n in d)
            for d in groups
        )
        print(f"- every ERSD configuration's text = target-only's: {same} of {len(groups)} prompts")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
