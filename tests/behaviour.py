"""Behaviour pins: what the smoke bench configs and a few library calls produce, reduced to the
fields that must not change under a refactor (tokens, target calls, ranks, draft forwards,
finish reasons, labels) — timings, host details and timing-driven choices dropped.

``tests/data/behaviour.json`` was written by running this module on the code before the request
redesign (issue 25)::

    PYTHONPATH=src python -m tests.behaviour --write

and ``tests/test_behaviour.py`` checks that today's code gives the same records.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "data" / "behaviour.json"

#: the record fields pinned (everything else is a timing, a host detail or derived from these)
KEPT = (
    "method",
    "label",
    "tree",
    "prompt_id",
    "prompt_index",
    "temperature",
    "seed",
    "batch_size",
    "group",
    "row_seeds",
    "finish_reasons",
    "tokens",
    "target_calls",
    "draft_forwards",
    "finish_reason",
    "ranks",
    "accepted_per_call",
    "acceptance_events",
    "error",
)


def _bench_records(name: str) -> list[dict[str, Any]]:
    from ersd.bench.config import load_config
    from ersd.bench.running import run_bench

    cfg = load_config(name)
    with tempfile.TemporaryDirectory() as tmp:
        out = run_bench(cfg, Path(tmp) / "run.jsonl", progress=False, log=lambda _: None)
        lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    return [
        {k: r[k] for k in KEPT if k in r}
        for r in lines
        # a cost-aware entry's tree is picked from measured forward times: not pinned
        if r.get("kind") in ("result", "batch") and r.get("choice") != "cost-aware"
    ]


def _result(res: Any) -> dict[str, Any]:
    return {
        "method": res.method,
        "tree": None if res.tree is None else str(res.tree),
        "tokens": list(res.tokens),
        "target_calls": res.target_calls,
        "draft_forwards": res.draft_forwards,
        "finish_reason": res.finish_reason,
        "ranks": [list(s.ranks) for s in res.steps],
    }


def _library_records() -> list[dict[str, Any]]:
    """Direct calls: the tree kinds through ``generate`` and ``generate_batch`` (``auto`` is left
    out: its choices follow measured forward times)."""
    import ersd
    from tests.toy import mixed_draft, table_model

    target = table_model(32, 0)
    draft = mixed_draft(target, table_model(32, 1), 0.5)
    prompts = [[1, 2, 3], [4, 5], [6]]
    out: list[dict[str, Any]] = []
    cases = [
        ("ersd", "chain:4", 1.0),
        ("ersd", "multi:2x2", 0.7),
        ("ersd", "binary:5", 0.0),
        ("sd", "chain:3", 1.0),
        ("specinfer", "batch:3", 1.0),
        ("ersd", "dynamic:4", 1.0),
        ("sd", "dynamic:4", 1.0),
    ]
    for method, tree, temp in cases:
        for i, p in enumerate(prompts):
            res = ersd.generate(
                target,
                draft,
                p,
                max_new_tokens=12,
                method=method,
                tree=tree,
                temperature=temp,
                seed=ersd.derive_seed(7, i),
            )
            out.append({"call": "generate", "case": [method, tree, temp], **_result(res)})
        if not tree.startswith("dynamic"):
            for i, res in enumerate(
                ersd.generate_batch(
                    target,
                    draft,
                    prompts,
                    max_new_tokens=12,
                    method=method,
                    tree=tree,
                    temperature=temp,
                    seeds=7,
                )
            ):
                out.append({"call": "batch", "case": [method, tree, temp, i], **_result(res)})
    return out


def records() -> dict[str, list[dict[str, Any]]]:
    return {
        "smoke-toy": _bench_records("smoke-toy"),
        "smoke-batch": _bench_records("smoke-batch"),
        "library": _library_records(),
    }


if __name__ == "__main__":
    data = records()
    if "--write" in sys.argv:
        FIXTURE.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"wrote {FIXTURE}: " + ", ".join(f"{k} {len(v)}" for k, v in data.items()))
    else:
        print(json.dumps({k: len(v) for k, v in data.items()}))
