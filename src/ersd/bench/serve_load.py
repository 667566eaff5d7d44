"""Load test of ``ersd serve`` (``ersd bench serve``): N concurrent streaming clients, ERSD against
target-only decoding on the same server (``tree="none"`` per request), reporting throughput, time
to first token (TTFT) and inter-token latency (ITL).

Either point it at a running server (a URL) or start one with :func:`local_server` (``ersd serve``
in a subprocess on a free loopback port, stopped at the end).  Each client sends ``requests``
streaming completions one after another (HumanEval prompts from ersd's bundled data, raw; seeds
0, 1, ...), so at concurrency C about C sequences share every step.  Throughput is all generated
tokens over the wall time of the level; TTFT is arrival to the first text; ITL is
(last text - first text) / (tokens - 1) per request (a speculative step delivers several tokens
at once, so this is the mean per-token gap).  Needs the ``serve`` extra (the ``openai`` client).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ersd.errors import ErsdError


class ServeLoadError(ErsdError):
    """The load test could not run: no ``openai`` client, a server that did not come up."""


@dataclass
class LoadSettings:
    """What every level of the load test sends."""

    concurrency: list[int] = field(default_factory=lambda: [1, 4, 8])
    requests: int = 3  # per client, one after another
    max_tokens: int = 64
    temperature: float = 1.0
    method: str = "ersd"
    tree: str | None = None  # ERSD requests' tree; None: the server's default
    baseline: bool = True  # also target-only decoding (tree "none") at every level
    warmup: int = 1  # requests before measuring
    #: the server watermarks (and allows opting out): also ERSD with ``"watermark": false``
    watermark_compare: bool = False
    #: rounds over every (level, mode), the modes' order reversed in every other round
    repeats: int = 1

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ServeLoadError(
                f"concurrency must be client counts >= 1, got {self.concurrency}; e.g. 1,4,8"
            )
        if self.requests < 1 or self.max_tokens < 1 or self.warmup < 0 or self.repeats < 1:
            raise ServeLoadError("requests, max_tokens and repeats must be >= 1 and warmup >= 0")

    def modes(self) -> list[tuple[str | None, dict[str, Any]]]:
        """(tree, extra body fields) of every mode a level runs: ERSD, ERSD without the
        watermark (``watermark_compare``), target-only (``baseline``)."""
        out: list[tuple[str | None, dict[str, Any]]] = [(self.tree, {})]
        if self.watermark_compare:
            out.append((self.tree, {"watermark": False}))
        if self.baseline:
            out.append(("none", {}))
        return out


def _openai() -> Any:
    try:
        import openai
    except ImportError:
        raise ServeLoadError(
            "the load test talks to the server with the openai client: pip install 'ersd[serve]'"
        ) from None
    return openai


def load_prompts(count: int) -> list[str]:
    """``count`` HumanEval prompts from the bundled evaluation split (cycled if more are asked)."""
    path = resources.files("ersd") / "data" / "humaneval_eval.jsonl"
    rows = [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    return [rows[i % len(rows)] for i in range(count)]


def one_request(
    client: Any,
    model: str,
    prompt: str,
    seed: int,
    s: LoadSettings,
    tree: str | None,
    body: dict[str, Any] | None = None,
) -> dict[str, float]:
    """One streaming completion: its tokens, TTFT, mean ITL and latency (seconds)."""
    extra: dict[str, Any] = {"method": s.method, **(body or {})}
    if tree is not None:
        extra["tree"] = tree
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=s.max_tokens,
        temperature=s.temperature,
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
    return request_times(t0, first, last, tokens, time.perf_counter())


def run_level(
    url: str,
    model: str,
    conc: int,
    s: LoadSettings,
    tree: str | None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``conc`` clients, ``s.requests`` requests each: one row of the table."""
    openai = _openai()
    texts = load_prompts(conc * s.requests)
    with openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600
    ) as client:

        def run_client(c: int) -> list[dict[str, float]]:
            ids = range(c * s.requests, (c + 1) * s.requests)
            return [one_request(client, model, texts[i], i, s, tree, body) for i in ids]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(conc) as pool:
            reqs = [r for rs in pool.map(run_client, range(conc)) for r in rs]
        wall = time.perf_counter() - t0
    mode = "target-only" if tree == "none" else f"{s.method} {tree or '(server tree)'}"
    if s.watermark_compare:
        mode += " (no watermark)" if (body or {}).get("watermark") is False else " (watermarked)"
    return {
        "mode": mode,
        "concurrency": conc,
        **level_stats(reqs, wall),
    }


def level_stats(reqs: list[dict[str, float]], wall: float) -> dict[str, Any]:
    """The measured fields of one level: its requests' tokens, throughput, TTFT, ITL, latency."""
    tokens = sum(int(r["tokens"]) for r in reqs)
    return {
        "requests": len(reqs),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_mean_s": statistics.mean(r["ttft"] for r in reqs),
        "ttft_p50_s": statistics.median(r["ttft"] for r in reqs),
        "itl_mean_s": statistics.mean(r["itl"] for r in reqs),
        "latency_mean_s": statistics.mean(r["latency"] for r in reqs),
    }


def request_times(
    t0: float, first: float | None, last: float | None, tokens: int, end: float
) -> dict[str, float]:
    """One request's tokens, TTFT, mean ITL and latency from its timestamps (seconds)."""
    ttft = (first if first is not None else end) - t0
    itl = (last - first) / (tokens - 1) if first is not None and last and tokens > 1 else 0.0
    return {"tokens": tokens, "ttft": ttft, "itl": itl, "latency": end - t0}


def run_load(
    url: str,
    s: LoadSettings,
    *,
    model: str | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every level of ``s`` against the server at ``url`` (ERSD, then target-only); returns the
    rows, each with the settings and the served model name, and calls ``on_row`` as each ends."""
    openai = _openai()
    rows: list[dict[str, Any]] = []
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
            model = model or client.models.list().data[0].id
            for i in range(s.warmup):
                one_request(client, model, load_prompts(1)[0], 10_000 + i, s, s.tree)
        meta = {"model": model, **{k: v for k, v in asdict(s).items() if k != "concurrency"}}
        for rep in range(s.repeats):
            for conc in s.concurrency:
                modes = s.modes() if rep % 2 == 0 else s.modes()[::-1]
                for tree, body in modes:
                    level = run_level(url, model, conc, s, tree, body)
                    row = {**meta, **level, "tree": tree, "repeat": rep}
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
    except openai.OpenAIError as exc:
        raise ServeLoadError(
            f"a request to {url} failed ({type(exc).__name__}: {exc}); check that the server is "
            "up and accepts these settings (see its log)"
        ) from None
    return rows


def watermark_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency: watermarked / unwatermarked ERSD tokens/s of each round (paired: same
    level, neighbouring in time), their median, and the rounds' range."""
    out = []
    for conc in sorted({r["concurrency"] for r in rows}):
        ratios = []
        for rep in sorted({r.get("repeat", 0) for r in rows}):
            at = [r for r in rows if r["concurrency"] == conc and r.get("repeat", 0) == rep]
            wm = [r for r in at if r["mode"].endswith("(watermarked)")]
            plain = [r for r in at if r["mode"].endswith("(no watermark)")]
            if wm and plain:
                ratios.append(wm[0]["tokens_per_s"] / plain[0]["tokens_per_s"])
        if ratios:
            out.append(
                {
                    "concurrency": conc,
                    "ratios": ratios,
                    "median": statistics.median(ratios),
                    "min": min(ratios),
                    "max": max(ratios),
                }
            )
    return out


def detect_throughput(url: str, texts: list[str], *, rounds: int = 3) -> dict[str, Any]:
    """``POST /v1/watermark/detect`` over ``texts`` one after another, ``rounds`` times: the
    median tokens scored per second (the server's tokenizing included) and per request."""
    per_round = []
    tokens = 0
    for _ in range(rounds):
        tokens = 0
        t0 = time.perf_counter()
        for text in texts:
            req = urllib.request.Request(
                f"{url}/v1/watermark/detect",
                data=json.dumps({"text": text}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=600) as r:
                tokens += int(json.loads(r.read())["num_tokens"])
        per_round.append(time.perf_counter() - t0)
    wall = statistics.median(per_round)
    return {
        "texts": len(texts),
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "requests_per_s": len(texts) / wall,
        "round_seconds": per_round,
    }


def library_rows(
    target: Any, draft: Any, s: LoadSettings, *, server_tree: str = "multi:2x3"
) -> list[dict[str, Any]]:
    """The concurrency-1 level without a server: the same prompts, seeds and settings through
    :func:`ersd.generate_stream` in this process (the library's batch-1 figure to hold the server
    against).  TTFT is the time to the first step's tokens (prefill included); ITL as for the
    server.  Run before the server starts, so the two never share the CPU."""
    import ersd

    texts = load_prompts(s.requests)
    eos = list(getattr(target, "eos_token_ids", []) or []) or None
    tok = target.tokenizer
    rows: list[dict[str, Any]] = []
    trees = (s.tree or server_tree, "none") if s.baseline else (s.tree or server_tree,)

    def one(text: str, seed: int, tree: str) -> dict[str, float]:
        t0 = time.perf_counter()
        first = last = None
        tokens = 0
        stream = ersd.generate_stream(
            target,
            draft if tree != "none" else None,
            tok.encode(text),
            max_new_tokens=s.max_tokens,
            method=s.method,
            tree=tree if tree != "none" else "chain:1",
            temperature=s.temperature,
            seed=seed,
            eos_token_id=eos,
        )
        for rec in stream:
            now = time.perf_counter()
            if rec.tokens:
                first = first if first is not None else now
                last = now
            tokens += len(rec.tokens)
        return request_times(t0, first, last, tokens, time.perf_counter())

    for i in range(s.warmup):
        one(load_prompts(1)[0], 10_000 + i, trees[0])
    for tree in trees:
        t0 = time.perf_counter()
        reqs = [one(texts[i], i, tree) for i in range(s.requests)]
        wall = time.perf_counter() - t0
        mode = "target-only" if tree == "none" else f"{s.method} {tree}"
        rows.append(
            {
                "mode": f"library {mode}",
                "concurrency": 1,
                **level_stats(reqs, wall),
                "tree": tree,
                **{k: v for k, v in asdict(s).items() if k not in ("concurrency", "tree")},
            }
        )
    return rows


TABLE_HEADER = (
    f"{'mode':<28} {'C':>3} {'tok/s':>8} {'TTFT s':>7} {'ITL ms':>8} {'tokens':>7} {'wall s':>7}"
)


def table_row(row: dict[str, Any]) -> str:
    """One line of the table under :data:`TABLE_HEADER`."""
    return (
        f"{row['mode']:<28} {row['concurrency']:>3} {row['tokens_per_s']:>8.2f} "
        f"{row['ttft_mean_s']:>7.2f} {1000 * row['itl_mean_s']:>8.1f} {row['tokens']:>7} "
        f"{row['wall_s']:>7.1f}"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_server(serve_args: list[str], *, timeout: float = 900.0) -> Iterator[str]:
    """``ersd serve SERVE_ARGS`` in a subprocess on a free loopback port; yields its URL once
    ``/health`` answers and stops it (SIGTERM, then kill) on exit.  The server runs this same
    ersd (its ``src`` leads ``PYTHONPATH``)."""
    port = _free_port()
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-c", "from ersd.cli import main; main()", "serve", *serve_args]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    tail = [ln for ln in log.read().splitlines() if ln.strip()][-1:]
                    raise ServeLoadError(
                        f"the server exited with code {proc.returncode} before answering: "
                        + (tail[0] if tail else "(no output)")
                    )
                if time.monotonic() > deadline:
                    raise ServeLoadError(
                        f"the server did not answer {url}/health in {timeout:.0f} s; "
                        "raise --startup-timeout (loading large models takes minutes)"
                    )
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=5):
                        break
                except OSError:
                    time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
