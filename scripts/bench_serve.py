#!/usr/bin/env python
"""Load test of ``ersd serve``: N concurrent streaming clients, ERSD against target-only decoding
on the same server (``tree="none"`` per request), reporting throughput, time to first token (TTFT)
and inter-token latency (ITL).

Either point it at a running server (``--url``) or let it start one (``--serve "ARGS"``: the
arguments of ``ersd serve``; it picks a free loopback port and stops the server at the end)::

    python scripts/bench_serve.py --concurrency 1,4,8 --max-tokens 64 \\
        --serve "--target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --draft-dtype int8 \\
                 --tree multi:2x3 --max-batch-size 8" --out bench-results/serve.json

Each client sends ``--requests`` streaming completions one after another (HumanEval prompts from
ersd's bundled data, raw; seeds 0, 1, ...), so at concurrency C about C sequences share every
step.  Throughput is all generated tokens over the wall time of the level; TTFT is arrival to
the first text; ITL is (last text - first text) / (tokens - 1) per request (a speculative step
delivers several tokens at once, so this is the mean per-token gap).  Run alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

import openai


def prompts(count: int) -> list[str]:
    path = resources.files("ersd") / "data" / "humaneval_eval.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["prompt"] for r in rows[:count]]


def one_request(
    client: openai.OpenAI, model: str, prompt: str, seed: int, args: Any, tree: str | None
) -> dict[str, float]:
    extra: dict[str, Any] = {"method": args.method}
    if tree is not None:
        extra["tree"] = tree
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=seed,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text:
            first = first if first is not None else now
            last = now
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    ttft = (first if first is not None else end) - t0
    itl = (last - first) / (tokens - 1) if first is not None and last and tokens > 1 else 0.0
    return {"tokens": tokens, "ttft": ttft, "itl": itl, "latency": end - t0}


def level(url: str, model: str, conc: int, args: Any, tree: str | None) -> dict[str, Any]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
    texts = prompts(conc * args.requests)

    def run_client(c: int) -> list[dict[str, float]]:
        return [
            one_request(
                client, model, texts[c * args.requests + j], c * args.requests + j, args, tree
            )
            for j in range(args.requests)
        ]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        reqs = [r for rs in pool.map(run_client, range(conc)) for r in rs]
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in reqs)
    return {
        "mode": "target-only" if tree == "none" else f"{args.method} {tree or '(server tree)'}",
        "concurrency": conc,
        "requests": len(reqs),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_mean_s": statistics.mean(r["ttft"] for r in reqs),
        "ttft_p50_s": statistics.median(r["ttft"] for r in reqs),
        "itl_mean_s": statistics.mean(r["itl"] for r in reqs),
        "latency_mean_s": statistics.mean(r["latency"] for r in reqs),
    }


def start_server(serve_args: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-c",
        "from ersd.cli import main; main()",
        "serve",
        *shlex.split(serve_args),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, env=os.environ)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return proc, url
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit("the server did not come up in 900 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start one with --serve)")
    ap.add_argument("--serve", help="arguments of `ersd serve` for a server started here")
    ap.add_argument("--model", help="model name (default: the server's first)")
    ap.add_argument("--concurrency", default="1,4,8", help="comma-separated client counts")
    ap.add_argument("--requests", type=int, default=3, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--method", default="ersd")
    ap.add_argument("--tree", default=None, help="ERSD tree per request (default: server's)")
    ap.add_argument("--warmup", type=int, default=1, help="requests before measuring")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    if (args.url is None) == (args.serve is None):
        ap.error("give exactly one of --url and --serve")
    proc = None
    url = args.url
    if args.serve is not None:
        proc, url = start_server(args.serve)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        model = args.model or client.models.list().data[0].id
        for i in range(args.warmup):
            one_request(client, model, prompts(1)[0], 10_000 + i, args, args.tree)
        rows = []
        for conc in [int(c) for c in args.concurrency.split(",")]:
            for tree in (args.tree, "none"):
                row = level(url, model, conc, args, tree)
                rows.append(row)
                print(
                    f"{row['mode']:<28} C={conc:<2} {row['tokens_per_s']:7.2f} tok/s  "
                    f"TTFT {row['ttft_mean_s']:6.2f}s  ITL {1000 * row['itl_mean_s']:7.1f}ms  "
                    f"({row['tokens']} tokens, {row['wall_s']:.1f}s)",
                    flush=True,
                )
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"model": model, "args": vars(args), "rows": rows}, f, indent=2)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
