#!/usr/bin/env python
"""Texts of two source trees on the same seeds: token for token, or the first difference.

Runs this file once per tree in a subprocess (``PYTHONPATH=<tree>/src``), each generating the
same grid -- SmolLM2-135M float32 target with its int8 copy as draft (or the tests' toy models
with ``--toy``), ERSD and the baselines, chains and trees, T = 1, 0.7 with top-p, min-p, a
watermark, batched and one by one -- and compares the token lists.  Used for issue 28 against
main (the batched step must not change a single token):

    python -m research.compare_texts --old /work/main/src --new src --out texts.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def grid(methods: list[str]) -> list[dict]:
    runs = []
    for method in methods:
        for tree in ("chain:4", "multi:2x3") if method != "sd" else ("chain:4",):
            for sampling in (
                {"temperature": 1.0},
                {"temperature": 0.7, "top_p": 0.9},
                {"temperature": 1.0, "min_p": 0.05, "top_k": 50},
            ):
                runs.append({"method": method, "tree": tree, **sampling})
    runs.append({"method": "ersd", "tree": "chain:3", "temperature": 1.0, "watermark": True})
    runs.append({"method": "ersd", "tree": "chain:4", "temperature": 0.0})
    return runs


def produce(toy: bool, tokens: int, methods: list[str]) -> dict:
    import ersd

    if toy:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
        from tests.toy import mixed_draft, table_model

        target = table_model(64, 0)
        draft = mixed_draft(target, table_model(64, 1), 0.6)
        prompts = [[1, 2, 3], [4, 5], [9, 9, 2, 7]]
    else:
        target = ersd.load_model("smollm2-135m", dtype="float32")
        draft = ersd.load_model("smollm2-135m", dtype="int8")
        tok = target.tokenizer
        texts = ["def fibonacci(n):", "The capital of France is", "Once upon a time, a robot"]
        prompts = [tok.encode(t) for t in texts]
    out = {}
    for run in grid(methods):
        kw = dict(run)
        if kw.pop("watermark", False):
            kw["watermark"] = ersd.Watermark(key=b"k" * 32, context_width=2)
        name = json.dumps(run, sort_keys=True)
        batch = ersd.generate_batch(target, draft, prompts, max_new_tokens=tokens, seeds=5, **kw)
        solo = [
            ersd.generate(
                target, draft, p, max_new_tokens=tokens, seed=ersd.derive_seed(5, i), **kw
            )
            for i, p in enumerate(prompts[:1])
        ]
        out[name] = {"batch": [r.tokens for r in batch], "solo": [r.tokens for r in solo]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", help="the reference tree's src folder")
    ap.add_argument("--new", help="the changed tree's src folder")
    ap.add_argument("--toy", action="store_true", help="the tests' toy models instead of SmolLM2")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", default=None)
    ap.add_argument("--methods", default="ersd,specinfer,sd", help="comma-separated")
    ap.add_argument("--produce", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.produce:
        json.dump(produce(args.toy, args.tokens, args.methods.split(",")), sys.stdout)
        return
    results = {}
    for side in ("old", "new"):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(getattr(args, side)))
        cmd = [sys.executable, __file__, "--produce", "--tokens", str(args.tokens)]
        cmd += ["--methods", args.methods]
        cmd += ["--toy"] if args.toy else []
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        results[side] = json.loads(proc.stdout)
    same = 0
    for name in results["old"]:
        if results["old"][name] == results["new"][name]:
            same += 1
        else:
            print(f"DIFFERENT: {name}")
    total = len(results["old"])
    n_texts = sum(len(v["batch"]) + len(v["solo"]) for v in results["old"].values())
    print(f"{same}/{total} configurations identical ({n_texts} texts per tree)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"identical": same == total, **results}, f)
    sys.exit(0 if same == total else 1)


if __name__ == "__main__":
    main()
