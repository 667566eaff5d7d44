"""``ersd serve`` on the toy models in a subprocess, optionally slowed down, for the server tests
that need time to pass (a client leaving mid-request, SIGTERM under load, a stalled engine).

    python -m tests.serve_harness STEP_DELAY ENCODE_DELAY SERVE-ARGS...

runs the real CLI (``ersd serve``, its flags, signal handling and shutdown) with the ``toy``
target's forward sleeping ``STEP_DELAY`` seconds and its tokenizer's ``encode`` sleeping
``ENCODE_DELAY`` seconds.  :func:`start` launches it on a free loopback port and waits for
``/health`` (bounded in count and seconds); the caller kills it in a ``finally``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    *args: str,
    step_delay: float = 0.0,
    encode_delay: float = 0.0,
    layer_delay: float = 0.0,
    env: dict[str, str] | None = None,
    log: Path,
    models: tuple[str, ...] = ("--target", "toy", "--draft", "toy-draft"),
    src: Path | None = None,
    up_seconds: float = 120,
) -> tuple[subprocess.Popen[bytes], str]:
    """The server process and its base URL (``http://127.0.0.1:PORT``), once /health is up.
    ``models``: the model flags (default the toys); ``src``: the ``ersd`` sources to run
    (default ``$ERSD_SERVE_SRC``, else this checkout's; another checkout's ``src`` measures or
    reproduces an older version: ``git worktree add /tmp/old HEAD``)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "tests.serve_harness",
        str(step_delay),
        str(encode_delay),
        *models,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "info",
        *args,
    ]
    stderr = log.open("wb")
    src = src or (Path(os.environ["ERSD_SERVE_SRC"]) if os.environ.get("ERSD_SERVE_SRC") else None)
    paths = {} if src is None else {"PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
    paths["ERSD_HARNESS_LAYER_DELAY"] = str(layer_delay)
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**ENV, **paths, **(env or {})},
        stdout=stderr,  # uvicorn's access log goes to stdout
        stderr=stderr,
    )
    stderr.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + up_seconds
    for _ in range(int(up_seconds * 10)):
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the server did not come up in {up_seconds:g} s")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the server did not come up")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def metric(url: str, name: str) -> float:
    """The value of one Prometheus sample (``name`` with its labels, e.g.
    ``ersd:requests_cancelled_total{model_name="toy"}``); 0 when absent."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


def _slow_layers(model: Any, delay: float) -> None:
    """Each decoder layer of an HF model sleeps ``delay`` seconds (a forward hook): a forward of
    any length takes ``layers * delay`` seconds, as a long prompt's prefill on a slow machine,
    and still reports progress layer by layer."""
    import torch

    def sleep(*_: Any) -> None:
        time.sleep(delay)

    for sub in model.hf_module.modules():
        if isinstance(sub, torch.nn.ModuleList):
            for layer in sub.children():
                layer.register_forward_hook(sleep)


def _slowed(load: Any, step_delay: float, encode_delay: float) -> Any:
    def slow_load(name: str, **options: Any) -> Any:
        model = load(name, **options)
        if name == "toy":
            forward, encode = model.fn, model.tokenizer.encode

            def fn(seqs: Any) -> Any:
                time.sleep(step_delay)
                return forward(seqs)

            def slow_encode(text: str) -> list[int]:
                time.sleep(encode_delay)
                return list(encode(text))

            model.fn = fn
            model.tokenizer.encode = slow_encode
        return model

    return slow_load


def main() -> None:
    import ersd
    from ersd.cli import main as cli
    from ersd.models import toy

    step_delay, encode_delay = float(sys.argv[1]), float(sys.argv[2])
    toy.load = _slowed(toy.load, step_delay, encode_delay)  # type: ignore[assignment]
    layer_delay = float(os.environ.get("ERSD_HARNESS_LAYER_DELAY") or 0)
    if layer_delay > 0:  # every HF model loaded (the target) gets slow layers
        load_model = ersd.load_model

        def slow_model(*args: Any, **kw: Any) -> Any:
            model = load_model(*args, **kw)
            if getattr(model, "hf_module", None) is not None:
                _slow_layers(model, layer_delay)
            return model

        ersd.load_model = slow_model
    cli(["serve", *sys.argv[3:]], prog_name="ersd")


if __name__ == "__main__":
    main()
