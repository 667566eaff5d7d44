"""Per-prompt paired comparisons of a dynamic-tree benchmark (issue 16's claims).

    python scripts/dynamic_pairs.py RESULTS.jsonl [MORE.jsonl ...]

For each temperature: every configuration's tokens per target call (block efficiency) and
tokens/s, Student-t 95% intervals over prompts (× seeds); then, for every configuration, the
paired ratio to SD's chain of the same budget on the same prompt and seed — tokens per call and
tokens/s — and whether ERSD's configurations gave the same text (drafter invariance: ERSD's text
is a function of seed, prompt and target only).
"""

from __future__ import annotations

import collections
import json
import re
import sys
from typing import Any

from ersd.bench.stats import t_interval


def label(r: dict[str, Any]) -> str:
    return f"{r['method']} {r['tree']}" if r.get("tree") else str(r["method"])


def budget(name: str) -> int | None:
    m = re.search(r"(?:chain|dynamic|dynamic-cost):(\d+)", name)
    return int(m.group(1)) if m else None


def main(paths: list[str]) -> None:
    recs = []
    for path in paths:
        with open(path) as f:
            recs += [json.loads(line) for line in f if line.strip()]
    by: dict[tuple[float, str, int], dict[str, Any]] = collections.defaultdict(dict)
    for r in recs:
        if r.get("kind") == "result" and "error" not in r:
            by[(r["temperature"], r["prompt_id"], r["seed"])][label(r)] = r
    for temp in sorted({t for t, _, _ in by}):
        groups = [d for (t, _, _), d in by.items() if t == temp]
        names = sorted({n for d in groups for n in d})
        print(f"\n### T = {temp:g} ({len(groups)} prompt × seed runs)\n")
        print(
            "| configuration | tokens/call | tokens/s | ÷ SD chain:K, tokens/call | ÷ SD, tok/s |"
        )
        print("|---|---|---|---|---|")
        for n in names:
            rows = [d for d in groups if n in d]
            be = t_interval([d[n]["num_tokens"] / d[n]["target_calls"] for d in rows])
            tps = t_interval([d[n]["tokens_per_second"] for d in rows])
            sd = f"sd chain:{budget(n)}"
            paired = [d for d in rows if sd in d] if n != sd else []
            r_be = r_tps = "–"
            if paired:
                r_be = t_interval(
                    [
                        (d[n]["num_tokens"] / d[n]["target_calls"])
                        / (d[sd]["num_tokens"] / d[sd]["target_calls"])
                        for d in paired
                    ]
                ).format(3)
                r_tps = t_interval(
                    [d[n]["tokens_per_second"] / d[sd]["tokens_per_second"] for d in paired]
                ).format(3)
            print(f"| {n} | {be.format(2)} | {tps.format(2)} | {r_be} | {r_tps} |")
        ersd = [n for n in names if n.startswith("ersd")]
        same = sum(len({tuple(d[n]["tokens"]) for n in ersd if n in d}) == 1 for d in groups)
        print(f"\n- ERSD configurations ({', '.join(ersd)}) gave one text: {same} of {len(groups)}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
