"""A long prefill is progress, not a stall, and a client that leaves stops it (issue 48, item 4).

Before: ``/health`` answered 503 ``stalled`` for the whole of a long prompt's prefill (8,000
tokens with ``--stall-timeout 10``: 48 s of 503 while the request succeeded), and a prefill ran
to its end for a client that had left.  Now the serving loop hears from every decoder layer of an
HF model (a forward hook): a step that keeps reporting layers is ``prefilling`` (200), only no
progress for ``--stall-timeout`` is 503, and a forward whose rows were all cancelled stops at the
next layer.

The real CLI serves SmolLM2-135M target-only in a subprocess, each decoder layer slowed to
``LAYER_DELAY`` seconds (``tests/serve_harness.py``), so that one forward takes ~30 x that on any
machine; every poll is capped in count and seconds.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serve_harness import start, stop
from tests.test_serve_safety import get, post

pytestmark = pytest.mark.realmodel

LAYER_DELAY = 0.1  # 30 layers: a forward takes >= 3 s
STALL = 1.0
PROMPT = "The history of lighthouses is long and varied. " * 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("prefill") / "server.log"
    proc, url = start(
        "--stall-timeout", str(STALL),
        models=("--target", "smollm2-135m", "--draft", "none", "--dtype", "float32"),
        layer_delay=LAYER_DELAY, log=log, up_seconds=600,
    )  # fmt: skip
    try:
        yield url, log
    finally:
        stop(proc)


def _health(url: str) -> tuple[int, dict[str, Any]]:
    r = get(f"{url}/health", timeout=10)
    return r.status_code, r.json()


def test_a_long_prefill_is_reported_busy_not_stalled(server: tuple[str, Path]) -> None:
    url, _ = server
    done: list[Any] = []
    body = {"model": "smollm2-135m", "prompt": PROMPT, "max_tokens": 1, "seed": 1}
    worker = threading.Thread(
        target=lambda: done.append(post(f"{url}/v1/completions", json_body=body, timeout=300))
    )
    t0 = time.monotonic()
    worker.start()
    seen: list[tuple[int, dict[str, Any]]] = []
    for _ in range(3000):  # capped: 3000 polls, 300 s
        if not worker.is_alive() or time.monotonic() - t0 > 300:
            break
        seen.append(_health(url))
        time.sleep(0.05)
    worker.join(timeout=300)
    took = time.monotonic() - t0
    assert done and done[0].status_code == 200, done
    assert took > 2 * STALL  # the prefill outlasted the stall timeout: the case at issue
    assert all(code == 200 for code, _ in seen), [b for c, b in seen if c != 200][:3]
    prefilling = [b for _, b in seen if b["status"] == "prefilling"]
    assert prefilling, seen[:5]
    assert all(b["seconds_since_progress"] < STALL for b in prefilling)
    assert max(b["step_seconds"] for b in prefilling) > STALL  # one step, longer than the limit
    assert prefilling[-1]["prefill_tokens"] >= 200 and prefilling[-1]["progress_inside_steps"]


def _wait_for(url: str, ready: Any, seconds: float) -> dict[str, Any]:
    """Poll /health until ``ready(body)`` (capped in count and seconds); the last body."""
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds * 50)):
        _, body = _health(url)
        if ready(body) or time.monotonic() > deadline:
            return body
        time.sleep(0.02)
    return body


def test_a_client_that_leaves_stops_its_prefill(server: tuple[str, Path]) -> None:
    """The client sends a prompt and leaves while it prefills: the forward stops at the next
    layer (a few LAYER_DELAYs), not at the end of the step (30 LAYER_DELAYs)."""
    url, log = server
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"model": "smollm2-135m", "prompt": PROMPT + " again", "max_tokens": 50, "seed": 2}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head + body)
        status = _wait_for(url, lambda b: b["running"] == 1, 120)
        assert status["running"] == 1, status
        time.sleep(5 * LAYER_DELAY)  # well inside the first forward (30 layers)
    left = time.monotonic()  # the socket is closed: the client is gone
    status = _wait_for(url, lambda b: b["running"] == 0, 60)
    gone = time.monotonic() - left
    assert status["running"] == 0, status
    step = 30 * LAYER_DELAY
    assert gone < step / 2, f"the prefill went on {gone:.1f} s for nobody (one step: {step:.1f} s)"
    assert "stopped a step mid-forward" in log.read_text()
    assert status["phase"] == "idle", status
