"""A generation stream while four clients hammer ``POST /v1/watermark/detect`` (issue 48, item 4).

Before: four clients looping 4 MB detection requests stretched one 40-token stream from 1.8 s to
51.3 s (gaps up to 10.5 s).  Now detection is capped in tokens (``--max-detect-tokens``) and
concurrency (``--detect-concurrency``) and parsed, tokenized and scored in a worker thread.

The test runs the real CLI on the toys (each target call slowed to 20 ms, as a small model's)
with a watermark key, measures a 40-token stream alone and then while 4 clients post detection
bodies in a loop, and bounds the stream's total time and largest gap between chunks.

``python -m tests.test_serve_detect_load --old /tmp/old-serve/src`` measures this checkout and an
older one side by side (interleaved, medians of repeats) and prints the table of docs/serve.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai

from tests.serve_harness import start, stop

STEP_DELAY = 0.02
TOKENS = 40


def _text(chars: int, seed: int = 0) -> str:
    """Seeded random letters and spaces: every 4-token window new, so every token is scored."""
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(chars))


#: the hammering clients' bodies: a 0.5 MB text (over the default cap: refused), and a text just
#: under the default cap of 4,096 tokens (the toys' tokenizer: a token per byte), scored: the
#: concurrency bound and the worker thread do the work
BIG_TEXT = _text(500_000)
CAP_TEXT = _text(4000)


def _key_file(folder: Path, num_salts: int | None = None) -> Path:
    """A key file; ``num_salts=8`` (the default before issue 48) for the old-vs-new measure:
    an uncapped old server scoring 0.5 MB under 256 salts would need gigabytes."""
    path = folder / "wm.json"
    fields: dict[str, Any] = {"key": "7e" * 32}
    if num_salts is not None:
        fields["num_salts"] = num_salts
    path.write_text(json.dumps(fields))
    path.chmod(0o600)
    return path


def stream_once(url: str) -> tuple[float, float]:
    """(total seconds, largest gap between chunks) of one 40-token stream."""
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300) as client:
        t0 = last = time.perf_counter()
        gap = 0.0
        got = 0
        for chunk in client.completions.create(
            model="toy", prompt="Once upon a time", max_tokens=TOKENS, stream=True, seed=3
        ):
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
            got += bool(chunk.choices and chunk.choices[0].text)
        assert got > 0
        return time.perf_counter() - t0, gap


class Hammer:
    """``clients`` threads posting ``text`` to the detector in a loop until stopped (each loop
    bounded: at most ``max_requests`` requests and ``max_seconds``)."""

    def __init__(self, url: str, text: str, clients: int = 4, max_seconds: float = 300) -> None:
        self.url, self.body = url, json.dumps({"text": text}).encode()
        self.stop = threading.Event()
        self.codes: list[int] = []
        self.deadline = time.monotonic() + max_seconds
        self.threads = [threading.Thread(target=self._loop) for _ in range(clients)]

    def _loop(self, max_requests: int = 10_000) -> None:
        for _ in range(max_requests):
            if self.stop.is_set() or time.monotonic() > self.deadline:
                return
            req = urllib.request.Request(
                f"{self.url}/v1/watermark/detect",
                data=self.body,
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    r.read()
                    self.codes.append(r.status)
            except urllib.error.HTTPError as exc:
                exc.read()
                exc.close()
                self.codes.append(exc.code)
                if exc.code == 429:  # as a client should: wait as told
                    time.sleep(float(exc.headers.get("Retry-After", "1")))
            except OSError:
                self.codes.append(0)

    def __enter__(self) -> Hammer:
        for t in self.threads:
            t.start()
        time.sleep(1.0)  # the load is on before the stream starts
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=300)


def _server(
    folder: Path, src: Path | None = None, num_salts: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    return start(
        "--tree", "chain:3", "--watermark-key-file", str(_key_file(folder, num_salts)),
        step_delay=STEP_DELAY, log=folder / "server.log", src=src,
    )  # fmt: skip


def test_detection_load_does_not_starve_a_stream(tmp_path: Path) -> None:
    proc, url = _server(tmp_path)
    try:
        stream_once(url)  # warm
        alone = min(stream_once(url)[0] for _ in range(2))
        for text in (BIG_TEXT, CAP_TEXT):
            with Hammer(url, text) as hammer:
                total, gap = stream_once(url)
            assert hammer.codes, "the hammering clients sent nothing"
            if text is BIG_TEXT:
                assert set(hammer.codes) == {413}, sorted(set(hammer.codes))
            else:
                assert 200 in hammer.codes, sorted(set(hammer.codes))
            # before: 28x alone and gaps of 10 s; bounds generous for a busy 2-core machine
            assert total < 4 * alone + 2.0, (text[:10], total, alone)
            assert gap < 1.5, (text[:10], gap)
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="the older checkout's src folder")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/detect-load"))
    ap.add_argument("--num-salts", type=int, default=8, help="the key's (256: the default)")
    ap.add_argument("--skip-big", action="store_true", help="no 0.5 MB texts (for 256 salts)")
    args = ap.parse_args()
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    servers: dict[str, tuple[Any, str]] = {}
    try:
        for name, src in (("old", args.old), ("new", None)):
            folder = args.out / name
            folder.mkdir(parents=True, exist_ok=True)
            servers[name] = _server(folder, src, num_salts=args.num_salts)
            stream_once(servers[name][1])  # warm
        loads = {"alone": None, "0.5 MB texts": BIG_TEXT, "4k-token texts": CAP_TEXT}
        if args.skip_big:
            del loads["0.5 MB texts"]
        for _ in range(args.repeats):
            for load, text in loads.items():
                for name, (_, url) in servers.items():  # interleaved
                    if text is None:
                        got = stream_once(url)
                    else:
                        with Hammer(url, text, max_seconds=240) as h:
                            got = stream_once(url)
                        codes = sorted(set(h.codes))
                        print(f"  {name} {load}: {got[0]:.2f}s gap {got[1]:.2f}s codes {codes}")
                    runs.setdefault((name, load), []).append(got)
    finally:
        for proc, _ in servers.values():
            stop(proc)
    print(
        f"| load | old total / max gap (s) | new total / max gap (s) |  (medians of {args.repeats})"
    )
    for load in loads:
        cells = []
        for name in ("old", "new"):
            got = runs[(name, load)]
            med = (statistics.median(t for t, _ in got), statistics.median(g for _, g in got))
            cells.append(f"{med[0]:.2f} / {med[1]:.2f}")
        print(f"| {load} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
